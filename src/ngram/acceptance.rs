//! What the target accepted of n-gram branches: P(a branch's token at depth d
//! is accepted | its parent was), per match length and depth, measured on
//! every branch node the target reached. Each estimate is its cell's rate
//! shrunk towards the rate of its match length over all depths, itself shrunk
//! towards a prior that grows with the match length (a suffix of one token
//! recurs by chance, one of eight hardly ever).

use super::propose::MAX_MATCH;
use crate::tree::Tree;

/// Depths with a cell of their own; deeper ones share the last.
const MAX_DEPTH: usize = 16;

/// Pseudo-observations of each prior.
const PRIOR_WEIGHT: f64 = 4.0;

#[derive(Clone, Debug, PartialEq)]
pub struct NgramAcceptance {
    /// (reached, accepted) per match length (index len - 1) and depth (d - 1).
    counts: Vec<[(f64, f64); MAX_DEPTH]>,
}

impl Default for NgramAcceptance {
    fn default() -> Self {
        NgramAcceptance { counts: vec![[(0.0, 0.0); MAX_DEPTH]; MAX_MATCH] }
    }
}

/// Before any measurement: 0.15 per matched token, at most 0.75.
fn prior(match_len: usize) -> f64 {
    (0.15 * match_len as f64).min(0.75)
}

impl NgramAcceptance {
    fn cell(match_len: usize, depth: usize) -> (usize, usize) {
        (match_len.clamp(1, MAX_MATCH) - 1, depth.clamp(1, MAX_DEPTH) - 1)
    }

    /// P(accepted | parent accepted) of a branch token at `depth` whose branch
    /// matched `match_len` tokens.
    pub fn p(&self, match_len: usize, depth: usize) -> f64 {
        let (m, d) = Self::cell(match_len, depth);
        let row = &self.counts[m];
        let (n, a) = row.iter().fold((0.0, 0.0), |(n, a), c| (n + c.0, a + c.1));
        let pooled = (a + PRIOR_WEIGHT * prior(match_len)) / (n + PRIOR_WEIGHT);
        (row[d].1 + PRIOR_WEIGHT * pooled) / (row[d].0 + PRIOR_WEIGHT)
    }

    /// One branch token the target reached: accepted or not.
    pub fn observe(&mut self, match_len: usize, depth: usize, accepted: bool) {
        let (m, d) = Self::cell(match_len, depth);
        let c = &mut self.counts[m][d];
        c.0 += 1.0;
        c.1 += accepted as u8 as f64;
    }

    /// A greedy tree was verified and `path` accepted: every branch node
    /// (`Node::ngram` > 0) whose parent was reached is a trial. Only the first
    /// `n_verified` nodes count (the host verified those); returns the branch
    /// nodes reached and accepted.
    pub fn observe_tree(&mut self, tree: &Tree, path: &[usize], n_verified: usize) -> (usize, usize) {
        let mut on_path = vec![false; tree.len()];
        path.iter().for_each(|&i| on_path[i] = true);
        let (mut reached, mut accepted) = (0, 0);
        for (i, n) in tree.nodes().iter().enumerate().take(n_verified) {
            let parent_reached = n.parent().is_none_or(|p| on_path[p]);
            if n.ngram > 0 && parent_reached {
                self.observe(n.ngram as usize, n.depth, on_path[i]);
                reached += 1;
                accepted += on_path[i] as usize;
            }
        }
        (reached, accepted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_measurements_longer_matches_are_trusted_more() {
        let m = NgramAcceptance::default();
        assert!((m.p(1, 1) - 0.15).abs() < 1e-12);
        assert!(m.p(2, 3) < m.p(4, 3));
        assert!((m.p(MAX_MATCH + 5, 40) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn measurements_dominate_the_prior_and_inform_other_depths() {
        let mut m = NgramAcceptance::default();
        for i in 0..200 {
            m.observe(1, 1, i % 10 < 9);
        }
        assert!((m.p(1, 1) - 0.9).abs() < 0.02, "{}", m.p(1, 1));
        // an unmeasured depth of the same match length leans on its pooled rate
        assert!(m.p(1, 5) > 0.8, "{}", m.p(1, 5));
        // another match length is untouched
        assert!((m.p(3, 1) - 0.45).abs() < 1e-12);
    }
}
