//! The per-sequence map between target positions and dense draft positions.
//!
//! Every committed target row gets the next draft position of its sequence,
//! whatever its target position: an M-RoPE image span (many rows pinned to one
//! position) or a position jump never reaches the draft. Host memory operations
//! arrive in target coordinates and are translated here into draft KV edits.
//! Pure bookkeeping; the engine applies the edits to the draft context.

/// One row in the draft KV: its target position and its draft position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub target: i32,
    pub draft: i32,
}

/// An edit of one sequence's cells in the draft KV, in draft positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEdit {
    /// Remove cells in [p0, p1).
    Remove { p0: i32, p1: i32 },
    /// Add `delta` to the positions of cells in [p0, p1).
    Shift { p0: i32, p1: i32, delta: i32 },
}

/// A target range [p0, p1) with llama's conventions: p0 < 0 means 0, p1 < 0
/// means no upper bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetRange {
    pub p0: i32,
    pub p1: i32,
}

impl TargetRange {
    pub fn new(p0: i32, p1: i32) -> TargetRange {
        TargetRange { p0: p0.max(0), p1: if p1 < 0 { i32::MAX } else { p1 } }
    }

    pub fn all() -> TargetRange {
        TargetRange::new(-1, -1)
    }

    pub fn contains(&self, pos: i32) -> bool {
        pos >= self.p0 && pos < self.p1
    }
}

/// The rows of one sequence: those in the draft KV, then those committed but
/// not yet injected (queued, without a draft position until injection).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqMap {
    in_kv: Vec<Entry>,
    queued: Vec<i32>,
}

/// What `SeqMap::remove` did: the KV edits to apply, in order, and which queued
/// rows survived (by their index before the removal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    pub edits: Vec<KvEdit>,
    pub queued_kept: Vec<bool>,
}

impl SeqMap {
    pub fn in_kv(&self) -> &[Entry] {
        &self.in_kv
    }

    pub fn queued(&self) -> &[i32] {
        &self.queued
    }

    pub fn is_empty(&self) -> bool {
        self.in_kv.is_empty() && self.queued.is_empty()
    }

    /// The draft position the next injected row (or a noise block) takes.
    pub fn next_draft_pos(&self) -> i32 {
        self.in_kv.last().map_or(0, |e| e.draft + 1)
    }

    /// Target position of the newest committed row.
    pub fn last_target_pos(&self) -> Option<i32> {
        self.queued.last().or(self.in_kv.last().map(|e| &e.target)).copied()
    }

    /// Commits a row: queued until the next injection.
    pub fn commit(&mut self, target: i32) {
        self.queued.push(target);
    }

    /// Gives the first `n` queued rows their draft positions (they were
    /// injected) and returns those positions.
    pub fn inject(&mut self, n: usize) -> Vec<i32> {
        let first = self.next_draft_pos();
        let mut out = Vec::with_capacity(n);
        for (draft, target) in (first..).zip(self.queued.drain(..n)) {
            self.in_kv.push(Entry { target, draft });
            out.push(draft);
        }
        out
    }

    /// Draft positions each queued row would take if injected now.
    pub fn pending_draft_positions(&self) -> std::ops::Range<i32> {
        let next = self.next_draft_pos();
        next..next + self.queued.len() as i32
    }

    /// Removes every row whose target position lies in `range`. With
    /// `can_shift` the rows after a removed span move down so that draft
    /// positions stay contiguous; without (an M-RoPE draft cache cannot shift,
    /// but accepts gaps) they keep their positions.
    pub fn remove(&mut self, range: TargetRange, can_shift: bool) -> Removal {
        let mut edits = Vec::new();
        // removed spans of draft positions, in order
        let mut i = 0;
        while i < self.in_kv.len() {
            if !range.contains(self.in_kv[i].target) {
                i += 1;
                continue;
            }
            let start = i;
            while i < self.in_kv.len() && range.contains(self.in_kv[i].target) {
                i += 1;
            }
            edits.push(KvEdit::Remove { p0: self.in_kv[start].draft, p1: self.in_kv[i - 1].draft + 1 });
        }
        self.in_kv.retain(|e| !range.contains(e.target));
        if can_shift {
            // move each kept run down to the index it now has
            let mut i = 0;
            while i < self.in_kv.len() {
                let start = i;
                let old = self.in_kv[start].draft;
                while i + 1 < self.in_kv.len() && self.in_kv[i + 1].draft == self.in_kv[i].draft + 1 {
                    i += 1;
                }
                let delta = start as i32 - old;
                if delta != 0 {
                    edits.push(KvEdit::Shift { p0: old, p1: self.in_kv[i].draft + 1, delta });
                    for e in &mut self.in_kv[start..=i] {
                        e.draft += delta;
                    }
                }
                i += 1;
            }
        }
        let queued_kept: Vec<bool> = self.queued.iter().map(|&t| !range.contains(t)).collect();
        let mut keep = queued_kept.iter();
        self.queued.retain(|_| *keep.next().unwrap());
        Removal { edits, queued_kept }
    }

