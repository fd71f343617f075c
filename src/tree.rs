//! Draft trees from the DFlash2 selector lattice (layout: `crate::selector`):
//! growth, the encoding that verifies a tree in one llama.cpp batch, and
//! acceptance, greedy or sampled (lossless). Pure and seeded; no model needed.
//!
//! # Trees
//! A tree hangs from the anchor: the last committed token, whose row starts the
//! verify batch but which is not a node. A node at depth d (its 1-based draft
//! position) holds a candidate of lattice position d; its children are
//! candidates of position d + 1, scored by the node's own candidate row
//! S_{d+1}[candidate][·] (the anchor's children by row 0 of position 1; all of
//! that position's rows are equal). Invariants ([`Tree::from_nodes`] checks
//! them): parents precede their children (a parent's index is smaller), depth
//! is the parent's plus 1, siblings carry distinct tokens. Two siblings with
//! one token would make the target's token match twice, so duplicate lattice
//! candidates are merged into one node (probabilities summed).
//!
//! Unusable candidates (an id outside the vocabulary, a non-finite score) are
//! never nodes. A row whose best-scoring entry (greedy's pick, with
//! `std::max_element` semantics) is unusable is corrupt and gives its node no
//! children, as it ends greedy's walk.
//!
//! - [`grow_tree`]: deterministic, best-first by path probability (the product
//!   of edge probabilities softmax_j(S[a][j]) at temperature 1 over usable
//!   candidates: the drafter's own estimate of how likely each candidate is the
//!   target's argmax). Nodes come in the order they were popped: path
//!   probabilities never increase along it, and the first n nodes are exactly
//!   the tree a budget of n grows, so one growth prices every budget
//!   ([`Tree::expected_accepted_by_size`]). With one child per node it is the
//!   greedy chain, token for token ([`TreeLimits::chain`]). For greedy
//!   acceptance ([`accept_greedy`], T = 0) or sample-and-match at T > 0
//!   ([`accept_matching`]).
//! - [`grow_tree_by`]: the same growth ordered by another edge weight, a
//!   calibrated estimate of acceptance (`crate::calibration`).
//! - [`sample_tree`]: children drawn from q = softmax(S[a][·] / T_draft)
//!   one after another without replacement, for [`verify_sampled_tree`].
//!
//! # Verifying a tree in one batch (llama.cpp)
//! One sequence id per root-to-leaf path; a row belongs to the ids of every
//! leaf below it. The KV mask keeps cell j for query i when j carries the
//! query's first sequence id and pos(j) <= pos(i): a node's first id is a leaf
//! below it, whose path cells are exactly the node's ancestors, so it sees the
//! prefix, the anchor and its ancestors, nothing else. [`Tree::verify_rows`]
//! gives the rows (anchor first, then nodes in tree order: every path id needs
//! non-decreasing positions through the batch), [`Tree::kv_prepare`] and
//! [`Tree::kv_commit`] the `llama_memory_seq_cp/rm` calls around the decode.
//!
//! Budget for one sequence, a tree of N nodes with L leaves (L <= N):
//! - KV cells: the batch writes 1 + N cells (anchor and nodes), as a chain of N
//!   drafted tokens does; after the commit 1 + accepted remain. The prefix is
//!   shared by tagging its cells with every path id (`seq_cp` within one stream
//!   copies no data), which is why the cache must be unified (`kv_unified`:
//!   otherwise the splitter refuses coupled sequences and cross-stream copies
//!   copy whole buffers).
//! - Sequence ids: L path ids. The sequence's own id may serve as the first
//!   path's (pool[0] == seq): then L - 1 extra ids, and a chain needs none.
//!   A context serving S slots with trees of at most L_max leaves needs
//!   n_seq_max >= S * L_max (reusing ids) or S * (1 + L_max) (fresh ids), and
//!   at most LLAMA_MAX_SEQ (256 in the pinned llama.cpp). `TreeLimits::max_leaves`
//!   caps L at growth.
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
//! A deterministic tree (best-first, [`grow_tree`]) is not a draw from q, and
//! this rule applied to it is lossy (tested). At T > 0 such a tree is still
//! verified losslessly by sample-and-match ([`accept_matching`]: sample the
//! target at each row with the host's own sampler and follow the child that
//! carries the sampled token), which accepts a level with probability
//! p(children) instead of the overlap the rejection rule gets.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::sampling::{Checked, Dist, RESIDUAL_EPSILON, Rng, acceptance_probability, draw, residual_weight};
use crate::selector::{Lattice, first_max, usable};

// ---- trees -----------------------------------------------------------------

/// How far a tree may grow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TreeLimits {
    /// Most nodes: the verify rows beyond the anchor.
    pub n_nodes: usize,
    /// Deepest draft position (clamped to the block's width - 1).
    pub max_depth: usize,
    /// Most children per node (and of the anchor); 0: no limit.
    pub max_children: usize,
    /// Most leaves, i.e. path sequence ids; 0: no limit.
    pub max_leaves: usize,
    /// [`grow_tree`]: a child whose edge probability (its own, before
    /// duplicates merge) is below this is not grown, greedy's rule on its pick.
    /// [`sample_tree`]: a node whose row confidence (temperature-1 softmax at
    /// the row's best usable candidate) is below this gets no children; decided
    /// before any child is drawn, as losslessness requires. 0 disables.
    pub p_min: f32,
}

impl TreeLimits {
    /// A tree of at most `n_nodes` nodes, `max_depth` deep, no other limit.
    pub fn tree(n_nodes: usize, max_depth: usize) -> TreeLimits {
        TreeLimits { n_nodes, max_depth, max_children: 0, max_leaves: 0, p_min: 0.0 }
    }

    /// The chain: one child per node. [`grow_tree`] then yields
    /// `greedy_walk_scored`'s tokens with `WalkLimits { n_max, n_min: 0, p_min }`
    /// (see [`grow_tree`] for the corrupt-row caveat), [`sample_tree`] the
    /// sampled walk's.
    pub fn chain(n_max: usize, p_min: f32) -> TreeLimits {
        TreeLimits { n_nodes: n_max, max_depth: n_max, max_children: 1, max_leaves: 1, p_min }
    }

    fn cap(n: usize) -> usize {
        if n == 0 { usize::MAX } else { n }
    }
}

/// One drafted token of a tree.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Node {
    pub token: i32,
    /// Index of the parent node; -1 for the anchor's children.
    pub parent: i32,
    /// Draft position, 1-based: verified at `pos = n_past + depth`.
    pub depth: usize,
    /// Edge probability: P(this token | parent) under the lattice (temperature
    /// 1 for [`grow_tree`]; for [`sample_tree`] q(token | parent), before any
    /// sibling was drawn).
    pub prob: f32,
    /// Product of the edge probabilities from the anchor.
    pub path_prob: f32,
    /// The lattice candidate (index into position `depth`'s K) the node's
    /// children are scored from.
    pub candidate: usize,
}

