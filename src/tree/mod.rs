//! Draft trees from the DFlash2 selector lattice (layout: `crate::selector`):
//! growth, the encoding that verifies a tree in one llama.cpp batch, and
//! acceptance, greedy or sampled (lossless). Pure and seeded; no model needed.
//!
//! Here: the trees themselves (`TreeLimits`, `Node`, `Tree`). Each other job
//! has its own file:
//! - `grow`: deterministic best-first growth (`grow_tree`, `grow_tree_by`);
//! - `merge`: n-gram branches (`crate::ngram`) merged into a grown tree, the
//!   budget re-spent over both (`merge_branches`);
//! - `sample`: sampled growth, the tree and its q (`sample_tree`,
//!   `SampledTree`);
//! - `encode`: the encoding that verifies a tree in one llama.cpp batch
//!   (`VerifyRow`, `KvOp`, `Tree::verify_rows`, `Tree::kv_prepare`,
//!   `Tree::kv_commit`) and its budget of KV cells and sequence ids;
//! - `accept`: greedy acceptance and sample-and-match (`accept_greedy`,
//!   `accept_matching`, `TreeVerdict`);
//! - `verify_sampled`: lossless sampled verification by recursive rejection
//!   sampling, and why it is lossless (`verify_sampled_tree`,
//!   `verify_sampled_node`, `verify_children`).
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
//!   one after another without replacement, for [`verify_sampled_tree`];
//!   [`sample_tree_by`] prices them by a calibrated key (`crate::calibration`).

mod accept;
mod encode;
mod grow;
mod merge;
mod sample;
#[cfg(test)]
mod test_support;
mod verify_sampled;

pub use accept::{TreeVerdict, accept_greedy, accept_matching};
pub use encode::{KvOp, VerifyRow};
pub use grow::{grow_tree, grow_tree_by};
pub use merge::{merge_branches, observe_branches};
pub use sample::{FirstChild, Proposals, SampledKey, SampledTree, raw_key, sample_tree, sample_tree_by};
pub use verify_sampled::{Outcome, TreeStep, verify_children, verify_sampled_node, verify_sampled_tree};

use crate::error::{Error, Result};

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
    /// Product of the edge probabilities from the anchor; for [`sample_tree`]
    /// the growth's estimate that the node is accepted (its priority).
    pub path_prob: f32,
    /// The lattice candidate (index into position `depth`'s K) the node's
    /// children are scored from; [`NOT_IN_LATTICE`] for a node only an n-gram
    /// branch proposed.
    pub candidate: usize,
    /// Class (`crate::ngram::Branch::class`: the match length, or past
    /// `MAX_MATCH` after an edit) of the n-gram branch that proposed this
    /// node too; 0: the lattice's alone.
    pub ngram: u8,
}

/// [`Node::candidate`] of a node that is not one of the lattice's.
pub const NOT_IN_LATTICE: usize = usize::MAX;

impl Node {
    /// The lattice proposed this node (an n-gram branch may have too).
    pub fn in_lattice(&self) -> bool {
        self.candidate != NOT_IN_LATTICE
    }

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

    /// P(the path to each node is accepted) when a node is accepted, given
    /// its parent was, with probability `accept(node)`, independently along the
    /// path. Siblings exclude each other (at most one matches the target), so
    /// a node gets at most what its earlier siblings left of 1: an estimate
    /// that rests on other candidates' trials (a confidence bin not seen yet
    /// takes its position's, which the top picks set) would otherwise give
    /// every sibling of a 0.9 pick 0.9 (a CPU run's trees of 16 nodes at
    /// depth 1 where the chain's three paid).
    pub fn reach(&self, mut accept: impl FnMut(&Node) -> f64) -> Vec<f64> {
        let mut reach: Vec<f64> = Vec::with_capacity(self.nodes.len());
        let mut room = vec![1.0f64; self.nodes.len() + 1];
        for n in &self.nodes {
            let parent = n.parent().map_or(1.0, |p| reach[p]);
            let left = &mut room[slot(n.parent())];
            let a = accept(n).clamp(0.0, *left);
            *left -= a;
            reach.push(parent * a);
        }
        reach
    }

    /// What the earlier siblings of a node appended after the first `len`
    /// nodes would leave of 1 under `reach` (its acceptances `reach` came
    /// from): the most its own acceptance may be.
    pub fn room_after(&self, len: usize, parent: Option<usize>, reach: &[f64]) -> f64 {
        let parent_reach = parent.map_or(1.0, |p| reach[p]);
        if parent_reach <= 0.0 {
            return 0.0;
        }
        let taken: f64 = self.children(parent).take_while(|&c| c < len).map(|c| reach[c] / parent_reach).sum();
        (1.0 - taken).max(0.0)
    }

    /// Keeps the first `n` nodes (in tree order they form a tree).
    pub fn truncate(&mut self, n: usize) {
        self.nodes.truncate(n);
    }

    /// The edge probabilities along an accepted `path` as far as it follows
    /// lattice nodes, then the first (most probable) lattice child where it
    /// stopped or left the lattice, which the target rejected: the draft
    /// positions the target reached, in the form of a chain's confidences for
    /// `crate::adaptive`, and how many of them it accepted. A path that goes
    /// on through a node only an n-gram branch proposed is cut there, and
    /// the lattice's child it passed over counts as rejected: left out, the
    /// lattice would be credited with the steps its own guess failed on
    /// wherever a branch's succeeded.
    pub fn path_confidences(&self, path: &[usize]) -> (Vec<f32>, usize) {
        let lattice = path.iter().take_while(|&&i| self.nodes[i].in_lattice()).count();
        let mut out: Vec<f32> = path[..lattice].iter().map(|&i| self.nodes[i].prob).collect();
        let at = if lattice == 0 { None } else { Some(path[lattice - 1]) };
        if let Some(next) = self.children(at).find(|&c| self.nodes[c].in_lattice()) {
            out.push(self.nodes[next].prob);
        }
        (out, lattice)
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
