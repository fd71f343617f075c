//! Tree drafts: the chain's one noise-block decode (`draft_step`), grown into
//! a best-first tree over each block's lattice (`crate::tree::grow_tree_by`,
//! ordered by the edges' acceptance calibrated on the greedy trees verified so
//! far, `crate::calibration`; at temperature > 0 drawn from it,
//! `crate::tree::sample_tree`, verified in `tree_sampled`) instead of walked as
//! a chain; the tree's verify rows held as one draft's; accept_tree() commits
//! the anchor row and the accepted path's rows, in path order, at the
//! sequence's next dense draft positions and drops the rest.
//!
//! Verify rows of a tree come in tree order, anchor first: the anchor at the
//! sequence's next position, node i at the anchor's position + its depth.
//! Siblings share positions, so while a tree is outstanding the rule that a
//! sequence's positions never go back gives way to exactly these positions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::draft_step::{NoiseLattices, StepStart};
use super::sampled::{self, Mode};
use super::sequence::Outstanding;
use super::stats::us_since;
use super::tree_sampled::SampledTreeDraft;
use super::{Engine, Request, Row};
use crate::calibration::{self, EdgeCalibration};
use crate::error::{Error, Result};
use crate::log;
use crate::ngram;
use crate::params::LLAMA_SPEC_DFLASH2_MAX_DRAFT;
use crate::sys::TreeRoom;
use crate::tree::{
    FirstChild, Proposals, SampledKey, SampledTree, Tree, TreeLimits, accept_matching, grow_tree, grow_tree_by,
    merge_branches, observe_branches, raw_key, sample_tree_by,
};
use crate::truncation::DraftQ;

/// One sequence's part of a tree draft call.
#[derive(Clone, Copy, Debug)]
pub struct TreeRequest {
    pub seq: i32,
    /// The last token the host sampled; the target has not decoded it yet.
    pub id_last: i32,
    /// Most nodes (verify rows beyond the anchor); 0: the engine's n_max.
    pub n_nodes: i32,
    /// Deepest draft position; 0: the engine's n_max. Lattice nodes go at
    /// most n_max deep (the noise block's width); n-gram branches as deep as
    /// this (at most LLAMA_SPEC_DFLASH2_MAX_DRAFT).
    pub max_depth: i32,
    /// Most children of one node (or of the anchor); 0: no limit.
    pub max_children: i32,
    /// Most leaves, i.e. path sequence ids the host has for this tree; 0: as
    /// many as the target context has sequence ids.
    pub max_leaves: i32,
    /// As a chain request's (`Request`): 0 grows the greedy tree; > 0 draws
    /// a sampled tree with q at `draft_temperature` (<= 0: as a chain's),
    /// from the sequence's generators for `seed`.
    pub temperature: f32,
    pub draft_temperature: f32,
    pub seed: u32,
    /// As a chain request's: q cut like the host sampler's p, for trees of
    /// at most 15 nodes (`Truncation::for_draft`).
    pub truncation: crate::truncation::Truncation,
}

/// Whether the chain fallback was logged: for a split KV cache, for memory
/// that cannot branch (once per process each).
static FALLBACK_LOGGED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

impl Engine {
    /// The growth limits of a request and the depth its n-gram branches may
    /// reach, or why the target cannot hold its tree.
    fn tree_limits(&self, r: &TreeRequest, room: &TreeRoom) -> Result<(TreeLimits, usize)> {
        for (name, v) in [
            ("n_nodes", r.n_nodes),
            ("max_depth", r.max_depth),
            ("max_children", r.max_children),
            ("max_leaves", r.max_leaves),
        ] {
            if v < 0 {
                return Err(Error::invalid(format!("tree request of sequence {}: {name} {v} is negative", r.seq)));
            }
        }
        let n_nodes = if r.n_nodes == 0 { self.drafter.limits.n_max } else { r.n_nodes as usize };
        let n_rows = n_nodes + 1;
        let n_batch = self.target.n_batch() as usize;
        if n_rows > n_batch || n_rows > room.n_ctx as usize {
            return Err(Error::invalid(format!(
                "tree request of sequence {}: {n_nodes} nodes verify in {n_rows} rows (KV cells), more than the \
                 target context holds (n_batch {n_batch}, n_ctx {})",
                r.seq, room.n_ctx
            )));
        }
        let max_leaves = if !room.branching || !room.unified {
            if !FALLBACK_LOGGED[room.branching as usize].swap(true, Ordering::Relaxed) {
                log::warn(if room.branching {
                    "the target context's KV cache is not unified (kv_unified): tree drafts are chains"
                } else {
                    "the target's memory is recurrent or hybrid and cannot branch: tree drafts are chains"
                });
            }
            1
        } else if r.max_leaves == 0 {
            room.n_seq_max as usize
        } else if r.max_leaves as u32 > room.n_seq_max {
            return Err(Error::invalid(format!(
                "tree request of sequence {}: max_leaves {} path sequence ids, the target context has n_seq_max {}",
                r.seq, r.max_leaves, room.n_seq_max
            )));
        } else {
            r.max_leaves as usize
        };
        let depth = if r.max_depth == 0 { self.drafter.limits.n_max } else { r.max_depth as usize };
        let limits = TreeLimits {
            n_nodes,
            max_depth: depth.min(self.drafter.limits.n_max).min(n_nodes),
            max_children: r.max_children as usize,
            max_leaves,
            p_min: self.drafter.limits.p_min,
        };
        Ok((limits, depth.min(LLAMA_SPEC_DFLASH2_MAX_DRAFT).min(n_nodes)))
    }

