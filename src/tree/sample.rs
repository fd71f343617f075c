//! Sampled growth for lossless verification ([`sample_tree`]): children
//! drawn from the drafter's q without replacement, kept with the q each
//! parent's children were drawn from ([`SampledTree`]).

use super::grow::{Frontier, Shape};
use super::{NOT_IN_LATTICE, Node, Tree, TreeLimits, slot};
#[cfg(doc)]
use super::{grow_tree, verify_sampled_tree};
use crate::error::{Error, Result};
use crate::ngram::Branch;
use crate::sampling::{Dist, Rng, draw};
use crate::selector::{Lattice, truncate, usable};
use crate::truncation::DraftQ;

/// How a parent's first child is chosen in a sampled tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FirstChild {
    /// Drawn from q like its siblings.
    #[default]
    Drawn,
    /// q's most probable token, taken without a draw. Its draft distribution
    /// is a point mass on it, so the verifier accepts it with the target's own
    /// probability of it (as sample-and-match would accept the greedy draft)
    /// instead of the overlap sum min(p, q), which is more wherever q is
    /// shaped like p; its siblings are drawn from q without it.
    Greedy,
}

impl FirstChild {
    /// The default for a sampled tree of `n_nodes` nodes at most: q's most
    /// probable token where the tree is big enough to draw from the whole q
    /// (`Truncation::for_draft`), drawn otherwise. A whole q is flatter than
    /// the target's p after the host sampler's cut, so a first child drawn
    /// from it often misses the token a cut q would have put first; as a
    /// point mass that token is accepted with the target's own probability
    /// (mixed-16, T = 0.8, the server's sampler, the controller's trees of up
    /// to 63 nodes, three seeds: tau 2.08 against 1.94 drawn). In small
    /// trees, whose q is cut like p, a drawn first child overlaps p about as
    /// well (7 nodes: within the noise of three seeds).
    pub fn for_tree(n_nodes: usize) -> FirstChild {
        if n_nodes > crate::truncation::TRUNCATED_TREE_MAX_NODES { FirstChild::Greedy } else { FirstChild::Drawn }
    }
}

/// Continuations proposed from outside q (n-gram branches of the sequence's
/// own text) for a sampled tree: each token becomes a child taken without a
/// draw (a point mass), where its estimated acceptance `p(class, depth)`
/// (`Branch::class`)
/// ranks it above the next draw, as deep as `max_depth`.
#[derive(Clone, Copy)]
pub struct Proposals<'a> {
    pub branches: &'a [Branch],
    pub max_depth: usize,
    pub p: &'a dyn Fn(usize, usize) -> f64,
}

impl Proposals<'_> {
    /// No proposal.
    pub fn none() -> Proposals<'static> {
        Proposals { branches: &[], max_depth: 0, p: &|_, _| 0.0 }
    }
}

/// A sampled tree and the draft distribution each parent's children were
/// drawn from, for [`verify_sampled_tree`]. The default: no node (a tree not
/// drafted, verified to its bonus token).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampledTree {
    pub(super) tree: Tree,
    /// Per slot (0 the anchor, i + 1 node i): q's distinct token ids and
    /// probabilities (f32, as the draws used them); empty when never computed.
    pub(super) q: Vec<(Vec<i32>, Vec<f32>)>,
    /// Per node: taken without a draw (its draft distribution a point mass
    /// on its token) rather than drawn from its parent's q.
    pub(super) fixed: Vec<bool>,
    /// Per node: what its growth key was read at, (sibling index, the
    /// expected q of its draw or a greedy first child's q); None for an
    /// n-gram branch's token (priced by its own model).
    pub(super) keys: Vec<Option<(usize, f32)>>,
}

