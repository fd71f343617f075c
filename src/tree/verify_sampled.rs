//! Lossless verification of a sampled tree ([`verify_sampled_tree`],
//! [`verify_sampled_node`], [`verify_children`]).
//!
//! # Lossless sampled verification (recursive rejection sampling)
//! At a node whose children c_1..c_m were drawn in that order without
//! replacement from q (its draft distribution), with p the target's
//! distribution at the node's row:
//!   p^(0) = p, q^(0) = q;
//!   for k = 1..m: accept c_k with probability min(1, p^(k-1)(c_k) / q^(k-1)(c_k));
//!     on rejection p^(k) = norm(max(0, p^(k-1) - q^(k-1))) and
//!     q^(k) = q^(k-1) without c_k, renormalized;
//!   if every child is rejected (or m = 0) emit a token drawn from p^(m).
//! An accepted child becomes the node and the walk goes on at its row.
//!
//! Why it is lossless: given c_1..c_{k-1} and their rejection, c_k is
//! distributed as q^(k-1) (that is what drawing without replacement means),
//! and p^(k) is a function of c_1..c_{k-1} only, not of c_k. So step k is the
//! one-draft rule of `crate::sampling` with target p^(k-1) and draft q^(k-1),
//! whose emitted token (c_k if accepted, else one from the residual p^(k),
//! which the later steps produce by induction from k = m) is distributed as
//! p^(k-1); at k = 1 that is p. Rejected tokens get p^(k) = 0, so siblings are
//! never emitted twice. An accepted child's own children are fresh draws from
//! its own q, independent of how it was accepted, so the argument repeats
//! down the tree and every emitted token is distributed as the target's.
//! It needs: the number of children (and whether a node has any) decided
//! before the child is drawn, from earlier draws only ([`sample_tree`]'s
//! best-first priorities are expectations, not the drawn token); the
//! verifier's random numbers independent of the drafter's (`STREAM_VERIFY`
//! vs `STREAM_DRAFT`). The tests enumerate every tree and verification
//! outcome exactly, and show that dropping the residual update, or the
//! renormalization of q, is lossy.
//!
//! A child taken without a draw ([`FirstChild::Greedy`]: q's most probable
//! token as each parent's first child) is the same rule with a point mass for
//! its draft distribution: q^(0) = delta(c_1), accepted with probability
//! p(c_1), on rejection p^(1) = p without c_1 renormalized, and the siblings
//! after it drawn from q without c_1 (q^(1) as above). Lossless by the same
//! argument: the point mass depends on nothing drawn at the node.
//!
//! A deterministic tree (best-first, [`grow_tree`]) is not a draw from q, and
//! this rule applied to it is lossy (tested). At T > 0 such a tree is still
//! verified losslessly by sample-and-match ([`accept_matching`]: sample the
//! target at each row with the host's own sampler and follow the child that
//! carries the sampled token), which accepts a level with probability
//! p(children) instead of the overlap the rejection rule gets.

use super::TreeVerdict;
#[cfg(doc)]
use super::sample::FirstChild;
use super::sample::{Chance, SampledTree};
#[cfg(doc)]
use super::{accept_matching, grow_tree, sample_tree};
use crate::error::{Error, Result};
use crate::sampling::{Checked, Dist, RESIDUAL_EPSILON, Rng, acceptance_probability, residual_weight};

/// Outcome of verifying one node's children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The child at this index (into the children given) is accepted.
    Child(usize),
    /// Every child rejected (or none): emit this token and stop.
    Emit(i32),
}

/// The rule `choose` applies; the lossy ones exist to prove the tests can
/// tell.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rule {
    Lossless,
    /// Each sibling tested against p itself, no residual update in between.
    #[cfg(test)]
    NoResidual,
    /// q not renormalized after a rejection (the with-replacement rule).
    #[cfg(test)]
    WithReplacement,
}

impl Rule {
    /// Whether a rejection updates the target to the residual p^(k).
    #[cfg_attr(not(test), allow(unused_variables))]
    fn updates_target(self, last_child: bool) -> bool {
        match self {
            Rule::Lossless => true,
            #[cfg(test)]
            Rule::NoResidual => last_child,
            #[cfg(test)]
            Rule::WithReplacement => true,
        }
    }

    /// Whether a rejected child leaves q (q^(k) = q^(k-1) without it).
    fn removes_drawn(self) -> bool {
        match self {
            Rule::Lossless => true,
            #[cfg(test)]
            Rule::NoResidual => true,
            #[cfg(test)]
            Rule::WithReplacement => false,
        }
    }
}

