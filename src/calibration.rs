//! The growth key of greedy trees: P(the target accepts a node | it accepted
//! the node's parent), estimated from the node's depth and lattice edge
//! probability and calibrated on the engine's own verify outcomes.
//!
//! Why: best-first growth ([`crate::tree::grow_tree_by`]) buys the nodes of
//! highest path probability, which is the expected-accepted optimum only when
//! the edge probabilities are right. The lattice softmax is not: on the SmolLM2
//! pair a pick it gives >= 0.9 is accepted about 70% of the time, while
//! siblings it gives < 0.1 are accepted 3-5% of the time (ranks 2-4), more than
//! it says. Trusting it, the tree goes deep where it should go wide.
//!
//! The measurements are the adaptive controller's kind ([`AcceptanceModel`]:
//! reached / accepted per draft position and confidence bin), taken per child:
//! every child of the anchor and of each accepted node was reached (the target
//! checked its token) and accepted or not ([`observe_tree`]). The path-style
//! observation of chains (the accepted tokens, then the first one rejected)
//! would miss the rejected siblings, which are most of what a tree learns.
//!
//! The estimate per depth and bin is the bin's acceptance rate shrunk towards
//! the rate of that bin over all depths, itself shrunk towards the bin's centre
//! (the raw confidence); both made non-decreasing in confidence (pool adjacent
//! violators), then interpolated linearly between bin centres. So it is bounded
//! to [0, 1], non-decreasing in the edge probability at each depth (greedy's
//! pick stays the first child: a one-child tree is still the greedy chain),
//! and before any measurement it is the raw edge probability itself.

use crate::adaptive::AcceptanceModel;
use crate::tree::{SampledTree, Tree};

/// Pseudo-observations of each prior: a bin's rate over all depths starts at
/// the bin's centre, a depth's rate at the all-depths rate. A few, so that
/// measurements dominate within tens of trials; on the SmolLM2 pair 1 to 16 all
/// grew trees within noise of each other.
const PRIOR_WEIGHT: f64 = 4.0;

/// Deepest depth given a table of its own; deeper ones share the last.
const MAX_DEPTH: usize = 64;

/// A snapshot of the calibrated edge acceptance, for one draft call.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeCalibration {
    /// Per depth (index depth - 1): the estimate at each bin's centre; empty
    /// before any measurement (the raw probability is the estimate).
    table: Vec<Vec<f64>>,
}

impl EdgeCalibration {
    /// No measurement: the raw edge probability.
    pub fn raw() -> EdgeCalibration {
        EdgeCalibration { table: Vec::new() }
    }

    /// The estimate from `model`'s per-child trials ([`observe_tree`]).
    pub fn from_model(model: &AcceptanceModel) -> EdgeCalibration {
        let n_pos = model.n_positions().min(MAX_DEPTH);
        let n_bins = model.counts(0).len();
        let (mut reached, mut accepted) = (vec![0.0; n_bins], vec![0.0; n_bins]);
        for p in 0..n_pos {
            for (b, &(n, a)) in model.counts(p).iter().enumerate() {
                reached[b] += n;
                accepted[b] += a;
            }
        }
        if reached.iter().sum::<f64>() <= 0.0 {
            return EdgeCalibration::raw();
        }
        let centre = |b: usize| (b as f64 + 0.5) / n_bins as f64;
        let pooled: Vec<f64> =
            (0..n_bins).map(|b| (accepted[b] + PRIOR_WEIGHT * centre(b)) / (reached[b] + PRIOR_WEIGHT)).collect();
        // monotone already, so that a depth with few trials inherits a monotone prior
        let pooled = non_decreasing(&pooled, &reached.iter().map(|n| n + PRIOR_WEIGHT).collect::<Vec<_>>());
        let table = (0..n_pos)
            .map(|p| {
                let counts = model.counts(p);
                let rate: Vec<f64> = counts
                    .iter()
                    .zip(&pooled)
                    .map(|(&(n, a), &q)| (a + PRIOR_WEIGHT * q) / (n + PRIOR_WEIGHT))
                    .collect();
                let weight: Vec<f64> = counts.iter().map(|&(n, _)| n + PRIOR_WEIGHT).collect();
                non_decreasing(&rate, &weight)
            })
            .collect();
        EdgeCalibration { table }
    }

    /// P(accepted | the parent was) for a node at `depth` (1-based) whose edge
    /// probability is `prob`: in [0, 1], non-decreasing in `prob`.
    pub fn p(&self, depth: usize, prob: f32) -> f64 {
        let prob = if prob.is_nan() { 0.0 } else { prob.clamp(0.0, 1.0) as f64 };
        let Some(row) = self.table.get(depth.clamp(1, self.table.len().max(1)) - 1) else {
            return prob;
        };
        // bin b's centre is at x = b
        let x = prob * row.len() as f64 - 0.5;
        if x <= 0.0 {
            // from (0, 0) up to the first centre, so that 0 stays 0
            return row[0] * (prob * row.len() as f64 * 2.0).min(1.0);
        }
        let b = x as usize;
        if b + 1 >= row.len() {
            return row[row.len() - 1];
        }
        // clamped: rounding must not step outside the segment (monotone across knots)
        (row[b] + (row[b + 1] - row[b]) * (x - b as f64)).clamp(row[b], row[b + 1])
    }
}