    /// Adds `delta` to the target positions in `range` (a context shift on the
    /// target). Draft positions do not change.
    pub fn shift_target(&mut self, range: TargetRange, delta: i32) {
        for e in &mut self.in_kv {
            if range.contains(e.target) {
                e.target = e.target.saturating_add(delta);
            }
        }
        for t in &mut self.queued {
            if range.contains(*t) {
                *t = t.saturating_add(delta);
            }
        }
    }

    /// Rebuilds a map from saved parts, checking that draft positions increase.
    pub fn from_parts(in_kv: Vec<Entry>, queued: Vec<i32>) -> Option<SeqMap> {
        let increasing = in_kv.windows(2).all(|w| w[0].draft < w[1].draft);
        let non_negative = in_kv.first().is_none_or(|e| e.draft >= 0);
        (increasing && non_negative).then_some(SeqMap { in_kv, queued })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(targets: &[i32]) -> SeqMap {
        let mut m = SeqMap::default();
        for &t in targets {
            m.commit(t);
        }
        m.inject(targets.len());
        m
    }

    fn drafts(m: &SeqMap) -> Vec<i32> {
        m.in_kv().iter().map(|e| e.draft).collect()
    }

    #[test]
    fn pinned_image_rows_take_distinct_dense_positions() {
        // text 0..3, an image pinned at 3 (4 rows), text continues at 7
        let m = map(&[0, 1, 2, 3, 3, 3, 3, 7, 8]);
        assert_eq!(drafts(&m), (0..9).collect::<Vec<_>>());
        assert_eq!(m.next_draft_pos(), 9);
    }

    #[test]
    fn removing_the_tail_is_one_edit() {
        let mut m = map(&[0, 1, 2, 3, 4]);
        let r = m.remove(TargetRange::new(3, -1), true);
        assert_eq!(r.edits, vec![KvEdit::Remove { p0: 3, p1: 5 }]);
        assert_eq!(m.next_draft_pos(), 3);
    }

    #[test]
    fn removing_a_middle_span_compacts_when_the_cache_can_shift() {
        // a context shift on the target: drop [2, 4), then targets 4.. move down by 2
        let mut m = map(&[0, 1, 2, 3, 4, 5]);
        let r = m.remove(TargetRange::new(2, 4), true);
        assert_eq!(r.edits, vec![KvEdit::Remove { p0: 2, p1: 4 }, KvEdit::Shift { p0: 4, p1: 6, delta: -2 }]);
        assert_eq!(drafts(&m), vec![0, 1, 2, 3]);
        m.shift_target(TargetRange::new(4, -1), -2);
        assert_eq!(m.in_kv().iter().map(|e| e.target).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn without_shift_gaps_stay() {
        let mut m = map(&[0, 1, 2, 3, 4, 5]);
        let r = m.remove(TargetRange::new(2, 4), false);
        assert_eq!(r.edits, vec![KvEdit::Remove { p0: 2, p1: 4 }]);
        assert_eq!(drafts(&m), vec![0, 1, 4, 5]);
        assert_eq!(m.next_draft_pos(), 6);
    }

    #[test]
    fn removing_several_spans_shifts_each_kept_run_to_its_index() {
        let mut m = map(&[0, 10, 1, 11, 2, 3]);
        // targets >= 10 are removed: draft positions 1 and 3
        let r = m.remove(TargetRange::new(10, -1), true);
        assert_eq!(
            r.edits,
            vec![
                KvEdit::Remove { p0: 1, p1: 2 },
                KvEdit::Remove { p0: 3, p1: 4 },
                KvEdit::Shift { p0: 2, p1: 3, delta: -1 },
                KvEdit::Shift { p0: 4, p1: 6, delta: -2 },
            ]
        );
        assert_eq!(drafts(&m), vec![0, 1, 2, 3]);
    }

    #[test]
    fn queued_rows_are_removed_without_kv_edits() {
        let mut m = map(&[0, 1]);
        m.commit(2);
        m.commit(3);
        let r = m.remove(TargetRange::new(3, -1), true);
        assert!(r.edits.is_empty());
        assert_eq!(r.queued_kept, vec![true, false]);
        assert_eq!(m.queued(), &[2]);
        assert_eq!(m.pending_draft_positions(), 2..3);
        assert_eq!(m.inject(1), vec![2]);
    }

    #[test]
    fn ranges_follow_llamas_negative_conventions() {
        assert!(TargetRange::new(-1, -1).contains(0));
        assert!(TargetRange::new(-1, -1).contains(i32::MAX - 1));
        assert!(!TargetRange::new(2, 4).contains(4));
    }

    #[test]
    fn saved_parts_must_have_increasing_draft_positions() {
        let e = |target, draft| Entry { target, draft };
        assert!(SeqMap::from_parts(vec![e(0, 0), e(1, 2)], vec![]).is_some());
        assert!(SeqMap::from_parts(vec![e(0, 1), e(1, 1)], vec![]).is_none());
        assert!(SeqMap::from_parts(vec![e(0, -1)], vec![]).is_none());
    }
}