/// Recursive rejection sampling at one node (module doc); `fixed[k]`: child
/// k was taken without a draw (a point mass on it). The current target p^(k)
/// is w / total on the support (q's, and the fixed children's) and
/// outside * p / total elsewhere, so a step costs O(|supp q|) and only the
/// final draw walks p. At k = 0 every number is the one `sampling::verify`
/// computes, so a chain verifies as it does.
fn choose<C: Chance>(
    children: &[i32],
    fixed: &[bool],
    q: Option<&Checked>,
    p: &Checked,
    chance: &mut C,
    rule: Rule,
) -> Outcome {
    let mut support: Vec<(i32, f64)> = q.map(|q| q.entries().filter(|e| e.1 > 0.0).collect()).unwrap_or_default();
    for (&c, _) in children.iter().zip(fixed).filter(|e| *e.1) {
        if let Err(at) = support.binary_search_by_key(&c, |e| e.0) {
            support.insert(at, (c, 0.0));
        }
    }
    let mut w: Vec<f64> = support.iter().map(|&(id, _)| p.prob(id)).collect();
    let out_mass = (1.0 - w.iter().sum::<f64>()).max(0.0);
    let (mut outside, mut total) = (1.0, 1.0);
    let mut left: Vec<f64> = support.iter().map(|e| e.1).collect();
    let mut left_mass: f64 = left.iter().sum();
    for (k, &c) in children.iter().enumerate() {
        let i = support.binary_search_by_key(&c, |e| e.0).expect("children are checked to be in the support");
        // q^(k-1) at support entry j: a point mass on c for a child taken without a draw
        let q_at = |j: usize| if fixed[k] { (j == i) as u8 as f64 } else { left[j] / left_mass };
        if chance.accept(acceptance_probability(w[i] / total, q_at(i))) {
            return Outcome::Child(k);
        }
        if rule.updates_target(k + 1 == children.len()) {
            let r: Vec<f64> = w.iter().enumerate().map(|(j, &wj)| residual_weight(wj / total, q_at(j))).collect();
            let r_total = outside / total * out_mass + r.iter().sum::<f64>();
            // At or below epsilon the residual is rounding: p^(k-1) = q^(k-1)
            // and the rejection had probability 0; keep p^(k-1).
            if r_total > RESIDUAL_EPSILON {
                outside /= total;
                (w, total) = (r, r_total);
            }
        }
        if rule.removes_drawn() {
            left[i] = 0.0;
            left_mass = left.iter().sum();
        }
    }
    let entries: Vec<(i32, f64)> = p.entries().collect();
    let weights: Vec<f64> = entries
        .iter()
        .map(|&(id, px)| support.binary_search_by_key(&id, |e| e.0).map_or(outside * px, |j| w[j]))
        .collect();
    Outcome::Emit(entries[chance.pick(&weights)].0)
}

/// Checks that `children` are distinct and each drawn one in q's support.
fn check_children(children: &[i32], fixed: &[bool], q: Option<&Checked>, what: &str) -> Result<()> {
    for (k, &c) in children.iter().enumerate() {
        let drawn_outside = !fixed[k] && q.is_none_or(|q| q.prob(c) <= 0.0);
        if children[..k].contains(&c) || drawn_outside {
            return Err(Error::invalid(format!(
                "{what}: child {k} (token {c}) repeats a sibling or has q = 0 (not drawn from q without replacement)"
            )));
        }
    }
    Ok(())
}

/// Verifies one node: `children` were drawn in this order without
/// replacement from `q`; `p` is the target's distribution at the node's row.
/// One uniform per child tested, one more for the emitted token. For hosts
/// that compute p lazily, row by row down the accepted path.
pub fn verify_children(children: &[i32], q: Dist, p: Dist, n_vocab: usize, rng: &mut Rng) -> Result<Outcome> {
    let p = Checked::new(p, n_vocab, "p")?;
    let q = Checked::new(q, n_vocab, "q")?;
    let drawn = vec![false; children.len()];
    check_children(children, &drawn, Some(&q), "node")?;
    Ok(choose(children, &drawn, Some(&q), &p, rng, Rule::Lossless))
}

/// One step of verifying a [`sample_tree`] tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TreeStep {
    /// This child node (an index into the tree) is accepted: its row is next.
    Accept(usize),
    /// Every child rejected (or none): emit this token; verification ends.
    Emit(i32),
}

/// Verifies the children of `at` (None: the anchor) in a [`sample_tree`]
/// tree against `p`, the target's distribution at `at`'s row: the step
/// [`verify_sampled_tree`] takes there, with the same random numbers, for a
/// host that computes p lazily along the accepted path. Inputs are checked
/// before any random number is drawn.
pub fn verify_sampled_node(
    tree: &SampledTree,
    at: Option<usize>,
    p: Dist,
    n_vocab: usize,
    rng: &mut Rng,
) -> Result<TreeStep> {
    if at.is_some_and(|i| i >= tree.tree.len()) {
        return Err(Error::invalid(format!("node {at:?}: the tree has {} nodes", tree.tree.len())));
    }
    let p = Checked::new(p, n_vocab, "p")?;
    let kids: Vec<usize> = tree.tree.children(at).collect();
    let tokens = tree.tree.tokens(&kids);
    let fixed = tree.fixed_of(&kids);
    let q = match (kids.is_empty(), tree.q(at)) {
        (true, _) => None,
        (false, Some(q)) => Some(Checked::new(q, n_vocab, "q")?),
        (false, None) if fixed.iter().all(|&f| f) => None,
        (false, None) => return Err(Error::invalid(format!("node {at:?} has drawn children but no q"))),
    };
    check_children(&tokens, &fixed, q.as_ref(), "node")?;
    Ok(match choose(&tokens, &fixed, q.as_ref(), &p, rng, Rule::Lossless) {
        Outcome::Child(k) => TreeStep::Accept(kids[k]),
        Outcome::Emit(x) => TreeStep::Emit(x),
    })
}