    /// Drafts a tree for each request with one noise-block decode; `room` is
    /// the most nodes the caller takes in all. Each requested sequence then has
    /// its tree outstanding (an empty one needs no accept_tree()).
    pub fn draft_tree(&mut self, reqs: &[TreeRequest], room: usize) -> Result<Vec<Tree>> {
        let target_room = self.target.tree_room();
        let (limits, mut branch_depths): (Vec<TreeLimits>, Vec<usize>) =
            reqs.iter().map(|r| self.tree_limits(r, &target_room)).collect::<Result<Vec<_>>>()?.into_iter().unzip();
        let chain: Vec<Request> = reqs
            .iter()
            .zip(&limits)
            .map(|(r, l)| Request {
                seq: r.seq,
                id_last: r.id_last,
                n_max: l.max_depth as i32,
                temperature: r.temperature,
                draft_temperature: r.draft_temperature,
                seed: r.seed,
                truncation: r.truncation,
            })
            .collect();
        // sequences, tokens, temperatures and outstanding drafts as the chain checks them
        self.open_step(&chain, usize::MAX, reqs.len())?;
        let modes =
            chain.iter().zip(&limits).map(|(r, l)| self.mode_of(r, Some(l.n_nodes))).collect::<Result<Vec<Mode>>>()?;
        // by the request's budget, as q's cut (before the controller's cap)
        let first_children: Vec<FirstChild> =
            limits.iter().map(|l| self.growth.first_child.unwrap_or_else(|| FirstChild::for_tree(l.n_nodes))).collect();
        let needed: usize = limits.iter().map(|l| l.n_nodes).sum();
        if room < needed {
            return Err(Error::buffer_too_small(format!(
                "the output holds {room} tree nodes, these requests may grow {needed}"
            )));
        }
        // the controller (adaptive walk): no tree this step, a short one for a
        // probed sequence, or each tree cut to the nodes that pay for their verify rows
        let wanted: Vec<usize> = limits.iter().map(|l| l.max_depth).collect();
        let Some(StepStart { caps, width, blocks }) = self.begin_step(&chain, &wanted)? else {
            return Ok(Vec::new());
        };
        let mut limits = limits;
        for ((l, &cap), branch_depth) in limits.iter_mut().zip(&caps).zip(&mut branch_depths) {
            if cap < l.max_depth {
                l.max_depth = cap;
                l.n_nodes = l.n_nodes.min(cap);
                *branch_depth = (*branch_depth).min(cap);
            }
        }
        let lattices = self.decode_noise(blocks, width)?;
        let (mut trees, mut sampled_trees) =
            self.grow_trees(reqs, &modes, &limits, &branch_depths, &first_children, &lattices)?;

        let mut held = Vec::with_capacity(reqs.len());
        for (i, (r, tree)) in reqs.iter().zip(&mut trees).enumerate() {
            let mut depth = tree.nodes().iter().map(|n| n.depth).max().unwrap_or(0);
            // a sampled tree is never dropped for its depth: that would bias it
            if depth < self.drafter.limits.n_min && modes[i] == Mode::Greedy {
                *tree = Tree::default(); // as the chain drops a draft below n_min
                depth = 0;
            }
            let nodes = tree.nodes();
            self.stats.n_drafts += !nodes.is_empty() as u64;
            self.stats.n_drafted += nodes.len() as u64;
            self.stats.n_ngram_nodes += nodes.iter().filter(|n| n.ngram > 0).count() as u64;
            for slot in self.stats.drafted_at.iter_mut().take(depth) {
                *slot += 1;
            }
            // a sampled tree of no nodes (not drafting, no room) still verifies: its bonus token
            let sampled_tree =
                (modes[i] != Mode::Greedy).then(|| SampledTreeDraft::new(sampled_trees[i].take().unwrap_or_default()));
            held.push(Outstanding {
                tokens: nodes.iter().map(|n| n.token).collect(),
                confidences: nodes.iter().map(|n| n.prob).collect(),
                after_target: self.seqs[r.seq as usize].last_target_pos(),
                sampled: None,
                tree: Some(tree.clone()),
                sampled_tree,
                tuning: modes[i].tuning(),
            });
        }
        self.end_step(&chain, &modes, held);
        Ok(trees)
    }

