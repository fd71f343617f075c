//! Target rows outside the draft KV, each with its tap features: the rows
//! committed but not yet injected, and the verify rows held until accept().
//! One type keeps a row's target position and its features together.

use crate::positions::TargetRange;

#[derive(Clone, Debug, PartialEq)]
pub struct RowQueue {
    n_feat: usize,
    targets: Vec<i32>,
    /// `n_feat` floats per row, in row order.
    features: Vec<f32>,
}

impl RowQueue {
    pub fn new(n_feat: usize) -> RowQueue {
        RowQueue { n_feat, targets: Vec::new(), features: Vec::new() }
    }

    /// Rebuilds a queue from saved parts; None when the lengths disagree.
    pub fn from_parts(n_feat: usize, targets: Vec<i32>, features: Vec<f32>) -> Option<RowQueue> {
        (features.len() == targets.len() * n_feat).then_some(RowQueue { n_feat, targets, features })
    }

    pub fn n_feat(&self) -> usize {
        self.n_feat
    }

    pub fn len(&self) -> usize {
        self.targets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Target positions, in row order.
    pub fn targets(&self) -> &[i32] {
        &self.targets
    }

    /// Features of all rows, row after row.
    pub fn features(&self) -> &[f32] {
        &self.features
    }

    /// Features of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.features[i * self.n_feat..(i + 1) * self.n_feat]
    }

    pub fn last_target(&self) -> Option<i32> {
        self.targets.last().copied()
    }

    pub fn push(&mut self, target: i32, features: &[f32]) {
        debug_assert_eq!(features.len(), self.n_feat);
        self.targets.push(target);
        self.features.extend_from_slice(features);
    }

    /// Appends the first `n` rows of `other`.
    pub fn extend_from(&mut self, other: &RowQueue, n: usize) {
        debug_assert_eq!(other.n_feat, self.n_feat);
        self.targets.extend_from_slice(&other.targets[..n]);
        self.features.extend_from_slice(&other.features[..n * self.n_feat]);
    }

    /// Drops the first `n` rows.
    pub fn drop_front(&mut self, n: usize) {
        self.targets.drain(..n);
        self.features.drain(..n * self.n_feat);
    }

    pub fn clear(&mut self) {
        self.targets.clear();
        self.features.clear();
    }

    /// Drops the rows whose target position lies in `range`.
    pub fn remove(&mut self, range: TargetRange) {
        let nf = self.n_feat;
        let mut kept = 0;
        for i in 0..self.targets.len() {
            if !range.contains(self.targets[i]) {
                self.targets[kept] = self.targets[i];
                self.features.copy_within(i * nf..(i + 1) * nf, kept * nf);
                kept += 1;
            }
        }
        self.targets.truncate(kept);
        self.features.truncate(kept * nf);
    }

    /// Adds `delta` to the target positions in `range`.
    pub fn shift_target(&mut self, range: TargetRange, delta: i32) {
        for t in &mut self.targets {
            if range.contains(*t) {
                *t = t.saturating_add(delta);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(targets: &[i32]) -> RowQueue {
        let mut q = RowQueue::new(2);
        for &t in targets {
            q.push(t, &[t as f32, -t as f32]);
        }
        q
    }

    #[test]
    fn a_removal_keeps_each_surviving_row_with_its_features() {
        let mut q = queue(&[0, 1, 2, 3, 4]);
        q.remove(TargetRange::new(1, 3));
        assert_eq!(q.targets(), &[0, 3, 4]);
        assert_eq!(q.features(), &[0.0, -0.0, 3.0, -3.0, 4.0, -4.0]);
        q.remove(TargetRange::new(4, -1));
        assert_eq!(q, queue(&[0, 3]));
    }

    #[test]
    fn held_rows_commit_a_prefix_into_another_queue() {
        let held = queue(&[7, 8, 9]);
        let mut committed = queue(&[6]);
        committed.extend_from(&held, 2);
        assert_eq!(committed, queue(&[6, 7, 8]));
        committed.drop_front(2);
        assert_eq!(committed, queue(&[8]));
        assert_eq!(committed.row(0), &[8.0, -8.0]);
    }

    #[test]
    fn a_target_shift_moves_positions_not_features() {
        let mut q = queue(&[2, 3, 10]);
        q.shift_target(TargetRange::new(3, -1), -2);
        assert_eq!(q.targets(), &[2, 1, 8]);
        assert_eq!(q.row(2), &[10.0, -10.0]);
    }

    #[test]
    fn saved_parts_must_agree_in_length() {
        assert!(RowQueue::from_parts(2, vec![1], vec![0.0, 1.0]).is_some());
        assert!(RowQueue::from_parts(2, vec![1], vec![0.0]).is_none());
    }
}
