//! Sampled trees (a tree request with temperature > 0): the tree drawn from the
//! lattice with its q per parent (`crate::tree::sample_tree`), kept until
//! accept_tree(), and its lossless verification against the host's sampling
//! distributions: node by node down the accepted path (p given lazily, as
//! llama.cpp's `cur_p`) or whole (dense rows of every verify row).
//!
//! Losslessness rests on what `sampled` keeps for chains (the draft and the
//! verifier draw from different streams of the sequence's generators, which
//! live across steps) and on the tree being verified against exactly the q
//! its children were drawn from, with the children's draw order kept.

use super::Engine;
use super::tuning::VerifiedNode;
use crate::calibration;
use crate::error::{Error, Result};
use crate::sampling::Dist;
use crate::tree::{SampledTree, TreeStep, verify_sampled_node, verify_sampled_tree};

/// The sampled part of an outstanding tree: the tree with its q, and how far
/// the node-by-node verification went.
#[derive(Clone, Debug)]
pub struct SampledTreeDraft {
    pub tree: SampledTree,
    /// The accepted path so far (node indices, depth 1 first).
    path: Vec<usize>,
    /// Whether node-by-node verification began, and whether it ended (a token
    /// was emitted from a residual or as the bonus).
    started: bool,
    ended: bool,
}

impl SampledTreeDraft {
    pub fn new(tree: SampledTree) -> SampledTreeDraft {
        SampledTreeDraft { tree, path: Vec::new(), started: false, ended: false }
    }

    /// The row node-by-node verification expects next: None the anchor's.
    fn at(&self) -> Option<usize> {
        self.path.last().copied()
    }

    /// accept_tree() after (or without) node-by-node verification: the path
    /// must be the verifier's, and a verification in progress must end first.
    /// Without it any path goes: the host may have verified by sample-and-match,
    /// lossless for a tree drawn independently of the target's samples.
    pub(super) fn check_accept(&self, seq: i32, path: &[usize]) -> Result<()> {
        if self.ended && path != self.path {
            return Err(Error::invalid(format!(
                "accept_tree({seq}, {path:?}): llama_spec_dflash2_verify_tree_sampled_step accepted the path {:?}; \
                 pass it",
                self.path
            )));
        }
        if self.started && !self.ended {
            return Err(Error::invalid_state(format!(
                "accept_tree({seq}) while llama_spec_dflash2_verify_tree_sampled_step is at node {}: go on until it \
                 emits a token",
                self.at().map_or(-1, |i| i as i64)
            )));
        }
        Ok(())
    }
}

impl Engine {
    /// The sampled tree of sequence index `s` was verified here (recursive
    /// rejection) down `path`: what it tested calibrates the next trees'
    /// growth key.
    fn observe_sampled_growth(&mut self, s: usize, path: &[usize]) {
        if let Some(st) = self.seqs[s].outstanding.as_ref().and_then(|o| o.sampled_tree.as_ref()) {
            calibration::observe_sampled_tree(&mut self.growth.sampled_acceptance, &st.tree, path);
        }
    }

    /// The sampled tree awaiting accept_tree() on `seq`, and its index.
    fn sampled_tree(&self, seq: i32, what: &str) -> Result<(usize, &SampledTreeDraft)> {
        let (s, o) = self.outstanding_draft(seq, what, "tree draft awaiting accept_tree()")?;
        let Some(st) = o.sampled_tree.as_ref() else {
            return Err(Error::invalid_state(format!(
                "{what} on sequence {seq}, whose draft is {}",
                if o.tree.is_some() {
                    "a greedy tree (temperature 0): it has no q; verify it with llama_spec_dflash2_verify_tree_greedy \
                     or by sample-and-match"
                } else {
                    "a chain, not a tree: verify it with llama_spec_dflash2_verify_sampled(_step)"
                }
            )));
        };
        Ok((s, st))
    }

    /// Verifies the children of `node` (-1: the anchor) of the sampled tree on
    /// `seq` against `p`, the host's distribution at that node's verify row,
    /// with the sequence's verify generator. Nodes go down the accepted path
    /// from the anchor: (child index, its token) when a child is accepted, the
    /// next call is at that child; (None, token) when every child was rejected
    /// or there is none: the token drawn from the residual, or the bonus, and
    /// the end. The host then calls accept_tree() with the accepted path.
    pub fn verify_tree_sampled_step(&mut self, seq: i32, node: i32, p: Dist) -> Result<(Option<usize>, i32)> {
        let (s, st) = self.sampled_tree(seq, "verify_tree_sampled_step")?;
        if st.ended {
            return Err(Error::invalid_state(format!(
                "verify_tree_sampled_step({seq}, {node}): the verification of this tree ended; call \
                 llama_spec_dflash2_accept_tree({seq}, {:?})",
                st.path
            )));
        }
        let n = st.tree.tree().len() as i32;
        if node < -1 || node >= n {
            return Err(Error::invalid(format!(
                "verify_tree_sampled_step({seq}, {node}): the tree has {n} nodes (-1 = the anchor)"
            )));
        }
        let at = st.at();
        if usize::try_from(node).ok() != at {
            return Err(Error::invalid_state(format!(
                "verify_tree_sampled_step({seq}, {node}): nodes are verified down the accepted path from the anchor; \
                 the next one is {}",
                at.map_or(-1, |i| i as i64)
            )));
        }
        let mut rng = self.verify_rng(s, seq)?;
        let step = verify_sampled_node(&st.tree, at, p, self.drafter.n_vocab, &mut rng)?;
        if let Some(tuning) = self.seqs[s].outstanding.as_ref().and_then(|o| o.tuning) {
            let node = VerifiedNode::of_tree(&st.tree, at);
            self.observe_node(Some(tuning), &node, p);
        }
        let q = &mut self.seqs[s];
        q.rng.as_mut().expect("checked above").verify = rng;
        let st = q.outstanding.as_mut().and_then(|o| o.sampled_tree.as_mut()).expect("checked above");
        st.started = true;
        Ok(match step {
            TreeStep::Accept(c) => {
                st.path.push(c);
                (Some(c), st.tree.tree().nodes()[c].token)
            }
            TreeStep::Emit(x) => {
                st.ended = true;
                let path = st.path.clone();
                self.observe_sampled_growth(s, &path);
                (None, x)
            }
        })
    }