impl SampledTree {
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The distribution `parent`'s children (None: the anchor's) are drawn
    /// from, in draw order = tree order; None where none was computed (max
    /// depth, no usable candidate, cut by `p_min`, or a node q does not have).
    pub fn q(&self, parent: Option<usize>) -> Option<Dist<'_>> {
        let (ids, probs) = self.q.get(slot(parent))?;
        (!ids.is_empty()).then_some(Dist::Sparse { ids, probs })
    }

    /// `parent`'s q (ids, probabilities; None where none was computed) and
    /// how many of its children were drawn from it.
    pub fn drawn_from(&self, parent: Option<usize>) -> (Option<Dist<'_>>, usize) {
        let kids: Vec<usize> = self.tree.children(parent).collect();
        (self.q(parent), self.fixed_of(&kids).iter().filter(|&&f| !f).count())
    }

    /// Per node: the sibling index and the q its growth key was read at
    /// (None: an n-gram branch's token), for calibrating the key.
    pub fn growth_keys(&self) -> &[Option<(usize, f32)>] {
        &self.keys
    }

    /// Whether each of `children` (node indices) was taken without a draw.
    pub(super) fn fixed_of(&self, children: &[usize]) -> Vec<bool> {
        children.iter().map(|&c| self.fixed.get(c).copied().unwrap_or(false)).collect()
    }
}

/// The index of q's most probable token (the first of equals).
fn most_probable(probs: &[f32]) -> usize {
    (0..probs.len()).fold(0, |b, j| if probs[j] > probs[b] { j } else { b })
}

/// The random choices of sampling and verification, behind one interface so
/// the tests can enumerate every outcome of the real code exactly.
pub(super) trait Chance {
    /// An index with probability weights[i] / sum (weights >= 0, sum > 0).
    fn pick(&mut self, weights: &[f64]) -> usize;
    /// true with probability p.
    fn accept(&mut self, p: f64) -> bool;
}

impl Chance for Rng {
    fn pick(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        draw(weights.iter().copied().enumerate(), total, self)
    }