impl Node {
    /// The parent's index, None for the anchor's children.
    pub fn parent(&self) -> Option<usize> {
        usize::try_from(self.parent).ok()
    }
}

/// A draft tree: nodes in tree order (parents first, siblings distinct).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tree {
    nodes: Vec<Node>,
}

/// Slot of a parent: 0 the anchor, i + 1 node i.
fn slot(parent: Option<usize>) -> usize {
    parent.map_or(0, |i| i + 1)
}

impl Tree {
    /// A tree from nodes, checking the invariants (see the module doc).
    pub fn from_nodes(nodes: Vec<Node>) -> Result<Tree> {
        for (i, n) in nodes.iter().enumerate() {
            let depth = match n.parent {
                -1 => 1,
                p if p >= 0 && (p as usize) < i => nodes[p as usize].depth + 1,
                p => return Err(Error::invalid(format!("node {i}: parent {p} (must be -1 or an earlier node)"))),
            };
            if n.depth != depth {
                return Err(Error::invalid(format!("node {i}: depth {} (its parent makes it {depth})", n.depth)));
            }
            if n.token < 0 {
                return Err(Error::invalid(format!("node {i}: token {}", n.token)));
            }
            if nodes[..i].iter().any(|s| s.parent == n.parent && s.token == n.token) {
                return Err(Error::invalid(format!("node {i}: a sibling already holds token {}", n.token)));
            }
        }
        Ok(Tree { nodes })
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Children of `parent` (None: the anchor), in tree order.
    pub fn children(&self, parent: Option<usize>) -> impl Iterator<Item = usize> + '_ {
        let p = parent.map_or(-1, |i| i as i32);
        self.nodes.iter().enumerate().filter(move |(_, n)| n.parent == p).map(|(i, _)| i)
    }

    /// Children per slot (0 the anchor, i + 1 node i).
    fn children_by_slot(&self) -> Vec<Vec<usize>> {
        let mut kids = vec![Vec::new(); self.nodes.len() + 1];
        for (i, n) in self.nodes.iter().enumerate() {
            kids[slot(n.parent())].push(i);
        }
        kids
    }

    /// Nodes without children, in tree order. Leaf l owns path sequence id
    /// `pool[l]` in the encoding.
    pub fn leaves(&self) -> Vec<usize> {
        let mut parent = vec![false; self.nodes.len()];
        self.nodes.iter().filter_map(Node::parent).for_each(|p| parent[p] = true);
        (0..self.nodes.len()).filter(|&i| !parent[i]).collect()
    }

    /// The root-to-leaf paths (node indices), one per leaf, in leaf order.
    pub fn paths(&self) -> Vec<Vec<usize>> {
        self.leaves().into_iter().map(|l| self.path_to(l)).collect()
    }

    /// Node indices from depth 1 down to `node`.
    pub fn path_to(&self, node: usize) -> Vec<usize> {
        let mut path: Vec<usize> = std::iter::successors(Some(node), |&i| self.nodes[i].parent()).collect();
        path.reverse();
        path
    }

    /// The tokens of a path of node indices.
    pub fn tokens(&self, path: &[usize]) -> Vec<i32> {
        path.iter().map(|&i| self.nodes[i].token).collect()
    }

    /// For every node, the leaves (indices into `leaves()`) below it, ascending.
    fn leaves_below(&self) -> Vec<Vec<usize>> {
        let mut below = vec![Vec::new(); self.nodes.len()];
        for (l, leaf) in self.leaves().into_iter().enumerate() {
            for i in std::iter::successors(Some(leaf), |&i| self.nodes[i].parent()) {
                below[i].push(l);
            }
        }
        below
    }