/// The least-squares non-decreasing fit of `values` with `weights` (pool
/// adjacent violators).
fn non_decreasing(values: &[f64], weights: &[f64]) -> Vec<f64> {
    // blocks of (mean, weight, count)
    let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(values.len());
    for (&v, &w) in values.iter().zip(weights) {
        blocks.push((v, w, 1));
        while blocks.len() > 1 && blocks[blocks.len() - 2].0 > blocks[blocks.len() - 1].0 {
            let (v2, w2, n2) = blocks.pop().expect("two blocks");
            let (v1, w1, n1) = blocks.pop().expect("two blocks");
            blocks.push(((v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2));
        }
    }
    blocks.into_iter().flat_map(|(v, _, n)| std::iter::repeat_n(v, n)).collect()
}

/// A greedy tree was verified and `path` accepted: every child of the anchor
/// and of each node on the path was reached, and accepted iff it is on the
/// path. Only nodes below `n_verified` (those whose verify rows the host
/// passed) count: a child the host did not verify was not rejected.
pub fn observe_tree(model: &mut AcceptanceModel, tree: &Tree, path: &[usize], n_verified: usize) {
    let mut reached = vec![false; tree.len() + 1]; // slot: 0 the anchor, i + 1 node i
    reached[0] = true;
    for &i in path {
        reached[i + 1] = true;
    }
    for (i, n) in tree.nodes().iter().enumerate().take(n_verified) {
        // a node only an n-gram branch proposed has no lattice probability
        if n.in_lattice() && reached[n.parent().map_or(0, |p| p + 1)] {
            model.observe_trial(n.depth - 1, n.prob, path.contains(&i));
        }
    }
}

/// Depths with positions of their own in the sampled trees' model; deeper
/// ones share the last.
const SAMPLED_DEPTHS: usize = 16;
/// Sibling indices with positions of their own; later siblings share the last.
const SAMPLED_SIBLINGS: usize = 4;

/// The sampled trees' growth key works like the greedy trees' with one more
/// coordinate: a sampled child is tested only once its earlier siblings were
/// rejected, against what they left of the target (the residual), so its
/// acceptance depends on its sibling index as well as its depth; and the
/// quantity known before the draw is the expected q of the draw, not the
/// drawn token's. The model's positions are (depth, sibling index) pairs and
/// its bins that expected q; [`EdgeCalibration::from_model`] turns it into
/// the estimate ([`EdgeCalibration::p_sampled`]).
pub fn sampled_model() -> AcceptanceModel {
    AcceptanceModel::new(SAMPLED_DEPTHS * SAMPLED_SIBLINGS)
}

fn sampled_position(depth: usize, sibling: usize) -> usize {
    (depth.clamp(1, SAMPLED_DEPTHS) - 1) * SAMPLED_SIBLINGS + sibling.min(SAMPLED_SIBLINGS - 1)
}

impl EdgeCalibration {
    /// P(accepted | tested) for a sampled tree's child at `depth` (1-based),
    /// sibling index `sibling`, whose draw's expected q is `q`, from a
    /// [`sampled_model`]'s calibration.
    pub fn p_sampled(&self, depth: usize, sibling: usize, q: f64) -> f64 {
        self.p(sampled_position(depth, sibling) + 1, q as f32)
    }
}

/// A sampled tree was verified by recursive rejection and `path` accepted:
/// at the anchor and at each node of the path the children were tested in
/// order until one was accepted (the next node of the path) or all were
/// rejected. Children taken from n-gram branches have their own model.
pub fn observe_sampled_tree(model: &mut AcceptanceModel, tree: &SampledTree, path: &[usize]) {
    let keys = tree.growth_keys();
    let parents = std::iter::once(None).chain(path.iter().map(|&i| Some(i)));
    for (d, parent) in parents.enumerate() {
        let accepted = path.get(d).copied();
        for c in tree.tree().children(parent) {
            if let Some((sibling, q)) = keys.get(c).copied().flatten() {
                model.observe_trial(sampled_position(d + 1, sibling), q, Some(c) == accepted);
            }
            if Some(c) == accepted {
                break; // the later siblings were not tested
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Node;

    fn node(token: i32, parent: i32, depth: usize, prob: f32) -> Node {
        Node { token, parent, depth, prob, path_prob: prob, candidate: 0, ngram: 0 }
    }

    fn probs() -> impl Iterator<Item = f32> {
        (0..=1000).map(|i| i as f32 / 1000.0)
    }

    #[test]
    fn before_any_measurement_the_estimate_is_the_raw_probability() {
        let raw = EdgeCalibration::raw();
        let empty = EdgeCalibration::from_model(&AcceptanceModel::new(7));
        assert_eq!(raw, empty);
        for depth in [1, 3, 7, 9] {
            for p in probs() {
                assert_eq!(raw.p(depth, p), p as f64);
            }
        }
    }

    #[test]
    fn an_overconfident_lattice_is_calibrated_to_the_measured_rates() {
        // picks at 0.95 accepted 70% of the time, siblings at 0.05 accepted 5%
        let mut m = AcceptanceModel::new(7);
        for i in 0..1000 {
            m.observe_trial(0, 0.95, i % 10 < 7);
            m.observe_trial(0, 0.05, i % 20 == 0);
        }
        let c = EdgeCalibration::from_model(&m);
        assert!((c.p(1, 0.95) - 0.7).abs() < 0.01, "{}", c.p(1, 0.95));
        assert!((c.p(1, 0.05) - 0.05).abs() < 0.01, "{}", c.p(1, 0.05));
        // deeper positions without trials of their own take the all-depths rate
        assert!((c.p(5, 0.95) - 0.7).abs() < 0.01, "{}", c.p(5, 0.95));
        // bins without trials keep the raw prior, made monotone
        assert!(c.p(1, 0.5) > c.p(1, 0.05) && c.p(1, 0.5) <= c.p(1, 0.95));
    }

    #[test]
    fn the_estimate_is_bounded_and_non_decreasing_in_the_edge_probability_at_every_depth() {
        // random counts, non-monotone on purpose
        let mut rng = crate::sampling::Rng::new(3);
        for _ in 0..200 {
            let mut m = AcceptanceModel::new(7);
            for _ in 0..(rng.next_u64() % 300) {
                let pos = (rng.next_u64() % 8) as usize;
                let conf = rng.next_f64() as f32;
                m.observe_trial(pos, conf, rng.next_f64() < 0.5);
            }
            let c = EdgeCalibration::from_model(&m);
            for depth in 1..=9 {
                let mut last = 0.0;
                for p in probs() {
                    let v = c.p(depth, p);
                    assert!((0.0..=1.0).contains(&v), "{v}");
                    assert!(v >= last, "depth {depth}: p({p}) = {v} < {last}");
                    last = v;
                }
            }
            assert_eq!(c.p(1, f32::NAN), 0.0);
        }
    }

    #[test]
    fn pooling_adjacent_violators_gives_the_monotone_fit() {
        assert_eq!(non_decreasing(&[0.1, 0.3, 0.2, 0.4], &[1.0; 4]), vec![0.1, 0.25, 0.25, 0.4]);
        assert_eq!(non_decreasing(&[0.5, 0.1, 0.0], &[1.0, 1.0, 2.0]), vec![0.15; 3]);
        assert_eq!(non_decreasing(&[0.1, 0.2], &[1.0; 2]), vec![0.1, 0.2]);
    }

    #[test]
    fn every_child_of_a_reached_node_is_a_trial() {
        // anchor -> 0 (0.6) -> 1 (0.5), 3 (0.3); anchor -> 2 (0.3); 1 -> 4 (0.9)
        let tree = Tree::from_nodes(vec![
            node(10, -1, 1, 0.6),
            node(11, 0, 2, 0.5),
            node(12, -1, 1, 0.3),
            node(13, 0, 2, 0.3),
            node(14, 1, 3, 0.9),
        ])
        .unwrap();
        // the target took 0 then 3: the anchor's and node 0's children were reached
        let mut m = AcceptanceModel::new(7);
        observe_tree(&mut m, &tree, &[0, 3], 5);
        let cell = |pos: usize, conf: f32| m.counts(pos)[(conf * 10.0) as usize];
        assert_eq!(cell(0, 0.6), (1.0, 1.0));
        assert_eq!(cell(0, 0.3), (1.0, 0.0));
        assert_eq!(cell(1, 0.5), (1.0, 0.0));
        assert_eq!(cell(1, 0.3), (1.0, 1.0));
        assert_eq!(cell(2, 0.9), (0.0, 0.0), "node 4's parent was not reached");
        // a host that verified only the first 2 nodes: node 2 and 3 were never checked
        let mut m = AcceptanceModel::new(7);
        observe_tree(&mut m, &tree, &[0], 2);
        assert_eq!(m.counts(0)[3], (0.0, 0.0));
        assert_eq!(m.counts(1)[5], (1.0, 0.0));
        // nothing accepted: only the anchor's children were reached
        let mut m = AcceptanceModel::new(7);
        observe_tree(&mut m, &tree, &[], 5);
        assert_eq!((m.counts(0)[6], m.counts(0)[3], m.counts(1)[5]), ((1.0, 0.0), (1.0, 0.0), (0.0, 0.0)));
    }
}