    fn accept(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

/// q(· | pred) at position p, computed exactly as `sampled_walk` computes it
/// (so that a one-child sampled tree is the sampled walk, draw for draw).
pub(super) struct RowQ {
    /// Temperature-1 softmax at the first best usable candidate.
    conf: f32,
    /// Distinct tokens with q > 0 (f32), candidate order, and q.
    pub(super) ids: Vec<i32>,
    pub(super) probs: Vec<f32>,
    /// Per candidate: its id if usable, and its weight (0 if unusable).
    cand: Vec<Option<i32>>,
    weight: Vec<f64>,
}

pub(super) fn row_q(lattice: &Lattice, p: usize, pred: usize, n_vocab: usize, q: DraftQ) -> Option<RowQ> {
    let t = q.t;
    let scores = lattice.scores(p, pred);
    let k = scores.len();
    let cand: Vec<Option<i32>> = (0..k).map(|j| usable(lattice, p, scores, j, n_vocab)).collect();
    let best = (0..k).filter(|&j| cand[j].is_some()).reduce(|b, j| if scores[b] < scores[j] { j } else { b })?;
    let max = scores[best] as f64;
    let exp_sum: f64 = (0..k).filter(|&j| cand[j].is_some()).map(|j| (scores[j] as f64 - max).exp()).sum();
    let conf = (1.0 / exp_sum) as f32;
    let mut weight: Vec<f64> = (0..k)
        .map(|j| match cand[j] {
            Some(_) if t == 0.0 => (j == best) as u8 as f64,
            Some(_) => ((scores[j] as f64 - max) / t as f64).exp(),
            None => 0.0,
        })
        .collect();
    truncate(&q, scores, &cand, max, &mut weight);
    let total: f64 = weight.iter().sum();
    let mut ids: Vec<i32> = Vec::with_capacity(k);
    let mut mass: Vec<f64> = Vec::with_capacity(k);
    for j in 0..k {
        if let (Some(id), true) = (cand[j], weight[j] > 0.0) {
            match ids.iter().position(|&x| x == id) {
                Some(m) => mass[m] += weight[j],
                None => {
                    ids.push(id);
                    mass.push(weight[j]);
                }
            }
        }
    }
    let (ids, probs): (Vec<i32>, Vec<f32>) =
        ids.into_iter().zip(mass.iter().map(|&m| (m / total) as f32)).filter(|e| e.1 > 0.0).unzip();
    Some(RowQ { conf, ids, probs, cand, weight })
}

/// A child a parent may take without a draw: a proposed token, its estimated
/// acceptance, the branch class its node carries (the best estimate's), and
/// the proposals that go on through it (index into the branches, next depth).
struct Offer {
    token: i32,
    est: f64,
    class: u8,
    through: Vec<usize>,
}

/// A parent during sampled growth.
struct Parent {
    depth: usize,
    path: f64,
    /// None: at max depth, no usable candidate, cut by `p_min`, or a node
    /// the lattice does not have.
    row: Option<RowQ>,
    drawn: Vec<bool>,
    /// Children on offer without a draw, best estimate first.
    offers: Vec<Offer>,
    /// Children so far, and the estimated probability that all of them are
    /// rejected once the parent is reached (the next one is tested only then).
    n_children: usize,
    rejected: f64,
}

impl Parent {
    /// The expected q of the parent's next draw (sum of q^2 / sum of q over
    /// what is left); None when nothing is left to draw.
    fn draw_estimate(&self) -> Option<f64> {
        let row = self.row.as_ref()?;
        let left = row.probs.iter().zip(&self.drawn).filter(|e| !*e.1).map(|e| *e.0 as f64);
        let (sum, sq) = left.fold((0.0, 0.0), |(s, q), x| (s + x, q + x * x));
        (sum > 0.0).then(|| sq / sum)
    }

    /// The next child: taken without a draw (an offer, or q's most probable
    /// token as a greedy first child) when its estimated acceptance is at
    /// least the next draw's, else drawn. With it: its estimated acceptance
    /// once tested (`key` of its depth, sibling index and the expected q of
    /// the draw, or the greedy token's q; an offer's own estimate), the q the
    /// key was read at (None for an offer), and its priority, the estimated
    /// probability that it is accepted: the parent's, times that of every
    /// earlier sibling rejected, times its own. Expectations only, never the
    /// drawn token: which children exist must not depend on what they turn
    /// out to be.
    fn next(&self, first: FirstChild, key: SampledKey) -> Option<Child> {
        let (depth, k) = (self.depth + 1, self.n_children);
        let child = |how: Next, h: f64, at: Option<f64>| Child {
            how,
            h,
            key_at: at.map(|x| (k, x as f32)),
            priority: self.path * self.rejected * h,
        };
        let draw = self.draw_estimate().map(|d| (key(depth, k, d), d));
        if first == FirstChild::Greedy && k == 0 {
            if let Some(row) = self.row.as_ref().filter(|r| !r.probs.is_empty()) {
                let m = most_probable(&row.probs);
                let q = row.probs[m] as f64;
                let h = key(depth, k, q);
                return Some(match self.offers.first().filter(|o| o.est > h) {
                    Some(o) => child(Next::Offer, o.est, None),
                    None => child(Next::Greedy(m), h, Some(q)),
                });
            }
        }
        match (self.offers.first(), draw) {
            (Some(o), Some((h, d))) if o.est < h => Some(child(Next::Draw, h, Some(d))),
            (Some(o), _) if o.est > 0.0 => Some(child(Next::Offer, o.est, None)),
            (_, Some((h, d))) => Some(child(Next::Draw, h, Some(d))),
            _ => None,
        }
    }
}

/// A parent's next child as [`Parent::next`] prices it.
struct Child {
    how: Next,
    h: f64,
    key_at: Option<(usize, f32)>,
    priority: f64,
}

/// The growth key of sampled trees: P(a child is accepted | it is tested)
/// estimated from its depth (1-based), its sibling index (0 the first) and
/// the expected q of its draw (a greedy first child's q); see
/// `crate::calibration::SampledCalibration`. [`raw_key`]: that q itself.
pub type SampledKey<'a> = &'a dyn Fn(usize, usize, f64) -> f64;

/// The uncalibrated growth key: the expected q of the draw.
pub fn raw_key(_depth: usize, _sibling: usize, q: f64) -> f64 {
    q
}

/// How a parent's next child is chosen.
#[derive(Clone, Copy)]
enum Next {
    /// Its first offer, without a draw.
    Offer,
    /// q's most probable token (this index of the row), without a draw.
    Greedy(usize),
    /// Drawn from q without the children taken so far.
    Draw,
}

/// A tree for lossless sampled verification: best-first like [`grow_tree`]
/// but each child is drawn when its slot is popped, from q(· | parent) =
/// softmax(S[a][·] / t_draft) over usable candidates (duplicates merged, as in
/// `sampled_walk`) without the parent's earlier children. The slot's priority
/// is the estimated probability that the child is accepted: the parent's,
/// times that of the earlier siblings all rejected (a sibling is tested only
/// then), times the child's own once tested, from the expected q of the next
/// draw (raw here, calibrated through [`sample_tree_by`]). So which children
/// exist depends only on what was drawn before (see the module doc of
/// `verify_sampled` for why that keeps verification lossless). The walk
/// continues from the drawn candidate, among duplicates in proportion to their
/// weights.
///
/// Children may also be taken without a draw, marked fixed: q's most probable
/// token as each parent's first child (`first`, [`FirstChild`]), and the
/// tokens of `proposals` (n-gram branches from the anchor) wherever their
/// estimate ranks them before the next draw. Drawn siblings exclude them.
///
/// `t_draft = 0`: one-hot q, the greedy chain, no random number drawn. With
/// [`TreeLimits::chain`], [`FirstChild::Drawn`] and no proposal it is
/// `sampled_walk` draw for draw. `n_min` has no counterpart: dropping a
/// sampled draft for being short biases it.
pub fn sample_tree(
    lattice: &Lattice,
    limits: TreeLimits,
    n_vocab: usize,
    t_draft: f32,
    first: FirstChild,
    proposals: Proposals,
    rng: &mut Rng,
) -> Result<SampledTree> {
    sample_tree_by(lattice, limits, n_vocab, DraftQ::at(t_draft), first, proposals, &raw_key, rng)
}

/// [`sample_tree`] with q as `q` says (its temperature and the host
/// sampler's truncation, `crate::truncation`) and priorities from `key` (a
/// calibrated growth key, [`SampledKey`]) instead of the raw expected q.
#[allow(clippy::too_many_arguments)]
pub fn sample_tree_by(
    lattice: &Lattice,
    limits: TreeLimits,
    n_vocab: usize,
    q: DraftQ,
    first: FirstChild,
    proposals: Proposals,
    key: SampledKey,
    rng: &mut Rng,
) -> Result<SampledTree> {
    let t_draft = q.t;
    if !(t_draft.is_finite() && t_draft >= 0.0) {
        return Err(Error::invalid(format!("draft temperature {t_draft} (must be finite and >= 0)")));
    }
    Ok(sample_tree_with(lattice, limits, n_vocab, q, first, proposals, key, rng))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn sample_tree_with<C: Chance>(
    lattice: &Lattice,
    limits: TreeLimits,
    n_vocab: usize,
    q: DraftQ,
    first: FirstChild,
    proposals: Proposals,
    key: SampledKey,
    chance: &mut C,
) -> SampledTree {
    let max_depth = limits.max_depth.min(lattice.n_rows().saturating_sub(1));
    // the offers of a parent at `depth` through which `through` (branch, next token) go on
    let offers = |depth: usize, through: &[usize]| -> Vec<Offer> {
        let mut out: Vec<Offer> = Vec::new();
        if depth >= proposals.max_depth {
            return out;
        }
        for &b in through {
            let branch = &proposals.branches[b];
            let Some(&token) = branch.tokens.get(depth) else { continue };
            let class = branch.class().min(u8::MAX as usize);
            let est = (proposals.p)(class, depth + 1);
            match out.iter_mut().find(|o| o.token == token) {
                Some(o) => {
                    o.through.push(b);
                    if est > o.est {
                        (o.est, o.class) = (est, class as u8);
                    }
                }
                None => out.push(Offer { token, est, class: class as u8, through: vec![b] }),
            }
        }
        out.sort_by(|a, b| b.est.total_cmp(&a.est));
        out
    };
    let open = |depth: usize, pred: Option<usize>, path: f64, through: &[usize]| {
        let row = pred
            .filter(|_| depth < max_depth)
            .and_then(|pred| row_q(lattice, depth + 1, pred, n_vocab, q))
            .filter(|r| !(limits.p_min > 0.0 && r.conf < limits.p_min));
        let drawn = vec![false; row.as_ref().map_or(0, |r| r.ids.len())];
        Parent { depth, path, row, drawn, offers: offers(depth, through), n_children: 0, rejected: 1.0 }
    };
    let all: Vec<usize> = (0..proposals.branches.len()).collect();
    let mut parents = vec![open(0, Some(0), 1.0, &all)];
    let mut nodes: Vec<Node> = Vec::new();
    let mut fixed: Vec<bool> = Vec::new();
    let mut keys: Vec<Option<(usize, f32)>> = Vec::new();
    let mut shape = Shape::new();
    let mut frontier = Frontier::new();
    if let Some(c) = parents[0].next(first, key) {
        frontier.push(c.priority, 0usize);
    }
    while nodes.len() < limits.n_nodes {
        let Some((_, s)) = frontier.pop() else { break };
        if !shape.may_add(s, &limits) {
            continue; // decided before the draw
        }
        let parent = &mut parents[s];
        let Child { how, h, key_at, .. } = parent.next(first, key).expect("only parents with a next child are pushed");
        let depth = parent.depth + 1;
        // the child's token, q at it (0 outside q), its estimate, the
        // candidate its row continues from, and the proposals through it
        let (token, prob, est, candidate, class, through) = match how {
            Next::Offer => {
                let o = parent.offers.remove(0);
                let m = parent.row.as_ref().and_then(|r| r.ids.iter().position(|&id| id == o.token));
                let (prob, candidate) = match (m, parent.row.as_ref()) {
                    (Some(m), Some(row)) => {
                        parent.drawn[m] = true;
                        (row.probs[m], best_candidate(row, o.token))
                    }
                    _ => (0.0, NOT_IN_LATTICE),
                };
                (o.token, prob, o.est, candidate, o.class, o.through)
            }
            Next::Greedy(_) | Next::Draw => {
                let row = parent.row.as_ref().expect("only parents with a row draw");
                let m = match how {
                    Next::Greedy(m) => m,
                    _ if q.t == 0.0 => 0, // one-hot q
                    _ => {
                        let w: Vec<f64> = row
                            .probs
                            .iter()
                            .zip(&parent.drawn)
                            .map(|(&q, &d)| if d { 0.0 } else { q as f64 })
                            .collect();
                        chance.pick(&w)
                    }
                };
                parent.drawn[m] = true;
                let (token, prob) = (row.ids[m], row.probs[m]);
                (token, prob, prob as f64, pick_candidate(row, token, chance), 0, Vec::new())
            }
        };
        let is_fixed = !matches!(how, Next::Draw);
        // a drawn child never repeats an offer: drop offers of its token
        parent.offers.retain(|o| o.token != token);
        let path = parent.path * parent.rejected * h;
        parent.n_children += 1;
        parent.rejected *= 1.0 - h;
        shape.add(s);
        if let Some(c) = parent.next(first, key) {
            frontier.push(c.priority, s);
        }
        let pred = (candidate != NOT_IN_LATTICE).then_some(candidate);
        nodes.push(Node {
            token,
            parent: s as i32 - 1,
            depth,
            prob: if candidate == NOT_IN_LATTICE { est as f32 } else { prob },
            path_prob: path as f32,
            candidate,
            ngram: class,
        });
        fixed.push(is_fixed);
        keys.push(key_at);
        parents.push(open(depth, pred, path, &through));
        if let Some(c) = parents[nodes.len()].next(first, key) {
            frontier.push(c.priority, nodes.len());
        }
    }
    let q = parents.into_iter().map(|p| p.row.map(|r| (r.ids, r.probs)).unwrap_or_default()).collect();
    SampledTree { tree: Tree { nodes }, q, fixed, keys }
}

/// The candidate a drawn token's row continues from: among duplicates, in
/// proportion to their weights.
fn pick_candidate<C: Chance>(row: &RowQ, token: i32, chance: &mut C) -> usize {
    let dups: Vec<usize> = (0..row.cand.len()).filter(|&j| row.cand[j] == Some(token) && row.weight[j] > 0.0).collect();
    if dups.len() == 1 { dups[0] } else { dups[chance.pick(&dups.iter().map(|&j| row.weight[j]).collect::<Vec<_>>())] }
}

/// The candidate a token taken without a draw continues from: the heaviest
/// of its duplicates (no random number: nothing was drawn).
fn best_candidate(row: &RowQ, token: i32) -> usize {
    (0..row.cand.len())
        .filter(|&j| row.cand[j] == Some(token))
        .reduce(|b, j| if row.weight[j] > row.weight[b] { j } else { b })
        .unwrap_or(NOT_IN_LATTICE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::{WalkLimits, sampled_walk_q};
    use crate::tree::test_support::{block, check_invariants, clean_block, random_block, same};
    use crate::truncation::Truncation;

    // ---- sampled trees with the real generator -----------------------------

    #[test]
    fn the_one_child_sampled_tree_is_the_sampled_walk_draw_for_draw() {
        let mut rng = Rng::new(5);
        for round in 0..2000u64 {
            let (rows, n_embd, k) = random_block(&mut rng, 20, true);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let t = [0.0f32, 0.5, 1.0, 2.0][(round % 4) as usize];
            let p_min = if round % 3 == 0 { 0.4 } else { 0.0 };
            let (mut a, mut b) = (Rng::new(round), Rng::new(round));
            // and q cut like a host sampler's p, the same way in both
            let truncation = [
                Truncation::NONE,
                Truncation::new(2, 0.0, 0.0).unwrap(),
                Truncation::new(0, 0.7, 0.0).unwrap(),
                Truncation::new(0, 0.0, 0.3).unwrap(),
            ][(round / 4 % 4) as usize];
            let q = DraftQ { t, truncation };
            let walk = sampled_walk_q(&lat, WalkLimits { n_max: 6, n_min: 0, p_min }, 20, q, &mut a).unwrap();
            let tree = sample_tree_by(
                &lat,
                TreeLimits::chain(6, p_min),
                20,
                q,
                FirstChild::Drawn,
                Proposals::none(),
                &raw_key,
                &mut b,
            )
            .unwrap();
            check_invariants(tree.tree());
            assert_eq!(tree.tree().len(), walk.len());
            for (i, (n, w)) in tree.tree().nodes().iter().zip(&walk).enumerate() {
                assert_eq!((n.token, n.prob), (w.token, w.q_of(w.token)));
                let Some(Dist::Sparse { ids, probs }) = tree.q(i.checked_sub(1)) else { panic!() };
                assert_eq!((ids, probs), (&w.q_ids[..], &w.q_probs[..]));
            }
            assert_eq!(a, b, "same random numbers consumed");
        }
    }

    /// The growth key prices the children: a key that says first children
    /// are accepted and siblings never grows a spine; the reverse, siblings.
    #[test]
    fn a_calibrated_key_decides_the_shape() {
        let (rows, n_embd) = block(4, &vec![vec![1.0, 2.0, 3.0, 4.0]; 6], &vec![same(4, &[1.0, 0.8, 0.6, 0.4]); 6]);
        let lat = Lattice::new(&rows, n_embd, 4).unwrap();
        let depths = |key: SampledKey| {
            let s = sample_tree_by(
                &lat,
                TreeLimits::tree(4, 6),
                10,
                DraftQ::at(1.0),
                FirstChild::Drawn,
                Proposals::none(),
                key,
                &mut Rng::new(1),
            )
            .unwrap();
            s.tree().nodes().iter().map(|n| n.depth).max().unwrap()
        };
        assert_eq!(depths(&|_, k, _| if k == 0 { 0.9 } else { 0.01 }), 4);
        assert_eq!(depths(&|d, _, _| if d == 1 { 0.5 } else { 0.01 }), 1);
    }

    /// Verification tests a node's children in order until one is accepted:
    /// those are the trials the key learns from, at their depth and sibling
    /// index.
    #[test]
    fn the_children_verification_tested_are_the_key_s_trials() {
        use crate::adaptive::AcceptanceModel;
        use crate::calibration::{EdgeCalibration, observe_sampled_tree, sampled_model};
        let mut rng = Rng::new(9);
        for _ in 0..300 {
            let (rows, n_embd, k) = clean_block(&mut rng, 40);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let s = sample_tree(&lat, TreeLimits::tree(8, 4), 40, 1.0, FirstChild::Drawn, Proposals::none(), &mut rng)
                .unwrap();
            // a path: the last child of the anchor, then the first child of each node
            let mut path: Vec<usize> = s.tree().children(None).last().into_iter().collect();
            while let Some(c) = path.last().and_then(|&i| s.tree().children(Some(i)).next()) {
                path.push(c);
            }
            let mut m: AcceptanceModel = sampled_model();
            observe_sampled_tree(&mut m, &s, &path);
            let total = |m: &AcceptanceModel| {
                (0..m.n_positions()).flat_map(|p| m.counts(p).to_vec()).fold((0.0, 0.0), |a, c| (a.0 + c.0, a.1 + c.1))
            };
            // every anchor child is tested (the accepted one is the last); one child
            // per later path node; the last node's children are all tested and rejected
            let n_last = path.last().map_or(0, |&i| s.tree().children(Some(i)).count());
            let n_anchor = s.tree().children(None).count();
            let expect = n_anchor + path.len().saturating_sub(1) + n_last;
            assert_eq!(total(&m), (expect as f64, path.len() as f64));
            // the first path node was the anchor's last child: tested at its sibling index
            if let Some(&first) = path.first() {
                let (sibling, q) = s.growth_keys()[first].unwrap();
                assert_eq!(sibling, n_anchor - 1);
                let cal = EdgeCalibration::from_model(&m);
                assert!(cal.p_sampled(1, sibling, q as f64) > 0.0);
            }
        }
    }

    #[test]
    fn sampled_siblings_are_distinct_draws_and_zero_temperature_draws_nothing() {
        let mut rng = Rng::new(6);
        for _ in 0..1000 {
            let (rows, n_embd, k) = random_block(&mut rng, 6, true);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let limits = TreeLimits {
                n_nodes: (rng.next_u64() % 16) as usize,
                max_depth: 8,
                max_children: (rng.next_u64() % 3) as usize,
                max_leaves: (rng.next_u64() % 4) as usize,
                p_min: 0.0,
            };
            let s = sample_tree(&lat, limits, 6, 0.8, FirstChild::Drawn, Proposals::none(), &mut rng).unwrap();
            check_invariants(s.tree());
            assert!(s.tree().len() <= limits.n_nodes);
            assert!(limits.max_leaves == 0 || s.tree().leaves().len() <= limits.max_leaves);
            for (i, n) in s.tree().nodes().iter().enumerate() {
                let Some(Dist::Sparse { ids, probs }) = s.q(n.parent()) else { panic!() };
                let j = ids.iter().position(|&t| t == n.token).unwrap();
                assert_eq!(probs[j], n.prob);
                // the estimated probability of acceptance: at most the parent's
                let parent = n.parent().map_or(1.0, |p| s.tree().nodes()[p].path_prob);
                assert!(n.path_prob >= 0.0 && n.path_prob <= parent * (1.0 + 1e-6), "{i}");
                // the growth key was read at the node's sibling index
                let sibling = s.tree().children(n.parent()).position(|c| c == i).unwrap();
                assert_eq!(s.growth_keys()[i].map(|k| k.0), Some(sibling), "{i}");
            }
            let before = rng.clone();
            let g = sample_tree(&lat, limits, 6, 0.0, FirstChild::Drawn, Proposals::none(), &mut rng).unwrap();
            assert_eq!(rng, before);
            assert!(g.tree().children_by_slot().iter().all(|c| c.len() <= 1));
        }
        assert!(
            sample_tree(
                &Lattice::new(&[0.0; 13], 13, 3).unwrap(),
                TreeLimits::tree(4, 4),
                6,
                -1.0,
                FirstChild::Drawn,
                Proposals::none(),
                &mut rng
            )
            .is_err()
        );
    }
}