    /// Grows each request's tree over its block's lattice, as its mode says:
    /// greedy, by the edges' calibrated acceptance, with its n-gram branches
    /// merged and the controller's cut; sampled, drawn from q (sized by the
    /// controller before any draw). Requests without a block get no tree.
    fn grow_trees(
        &mut self,
        reqs: &[TreeRequest],
        modes: &[Mode],
        limits: &[TreeLimits],
        branch_depths: &[usize],
        first_children: &[FirstChild],
        lattices: &NoiseLattices,
    ) -> Result<(Vec<Tree>, Vec<Option<SampledTree>>)> {
        let mut trees = vec![Tree::default(); reqs.len()];
        let mut sampled_trees: Vec<Option<SampledTree>> = vec![None; reqs.len()];
        let n_vocab = self.drafter.n_vocab;
        let t = Instant::now();
        let calibration = EdgeCalibration::from_model(&self.growth.acceptance);
        // a node's calibrated acceptance: what a merged branch's lattice node and a
        // sibling in the controller's cut are priced with
        let edge_p = |n: &crate::tree::Node| calibration.p(n.depth, n.prob);
        // built only for a call that grows sampled trees by it
        let sampled_calibration = if self.growth.calibrate_sampled && modes.iter().any(|m| *m != Mode::Greedy) {
            EdgeCalibration::from_model(&self.growth.sampled_acceptance)
        } else {
            EdgeCalibration::raw()
        };
        for (block, lattice) in lattices.iter(self.drafter.n_embd, self.drafter.top_k) {
            let (i, mut lim) = (block.request, limits[block.request]);
            let seq = reqs[i].seq;
            // n-gram branches: merged into a greedy tree, children taken without a
            // draw (point masses) in a sampled one
            let history = self.seqs[seq as usize].history.tokens();
            let branches = ngram::propose(history, reqs[i].id_last, branch_depths[i], self.growth.ngram_branches);
            let ng = &self.growth.ngram_acceptance;
            match modes[i] {
                Mode::Greedy => {
                    let mut tree = grow_tree_by(&lattice, lim, n_vocab, |depth, prob| calibration.p(depth, prob));
                    if !branches.is_empty() {
                        tree = merge_branches(
                            &tree,
                            &branches,
                            TreeLimits { max_depth: branch_depths[i], ..lim },
                            edge_p,
                            |m, d| ng.p(m, d),
                        );
                    }
                    if let Some(policy) = self.controller.policy.as_mut() {
                        let branch_p =
                            |n: &crate::tree::Node| if n.ngram > 0 { ng.p(n.ngram as usize, n.depth) } else { 0.0 };
                        tree.truncate(policy.keep_tree(&tree, branch_p, edge_p));
                    }
                    trees[i] = tree;
                }
                Mode::Sampled { t_draft, seed, truncation, .. } => {
                    // The controller sizes a sampled tree before any draw, from
                    // the lattice's greedy tree: a cut that saw the drawn
                    // children would bias the verification.
                    if let Some(policy) = self.controller.policy.as_mut() {
                        lim.n_nodes = policy.keep_tree(&grow_tree(&lattice, lim, n_vocab), |_| 0.0, edge_p);
                    }
                    let branch_p = |m: usize, d: usize| ng.p(m, d);
                    let proposals = Proposals { branches: &branches, max_depth: branch_depths[i], p: &branch_p };
                    let rng = &mut sampled::seeded(&mut self.seqs[seq as usize].rng, seed, seq).draft;
                    let calibrated = |d: usize, k: usize, q: f64| sampled_calibration.p_sampled(d, k, q);
                    let key: SampledKey = if self.growth.calibrate_sampled { &calibrated } else { &raw_key };
                    let st = sample_tree_by(
                        &lattice,
                        lim,
                        n_vocab,
                        DraftQ { t: t_draft, truncation },
                        first_children[i],
                        proposals,
                        key,
                        rng,
                    )?;
                    trees[i] = st.tree().clone();
                    sampled_trees[i] = Some(st);
                }
            }
        }
        self.stats.t_walk_us += us_since(t);
        Ok((trees, sampled_trees))
    }