    /// Checks a pool of path ids for this tree: one per leaf, >= 0, distinct;
    /// `seq` (the sequence's own id) may only be the first.
    fn path_ids<'p>(&self, pool: &'p [i32], seq: Option<i32>) -> Result<&'p [i32]> {
        let n_leaves = self.leaves().len();
        let Some(ids) = pool.get(..n_leaves) else {
            return Err(Error::invalid(format!(
                "{n_leaves} leaves need {n_leaves} path ids; the pool has {}",
                pool.len()
            )));
        };
        for (i, &id) in ids.iter().enumerate() {
            if id < 0 || ids[..i].contains(&id) || (i > 0 && Some(id) == seq) {
                return Err(Error::invalid(format!(
                    "path id {id} at {i}: ids must be >= 0, distinct, and the sequence's own id only first"
                )));
            }
        }
        Ok(ids)
    }

    /// For each node, the path sequence ids it belongs to: `pool[l]` for every
    /// leaf l below it, in leaf order. The first is the id its attention mask
    /// follows. `pool` needs one id per leaf (more are ignored).
    pub fn node_seq_ids(&self, pool: &[i32]) -> Result<Vec<Vec<i32>>> {
        let ids = self.path_ids(pool, None)?;
        Ok(self.leaves_below().into_iter().map(|ls| ls.into_iter().map(|l| ids[l]).collect()).collect())
    }

    /// The verify batch for a sequence whose own id is `seq` and whose next
    /// position is `n_past` (the anchor's): row 0 the anchor (`seq` and every
    /// path id), row i + 1 node i at `n_past + depth`. Every row wants logits.
    /// Add them to the batch in this order.
    pub fn verify_rows(&self, anchor: i32, n_past: i32, seq: i32, pool: &[i32]) -> Result<Vec<VerifyRow>> {
        let ids = self.path_ids(pool, Some(seq))?;
        let mut anchor_ids = vec![seq];
        anchor_ids.extend(ids.iter().filter(|&&id| id != seq));
        let mut rows = vec![VerifyRow { token: anchor, pos: n_past, seq_ids: anchor_ids }];
        for (n, seq_ids) in self.nodes.iter().zip(self.node_seq_ids(ids)?) {
            rows.push(VerifyRow { token: n.token, pos: n_past + n.depth as i32, seq_ids });
        }
        Ok(rows)
    }

    /// Memory calls before the verify decode: every path id gets the
    /// committed prefix `seq` holds (in a unified cache a tag, not a copy).
    /// The path ids must hold nothing before (after [`Tree::kv_commit`] they don't).
    pub fn kv_prepare(&self, seq: i32, pool: &[i32]) -> Result<Vec<KvOp>> {
        let ids = self.path_ids(pool, Some(seq))?;
        Ok(ids.iter().filter(|&&id| id != seq).map(|&dst| KvOp::SeqCp { src: seq, dst, p0: -1, p1: -1 }).collect())
    }

    /// Memory calls after verification accepted `path` (node indices, depth 1
    /// first, possibly empty): `seq` keeps the prefix, the anchor and the
    /// accepted nodes at positions n_past + 1 ..= n_past + path.len(); every
    /// path id is emptied and the rejected nodes' cells freed.
    pub fn kv_commit(&self, path: &[usize], n_past: i32, seq: i32, pool: &[i32]) -> Result<Vec<KvOp>> {
        let ids = self.path_ids(pool, Some(seq))?;
        self.check_path(path)?;
        let (start, end) = (n_past + 1, n_past + 1 + path.len() as i32);
        // The accepted nodes are, below the anchor, exactly the cells of any
        // leaf's path under the deepest one, up to its depth.
        let keep = path.last().map(|&a| self.leaves_below()[a][0]);
        let reused = ids.first() == Some(&seq);
        let mut ops = Vec::new();
        match keep {
            // seq's own path runs through the accepted nodes: cut it below them
            Some(0) if reused => ops.push(KvOp::SeqRm { seq, p0: end, p1: -1 }),
            _ => {
                if reused {
                    ops.push(KvOp::SeqRm { seq, p0: start, p1: -1 });
                }
                if let Some(l) = keep {
                    ops.push(KvOp::SeqCp { src: ids[l], dst: seq, p0: start, p1: end });
                }
            }
        }
        ops.extend(ids.iter().filter(|&&id| id != seq).map(|&id| KvOp::SeqRm { seq: id, p0: -1, p1: -1 }));
        Ok(ops)
    }

    /// A path must start at depth 1 and go from parent to child.
    fn check_path(&self, path: &[usize]) -> Result<()> {
        let mut parent = -1;
        for &i in path {
            match self.nodes.get(i) {
                Some(n) if n.parent == parent => parent = i as i32,
                _ => return Err(Error::invalid(format!("path {path:?} is not a path from the anchor in this tree"))),
            }
        }
        Ok(())
    }

    /// P(the path to each node is accepted) when a node is accepted, given
    /// its parent was, with probability `accept(node)`, independently along the
    /// path (siblings exclude each other: at most one matches the target).
    pub fn reach(&self, mut accept: impl FnMut(&Node) -> f64) -> Vec<f64> {
        let mut reach: Vec<f64> = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let parent = n.parent().map_or(1.0, |p| reach[p]);
            reach.push(parent * accept(n));
        }
        reach
    }

    /// Keeps the first `n` nodes (in tree order they form a tree).
    pub fn truncate(&mut self, n: usize) {
        self.nodes.truncate(n);
    }

    /// The edge probabilities along an accepted `path`, then, when the path's
    /// last node (or the anchor) has children, its first (most probable)
    /// child's: the draft positions the target reached, in the form of a
    /// chain's confidences for `crate::adaptive`.
    pub fn path_confidences(&self, path: &[usize]) -> Vec<f32> {
        let mut out: Vec<f32> = path.iter().map(|&i| self.nodes[i].prob).collect();
        if let Some(next) = self.children(path.last().copied()).next() {
            out.push(self.nodes[next].prob);
        }
        out
    }

    /// Expected accepted tokens (the bonus token not counted) under the
    /// lattice's own estimate, P(node accepted | parent accepted) = its edge
    /// probability: the sum of the path probabilities. For greedy trees;
    /// calibrate with [`Tree::reach`] (e.g. measured acceptance by depth and
    /// edge probability). A step then emits 1 + this many tokens on average.
    pub fn expected_accepted(&self) -> f64 {
        self.reach(|n| n.prob as f64).iter().sum()
    }

    /// `expected_accepted` of the first n nodes for n = 1..=len: for a
    /// [`grow_tree`] tree, the expectation for every budget up to its own.
    pub fn expected_accepted_by_size(&self) -> Vec<f64> {
        self.reach(|n| n.prob as f64)
            .into_iter()
            .scan(0.0, |sum, r| {
                *sum += r;
                Some(*sum)
            })
            .collect()
    }
}

/// One row of the verify batch (`common_batch_add(batch, token, pos, seq_ids, true)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyRow {
    pub token: i32,
    pub pos: i32,
    pub seq_ids: Vec<i32>,
}

/// A memory call on the target context: `llama_memory_seq_cp(mem, src, dst,
/// p0, p1)` or `llama_memory_seq_rm(mem, seq, p0, p1)`; -1 is an open end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvOp {
    SeqCp { src: i32, dst: i32, p0: i32, p1: i32 },
    SeqRm { seq: i32, p0: i32, p1: i32 },
}

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
struct Frontier<T> {
    heap: BinaryHeap<Entry<T>>,
    pushed: u64,
}

impl<T> Frontier<T> {
    fn new() -> Self {
        Frontier { heap: BinaryHeap::new(), pushed: 0 }
    }

    fn push(&mut self, key: f64, item: T) {
        self.heap.push(Entry { key, order: self.pushed, item });
        self.pushed += 1;
    }

    fn pop(&mut self) -> Option<(f64, T)> {
        self.heap.pop().map(|e| (e.key, e.item))
    }
}

/// Child counts per slot and the leaf count, for `max_children`/`max_leaves`.
struct Shape {
    children: Vec<usize>,
    leaves: usize,
}

impl Shape {
    fn new() -> Shape {
        Shape { children: vec![0], leaves: 0 }
    }

    /// A child of the anchor, or of a node that has children already, adds a
    /// leaf; a node's first child only moves its leaf down.
    fn adds_leaf(&self, slot: usize) -> bool {
        slot == 0 || self.children[slot] > 0
    }

    fn may_add(&self, slot: usize, limits: &TreeLimits) -> bool {
        self.children[slot] < TreeLimits::cap(limits.max_children)
            && (!self.adds_leaf(slot) || self.leaves < TreeLimits::cap(limits.max_leaves))
    }

    fn add(&mut self, slot: usize) {
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
        });
        expand(&mut frontier, Some(nodes.len() - 1), c.depth, c.candidate, key, c.path_prob);
    }
    Tree { nodes }
}

/// A sampled tree and the draft distribution each parent's children were
/// drawn from, for [`verify_sampled_tree`]. The default: no node (a tree not
/// drafted, verified to its bonus token).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampledTree {
    tree: Tree,
    /// Per slot (0 the anchor, i + 1 node i): q's distinct token ids and
    /// probabilities (f32, as the draws used them); empty when never computed.
    q: Vec<(Vec<i32>, Vec<f32>)>,
}

impl SampledTree {
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The distribution `parent`'s children (None: the anchor's) are drawn
    /// from, in draw order = tree order; None where none was computed (max
    /// depth, no usable candidate, or cut by `p_min`).
    pub fn q(&self, parent: Option<usize>) -> Option<Dist<'_>> {
        let (ids, probs) = self.q.get(slot(parent))?;
        (!ids.is_empty()).then_some(Dist::Sparse { ids, probs })
    }
}