    /// Verifies the whole sampled tree on `seq` against dense distributions
    /// (`p_rows`: n_nodes + 1 rows of `n_vocab`, row 0 the anchor's, row i + 1
    /// node i's) and accepts the path it kept. Writes the tokens the host emits
    /// into `out` (the path's, then the residual or bonus token), the path into
    /// `path_out`, and returns their count, path length + 1.
    pub fn verify_tree_sampled(
        &mut self,
        seq: i32,
        p_rows: &[f32],
        n_rows: usize,
        n_vocab: usize,
        out: &mut [i32],
        path_out: Option<&mut [i32]>,
    ) -> Result<usize> {
        let (s, st) = self.sampled_tree(seq, "verify_tree_sampled")?;
        if st.started {
            return Err(Error::invalid_state(format!(
                "verify_tree_sampled on sequence {seq}, whose tree llama_spec_dflash2_verify_tree_sampled_step is \
                 verifying"
            )));
        }
        if n_vocab != self.drafter.n_vocab {
            return Err(Error::invalid(format!(
                "verify_tree_sampled: n_vocab {n_vocab} (the model has {})",
                self.drafter.n_vocab
            )));
        }
        let tree = st.tree.tree();
        let n_nodes = tree.len();
        if n_rows != n_nodes + 1 {
            return Err(Error::invalid(format!(
                "verify_tree_sampled of sequence {seq}: {n_rows} rows of p for a tree of {n_nodes} nodes (pass {})",
                n_nodes + 1
            )));
        }
        debug_assert_eq!(p_rows.len(), n_rows * n_vocab);
        let n_held = self.seqs[s].held.len();
        if n_nodes > 0 && n_held < n_nodes + 1 {
            return Err(Error::invalid_state(format!(
                "verify_tree_sampled of sequence {seq}: process() received {n_held} of the tree's {} verify rows; \
                 pass the decoded verify batch to llama_spec_dflash2_process() first",
                n_nodes + 1
            )));
        }
        let depth = tree.nodes().iter().map(|n| n.depth).max().unwrap_or(0);
        if out.len() < depth + 1 || path_out.as_ref().is_some_and(|p| p.len() < depth) {
            return Err(Error::buffer_too_small(format!(
                "verify_tree_sampled of sequence {seq} may emit {} tokens along a path of {depth} nodes; the output \
                 holds {} (the path {})",
                depth + 1,
                out.len(),
                path_out.as_ref().map_or("is not asked for".to_string(), |p| format!("holds {}", p.len()))
            )));
        }
        let ps: Vec<Dist> = p_rows.chunks_exact(n_vocab).map(Dist::Dense).collect();
        let mut rng = self.verify_rng(s, seq)?;
        let verdict = verify_sampled_tree(&st.tree, &ps, n_vocab, &mut rng)?;
        let tuning = self.seqs[s].outstanding.as_ref().and_then(|o| o.tuning);
        // the nodes verification reached: the anchor, then the accepted path
        let reached: Vec<(VerifiedNode, usize)> = std::iter::once(None)
            .chain(verdict.path.iter().map(|&i| Some(i)))
            .filter(|_| tuning.is_some())
            .map(|at| (VerifiedNode::of_tree(&st.tree, at), at.map_or(0, |i| i + 1)))
            .collect();
        let path: Vec<i32> = verdict.path.iter().map(|&i| i as i32).collect();
        self.observe_sampled_growth(s, &verdict.path);
        self.accept_tree(seq, &path)?;
        self.seqs[s].rng.as_mut().expect("accept_tree keeps the generators").verify = rng;
        for (node, row) in &reached {
            self.observe_node(tuning, node, ps[*row]);
        }
        out[..verdict.tokens.len()].copy_from_slice(&verdict.tokens);
        if let Some(p) = path_out {
            p[..path.len()].copy_from_slice(&path);
        }
        Ok(verdict.tokens.len())
    }
}