    /// The host verified the outstanding tree of `seq` and accepts `path`:
    /// node indices from depth 1 down, each a child of the one before (empty:
    /// no node). The anchor's row and the path's rows are committed in path
    /// order; every other verify row is dropped.
    pub fn accept_tree(&mut self, seq: i32, path: &[i32]) -> Result<()> {
        let s = self.seq_index(seq)?;
        let q = &self.seqs[s];
        let Some(o) = q.outstanding.as_ref() else {
            return Err(Error::invalid_state(format!("accept_tree() on sequence {seq}, which has no draft to accept")));
        };
        let Some(tree) = o.tree.as_ref() else {
            return Err(Error::invalid_state(format!(
                "sequence {seq}'s draft is a chain, not a tree: call llama_spec_dflash2_accept()"
            )));
        };
        let path = root_path(tree, path)?;
        if let Some(st) = o.sampled_tree.as_ref() {
            st.check_accept(seq, &path)?;
        }
        let n_rows = if tree.is_empty() { 0 } else { 1 + path.last().map_or(0, |&i| i + 1) };
        if q.held.len() < n_rows {
            return Err(Error::invalid_state(format!(
                "accept_tree() on sequence {seq} needs the tree's verify rows up to row {} (anchor, then node i \
                 at row i + 1), but process() received {} since the draft",
                n_rows.saturating_sub(1),
                q.held.len()
            )));
        }
        let n_nodes = tree.len();
        let rows: Vec<usize> =
            if n_rows == 0 { Vec::new() } else { std::iter::once(0).chain(path.iter().map(|&i| i + 1)).collect() };
        if let Some(policy) = self.controller.policy.as_mut() {
            let (confidences, n_lattice) = tree.path_confidences(&path);
            policy.accepted_path(&confidences, n_lattice, path.len());
        }
        let n_verified = q.held.len().saturating_sub(1);
        if o.sampled_tree.is_none() {
            // a greedy tree: its reached children calibrate the next trees' growth
            calibration::observe_tree(&mut self.growth.acceptance, tree, &path, n_verified);
        }
        // n-gram branch nodes of either kind of tree: their measured acceptance prices the next ones
        let (reached, accepted) = observe_branches(&mut self.growth.ngram_acceptance, tree, &path, n_verified);
        self.stats.n_ngram_reached += reached as u64;
        self.stats.n_ngram_accepted += accepted as u64;
        let dropped = self.seqs[s].resolve_held_rows(&rows);
        self.stats.n_rejected_rows += dropped as u64;
        self.stats.record_accept(n_nodes, path.len());
        Ok(())
    }

    /// Verifies the outstanding tree of `seq` greedily against the target's
    /// logits at rows `i_batch` (the anchor's row, then node i's at i + 1):
    /// the longest path whose every node is the argmax of its parent's row,
    /// accepted. Writes the emitted tokens (the path's, then the argmax at its
    /// last row) into `out`, the path into `path_out`, and returns their count.
    pub fn verify_tree_greedy(
        &mut self,
        seq: i32,
        i_batch: &[i32],
        out: &mut [i32],
        path_out: Option<&mut [i32]>,
    ) -> Result<usize> {
        let s = self.seq_index(seq)?;
        let Some(tree) = self.seqs[s].tree() else {
            return Err(Error::invalid_state(format!(
                "verify_tree_greedy() on sequence {seq}, which has no tree draft to verify{}",
                if self.seqs[s].outstanding.is_some() {
                    " (its draft is a chain: llama_spec_dflash2_verify_greedy)"
                } else {
                    ""
                }
            )));
        };
        let n_nodes = tree.len();
        if i_batch.len() != n_nodes + 1 {
            return Err(Error::invalid(format!(
                "tree verify of sequence {seq}: {} rows for a tree of {n_nodes} nodes (pass {})",
                i_batch.len(),
                n_nodes + 1
            )));
        }
        let n_held = self.seqs[s].held.len();
        if n_nodes > 0 && n_held < n_nodes + 1 {
            return Err(Error::invalid_state(format!(
                "tree verify of sequence {seq}: process() received {n_held} of the tree's {} verify rows; pass \
                 the decoded verify batch to llama_spec_dflash2_process() first",
                n_nodes + 1
            )));
        }
        let depth = tree.nodes().iter().map(|n| n.depth).max().unwrap_or(0);
        if out.len() < depth + 1 || path_out.as_ref().is_some_and(|p| p.len() < depth) {
            return Err(Error::buffer_too_small(format!(
                "tree verify of sequence {seq} may emit {} tokens along a path of {depth} nodes; the output holds {} \
                 (the path {})",
                depth + 1,
                out.len(),
                path_out.as_ref().map_or("is not asked for".to_string(), |p| format!("holds {}", p.len()))
            )));
        }
        let logits = self.verify_logits(i_batch)?;
        // the argmax only of the rows the walk reaches
        let verdict = accept_matching(tree, |row| super::verify::argmax(logits[row.map_or(0, |i| i + 1)]));
        let path: Vec<i32> = verdict.path.iter().map(|&i| i as i32).collect();
        self.accept_tree(seq, &path)?;
        out[..verdict.tokens.len()].copy_from_slice(&verdict.tokens);
        if let Some(p) = path_out {
            p[..path.len()].copy_from_slice(&path);
        }
        Ok(verdict.tokens.len())
    }