/// The random choices of sampling and verification, behind one interface so
/// the tests can enumerate every outcome of the real code exactly.
trait Chance {
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
struct RowQ {
    /// Temperature-1 softmax at the first best usable candidate.
    conf: f32,
    /// Distinct tokens with q > 0 (f32), candidate order, and q.
    ids: Vec<i32>,
    probs: Vec<f32>,
    /// Per candidate: its id if usable, and its weight (0 if unusable).
    cand: Vec<Option<i32>>,
    weight: Vec<f64>,
}

fn row_q(lattice: &Lattice, p: usize, pred: usize, n_vocab: usize, t: f32) -> Option<RowQ> {
    let scores = lattice.scores(p, pred);
    let k = scores.len();
    let cand: Vec<Option<i32>> = (0..k).map(|j| usable(lattice, p, scores, j, n_vocab)).collect();
    let best = (0..k).filter(|&j| cand[j].is_some()).reduce(|b, j| if scores[b] < scores[j] { j } else { b })?;
    let max = scores[best] as f64;
    let exp_sum: f64 = (0..k).filter(|&j| cand[j].is_some()).map(|j| (scores[j] as f64 - max).exp()).sum();
    let conf = (1.0 / exp_sum) as f32;
    let weight: Vec<f64> = (0..k)
        .map(|j| match cand[j] {
            Some(_) if t == 0.0 => (j == best) as u8 as f64,
            Some(_) => ((scores[j] as f64 - max) / t as f64).exp(),
            None => 0.0,
        })
        .collect();
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

/// A parent during sampled growth.
struct Parent {
    depth: usize,
    path: f64,
    /// None: at max depth, no usable candidate, or cut by `p_min`.
    row: Option<RowQ>,
    drawn: Vec<bool>,
}

impl Parent {
    /// Priority of the parent's next child: its path probability times the
    /// expected q of the next draw (sum of q^2 / sum of q over what is left).
    /// An expectation, not the drawn token: which children exist must not
    /// depend on what they turn out to be.
    fn priority(&self) -> Option<f64> {
        let row = self.row.as_ref()?;
        let left = row.probs.iter().zip(&self.drawn).filter(|e| !*e.1).map(|e| *e.0 as f64);
        let (sum, sq) = left.fold((0.0, 0.0), |(s, q), x| (s + x, q + x * x));
        (sum > 0.0).then(|| self.path * sq / sum)
    }
}

/// A tree for lossless sampled verification: best-first like [`grow_tree`]
/// but each child is drawn when its slot is popped, from q(· | parent) =
/// softmax(S[a][·] / t_draft) over usable candidates (duplicates merged, as in
/// `sampled_walk`) without the parent's earlier children. The slot's priority
/// is the parent's path probability times the expected q of the next draw, so
/// which children exist depends only on what was drawn before (see the module
/// doc for why that keeps verification lossless). The walk continues from the
/// drawn candidate, among duplicates in proportion to their weights.
///
/// `t_draft = 0`: one-hot q, the greedy chain, no random number drawn. With
/// [`TreeLimits::chain`] it is `sampled_walk` draw for draw. `n_min` has no
/// counterpart: dropping a sampled draft for being short biases it.
pub fn sample_tree(
    lattice: &Lattice,
    limits: TreeLimits,
    n_vocab: usize,
    t_draft: f32,
    rng: &mut Rng,
) -> Result<SampledTree> {
    if !(t_draft.is_finite() && t_draft >= 0.0) {
        return Err(Error::invalid(format!("draft temperature {t_draft} (must be finite and >= 0)")));
    }
    Ok(sample_tree_with(lattice, limits, n_vocab, t_draft, rng))
}

fn sample_tree_with<C: Chance>(
    lattice: &Lattice,
    limits: TreeLimits,
    n_vocab: usize,
    t: f32,
    chance: &mut C,
) -> SampledTree {
    let max_depth = limits.max_depth.min(lattice.n_rows().saturating_sub(1));
    let open = |depth: usize, pred: usize, path: f64| {
        let row = (depth < max_depth)
            .then(|| row_q(lattice, depth + 1, pred, n_vocab, t))
            .flatten()
            .filter(|r| !(limits.p_min > 0.0 && r.conf < limits.p_min));
        let drawn = vec![false; row.as_ref().map_or(0, |r| r.ids.len())];
        Parent { depth, path, row, drawn }
    };
    let mut parents = vec![open(0, 0, 1.0)];
    let mut nodes: Vec<Node> = Vec::new();
    let mut shape = Shape::new();
    let mut frontier = Frontier::new();
    if let Some(key) = parents[0].priority() {
        frontier.push(key, 0usize);
    }
    while nodes.len() < limits.n_nodes {
        let Some((_, s)) = frontier.pop() else { break };
        if !shape.may_add(s, &limits) {
            continue; // decided before the draw
        }
        let parent = &mut parents[s];
        let row = parent.row.as_ref().expect("only parents with a row are pushed");
        let m = if t == 0.0 {
            0 // one-hot q
        } else {
            let w: Vec<f64> =
                row.probs.iter().zip(&parent.drawn).map(|(&q, &d)| if d { 0.0 } else { q as f64 }).collect();
            chance.pick(&w)
        };
        parent.drawn[m] = true;
        let (token, prob) = (row.ids[m], row.probs[m]);
        let dups: Vec<usize> =
            (0..row.cand.len()).filter(|&j| row.cand[j] == Some(token) && row.weight[j] > 0.0).collect();
        let candidate = if dups.len() == 1 {
            dups[0]
        } else {
            dups[chance.pick(&dups.iter().map(|&j| row.weight[j]).collect::<Vec<_>>())]
        };
        let (depth, path) = (parent.depth + 1, parent.path * prob as f64);
        shape.add(s);
        if let Some(key) = parent.priority() {
            frontier.push(key, s);
        }
        nodes.push(Node { token, parent: s as i32 - 1, depth, prob, path_prob: path as f32, candidate });
        parents.push(open(depth, candidate, path));
        if let Some(key) = parents[nodes.len()].priority() {
            frontier.push(key, nodes.len());
        }
    }
    let q = parents.into_iter().map(|p| p.row.map(|r| (r.ids, r.probs)).unwrap_or_default()).collect();
    SampledTree { tree: Tree { nodes }, q }
}

// ---- acceptance ------------------------------------------------------------

/// Result of verifying a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeVerdict {
    /// Accepted nodes, depth 1 first: a path from the anchor.
    pub path: Vec<usize>,
    /// Tokens to emit: the path's, then the bonus or replacement token
    /// (always `path.len() + 1`).
    pub tokens: Vec<i32>,
}

/// Follows the target: at the anchor row, then at each accepted node's row,
/// `target(row)` gives the target's token there (row None: the anchor); if a
/// child carries it, that child is accepted and the walk goes on, otherwise
/// the token is the bonus and the walk ends. Rows are asked in path order,
/// once each, so a host may sample lazily with its own stateful sampler: at
/// T = 0 this is greedy acceptance, at T > 0 sample-and-match, lossless for
/// any tree (the emitted tokens are the target's own samples).
pub fn accept_matching(tree: &Tree, mut target: impl FnMut(Option<usize>) -> i32) -> TreeVerdict {
    let (mut path, mut tokens, mut at) = (Vec::new(), Vec::new(), None);
    loop {
        let t = target(at);
        tokens.push(t);
        match tree.children(at).find(|&c| tree.nodes[c].token == t) {
            Some(c) => {
                path.push(c);
                at = Some(c);
            }
            None => return TreeVerdict { path, tokens },
        }
    }
}

/// Greedy acceptance: `argmax[0]` is the target's argmax at the anchor row,
/// `argmax[i + 1]` at node i's. The longest path whose every node carries its
/// parent row's argmax, and the deepest accepted row's argmax as bonus.
pub fn accept_greedy(tree: &Tree, argmax: &[i32]) -> Result<TreeVerdict> {
    if argmax.len() != tree.len() + 1 {
        return Err(Error::invalid(format!(
            "{} nodes need {} argmax rows; got {}",
            tree.len(),
            tree.len() + 1,
            argmax.len()
        )));
    }
    Ok(accept_matching(tree, |row| argmax[slot(row)]))
}

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

/// Recursive rejection sampling at one node (module doc). The current target
/// p^(k) is w / total on q's support and outside * p / total elsewhere, so a
/// step costs O(|supp q|) and only the final draw walks p. At k = 0 every
/// number is the one `sampling::verify` computes, so a chain verifies as it does.
fn choose<C: Chance>(children: &[i32], q: Option<&Checked>, p: &Checked, chance: &mut C, rule: Rule) -> Outcome {
    let support: Vec<(i32, f64)> = q.map(|q| q.entries().filter(|e| e.1 > 0.0).collect()).unwrap_or_default();
    let mut w: Vec<f64> = support.iter().map(|&(id, _)| p.prob(id)).collect();
    let out_mass = (1.0 - w.iter().sum::<f64>()).max(0.0);
    let (mut outside, mut total) = (1.0, 1.0);
    let mut left: Vec<f64> = support.iter().map(|e| e.1).collect();
    let mut left_mass = 1.0; // q is normalized
    for (k, &c) in children.iter().enumerate() {
        let i = support.binary_search_by_key(&c, |e| e.0).expect("children are checked to be in q's support");
        if chance.accept(acceptance_probability(w[i] / total, left[i] / left_mass)) {
            return Outcome::Child(k);
        }
        if rule.updates_target(k + 1 == children.len()) {
            let r: Vec<f64> =
                w.iter().zip(&left).map(|(&wj, &qj)| residual_weight(wj / total, qj / left_mass)).collect();
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

/// Checks that `children` are distinct and each in q's support.
fn check_children(children: &[i32], q: &Checked, what: &str) -> Result<()> {
    for (k, &c) in children.iter().enumerate() {
        if children[..k].contains(&c) || q.prob(c) <= 0.0 {
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
    check_children(children, &q, "node")?;
    Ok(choose(children, Some(&q), &p, rng, Rule::Lossless))
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
    let q = match (kids.is_empty(), tree.q(at)) {
        (true, _) => None,
        (false, Some(q)) => Some(Checked::new(q, n_vocab, "q")?),
        (false, None) => return Err(Error::invalid(format!("node {at:?} has children but no q"))),
    };
    if let Some(q) = &q {
        check_children(&tokens, q, "node")?;
    }
    Ok(match choose(&tokens, q.as_ref(), &p, rng, Rule::Lossless) {
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
    for (s, k) in kids.iter().enumerate() {
        let q = match (k.is_empty(), tree.q(s.checked_sub(1))) {
            (true, _) => None,
            (false, Some(q)) => Some(Checked::new(q, n_vocab, &format!("q[{s}]"))?),
            (false, None) => return Err(Error::invalid(format!("slot {s} has children but no q"))),
        };
        if let Some(q) = &q {
            check_children(&tree.tree.tokens(k), q, &format!("slot {s}"))?;
        }
        qs.push(q);
    }
    let (mut path, mut tokens, mut s) = (Vec::new(), Vec::new(), 0);
    loop {
        match choose(&tree.tree.tokens(&kids[s]), qs[s].as_ref(), &ps[s], chance, rule) {
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
    use crate::sampling::{self, STREAM_DRAFT, STREAM_VERIFY};
    use crate::selector::{WalkLimits, greedy_walk_scored, sampled_walk};
    use std::collections::BTreeSet;

    // ---- helpers -------------------------------------------------------

    /// A block of K candidates per position: `cands[p-1]`, `scores[p-1][i][j]`.
    fn block(k: usize, cands: &[Vec<f32>], scores: &[Vec<Vec<f32>>]) -> (Vec<f32>, usize) {
        let n_embd = k * (k + 1) + 1;
        let mut rows = vec![0.0; n_embd]; // anchor row
        for (c, s) in cands.iter().zip(scores) {
            let mut row = vec![0.0; n_embd];
            row[..k].copy_from_slice(c);
            for i in 0..k {
                row[k + i * k..k + (i + 1) * k].copy_from_slice(&s[i]);
            }
            rows.extend(row);
        }
        (rows, n_embd)
    }

    fn same(k: usize, s: &[f32]) -> Vec<Vec<f32>> {
        vec![s.to_vec(); k]
    }

    /// A random lattice: K in 2..=5, 1..=8 positions, ids in 0..n_vocab + 2
    /// (some out of the vocabulary, duplicates), scores from a small set (ties);
    /// with `corrupt`, some NaN and infinite scores.
    fn random_block(rng: &mut Rng, n_vocab: usize, corrupt: bool) -> (Vec<f32>, usize, usize) {
        let k = 2 + (rng.next_u64() % 4) as usize;
        let n_pos = 1 + (rng.next_u64() % 8) as usize;
        let score = |rng: &mut Rng| match rng.next_u64() % 40 {
            0 if corrupt => f32::NAN,
            1 if corrupt => f32::INFINITY,
            2 if corrupt => f32::NEG_INFINITY,
            x => (x % 7) as f32 * 0.5 - 1.0,
        };
        let cands: Vec<Vec<f32>> = (0..n_pos)
            .map(|_| {
                (0..k)
                    .map(|_| {
                        let r = rng.next_u64();
                        if corrupt && r % 25 == 0 { (n_vocab + 1) as f32 } else { (r % n_vocab as u64) as f32 }
                    })
                    .collect()
            })
            .collect();
        let scores: Vec<Vec<Vec<f32>>> =
            (0..n_pos).map(|_| (0..k).map(|_| (0..k).map(|_| score(rng)).collect()).collect()).collect();
        let (rows, n_embd) = block(k, &cands, &scores);
        (rows, n_embd, k)
    }

    /// A clean random lattice: distinct in-vocabulary ids, finite scores.
    fn clean_block(rng: &mut Rng, n_vocab: usize) -> (Vec<f32>, usize, usize) {
        let k = 2 + (rng.next_u64() % 4) as usize;
        let n_pos = 1 + (rng.next_u64() % 8) as usize;
        let cands: Vec<Vec<f32>> = (0..n_pos)
            .map(|_| {
                let start = rng.next_u64() % (n_vocab - k) as u64;
                (0..k).map(|j| (start + j as u64) as f32).collect()
            })
            .collect();
        let scores: Vec<Vec<Vec<f32>>> = (0..n_pos)
            .map(|_| (0..k).map(|_| (0..k).map(|_| (rng.next_f64() * 6.0 - 3.0) as f32).collect()).collect())
            .collect();
        let (rows, n_embd) = block(k, &cands, &scores);
        (rows, n_embd, k)
    }

    fn check_invariants(t: &Tree) {
        assert_eq!(Tree::from_nodes(t.nodes().to_vec()).as_ref(), Ok(t));
    }

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

    // ---- encoding --------------------------------------------------------

    fn node(token: i32, parent: i32, depth: usize) -> Node {
        Node { token, parent, depth, prob: 0.5, path_prob: 0.5, candidate: 0 }
    }

    #[test]
    fn trees_are_checked_and_seq_ids_follow_the_leaves() {
        assert!(Tree::from_nodes(vec![node(1, 0, 1)]).is_err()); // parent not earlier
        assert!(Tree::from_nodes(vec![node(1, -1, 2)]).is_err()); // wrong depth
        assert!(Tree::from_nodes(vec![node(1, -1, 1), node(1, -1, 1)]).is_err()); // twin siblings
        assert!(Tree::from_nodes(vec![node(1, -2, 1)]).is_err());
        assert!(Tree::from_nodes(vec![node(-3, -1, 1)]).is_err());
        //      anchor
        //      /    \
        //     0      1
        //    / \      \
        //   2   3      4
        //   |
        //   5
        let t = Tree::from_nodes(vec![
            node(10, -1, 1),
            node(11, -1, 1),
            node(20, 0, 2),
            node(21, 0, 2),
            node(22, 1, 2),
            node(30, 2, 3),
        ])
        .unwrap();
        assert_eq!(t.leaves(), vec![3, 4, 5]);
        assert_eq!(t.paths(), vec![vec![0, 3], vec![1, 4], vec![0, 2, 5]]);
        let ids = t.node_seq_ids(&[7, 8, 9, 100]).unwrap();
        assert_eq!(ids, vec![vec![7, 9], vec![8], vec![9], vec![7], vec![8], vec![9]]);
        let rows = t.verify_rows(42, 100, 3, &[7, 8, 9]).unwrap();
        assert_eq!(rows[0], VerifyRow { token: 42, pos: 100, seq_ids: vec![3, 7, 8, 9] });
        assert_eq!(rows[6], VerifyRow { token: 30, pos: 103, seq_ids: vec![9] });
        // the sequence's own id may serve the first path
        let rows = t.verify_rows(42, 100, 7, &[7, 8, 9]).unwrap();
        assert_eq!(rows[0].seq_ids, vec![7, 8, 9]);
        for bad in [&[7, 8][..], &[7, 7, 9], &[7, -1, 9], &[8, 3, 9]] {
            let e = t.verify_rows(42, 100, 3, bad).unwrap_err();
            assert_eq!(e.status, crate::error::Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
        }
        assert!(t.kv_commit(&[1, 3], 100, 3, &[7, 8, 9]).is_err()); // not a path
        assert!(t.kv_commit(&[2], 100, 3, &[7, 8, 9]).is_err()); // not from the anchor
        // a chain reusing the sequence's id: upstream's own calls
        let chain = Tree::from_nodes(vec![node(1, -1, 1), node(2, 0, 2), node(3, 1, 3)]).unwrap();
        assert_eq!(chain.kv_prepare(5, &[5]).unwrap(), vec![]);
        assert!(chain.verify_rows(0, 10, 5, &[5]).unwrap().iter().all(|r| r.seq_ids == vec![5]));
        assert_eq!(chain.kv_commit(&[0, 1], 10, 5, &[5]).unwrap(), vec![KvOp::SeqRm { seq: 5, p0: 13, p1: -1 }]);
    }

    /// llama.cpp's KV cells as far as trees touch them: positions, sequence
    /// sets, `seq_rm`/`seq_cp` in one stream, the batch checks of
    /// `llama_batch_allocr::init`, and the mask (first sequence id, causal).
    #[derive(Default)]
    struct Kv {
        cells: Vec<(usize, i32, BTreeSet<i32>)>, // (cell id, pos, seqs)
        next: usize,
    }

    impl Kv {
        fn add(&mut self, pos: i32, seqs: &[i32]) -> usize {
            self.next += 1;
            self.cells.push((self.next, pos, seqs.iter().copied().collect()));
            self.next
        }

        fn range(p: i32, p0: i32, p1: i32) -> bool {
            p >= p0.max(0) && (p1 < 0 || p < p1)
        }

        fn apply(&mut self, op: KvOp) {
            match op {
                KvOp::SeqRm { seq, p0, p1 } => {
                    for c in self.cells.iter_mut().filter(|c| Kv::range(c.1, p0, p1)) {
                        c.2.remove(&seq);
                    }
                    self.cells.retain(|c| !c.2.is_empty());
                }
                KvOp::SeqCp { src, dst, p0, p1 } => {
                    for c in self.cells.iter_mut().filter(|c| Kv::range(c.1, p0, p1) && c.2.contains(&src)) {
                        c.2.insert(dst);
                    }
                }
            }
        }

        fn pos_range(&self, s: i32) -> Option<(i32, i32)> {
            let ps = self.cells.iter().filter(|c| c.2.contains(&s)).map(|c| c.1);
            ps.clone().min().zip(ps.max())
        }

        /// Decodes rows (asserting llama.cpp would accept the batch); returns
        /// per row its cell id and the cell ids its query sees.
        fn decode(&mut self, rows: &[VerifyRow]) -> Vec<(usize, BTreeSet<usize>)> {
            let all: BTreeSet<i32> = rows.iter().flat_map(|r| r.seq_ids.iter().copied()).collect();
            for &s in &all {
                let pos: BTreeSet<i32> = rows.iter().filter(|r| r.seq_ids.contains(&s)).map(|r| r.pos).collect();
                let (lo, hi) = (*pos.first().unwrap(), *pos.last().unwrap());
                if let Some((_, max)) = self.pos_range(s) {
                    assert_eq!(lo, max + 1, "seq {s}: Y = X + 1");
                }
                assert_eq!((hi - lo + 1) as usize, pos.len(), "seq {s}: positions not continuous");
                let sets = rows.iter().filter(|r| r.seq_ids.contains(&s)).map(|r| r.seq_ids.iter().copied().collect());
                let common = sets.reduce(|a: BTreeSet<i32>, b| a.intersection(&b).copied().collect()).unwrap();
                assert!(!common.is_empty(), "seq {s}: incompatible sequence sets");
                let ordered: Vec<i32> = rows.iter().filter(|r| r.seq_ids.contains(&s)).map(|r| r.pos).collect();
                assert!(ordered.windows(2).all(|w| w[0] <= w[1]), "seq {s}: decreasing positions");
            }
            for r in rows {
                for &s1 in &r.seq_ids[1..] {
                    assert_eq!(
                        self.pos_range(r.seq_ids[0]),
                        self.pos_range(s1),
                        "coupled {} {s1} diverged",
                        r.seq_ids[0]
                    );
                }
            }
            let ids: Vec<usize> = rows.iter().map(|r| self.add(r.pos, &r.seq_ids)).collect();
            rows.iter()
                .zip(ids)
                .map(|(r, id)| {
                    let seen = self.cells.iter().filter(|c| c.2.contains(&r.seq_ids[0]) && c.1 <= r.pos).map(|c| c.0);
                    (id, seen.collect())
                })
                .collect()
        }
    }

    #[test]
    fn one_batch_masks_each_node_to_its_ancestors_and_the_commit_keeps_the_accepted_path() {
        let mut rng = Rng::new(3);
        let mut shapes = 0;
        for round in 0..400 {
            let (rows, n_embd, k) = random_block(&mut rng, 9, false);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let tree = grow_tree(&lat, TreeLimits::tree(1 + (rng.next_u64() % 12) as usize, 8), 9);
            let (n_past, seq) = (6, 2);
            let n_leaves = tree.leaves().len();
            shapes += (n_leaves > 1) as usize;
            // fresh path ids, or the sequence's own id for the first path
            let pool: Vec<i32> =
                (0..n_leaves as i32).map(|l| if round % 2 == 0 && l == 0 { seq } else { 10 + l }).collect();
            let mut kv = Kv::default();
            let prefix: Vec<usize> = (0..n_past).map(|p| kv.add(p, &[seq])).collect();
            let other = kv.add(0, &[1]); // another sequence's cell, never touched
            for op in tree.kv_prepare(seq, &pool).unwrap() {
                kv.apply(op);
            }
            let batch = tree.verify_rows(99, n_past, seq, &pool).unwrap();
            let seen = kv.decode(&batch);
            let cell = |row: usize| seen[row].0;
            let mut want: BTreeSet<usize> = prefix.iter().copied().chain([cell(0)]).collect();
            assert_eq!(seen[0].1, want, "anchor");
            for i in 0..tree.len() {
                want = prefix
                    .iter()
                    .copied()
                    .chain([cell(0)])
                    .chain(tree.path_to(i).iter().map(|&a| cell(a + 1)))
                    .collect();
                assert_eq!(seen[i + 1].1, want, "node {i} of {:?}", tree.nodes());
            }
            // accept a random path (the greedy verdict for random argmaxes)
            let argmax: Vec<i32> = (0..=tree.len()).map(|_| (rng.next_u64() % 9) as i32).collect();
            let v = accept_greedy(&tree, &argmax).unwrap();
            for op in tree.kv_commit(&v.path, n_past, seq, &pool).unwrap() {
                kv.apply(op);
            }
            let kept: Vec<(usize, i32)> = kv.cells.iter().filter(|c| c.2.contains(&seq)).map(|c| (c.0, c.1)).collect();
            let want: Vec<(usize, i32)> = (0..n_past)
                .map(|p| (prefix[p as usize], p))
                .chain([(cell(0), n_past)])
                .chain(v.path.iter().enumerate().map(|(d, &a)| (cell(a + 1), n_past + 1 + d as i32)))
                .collect();
            assert_eq!(kept, want);
            // nothing else is left but the other sequence's cell, and no path id
            assert_eq!(kv.cells.len(), want.len() + 1);
            assert!(kv.cells.iter().any(|c| c.0 == other));
            assert!(kv.cells.iter().all(|c| c.2.iter().all(|&s| s == seq || s == 1)));
            // and the next step's anchor fits: seq ends right before it
            assert_eq!(kv.pos_range(seq), Some((0, n_past + v.path.len() as i32)));
        }
        assert!(shapes > 100, "too few branching trees: {shapes}");
    }

    // ---- greedy acceptance -------------------------------------------------

    #[test]
    fn greedy_acceptance_on_a_chain_is_chain_acceptance() {
        let mut rng = Rng::new(4);
        for _ in 0..2000 {
            let (rows, n_embd, k) = clean_block(&mut rng, 8);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let chain = grow_tree(&lat, TreeLimits::chain(8, 0.0), 8);
            let draft = chain.tokens(&(0..chain.len()).collect::<Vec<_>>());
            // targets that often agree with the draft
            let argmax: Vec<i32> = (0..=draft.len())
                .map(|i| if i < draft.len() && rng.next_u64() % 3 > 0 { draft[i] } else { (rng.next_u64() % 8) as i32 })
                .collect();
            let n_acc = draft.iter().zip(&argmax).take_while(|(d, a)| d == a).count();
            let v = accept_greedy(&chain, &argmax).unwrap();
            assert_eq!(v.path, (0..n_acc).collect::<Vec<_>>());
            assert_eq!(v.tokens, argmax[..=n_acc].to_vec());
        }
    }

    #[test]
    fn greedy_acceptance_follows_the_argmax_down_any_branch() {
        let t = Tree::from_nodes(vec![
            node(10, -1, 1),
            node(11, -1, 1),
            node(20, 0, 2),
            node(21, 1, 2),
            node(22, 1, 2),
            node(30, 4, 3),
        ])
        .unwrap();
        //            anchor  0   1   2   3   4   5
        let argmax = [11, 20, 22, 0, 0, 30, 7];
        assert_eq!(
            accept_greedy(&t, &argmax).unwrap(),
            TreeVerdict { path: vec![1, 4, 5], tokens: vec![11, 22, 30, 7] }
        );
        assert_eq!(accept_greedy(&t, &[12, 0, 0, 0, 0, 0, 0]).unwrap(), TreeVerdict { path: vec![], tokens: vec![12] });
        assert!(accept_greedy(&t, &argmax[..6]).is_err());
        // rows are asked lazily, in path order, once each
        let mut asked = Vec::new();
        accept_matching(&t, |r| {
            asked.push(r);
            argmax[slot(r)]
        });
        assert_eq!(asked, vec![None, Some(1), Some(4), Some(5)]);
        // reach under a per-node model, and the lattice estimate
        let reach = t.reach(|n| if n.depth == 1 { 0.5 } else { 0.2 });
        let want = [0.5, 0.5, 0.1, 0.1, 0.1, 0.02];
        assert!(reach.iter().zip(want).all(|(r, w)| (r - w).abs() < 1e-15), "{reach:?}");
        assert!((t.expected_accepted() - (0.5 + 0.5 + 0.25 * 3.0 + 0.125)).abs() < 1e-12);
    }

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
    fn step<C: Chance>(lat: &Lattice, limits: TreeLimits, t: f32, c: &mut C, rule: Rule) -> (usize, usize) {
        let tree = sample_tree_with(lat, limits, V, t, c);
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
    fn exact(lat: &Lattice, limits: TreeLimits, t: f32, rule: Rule) -> (Vec<f64>, f64) {
        let mut dist = vec![0.0; V.pow(LEN as u32)];
        let mut acc = 0.0;
        for ((i, a), pr) in enumerate(|c| step(lat, limits, t, c, rule)) {
            dist[i] += pr;
            acc += pr * a as f64;
        }
        (dist, acc)
    }

    fn tv(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / 2.0
    }

    fn configs() -> Vec<(TreeLimits, f32)> {
        let mut out = Vec::new();
        for n_nodes in [1, 2, 3, 5] {
            for (max_children, max_leaves) in [(0, 0), (1, 0), (2, 0), (0, 2)] {
                for t in [0.6, 1.0, 1.7] {
                    out.push((TreeLimits { n_nodes, max_depth: 2, max_children, max_leaves, p_min: 0.0 }, t));
                }
            }
        }
        out.push((TreeLimits { p_min: 0.5, ..TreeLimits::tree(5, 2) }, 1.0));
        out.push((TreeLimits::tree(5, 2), 0.0));
        out
    }

    #[test]
    fn sampled_trees_verify_to_exactly_the_target_distribution() {
        let want = target_joint();
        assert!((want.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let mut outcomes = 0;
        for (rows, n_embd) in lattices() {
            let lat = Lattice::new(&rows, n_embd, 3).unwrap();
            for (limits, t) in configs() {
                let all = enumerate(|c| step(&lat, limits, t, c, Rule::Lossless));
                outcomes += all.len();
                let (got, _) = exact(&lat, limits, t, Rule::Lossless);
                assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-12);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() < 1e-9, "{limits:?} t={t}: outcome {i}: {g} vs {w}");
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
                for (limits, t) in configs() {
                    let (got, _) = exact(&lat, limits, t, rule);
                    assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-12);
                    worst = worst.max(tv(&got, &want));
                    // with one child per node the rules coincide with the lossless one
                    if limits.max_children == 1 || limits.n_nodes == 1 || t == 0.0 {
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
                match (depth < 2).then(|| row_q(&lat, depth + 1, pred, V, 1.0)).flatten() {
                    Some(r) => (r.ids, r.probs),
                    None => Default::default(),
                }
            })
            .collect();
        let det = SampledTree { tree: tree.clone(), q };
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
    fn a_tree_accepts_more_than_a_chain_of_its_depth() {
        let (rows, n_embd) = &lattices()[0];
        let lat = Lattice::new(rows, *n_embd, 3).unwrap();
        let (_, chain) = exact(&lat, TreeLimits::chain(2, 0.0), 1.0, Rule::Lossless);
        let (_, tree) = exact(&lat, TreeLimits::tree(5, 2), 1.0, Rule::Lossless);
        let (_, wide) = exact(&lat, TreeLimits::tree(12, 2), 1.0, Rule::Lossless);
        eprintln!("E[accepted] depth 2: chain {chain:.4}, tree of 5 {tree:.4}, full tree {wide:.4}");
        assert!(tree > chain + 0.05 && wide >= tree);
    }

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
            let walk = sampled_walk(&lat, WalkLimits { n_max: 6, n_min: 0, p_min }, 20, t, &mut a).unwrap();
            let tree = sample_tree(&lat, TreeLimits::chain(6, p_min), 20, t, &mut b).unwrap();
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
            let s = sample_tree(&lat, limits, 6, 0.8, &mut rng).unwrap();
            check_invariants(s.tree());
            assert!(s.tree().len() <= limits.n_nodes);
            assert!(limits.max_leaves == 0 || s.tree().leaves().len() <= limits.max_leaves);
            for (i, n) in s.tree().nodes().iter().enumerate() {
                let Some(Dist::Sparse { ids, probs }) = s.q(n.parent()) else { panic!() };
                let j = ids.iter().position(|&t| t == n.token).unwrap();
                assert_eq!(probs[j], n.prob);
                let parent = n.parent().map_or(1.0, |p| s.tree().nodes()[p].path_prob);
                assert!((n.path_prob - parent * n.prob).abs() <= 1e-6 * parent, "{i}");
            }
            let before = rng.clone();
            let g = sample_tree(&lat, limits, 6, 0.0, &mut rng).unwrap();
            assert_eq!(rng, before);
            assert!(g.tree().children_by_slot().iter().all(|c| c.len() <= 1));
        }
        assert!(
            sample_tree(&Lattice::new(&[0.0; 13], 13, 3).unwrap(), TreeLimits::tree(4, 4), 6, -1.0, &mut rng).is_err()
        );
    }

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
        let (exact_lossy, _) = exact(&lat, limits, 1.0, Rule::NoResidual);
        let run = |rule: Rule| {
            let mut draft = Rng::with_stream(8, STREAM_DRAFT);
            let mut verify = Rng::with_stream(8, STREAM_VERIFY);
            let mut counts = vec![0usize; want.len()];
            let mut accepted = 0;
            for _ in 0..n {
                let tree = sample_tree_with(&lat, limits, V, 1.0, &mut draft);
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
        let (_, exact_rate) = exact(&lat, limits, 1.0, Rule::Lossless);
        assert!((rate - exact_rate).abs() < 0.01, "{rate} vs {exact_rate}");
    }

    #[test]
    fn a_chain_verifies_exactly_as_sampling_verify() {
        let mut rng = Rng::new(9);
        for seed in 0..3000u64 {
            let (rows, n_embd, k) = random_block(&mut rng, V, false);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let tree = sample_tree(&lat, TreeLimits::chain(4, 0.0), V, 0.9, &mut rng).unwrap();
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
            let tree = sample_tree(&lat, limits, V, [0.5, 1.0, 1.5][(seed % 3) as usize], &mut rng).unwrap();
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
        let tree = sample_tree(&lat, TreeLimits::tree(3, 2), V, 1.0, &mut rng).unwrap();
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
        let tree = sample_tree(&lat, TreeLimits::tree(3, 2), V, 1.0, &mut rng).unwrap();
        let pd = vec![Dist::Dense(&p); tree.tree().len()];
        assert!(verify_sampled_tree(&tree, &pd, V, &mut rng).unwrap_err().message.contains("p rows"));
        let bad = [0.5f32; 4];
        let mut pd = vec![Dist::Dense(&p); tree.tree().len() + 1];
        *pd.last_mut().unwrap() = Dist::Dense(&bad);
        assert!(verify_sampled_tree(&tree, &pd, V, &mut rng).unwrap_err().message.contains("sum"));
    }
}
