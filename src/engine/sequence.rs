//! One target sequence as the engine tracks it: its position map, the features
//! of committed rows waiting for injection, and the rows of an outstanding
//! verify batch held until the host says how many were accepted.

use crate::positions::{SeqMap, TargetRange};

/// A verify-batch row, held until accept().
#[derive(Clone, Copy, Debug)]
pub struct HeldRow {
    pub target: i32,
}

/// The last draft handed to the host, not yet accepted.
#[derive(Clone, Copy, Debug)]
pub struct Outstanding {
    pub n_drafted: usize,
}

#[derive(Default)]
pub struct Sequence {
    pub map: SeqMap,
    /// Features of `map.queued()`, `n_feat` floats each.
    pub queued: Vec<f32>,
    pub held: Vec<HeldRow>,
    /// Features of `held`, `n_feat` floats each.
    pub held_features: Vec<f32>,
    pub outstanding: Option<Outstanding>,
    /// Lattice softmax of each token of the outstanding draft (adaptive walk).
    pub draft_confidences: Vec<f32>,
}

impl Sequence {
    /// Rows arriving now belong to a verify batch (held), not to the sequence yet.
    pub fn holds_rows(&self) -> bool {
        self.outstanding.is_some_and(|o| o.n_drafted > 0)
    }

    pub fn commit(&mut self, target: i32, features: &[f32]) {
        self.map.commit(target);
        self.queued.extend_from_slice(features);
    }

    pub fn hold(&mut self, target: i32, features: &[f32]) {
        self.held.push(HeldRow { target });
        self.held_features.extend_from_slice(features);
    }

    /// Commits the first `n` held rows and drops the rest; returns how many
    /// were dropped.
    pub fn resolve_held(&mut self, n: usize, n_feat: usize) -> usize {
        let n = n.min(self.held.len());
        for i in 0..n {
            let target = self.held[i].target;
            self.map.commit(target);
            self.queued.extend_from_slice(&self.held_features[i * n_feat..(i + 1) * n_feat]);
        }
        let dropped = self.held.len() - n;
        self.held.clear();
        self.held_features.clear();
        self.outstanding = None;
        dropped
    }

    /// Drops held rows whose target position is in `range`.
    pub fn drop_held(&mut self, range: TargetRange, n_feat: usize) {
        let mut kept = 0;
        for i in 0..self.held.len() {
            if !range.contains(self.held[i].target) {
                self.held[kept] = self.held[i];
                self.held_features.copy_within(i * n_feat..(i + 1) * n_feat, kept * n_feat);
                kept += 1;
            }
        }
        self.held.truncate(kept);
        self.held_features.truncate(kept * n_feat);
    }

    /// Keeps the queued features whose rows survived a removal.
    pub fn retain_queued(&mut self, kept: &[bool], n_feat: usize) {
        let mut out = 0;
        for (i, &keep) in kept.iter().enumerate() {
            if keep {
                self.queued.copy_within(i * n_feat..(i + 1) * n_feat, out * n_feat);
                out += 1;
            }
        }
        self.queued.truncate(out * n_feat);
    }
}