    /// Checks the verify rows of sequences holding a tree: the anchor's not
    /// before the sequence's newest row, node i's at the anchor's position +
    /// its depth (rows in tree order). Rows beyond the tree are left to the
    /// count check of `check_rows`.
    pub(super) fn check_tree_rows(&self, rows: &[Row]) -> Result<()> {
        // per sequence: verify rows received, the anchor's position
        let mut at: Vec<(usize, Option<i32>)> =
            self.seqs.iter().map(|q| (q.held.len(), q.held.targets().first().copied())).collect();
        for r in rows {
            let s = r.seq as usize;
            if !self.seqs[s].holds_tree() {
                continue;
            }
            let tree = self.seqs[s].tree().expect("holds a tree");
            let (k, anchor) = &mut at[s];
            match *anchor {
                None => {
                    if let Some(last) = self.seqs[s].last_target_pos().filter(|&last| r.pos < last) {
                        return Err(Error::invalid_state(format!(
                            "sequence {s}: the anchor row of its tree at position {} is before its newest row at \
                             {last}",
                            r.pos
                        )));
                    }
                    *anchor = Some(r.pos);
                }
                Some(a) => {
                    if let Some(node) = tree.nodes().get(*k - 1) {
                        let want = a + node.depth as i32;
                        if r.pos != want {
                            return Err(Error::invalid_state(format!(
                                "sequence {s}: verify row {k} of its tree is node {} at depth {}, so at position \
                                 {want} (the anchor's {a} + depth), not {}: pass a tree's verify rows to process() in \
                                 the order anchor, node 0, node 1, ...",
                                *k - 1,
                                node.depth,
                                r.pos
                            )));
                        }
                    }
                }
            }
            *k += 1;
        }
        Ok(())
    }
}

/// `path` as node indices, if it is a path from the anchor in `tree`.
fn root_path(tree: &Tree, path: &[i32]) -> Result<Vec<usize>> {
    let mut parent = -1;
    let mut out = Vec::with_capacity(path.len());
    for &i in path {
        match usize::try_from(i).ok().and_then(|u| tree.nodes().get(u)) {
            Some(n) if n.parent == parent => parent = i,
            Some(_) => {
                return Err(Error::invalid(format!(
                    "path {path:?} is not a path from the anchor: node {i} is not a child of {}",
                    if parent < 0 { "the anchor".to_string() } else { format!("node {parent}") }
                )));
            }
            None => {
                return Err(Error::invalid(format!(
                    "path {path:?}: node {i} is not one of the tree's {} nodes",
                    tree.len()
                )));
            }
        }
        out.push(i as usize);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::root_path;
    use crate::tree::{Node, Tree};

    fn node(token: i32, parent: i32, depth: usize) -> Node {
        Node { token, parent, depth, prob: 0.5, path_prob: 0.5, candidate: 0, ngram: 0 }
    }

    #[test]
    fn only_paths_from_the_anchor_are_accepted() {
        // 0 and 2 under the anchor, 1 under 0, 3 under 1
        let tree =
            Tree::from_nodes(vec![node(5, -1, 1), node(6, 0, 2), node(7, -1, 1), node(8, 1, 3)]).expect("valid tree");
        assert_eq!(root_path(&tree, &[]).unwrap(), Vec::<usize>::new());
        assert_eq!(root_path(&tree, &[0, 1, 3]).unwrap(), vec![0, 1, 3]);
        assert_eq!(root_path(&tree, &[2]).unwrap(), vec![2]);
        for bad in [&[1][..], &[0, 3], &[2, 1], &[0, 0], &[4], &[-1], &[0, 1, 3, 3]] {
            assert!(root_path(&tree, bad).is_err(), "{bad:?}");
        }
    }
}
