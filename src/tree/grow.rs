//! Deterministic best-first growth ([`grow_tree`], [`grow_tree_by`]), and
//! the frontier and the shape limits that sampled growth shares.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{Node, Tree, TreeLimits, slot};
use crate::selector::{Lattice, first_max, usable};

// ---- growth ----------------------------------------------------------------

/// A frontier entry: higher `key` first, then earlier `order` (deterministic ties).
struct Entry<T> {
    key: f64,
    order: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.total_cmp(&other.key).then(other.order.cmp(&self.order))
    }
}

/// Max-heap frontier of best-first growth.
pub(super) struct Frontier<T> {
    heap: BinaryHeap<Entry<T>>,
    pushed: u64,
}

impl<T> Frontier<T> {
    pub(super) fn new() -> Self {
        Frontier { heap: BinaryHeap::new(), pushed: 0 }
    }

    pub(super) fn push(&mut self, key: f64, item: T) {
        self.heap.push(Entry { key, order: self.pushed, item });
        self.pushed += 1;
    }

    pub(super) fn pop(&mut self) -> Option<(f64, T)> {
        self.heap.pop().map(|e| (e.key, e.item))
    }
}

/// Child counts per slot and the leaf count, for `max_children`/`max_leaves`.
pub(super) struct Shape {
    children: Vec<usize>,
    leaves: usize,
}

impl Shape {
    pub(super) fn new() -> Shape {
        Shape { children: vec![0], leaves: 0 }
    }

    /// A child of the anchor, or of a node that has children already, adds a
    /// leaf; a node's first child only moves its leaf down.
    fn adds_leaf(&self, slot: usize) -> bool {
        slot == 0 || self.children[slot] > 0
    }

    pub(super) fn may_add(&self, slot: usize, limits: &TreeLimits) -> bool {
        self.children[slot] < TreeLimits::cap(limits.max_children)
            && (!self.adds_leaf(slot) || self.leaves < TreeLimits::cap(limits.max_leaves))
    }

    pub(super) fn add(&mut self, slot: usize) {
        self.leaves += self.adds_leaf(slot) as usize;
        self.children[slot] += 1;
        self.children.push(0);
    }
}

/// A distinct token among a row's usable candidates, ranked as greedy ranks.
struct Ranked {
    token: i32,
    candidate: usize,
    /// Softmax (temperature 1, over usable candidates) at `candidate`,
    /// computed as greedy computes its confidence.
    conf: f32,
    /// `conf` summed over the candidates that carry `token`.
    prob: f32,
}

/// The usable candidates of position `p` from predecessor `pred`, by score
/// (first maximum first, as greedy), duplicates merged into the best-ranked
/// occurrence. Empty when greedy's pick (the raw first maximum) is unusable.
fn ranked_children(lattice: &Lattice, p: usize, pred: usize, n_vocab: usize) -> Vec<Ranked> {
    let scores = lattice.scores(p, pred);
    if usable(lattice, p, scores, first_max(scores), n_vocab).is_none() {
        return Vec::new();
    }
    let ok: Vec<usize> = (0..scores.len()).filter(|&j| usable(lattice, p, scores, j, n_vocab).is_some()).collect();
    let mut order = ok.clone();
    // Stable and comparing with `<` semantics (-0 == 0): ties keep candidate
    // order, so the first child is greedy's first maximum.
    order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).expect("usable scores are finite"));
    let mut out: Vec<Ranked> = Vec::with_capacity(order.len());
    for j in order {
        // Greedy's softmax_at restricted to usable entries: on a clean row the
        // very same f32 sum, so the chain's probabilities are greedy's.
        let sum: f32 = ok.iter().map(|&i| (scores[i] - scores[j]).exp()).sum();
        let conf = 1.0 / sum;
        let token = lattice.candidates(p)[j] as i32;
        match out.iter_mut().find(|r| r.token == token) {
            Some(r) => r.prob += conf,
            None => out.push(Ranked { token, candidate: j, conf, prob: conf }),
        }
    }
    out.retain(|r| r.prob > 0.0);
    out
}

/// A would-be node of [`grow_tree`].
struct Child {
    parent: Option<usize>,
    depth: usize,
    token: i32,
    candidate: usize,
    prob: f32,
    /// Product of the edge probabilities from the anchor, this edge's included.
    path_prob: f64,
}