/// Verifies a [`sample_tree`] tree: `p[0]` is the target's distribution at
/// the anchor row, `p[i + 1]` at node i's (each given its path). Every input
/// is checked before any random number is drawn.
pub fn verify_sampled_tree(tree: &SampledTree, p: &[Dist], n_vocab: usize, rng: &mut Rng) -> Result<TreeVerdict> {
    verify_sampled_with(tree, p, n_vocab, rng, Rule::Lossless)
}

fn verify_sampled_with<C: Chance>(
    tree: &SampledTree,
    p: &[Dist],
    n_vocab: usize,
    chance: &mut C,
    rule: Rule,
) -> Result<TreeVerdict> {
    let nodes = &tree.tree.nodes;
    if p.len() != nodes.len() + 1 {
        return Err(Error::invalid(format!("{} nodes need {} p rows; got {}", nodes.len(), nodes.len() + 1, p.len())));
    }
    let ps =
        p.iter().enumerate().map(|(i, &d)| Checked::new(d, n_vocab, &format!("p[{i}]"))).collect::<Result<Vec<_>>>()?;
    let kids = tree.tree.children_by_slot();
    let mut qs = Vec::with_capacity(kids.len());
    let fixed: Vec<Vec<bool>> = kids.iter().map(|k| tree.fixed_of(k)).collect();
    for (s, k) in kids.iter().enumerate() {
        let q = match (k.is_empty(), tree.q(s.checked_sub(1))) {
            (true, _) => None,
            (false, Some(q)) => Some(Checked::new(q, n_vocab, &format!("q[{s}]"))?),
            (false, None) if fixed[s].iter().all(|&f| f) => None,
            (false, None) => return Err(Error::invalid(format!("slot {s} has drawn children but no q"))),
        };
        check_children(&tree.tree.tokens(k), &fixed[s], q.as_ref(), &format!("slot {s}"))?;
        qs.push(q);
    }
    let (mut path, mut tokens, mut s) = (Vec::new(), Vec::new(), 0);
    loop {
        match choose(&tree.tree.tokens(&kids[s]), &fixed[s], qs[s].as_ref(), &ps[s], chance, rule) {
            Outcome::Child(k) => {
                let c = kids[s][k];
                path.push(c);
                tokens.push(nodes[c].token);
                s = c + 1;
            }
            Outcome::Emit(x) => {
                tokens.push(x);
                return Ok(TreeVerdict { path, tokens });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngram::Branch;
    use crate::sampling::{self, STREAM_DRAFT, STREAM_VERIFY};
    use crate::selector::Lattice;
    use crate::tree::sample::{FirstChild, Proposals, raw_key, row_q, sample_tree_with};
    use crate::tree::test_support::{block, random_block, same};
    use crate::tree::{TreeLimits, accept_matching, grow_tree, sample_tree, slot};
    use crate::truncation::{DraftQ, Truncation};

    // ---- exact enumeration -------------------------------------------------

    /// A `Chance` that follows a script of choices and records the rest, so
    /// that `enumerate` can run the real code down every branch.
    struct Script {
        script: Vec<usize>,
        taken: Vec<(usize, Vec<f64>)>,
        prob: f64,
    }

    impl Chance for Script {
        fn pick(&mut self, weights: &[f64]) -> usize {
            let total: f64 = weights.iter().sum();
            let i = match self.script.get(self.taken.len()) {
                Some(&i) => i,
                None => weights.iter().position(|&w| w > 0.0).unwrap(),
            };
            self.prob *= weights[i] / total;
            self.taken.push((i, weights.to_vec()));
            i
        }

        fn accept(&mut self, p: f64) -> bool {
            let p = p.clamp(0.0, 1.0);
            self.pick(&[p, 1.0 - p]) == 0
        }
    }

    /// Every outcome of `run` with its probability.
    fn enumerate<R>(mut run: impl FnMut(&mut Script) -> R) -> Vec<(R, f64)> {
        let (mut out, mut stack) = (Vec::new(), vec![Vec::new()]);
        while let Some(script) = stack.pop() {
            let n = script.len();
            let mut s = Script { script, taken: Vec::new(), prob: 1.0 };
            let r = run(&mut s);
            for d in n..s.taken.len() {
                for (alt, &w) in s.taken[d].1.iter().enumerate() {
                    if alt != s.taken[d].0 && w > 0.0 {
                        stack.push(s.taken[..d].iter().map(|t| t.0).chain([alt]).collect());
                    }
                }
            }
            out.push((r, s.prob));
        }
        out
    }

    const V: usize = 4;
    const LEN: usize = 3;

    /// A target whose distribution depends on the last token.
    fn target(prefix: &[i32]) -> [f32; V] {
        match prefix.last() {
            None => [0.1, 0.4, 0.2, 0.3],
            Some(0) => [0.5, 0.0, 0.25, 0.25],
            Some(1) => [0.0, 0.3, 0.3, 0.4],
            Some(2) => [0.05, 0.05, 0.1, 0.8],
            _ => [0.7, 0.1, 0.0, 0.2],
        }
    }

    /// p as the verifier sees it: f32, renormalized in f64.
    fn given(p: &[f32]) -> Vec<f64> {
        let s: f64 = p.iter().map(|&x| x as f64).sum();
        p.iter().map(|&x| x as f64 / s).collect()
    }

    fn index(seq: &[i32]) -> usize {
        seq.iter().fold(0, |i, &t| i * V + t as usize)
    }

    fn target_joint() -> Vec<f64> {
        (0..V.pow(LEN as u32))
            .map(|i| {
                let seq: Vec<i32> = (0..LEN).map(|k| ((i / V.pow((LEN - 1 - k) as u32)) % V) as i32).collect();
                (0..LEN).map(|k| given(&target(&seq[..k]))[seq[k] as usize]).product()
            })
            .collect()
    }

    /// Two lattices of depth 2 over V = 4: one with a duplicated candidate,
    /// one with an out-of-vocabulary candidate and a NaN score.
    fn lattices() -> Vec<(Vec<f32>, usize)> {
        vec![
            block(
                3,
                &[vec![0.0, 1.0, 2.0], vec![3.0, 1.0, 3.0]],
                &[same(3, &[1.0, 0.2, -0.5]), vec![vec![0.5, 1.0, 0.0], vec![2.0, -1.0, 0.3], vec![0.0, 0.0, 0.0]]],
            ),
            block(
                3,
                &[vec![2.0, 9.0, 0.0], vec![1.0, 0.0, 2.0]],
                &[same(3, &[0.3, 0.1, 0.9]), vec![vec![1.0, f32::NAN, 0.2], vec![0.0, 0.5, 1.0], vec![-0.3, 0.3, 0.0]]],
            ),
        ]
    }

    /// One speculative step: sample a tree, verify it, complete the emitted
    /// tokens to LEN by target sampling. Returns (outcome index, accepted).
    fn step<C: Chance>(lat: &Lattice, draft: Draft, c: &mut C, rule: Rule) -> (usize, usize) {
        let tree = sample_tree_with(lat, draft.limits, V, draft.q(), draft.first, draft.proposals(), &raw_key, c);
        verify_step(&tree, c, rule)
    }

    fn verify_step<C: Chance>(tree: &SampledTree, c: &mut C, rule: Rule) -> (usize, usize) {
        let nodes = tree.tree().nodes();
        let ps: Vec<[f32; V]> = std::iter::once(target(&[]))
            .chain((0..nodes.len()).map(|i| target(&tree.tree().tokens(&tree.tree().path_to(i)))))
            .collect();
        let pd: Vec<Dist> = ps.iter().map(|p| Dist::Dense(p)).collect();
        let v = verify_sampled_with(tree, &pd, V, c, rule).unwrap();
        assert_eq!(v.tokens.len(), v.path.len() + 1);
        assert_eq!(tree.tree().tokens(&v.path), v.tokens[..v.path.len()]);
        let mut out = v.tokens;
        while out.len() < LEN {
            let p = given(&target(&out));
            out.push(c.pick(&p) as i32);
        }
        (index(&out[..LEN]), v.path.len())
    }

    /// Exact distribution of the LEN emitted tokens, and E[accepted].
    fn exact(lat: &Lattice, draft: Draft, rule: Rule) -> (Vec<f64>, f64) {
        let mut dist = vec![0.0; V.pow(LEN as u32)];
        let mut acc = 0.0;
        for ((i, a), pr) in enumerate(|c| step(lat, draft, c, rule)) {
            dist[i] += pr;
            acc += pr * a as f64;
        }
        (dist, acc)
    }

    fn tv(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / 2.0
    }

    /// How a test tree is drafted: its limits, q's temperature, its first
    /// children, and proposals taken without a draw (n-gram branches: tokens
    /// from the anchor, match length) with their estimated acceptance.
    #[derive(Clone, Copy, Debug)]
    struct Draft {
        limits: TreeLimits,
        t: f32,
        truncation: Truncation,
        first: FirstChild,
        branches: &'static [(&'static [i32], usize)],
        est: f64,
    }

    impl Draft {
        fn q(&self) -> DraftQ {
            DraftQ { t: self.t, truncation: self.truncation }
        }

        fn proposals(&self) -> Proposals<'static> {
            // leaked: a test's handful of small branch lists
            let branches: &'static [Branch] = Box::leak(
                self.branches
                    .iter()
                    .map(|&(t, m)| Branch { tokens: t.to_vec(), match_len: m, after_edit: false })
                    .collect::<Vec<_>>()
                    .into(),
            );
            let est: &'static dyn Fn(usize, usize) -> f64 = match self.est {
                e if e >= 0.9 => &|_, _| 0.95,
                e if e >= 0.4 => &|m, d| 0.2 * m as f64 / d as f64,
                _ => &|_, _| 0.05,
            };
            Proposals { branches, max_depth: 2, p: est }
        }
    }

    fn drawn(limits: TreeLimits, t: f32) -> Draft {
        Draft { limits, t, truncation: Truncation::NONE, first: FirstChild::Drawn, branches: &[], est: 0.0 }
    }

    /// Branch sets over V = 4: one whose tokens q has, one whose tokens it
    /// may not (token 3 follows 0 and 2 in the target), branches sharing a
    /// first token.
    const BRANCHES: [&[(&[i32], usize)]; 3] = [&[], &[(&[3, 0], 2), (&[1, 3], 1)], &[(&[2, 3], 3), (&[2, 1], 1)]];

    fn configs() -> Vec<Draft> {
        let mut out = Vec::new();
        for (first, branches, est) in [
            (FirstChild::Drawn, BRANCHES[0], 0.0),
            (FirstChild::Greedy, BRANCHES[0], 0.0),
            (FirstChild::Drawn, BRANCHES[1], 0.95),
            (FirstChild::Drawn, BRANCHES[2], 0.5),
            (FirstChild::Greedy, BRANCHES[1], 0.5),
            (FirstChild::Drawn, BRANCHES[1], 0.05),
        ] {
            for n_nodes in [1, 2, 3, 5] {
                for (max_children, max_leaves) in [(0, 0), (1, 0), (2, 0), (0, 2)] {
                    for t in [0.6, 1.0, 1.7] {
                        let limits = TreeLimits { n_nodes, max_depth: 2, max_children, max_leaves, p_min: 0.0 };
                        out.push(Draft { limits, t, truncation: Truncation::NONE, first, branches, est });
                    }
                }
            }
            let limits = TreeLimits { p_min: 0.5, ..TreeLimits::tree(5, 2) };
            out.push(Draft { limits, t: 1.0, truncation: Truncation::NONE, first, branches, est });
            out.push(Draft {
                limits: TreeLimits::tree(5, 2),
                t: 0.0,
                truncation: Truncation::NONE,
                first,
                branches,
                est,
            });
            // q cut like a host sampler's p: top-k 2 of 3 candidates, min-p 0.5
            for truncation in [Truncation::new(2, 0.0, 0.0).unwrap(), Truncation::new(0, 0.0, 0.5).unwrap()] {
                for n_nodes in [2, 5] {
                    let limits = TreeLimits::tree(n_nodes, 2);
                    out.push(Draft { limits, t: 1.0, truncation, first, branches, est });
                }
            }
        }
        out
    }

    #[test]
    fn sampled_trees_verify_to_exactly_the_target_distribution() {
        let want = target_joint();
        assert!((want.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let mut outcomes = 0;
        for (rows, n_embd) in lattices() {
            let lat = Lattice::new(&rows, n_embd, 3).unwrap();
            for draft in configs() {
                let all = enumerate(|c| step(&lat, draft, c, Rule::Lossless));
                outcomes += all.len();
                let (got, _) = exact(&lat, draft, Rule::Lossless);
                assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-12);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() < 1e-9, "{draft:?}: outcome {i}: {g} vs {w}");
                }
            }
        }
        assert!(outcomes > 10_000, "{outcomes}");
    }

    #[test]
    fn dropping_the_residual_update_or_the_renormalization_of_q_is_lossy() {
        let want = target_joint();
        for rule in [Rule::NoResidual, Rule::WithReplacement] {
            let mut worst: f64 = 0.0;
            for (rows, n_embd) in lattices() {
                let lat = Lattice::new(&rows, n_embd, 3).unwrap();
                for draft in configs() {
                    let (got, _) = exact(&lat, draft, rule);
                    assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-12);
                    worst = worst.max(tv(&got, &want));
                    // with one child per node the rules coincide with the lossless one
                    let one_child = draft.limits.max_children == 1 || draft.limits.n_nodes == 1;
                    if one_child || (draft.t == 0.0 && draft.branches.is_empty()) {
                        assert!(tv(&got, &want) < 1e-9);
                    }
                }
            }
            eprintln!(
                "{}: worst TV to the target {worst:.4}",
                if rule == Rule::NoResidual { "no residual update" } else { "q not renormalized" }
            );
            assert!(worst > 0.02, "the lossy rule must be caught: TV {worst}");
        }
    }

    #[test]
    fn the_rejection_rule_on_a_deterministic_tree_is_lossy_and_sample_and_match_is_not() {
        // q over the anchor's children as the lattice gives it; the best two
        // taken as children (not drawn), each with its best child.
        let (rows, n_embd) = &lattices()[0];
        let lat = Lattice::new(rows, *n_embd, 3).unwrap();
        let tree = grow_tree(&lat, TreeLimits { max_children: 2, ..TreeLimits::tree(4, 2) }, V);
        assert_eq!(tree.children(None).count(), 2);
        let q: Vec<(Vec<i32>, Vec<f32>)> = std::iter::once(None)
            .chain((0..tree.len()).map(Some))
            .map(|parent| {
                let (depth, pred) =
                    parent.map_or((0, 0), |i: usize| (tree.nodes()[i].depth, tree.nodes()[i].candidate));
                match (depth < 2).then(|| row_q(&lat, depth + 1, pred, V, DraftQ::at(1.0))).flatten() {
                    Some(r) => (r.ids, r.probs),
                    None => Default::default(),
                }
            })
            .collect();
        let det = SampledTree { tree: tree.clone(), q, fixed: Vec::new(), keys: Vec::new() };
        let mut got = vec![0.0; V.pow(LEN as u32)];
        for ((i, _), pr) in enumerate(|c| verify_step(&det, c, Rule::Lossless)) {
            got[i] += pr;
        }
        let lossy = tv(&got, &target_joint());
        eprintln!("rejection rule on a deterministic tree: TV to the target {lossy:.4}");
        assert!(lossy > 0.02, "TV {lossy}");
        // sample-and-match: the target samples each row, the tree only says how far that matches
        let mut got = vec![0.0; V.pow(LEN as u32)];
        for (i, pr) in enumerate(|c| {
            let v = accept_matching(&tree, |row| {
                let prefix = row.map_or(Vec::new(), |i| tree.tokens(&tree.path_to(i)));
                c.pick(&given(&target(&prefix))) as i32
            });
            let mut out = v.tokens;
            while out.len() < LEN {
                out.push(c.pick(&given(&target(&out))) as i32);
            }
            index(&out[..LEN])
        }) {
            got[i] += pr;
        }
        assert!(tv(&got, &target_joint()) < 1e-9);
    }

    #[test]
    fn a_greedy_first_chain_accepts_what_sample_and_match_accepts_on_it() {
        // one child per node, taken without a draw: accepted with p(child),
        // as sample-and-match accepts it (the lattice has no duplicate
        // candidate, so the tree is drafted without a random number)
        let (rows, n_embd) = &lattices()[1];
        let lat = Lattice::new(rows, *n_embd, 3).unwrap();
        for t in [0.6, 1.0, 1.7] {
            let draft = Draft { first: FirstChild::Greedy, ..drawn(TreeLimits::chain(2, 0.0), t) };
            let tree = sample_tree(&lat, draft.limits, V, t, draft.first, Proposals::none(), &mut Rng::new(0)).unwrap();
            assert_eq!(tree.tree().len(), 2);
            let (_, rejection) = exact(&lat, draft, Rule::Lossless);
            let det = tree.tree();
            let matching: f64 = enumerate(|c| {
                accept_matching(det, |row| {
                    let prefix = row.map_or(Vec::new(), |i| det.tokens(&det.path_to(i)));
                    c.pick(&given(&target(&prefix))) as i32
                })
                .path
                .len()
            })
            .into_iter()
            .map(|(a, pr)| a as f64 * pr)
            .sum();
            let (_, drawn_chain) = exact(&lat, drawn(draft.limits, t), Rule::Lossless);
            eprintln!(
                "t={t}: E[accepted] greedy first {rejection:.4}, sample-and-match {matching:.4}, drawn {drawn_chain:.4}"
            );
            assert!((rejection - matching).abs() < 1e-12, "{rejection} vs {matching}");
        }
    }

    #[test]
    fn proposals_become_children_without_a_draw_where_they_outrank_the_next_draw() {
        let (rows, n_embd) = &lattices()[0];
        let lat = Lattice::new(rows, *n_embd, 3).unwrap();
        let confident = Draft { branches: BRANCHES[1], est: 0.95, ..drawn(TreeLimits::tree(6, 2), 1.0) };
        let s = sample_tree(&lat, confident.limits, V, 1.0, FirstChild::Drawn, confident.proposals(), &mut Rng::new(3))
            .unwrap();
        let t = s.tree();
        let anchor: Vec<usize> = t.children(None).collect();
        assert_eq!(t.tokens(&anchor[..2]), vec![3, 1], "both branch heads first, in estimate order");
        assert_eq!(s.fixed_of(&anchor), (0..anchor.len()).map(|k| k < 2).collect::<Vec<_>>());
        for (i, n) in t.nodes().iter().enumerate() {
            if n.parent() == Some(anchor[0]) && s.fixed[i] {
                assert_eq!(n.token, 0, "the branch [3, 0] goes on under its head");
            }
        }
        assert!(t.nodes().iter().zip(&s.fixed).any(|(n, &f)| f && n.depth == 2), "a branch's second token");
        // a proposal estimated below the next draw waits behind the draws
        let doubtful = Draft { est: 0.05, ..confident };
        let s = sample_tree(&lat, doubtful.limits, V, 1.0, FirstChild::Drawn, doubtful.proposals(), &mut Rng::new(3))
            .unwrap();
        let first = s.tree().children(None).next().unwrap();
        assert!(!s.fixed[first]);
    }

    #[test]
    fn a_greedy_first_child_comes_first_and_its_siblings_are_drawn_without_it() {
        let mut rng = Rng::new(11);
        for _ in 0..500 {
            let (rows, n_embd, k) = random_block(&mut rng, 6, true);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let s = sample_tree(&lat, TreeLimits::tree(8, 3), 6, 0.9, FirstChild::Greedy, Proposals::none(), &mut rng)
                .unwrap();
            let kids = s.tree().children_by_slot();
            for (slot, children) in kids.iter().enumerate() {
                let Some(&first) = children.first() else { continue };
                let Some(Dist::Sparse { ids, probs }) = s.q(slot.checked_sub(1)) else { panic!() };
                let best = (0..probs.len()).fold(0, |b, j| if probs[j] > probs[b] { j } else { b });
                assert_eq!(s.tree().nodes()[first].token, ids[best], "slot {slot}");
                let tokens = s.tree().tokens(children);
                assert!(tokens.iter().enumerate().all(|(i, t)| !tokens[..i].contains(t)), "distinct siblings");
            }
        }
    }

    #[test]
    fn a_tree_accepts_more_than_a_chain_of_its_depth() {
        let (rows, n_embd) = &lattices()[0];
        let lat = Lattice::new(rows, *n_embd, 3).unwrap();
        let (_, chain) = exact(&lat, drawn(TreeLimits::chain(2, 0.0), 1.0), Rule::Lossless);
        let (_, tree) = exact(&lat, drawn(TreeLimits::tree(5, 2), 1.0), Rule::Lossless);
        let (_, wide) = exact(&lat, drawn(TreeLimits::tree(12, 2), 1.0), Rule::Lossless);
        eprintln!("E[accepted] depth 2: chain {chain:.4}, tree of 5 {tree:.4}, full tree {wide:.4}");
        assert!(tree > chain + 0.05 && wide >= tree);
    }

    // ---- sampled trees with the real generator -----------------------------

    /// Hoeffding with a union bound over the 2^m events of m outcomes: the
    /// total variation between n samples and their distribution exceeds this
    /// with probability at most 1e-9.
    fn tv_threshold(n: usize, m: usize) -> f64 {
        ((m as f64 + 1.0) * 2f64.ln() - 1e-9f64.ln()).sqrt() / (2.0 * n as f64).sqrt()
    }

    #[test]
    fn monte_carlo_sampled_tree_steps_match_the_target_and_a_lossy_verifier_does_not() {
        let (rows, n_embd) = &lattices()[0];
        let lat = Lattice::new(rows, *n_embd, 3).unwrap();
        let limits = TreeLimits::tree(5, 2);
        let want = target_joint();
        let n = 200_000;
        let threshold = tv_threshold(n, want.len()); // 64 outcomes: ~0.0128
        let (exact_lossy, _) = exact(&lat, drawn(limits, 1.0), Rule::NoResidual);
        let run = |rule: Rule| {
            let mut draft = Rng::with_stream(8, STREAM_DRAFT);
            let mut verify = Rng::with_stream(8, STREAM_VERIFY);
            let mut counts = vec![0usize; want.len()];
            let mut accepted = 0;
            for _ in 0..n {
                let tree = sample_tree_with(
                    &lat,
                    limits,
                    V,
                    DraftQ::at(1.0),
                    FirstChild::Drawn,
                    Proposals::none(),
                    &raw_key,
                    &mut draft,
                );
                let (i, a) = verify_step(&tree, &mut verify, rule);
                counts[i] += 1;
                accepted += a;
            }
            let freq: Vec<f64> = counts.iter().map(|&c| c as f64 / n as f64).collect();
            (tv(&freq, &want), accepted as f64 / n as f64)
        };
        let (honest, rate) = run(Rule::Lossless);
        let (lossy, _) = run(Rule::NoResidual);
        eprintln!(
            "MC n={n}: TV lossless {honest:.5}, lossy {lossy:.5} (exact {:.5}), threshold {threshold:.5}, accepted/step {rate:.4}",
            tv(&exact_lossy, &want)
        );
        assert!(honest < threshold, "TV {honest} >= {threshold}");
        assert!(lossy > 2.0 * threshold, "lossy TV {lossy}");
        let (_, exact_rate) = exact(&lat, drawn(limits, 1.0), Rule::Lossless);
        assert!((rate - exact_rate).abs() < 0.01, "{rate} vs {exact_rate}");
    }

    #[test]
    fn a_chain_verifies_exactly_as_sampling_verify() {
        let mut rng = Rng::new(9);
        for seed in 0..3000u64 {
            let (rows, n_embd, k) = random_block(&mut rng, V, false);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let tree =
                sample_tree(&lat, TreeLimits::chain(4, 0.0), V, 0.9, FirstChild::Drawn, Proposals::none(), &mut rng)
                    .unwrap();
            let t = tree.tree();
            let draft = t.tokens(&(0..t.len()).collect::<Vec<_>>());
            let ps: Vec<[f32; V]> = (0..=draft.len()).map(|i| target(&draft[..i])).collect();
            let pd: Vec<Dist> = ps.iter().map(|p| Dist::Dense(p)).collect();
            let qs: Vec<Dist> = (0..draft.len()).map(|i| tree.q(i.checked_sub(1)).unwrap()).collect();
            let want = sampling::verify(&draft, &qs, &pd, V, &mut Rng::new(seed)).unwrap();
            let got = verify_sampled_tree(&tree, &pd, V, &mut Rng::new(seed)).unwrap();
            assert_eq!((got.path.len(), &got.tokens), (want.n_accepted, &want.tokens));
        }
    }

    /// The engine's step-by-step verification (one call per row of the
    /// accepted path, p given lazily) is `verify_sampled_tree`, draw for draw;
    /// p rows of nodes off the path are never read.
    #[test]
    fn node_by_node_verification_is_the_whole_tree_s_draw_for_draw() {
        let mut rng = Rng::new(12);
        let mut branched = 0;
        for seed in 0..3000u64 {
            let (rows, n_embd, k) = random_block(&mut rng, V, false);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let limits =
                TreeLimits { max_children: (seed % 3) as usize, ..TreeLimits::tree(1 + (seed % 7) as usize, 8) };
            let tree = sample_tree(
                &lat,
                limits,
                V,
                [0.5, 1.0, 1.5][(seed % 3) as usize],
                FirstChild::Drawn,
                Proposals::none(),
                &mut rng,
            )
            .unwrap();
            let t = tree.tree();
            branched += (t.nodes().iter().any(|n| n.depth > 1) && t.children(None).count() > 1) as usize;
            let ps: Vec<[f32; V]> =
                std::iter::once(target(&[])).chain((0..t.len()).map(|i| target(&t.tokens(&t.path_to(i))))).collect();
            let pd: Vec<Dist> = ps.iter().map(|p| Dist::Dense(p)).collect();
            let mut whole_rng = Rng::new(seed);
            let want = verify_sampled_tree(&tree, &pd, V, &mut whole_rng).unwrap();
            let (mut step_rng, mut at, mut path) = (Rng::new(seed), None, Vec::new());
            let emitted = loop {
                match verify_sampled_node(&tree, at, pd[slot(at)], V, &mut step_rng).unwrap() {
                    TreeStep::Accept(c) => {
                        assert_eq!(t.nodes()[c].parent(), at);
                        path.push(c);
                        at = Some(c);
                    }
                    TreeStep::Emit(x) => break x,
                }
            };
            assert_eq!(path, want.path);
            assert_eq!(*want.tokens.last().unwrap(), emitted);
            assert_eq!(whole_rng, step_rng, "the same random numbers consumed");
        }
        assert!(branched > 300, "{branched}");
        let (rows, n_embd) = &lattices()[0];
        let lat = Lattice::new(rows, *n_embd, 3).unwrap();
        let tree =
            sample_tree(&lat, TreeLimits::tree(3, 2), V, 1.0, FirstChild::Drawn, Proposals::none(), &mut rng).unwrap();
        let p = target(&[]);
        let before = rng.clone();
        let e = verify_sampled_node(&tree, Some(3), Dist::Dense(&p), V, &mut rng).unwrap_err();
        assert!(e.message.contains("3 nodes"), "{}", e.message);
        let e = verify_sampled_node(&tree, None, Dist::Dense(&[0.5f32; V]), V, &mut rng).unwrap_err();
        assert!(e.message.contains("sum"), "{}", e.message);
        assert_eq!(rng, before, "no random number drawn on an error");
    }

    #[test]
    fn bad_verification_inputs_are_refused() {
        let p = [0.25f32; 4];
        let q = Dist::Sparse { ids: &[1, 2], probs: &[0.5, 0.5] };
        let mut rng = Rng::new(0);
        let msg = |r: Result<Outcome>| r.unwrap_err().message;
        assert!(msg(verify_children(&[1, 1], q, Dist::Dense(&p), 4, &mut rng)).contains("repeats"));
        assert!(msg(verify_children(&[3], q, Dist::Dense(&p), 4, &mut rng)).contains("q = 0"));
        assert!(msg(verify_children(&[1], q, Dist::Dense(&p[..3]), 4, &mut rng)).contains("entries"));
        assert!(verify_children(&[], q, Dist::Dense(&p), 4, &mut rng).is_ok());
        let (rows, n_embd) = &lattices()[0];
        let lat = Lattice::new(rows, *n_embd, 3).unwrap();
        let tree =
            sample_tree(&lat, TreeLimits::tree(3, 2), V, 1.0, FirstChild::Drawn, Proposals::none(), &mut rng).unwrap();
        let pd = vec![Dist::Dense(&p); tree.tree().len()];
        assert!(verify_sampled_tree(&tree, &pd, V, &mut rng).unwrap_err().message.contains("p rows"));
        let bad = [0.5f32; 4];
        let mut pd = vec![Dist::Dense(&p); tree.tree().len() + 1];
        *pd.last_mut().unwrap() = Dist::Dense(&bad);
        assert!(verify_sampled_tree(&tree, &pd, V, &mut rng).unwrap_err().message.contains("sum"));
    }
}
