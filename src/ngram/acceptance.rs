//! What the target accepted of n-gram branches: P(a branch's token at depth d
//! is accepted | its parent was), per class (the match length, apart for
//! branches after an edit: `Branch::class`) and depth, measured on every
//! branch node the target reached. A branch's first token is its cell's rate
//! shrunk towards a prior that grows with the match length (a suffix of one
//! token recurs by chance, one of eight hardly ever). A later token is
//! another question, whether a copy that held goes on: its cell's rate is
//! shrunk towards its class's later tokens, those towards every class's,
//! and those towards [`CONTINUATION_PRIOR`].

use super::propose::{MAX_MATCH, N_CLASSES};

/// Depths with a cell of their own; deeper ones share the last.
const MAX_DEPTH: usize = 16;

/// Pseudo-observations of each prior.
const PRIOR_WEIGHT: f64 = 4.0;

/// P(a branch token past the first is accepted | its parent was) before any
/// measurement.
const CONTINUATION_PRIOR: f64 = 0.6;

#[derive(Clone, Debug, PartialEq)]
pub struct NgramAcceptance {
    /// (reached, accepted) per class (index class - 1) and depth (d - 1).
    counts: Vec<[(f64, f64); MAX_DEPTH]>,
    /// (reached, accepted) of the tokens past a branch's first, per class
    /// and over every class: kept as they are observed, since the estimate
    /// reads them for every node of every tree.
    later: Vec<(f64, f64)>,
    every_later: (f64, f64),
}

impl Default for NgramAcceptance {
    fn default() -> Self {
        NgramAcceptance {
            counts: vec![[(0.0, 0.0); MAX_DEPTH]; N_CLASSES],
            later: vec![(0.0, 0.0); N_CLASSES],
            every_later: (0.0, 0.0),
        }
    }
}

/// Before any measurement: 0.15 per matched token, at most 0.75; after an
/// edit (the anchor unmatched) a third of that.
fn prior(class: usize) -> f64 {
    let per_token = if class > MAX_MATCH { 0.05 } else { 0.15 };
    (per_token * ((class - 1) % MAX_MATCH + 1) as f64).min(0.75)
}

impl NgramAcceptance {
    fn cell(class: usize, depth: usize) -> (usize, usize) {
        (class.clamp(1, N_CLASSES) - 1, depth.clamp(1, MAX_DEPTH) - 1)
    }

    /// P(accepted | parent accepted) of a branch token at `depth` whose branch
    /// is of class `class` (`Branch::class`).
    pub fn p(&self, class: usize, depth: usize) -> f64 {
        let (m, d) = Self::cell(class, depth);
        let shrunk = |(n, a): (f64, f64), towards: f64| (a + PRIOR_WEIGHT * towards) / (n + PRIOR_WEIGHT);
        let base =
            if d == 0 { prior(m + 1) } else { shrunk(self.later[m], shrunk(self.every_later, CONTINUATION_PRIOR)) };
        shrunk(self.counts[m][d], base)
    }

    /// One branch token of class `class` the target reached: accepted or not.
    pub fn observe(&mut self, class: usize, depth: usize, accepted: bool) {
        let (m, d) = Self::cell(class, depth);
        let hit = accepted as u8 as f64;
        let add = |c: &mut (f64, f64)| {
            c.0 += 1.0;
            c.1 += hit;
        };
        add(&mut self.counts[m][d]);
        if d > 0 {
            add(&mut self.later[m]);
            add(&mut self.every_later);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_measurements_longer_matches_are_trusted_more() {
        let m = NgramAcceptance::default();
        assert!((m.p(1, 1) - 0.15).abs() < 1e-12);
        assert!(m.p(2, 1) < m.p(4, 1));
        assert!((m.p(MAX_MATCH, 1) - 0.75).abs() < 1e-12);
        // past the first token, the trust that a copy goes on
        assert!((m.p(2, 3) - CONTINUATION_PRIOR).abs() < 1e-12);
        // after an edit, a third of the trust of the same match length
        assert!((m.p(MAX_MATCH + 2, 1) - 0.1).abs() < 1e-12);
        assert!((m.p(N_CLASSES + 5, 1) - 0.4).abs() < 1e-12);
    }

    #[test]
    fn measurements_dominate_the_prior_and_inform_other_depths() {
        let mut m = NgramAcceptance::default();
        for i in 0..200 {
            m.observe(1, 1, i % 10 < 9);
        }
        assert!((m.p(1, 1) - 0.9).abs() < 0.02, "{}", m.p(1, 1));
        // first tokens say nothing of later ones, nor of another class
        assert!((m.p(1, 5) - CONTINUATION_PRIOR).abs() < 1e-12);
        assert!((m.p(3, 1) - 0.45).abs() < 1e-12);
        // later tokens of one class inform an unmeasured depth of it most,
        // then the later tokens of every class
        for i in 0..200 {
            m.observe(2, 2 + i % 3, i % 10 < 2);
        }
        assert!((m.p(2, 3) - 0.2).abs() < 0.02, "{}", m.p(2, 3));
        assert!((m.p(2, 9) - 0.2).abs() < 0.02, "{}", m.p(2, 9));
        assert!(m.p(MAX_MATCH + 4, 2) < 0.3, "{}", m.p(MAX_MATCH + 4, 2));
        assert!(m.p(MAX_MATCH + 4, 2) > 0.2);
    }
}