/// The deterministic best-first tree for greedy verification: starting from
/// the anchor's children, repeatedly adds the frontier child of highest path
/// probability (ties: the one pushed first) until `n_nodes`. Edge probability
/// from a node with candidate a to the candidates j of the next position is
/// softmax_j(S[a][j]) at temperature 1 over usable candidates (why 1: it is
/// the drafter's estimate of the target's argmax, whatever temperature the
/// host samples at). A node's children are pushed in greedy's rank order, at
/// most `max_children` of them, and stop at the first below `p_min`.
///
/// With [`TreeLimits::chain`] the tokens are `greedy_walk_scored`'s with
/// `n_min = 0`, on every lattice where greedy picks usable candidates; where
/// greedy picks a NaN or infinite score (it emits the token, with a NaN
/// confidence) the tree stops instead. `prob` equals greedy's confidence on
/// rows without unusable entries; with `p_min > 0` the rule reads `conf`
/// renormalized over usable candidates, where greedy's denominator counts a
/// corrupt entry (and a NaN disables its rule).
pub fn grow_tree(lattice: &Lattice, limits: TreeLimits, n_vocab: usize) -> Tree {
    grow_tree_by(lattice, limits, n_vocab, |_, prob| prob as f64)
}

/// [`grow_tree`] with another growth order: best-first by the product along
/// the path of `edge(depth, prob)`, an estimate of P(the target accepts the
/// node | it accepted the parent) from the node's depth and lattice edge
/// probability (`crate::calibration`: measured, where the lattice's own
/// probability is overconfident). Everything else is [`grow_tree`]'s: the
/// nodes' `prob` and `path_prob` stay the lattice's, only which nodes a budget
/// buys and their order change (`path_prob` need no longer decrease along it).
///
/// `edge` must be non-decreasing in `prob` at each depth (and finite, >= 0):
/// siblings then come in greedy's rank order (ties go to the child pushed
/// first), so a one-child tree is still the greedy chain.
pub fn grow_tree_by(lattice: &Lattice, limits: TreeLimits, n_vocab: usize, edge: impl Fn(usize, f32) -> f64) -> Tree {
    let max_depth = limits.max_depth.min(lattice.n_rows().saturating_sub(1));
    let expand =
        |frontier: &mut Frontier<Child>, parent: Option<usize>, depth: usize, pred: usize, key: f64, path: f64| {
            if depth >= max_depth {
                return;
            }
            for r in ranked_children(lattice, depth + 1, pred, n_vocab)
                .into_iter()
                .take(TreeLimits::cap(limits.max_children))
            {
                if limits.p_min > 0.0 && r.conf < limits.p_min {
                    break; // ranked by score, so every later one is below too
                }
                let path_prob = path * r.prob as f64;
                let child =
                    Child { parent, depth: depth + 1, token: r.token, candidate: r.candidate, prob: r.prob, path_prob };
                frontier.push(key * edge(depth + 1, r.prob), child);
            }
        };
    let mut nodes: Vec<Node> = Vec::new();
    let mut shape = Shape::new();
    let mut frontier = Frontier::new();
    expand(&mut frontier, None, 0, 0, 1.0, 1.0);
    while nodes.len() < limits.n_nodes {
        let Some((key, c)) = frontier.pop() else { break };
        let s = slot(c.parent);
        if !shape.may_add(s, &limits) {
            continue;
        }
        shape.add(s);
        let parent = c.parent.map_or(-1, |p| p as i32);
        nodes.push(Node {
            token: c.token,
            parent,
            depth: c.depth,
            prob: c.prob,
            path_prob: c.path_prob as f32,
            candidate: c.candidate,
            ngram: 0,
        });
        expand(&mut frontier, Some(nodes.len() - 1), c.depth, c.candidate, key, c.path_prob);
    }
    Tree { nodes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Rng;
    use crate::selector::{WalkLimits, greedy_walk_scored};
    use crate::tree::test_support::{block, check_invariants, clean_block, random_block, same};

    // ---- growth --------------------------------------------------------

    #[test]
    fn the_one_child_tree_is_the_greedy_chain_on_random_lattices() {
        let mut rng = Rng::new(1);
        for _ in 0..3000 {
            let (rows, n_embd, k) = random_block(&mut rng, 20, true);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let n_max = 1 + (rng.next_u64() % 9) as usize;
            let greedy = greedy_walk_scored(&lat, WalkLimits { n_max, n_min: 0, p_min: 0.0 }, 20);
            // greedy emits a pick whose score is NaN or infinite; the tree stops there
            let mut want = Vec::new();
            let mut pred = 0;
            for (p, g) in (1..).zip(&greedy) {
                let s = lat.scores(p, pred);
                pred = first_max(s);
                if !s[pred].is_finite() {
                    break;
                }
                want.push(*g);
            }
            let tree = grow_tree(&lat, TreeLimits::chain(n_max, 0.0), 20);
            check_invariants(&tree);
            assert_eq!(
                tree.tokens(&(0..tree.len()).collect::<Vec<_>>()),
                want.iter().map(|p| p.token).collect::<Vec<_>>()
            );
            for (i, n) in tree.nodes().iter().enumerate() {
                assert_eq!((n.parent, n.depth), (i as i32 - 1, i + 1));
            }
        }
        // clean lattices: any p_min, and the probabilities are greedy's confidences, bit for bit
        for _ in 0..3000 {
            let (rows, n_embd, k) = clean_block(&mut rng, 50);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let p_min = if rng.next_u64() % 2 == 0 { 0.0 } else { rng.next_f64() as f32 * 0.8 };
            let greedy = greedy_walk_scored(&lat, WalkLimits { n_max: 8, n_min: 0, p_min }, 50);
            let tree = grow_tree(&lat, TreeLimits::chain(8, p_min), 50);
            let got: Vec<Pick> = tree.nodes().iter().map(|n| Pick { token: n.token, confidence: n.prob }).collect();
            assert_eq!(got, greedy);
        }
    }
    use crate::selector::Pick;

    #[test]
    fn best_first_grows_the_most_probable_paths_first() {
        // position 1: A=10 (e^1), B=11 (e^0), C=12 (e^-2) from the anchor;
        // position 2 from A: 20 sure; from B: 21/22 even; from C: anything
        let (rows, n_embd) = block(
            3,
            &[vec![10.0, 11.0, 12.0], vec![20.0, 21.0, 22.0]],
            &[same(3, &[1.0, 0.0, -2.0]), vec![vec![9.0, 0.0, 0.0], vec![0.0, 5.0, 5.0], vec![0.0, 0.0, 0.0]]],
        );
        let lat = Lattice::new(&rows, n_embd, 3).unwrap();
        let tree = grow_tree(&lat, TreeLimits::tree(5, 8), 100);
        check_invariants(&tree);
        let (a, b, c) = (1f64.exp(), 1.0, (-2f64).exp());
        let pa = a / (a + b + c);
        let pb = b / (a + b + c);
        let toks: Vec<(i32, i32, usize)> = tree.nodes().iter().map(|n| (n.token, n.parent, n.depth)).collect();
        // A (.705), A->20 (.705 * ~1), B (.259), B->21 and B->22 (.130 each; 21 pushed first)
        assert_eq!(toks, vec![(10, -1, 1), (20, 0, 2), (11, -1, 1), (21, 2, 2), (22, 2, 2)]);
        assert!((tree.nodes()[0].path_prob as f64 - pa).abs() < 1e-6);
        let p21 = 5f64.exp() / (1.0 + 2.0 * 5f64.exp());
        assert!((tree.nodes()[3].path_prob as f64 - pb * p21).abs() < 1e-6);
        assert_eq!(tree.nodes()[3].candidate, 1);
        assert_eq!(tree.leaves(), vec![1, 3, 4]);
        assert_eq!(tree.paths(), vec![vec![0, 1], vec![2, 3], vec![2, 4]]);
        // expected accepted: the sum of the path probabilities
        let sum: f64 = tree.nodes().iter().map(|n| n.path_prob as f64).sum();
        assert!((tree.expected_accepted() - sum).abs() < 1e-6);
        // limits: children per node, leaves, p_min on each edge
        let t = grow_tree(&lat, TreeLimits { max_children: 1, ..TreeLimits::tree(5, 8) }, 100);
        assert_eq!(t.tokens(&[0, 1]), vec![10, 20]);
        assert_eq!(t.len(), 2);
        let t = grow_tree(&lat, TreeLimits { max_leaves: 2, ..TreeLimits::tree(5, 8) }, 100);
        assert_eq!(t.nodes().iter().map(|n| n.token).collect::<Vec<_>>(), vec![10, 20, 11, 21]);
        let t = grow_tree(&lat, TreeLimits { p_min: 0.3, ..TreeLimits::tree(5, 8) }, 100);
        assert_eq!(t.nodes().iter().map(|n| n.token).collect::<Vec<_>>(), vec![10, 20]);
        let t = grow_tree(&lat, TreeLimits::tree(5, 1), 100);
        assert_eq!(t.nodes().iter().map(|n| n.token).collect::<Vec<_>>(), vec![10, 11, 12]);
        assert!(grow_tree(&lat, TreeLimits::tree(0, 8), 100).is_empty());
    }

    #[test]
    fn duplicates_merge_and_unusable_candidates_are_never_nodes() {
        let (rows, n_embd) = block(
            4,
            &[vec![7.0, 5.0, 7.0, 500.0], vec![1.0, 2.0, 3.0, 4.0]],
            &[same(4, &[1.0, 0.5, 0.8, 0.0]), same(4, &[0.0, f32::NAN, f32::NEG_INFINITY, 0.0])],
        );
        let lat = Lattice::new(&rows, n_embd, 4).unwrap();
        let tree = grow_tree(&lat, TreeLimits::tree(10, 8), 100);
        check_invariants(&tree);
        let e = [1f64.exp(), 0.5f64.exp(), 0.8f64.exp()]; // 500 is not in the vocabulary
        let first: Vec<(i32, usize, f64)> = tree
            .children(None)
            .map(|i| (tree.nodes()[i].token, tree.nodes()[i].candidate, tree.nodes()[i].prob as f64))
            .collect();
        // 7 at candidates 0 and 2: one node, continuing from the better one, probabilities summed
        assert_eq!(first.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>(), vec![(7, 0), (5, 1)]);
        assert!((first[0].2 - (e[0] + e[2]) / e.iter().sum::<f64>()).abs() < 1e-6);
        // below: NaN and -inf scores are not nodes; 1 and 4 are, at 1/2 each
        for p in tree.children(None) {
            let kids: Vec<(i32, f32)> =
                tree.children(Some(p)).map(|i| (tree.nodes()[i].token, tree.nodes()[i].prob)).collect();
            assert_eq!(kids, vec![(1, 0.5), (4, 0.5)]);
        }
        assert_eq!(tree.len(), 6);
        // a row whose best entry is unusable (greedy stops there) gives no children
        let (rows, n_embd) = block(3, &[vec![1.0, 2.0, 900.0]], &[same(3, &[0.0, 0.5, 3.0])]);
        assert!(grow_tree(&Lattice::new(&rows, n_embd, 3).unwrap(), TreeLimits::tree(4, 4), 100).is_empty());
        let (rows, n_embd) = block(3, &[vec![1.0, 2.0, 3.0]], &[same(3, &[f32::NAN, 0.5, 3.0])]);
        assert!(grow_tree(&Lattice::new(&rows, n_embd, 3).unwrap(), TreeLimits::tree(4, 4), 100).is_empty());
    }

    #[test]
    fn smaller_budgets_are_prefixes_and_path_probabilities_never_increase() {
        let mut rng = Rng::new(2);
        for _ in 0..500 {
            let (rows, n_embd, k) = random_block(&mut rng, 12, true);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let limits = TreeLimits {
                n_nodes: 24,
                max_depth: 1 + (rng.next_u64() % 8) as usize,
                max_children: (rng.next_u64() % 4) as usize,
                max_leaves: (rng.next_u64() % 5) as usize,
                p_min: 0.0,
            };
            let big = grow_tree(&lat, limits, 12);
            check_invariants(&big);
            assert!(big.nodes().windows(2).all(|w| w[0].path_prob >= w[1].path_prob));
            assert!(big.nodes().iter().all(|n| n.depth <= limits.max_depth && n.depth < lat.n_rows()));
            let kids = big.children_by_slot();
            assert!(kids.iter().all(|c| limits.max_children == 0 || c.len() <= limits.max_children));
            assert!(limits.max_leaves == 0 || big.leaves().len() <= limits.max_leaves);
            let by_size = big.expected_accepted_by_size();
            for n in 0..=big.len() {
                let small = grow_tree(&lat, TreeLimits { n_nodes: n, ..limits }, 12);
                assert_eq!(small.nodes(), &big.nodes()[..n]);
                if n > 0 {
                    assert!((small.expected_accepted() - by_size[n - 1]).abs() < 1e-12);
                }
            }
        }
    }

    #[test]
    fn a_calibrated_growth_key_keeps_the_chain_and_widens_an_overconfident_tree() {
        use crate::adaptive::AcceptanceModel;
        use crate::calibration::EdgeCalibration;
        // The lattice of best_first_grows_the_most_probable_paths_first: raw, a
        // budget of 2 buys A (.705) and A->20 (.705 x ~1), B (.259) comes next.
        let (rows, n_embd) = block(
            3,
            &[vec![10.0, 11.0, 12.0], vec![20.0, 21.0, 22.0]],
            &[same(3, &[1.0, 0.0, -2.0]), vec![vec![9.0, 0.0, 0.0], vec![0.0, 5.0, 5.0], vec![0.0, 0.0, 0.0]]],
        );
        let lat = Lattice::new(&rows, n_embd, 3).unwrap();
        let tokens = |t: &Tree| t.nodes().iter().map(|n| (n.token, n.parent)).collect::<Vec<_>>();
        let raw = grow_tree(&lat, TreeLimits::tree(2, 8), 100);
        assert_eq!(tokens(&raw), vec![(10, -1), (20, 0)]);
        // measured: picks the lattice calls sure (0.99) are accepted a fifth of
        // the time, and nothing above 0.2 does better (the estimate is monotone):
        // A and B both ~0.21 (a tie: greedy's A first), A->20 0.21 x 0.2
        let mut m = AcceptanceModel::new(2);
        for i in 0..2000 {
            m.observe_trial(1, 0.99, i % 5 == 0);
        }
        let cal = EdgeCalibration::from_model(&m);
        assert!((cal.p(1, 0.705) - cal.p(1, 0.259)).abs() < 1e-12 && cal.p(2, 0.999) < 0.21);
        let wide = grow_tree_by(&lat, TreeLimits::tree(2, 8), 100, |d, p| cal.p(d, p));
        check_invariants(&wide);
        assert_eq!(tokens(&wide), vec![(10, -1), (11, -1)]);
        // the nodes' probabilities are still the lattice's
        let big = grow_tree(&lat, TreeLimits::tree(3, 8), 100);
        assert_eq!(wide.nodes(), &[big.nodes()[0], big.nodes()[2]]);
        // the identity key is grow_tree, node for node
        assert_eq!(
            grow_tree_by(&lat, TreeLimits::tree(5, 8), 100, |_, p| p as f64),
            grow_tree(&lat, TreeLimits::tree(5, 8), 100)
        );
    }

    #[test]
    fn with_any_calibration_a_one_child_tree_is_the_greedy_chain() {
        use crate::adaptive::AcceptanceModel;
        use crate::calibration::EdgeCalibration;
        let mut rng = Rng::new(13);
        for _ in 0..2000 {
            let mut m = AcceptanceModel::new(8);
            for _ in 0..(rng.next_u64() % 200) {
                let pos = (rng.next_u64() % 8) as usize;
                let conf = rng.next_f64() as f32;
                m.observe_trial(pos, conf, rng.next_f64() < 0.4);
            }
            let cal = EdgeCalibration::from_model(&m);
            let (rows, n_embd, k) = clean_block(&mut rng, 50);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let greedy = greedy_walk_scored(&lat, WalkLimits { n_max: 8, n_min: 0, p_min: 0.0 }, 50);
            for limits in [TreeLimits::chain(8, 0.0), TreeLimits { max_leaves: 1, ..TreeLimits::tree(8, 8) }] {
                let tree = grow_tree_by(&lat, limits, 50, |d, p| cal.p(d, p));
                let got: Vec<Pick> = tree.nodes().iter().map(|n| Pick { token: n.token, confidence: n.prob }).collect();
                assert_eq!(got, greedy, "{limits:?}");
            }
        }
    }
}
