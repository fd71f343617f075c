//! The DFlash2 engine: one per target context. It owns the draft model and
//! context, maps every committed target row to a dense draft position, injects
//! the target's tap features into the draft KV, decodes the noise blocks of all
//! drafting sequences together, walks the selector lattice, and keeps the draft
//! KV equal to the accepted prefix of every sequence.
//!
//! This file holds the engine and what it reports; `parts` the parts of its
//! state (what it reads from the target, the drafter, the controller, the
//! trees' growth); each step lives in its own file: `feed` (target rows in:
//! process, accept), `draft_step`, `verify`, `memory` (the host's memory
//! operations), `state` (save and restore), `tree_step` (tree drafts over the
//! same decode, accept_tree), `tree_sampled` (trees at temperature > 0 and
//! their lossless verification).

mod claim;
mod draft_step;
pub mod drafter;
mod estimate;
mod feed;
mod memory;
mod parts;
pub mod placement;
mod row_queue;
mod sampled;
mod sequence;
mod setup;
mod state;
mod state_blob;
pub mod stats;
mod tree_kv;
mod tree_sampled;
mod tree_step;
mod tuning;
mod verify;

use std::path::Path;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::log;
use crate::sys::{Device, MemoryUse, TargetContext};

pub use crate::config::DraftGraph;
pub use drafter::Drafter;
pub use estimate::{MemoryEstimate, estimate_memory};
use parts::{Controller, DraftSide, TargetLink, TreeGrowth};
use sequence::Sequence;
pub use setup::Limits;
/// The drafter of an engine without the engine: for the parity checks of
/// the two draft graphs on the same inputs (tests/draft_graph_parity.rs).
#[doc(hidden)]
pub use setup::{Setup, create as create_drafter};
use stats::Stats;
pub use tree_kv::seq_ids as tree_kv_seq_ids;
pub use tree_step::TreeRequest;

/// A row of the batch the target just decoded.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// Index of the row in the target batch (its captured layer-input row).
    pub i_batch: i32,
    pub seq: i32,
    /// Target position (the first component for M-RoPE).
    pub pos: i32,
    /// Decoded from an embedding (an image or audio row), not a token.
    pub embd: bool,
    /// The row's token when the host said (`crate::ngram` reads the text).
    pub token: Option<i32>,
}

/// One sequence's part of a draft call.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request {
    pub seq: i32,
    /// The last token the host sampled; the target has not decoded it yet.
    pub id_last: i32,
    pub n_max: i32,
    /// The host's sampling temperature: 0 drafts the greedy chain; > 0 a
    /// sampled draft with q (`sampled`).
    pub temperature: f32,
    /// Temperature of the draft walk at temperature > 0; <= 0: the engine's
    /// choice (`tuning`), or `temperature` with adaptation off.
    pub draft_temperature: f32,
    /// Seeds the sequence's generators (sampled drafts only).
    pub seed: u32,
    /// The host sampler's top-k / top-p / min-p, applied to q too (sampled
    /// drafts only; `crate::truncation`).
    pub truncation: crate::truncation::Truncation,
}

/// What the engine holds for one sequence (for hosts and tests to check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqInfo {
    pub n_in_kv: usize,
    pub n_queued: usize,
    pub n_held: usize,
    /// Tokens of the draft awaiting accept(), or None.
    pub outstanding: Option<usize>,
    pub next_draft_pos: i32,
    pub last_target_pos: Option<i32>,
    /// Cells of the sequence in the draft KV, from its cache (-1 when empty).
    pub kv_pos_min: i32,
    pub kv_pos_max: i32,
}

/// The engine: the host's target context and what the engine reads from it,
/// the drafter, one state per sequence, the controller and the trees'
/// growth, the statistics (`parts` says what each part holds).
pub struct Engine {
    /// Dropped first (fields drop in order), as it always was.
    drafter: DraftSide,
    target: TargetContext,
    link: TargetLink,
    seqs: Vec<Sequence>,
    controller: Controller,
    growth: TreeGrowth,
    stats: Stats,
    /// The target's KV bookkeeping of trees, once the host handed it over
    /// (`tree_kv`).
    tree_kv: Option<tree_kv::TreeKv>,
    /// Released after Drop turned the capture off (fields drop after drop()).
    _claim: claim::TargetClaim,
}

impl Engine {
    /// Creates an engine for the host's target context.
    pub fn new(target: TargetContext, path: &Path, config: &Config) -> Result<Engine> {
        let claim = claim::TargetClaim::take(target.as_ptr() as usize)?;
        let s = setup::create(&target, path, config)?;
        let taps: Vec<u32> = s.ckpt.hparams.target_layers.iter().map(|&l| l as u32).collect();
        let link = TargetLink::attach(&target, taps, config);
        let drafter = DraftSide::new(s);
        log::info(&format!(
            "drafter '{}': block {} (n_max {}), top-k {}, taps {:?}, {} sequence(s), {} draft graph",
            path.display(),
            drafter.limits.block_size,
            drafter.limits.n_max,
            drafter.top_k,
            link.taps,
            config.n_seq,
            drafter.model.graph().name()
        ));
        Ok(Engine {
            seqs: (0..config.n_seq).map(|_| Sequence::new(link.n_feat)).collect(),
            controller: Controller::new(config, &drafter.limits),
            growth: TreeGrowth::new(config, &drafter.limits),
            stats: Stats::default(),
            drafter,
            target,
            link,
            tree_kv: None,
            _claim: claim,
        })
    }

    pub fn limits(&self) -> Limits {
        self.drafter.limits
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats = Stats::default();
    }

    /// What the drafter holds: weights, KV cache, compute buffers.
    pub fn memory_use(&self) -> Result<MemoryUse> {
        self.memory_use_on(None)
    }

    /// What the drafter holds on one device (None: on all of them).
    pub fn memory_use_on(&self, device: Option<&Device>) -> Result<MemoryUse> {
        self.drafter
            .model
            .memory_use(device)
            .ok_or_else(|| Error::backend("libllama could not report the draft context's memory"))
    }

    /// The devices the drafter was placed on (empty: the CPU only).
    pub fn draft_devices(&self) -> Vec<Device> {
        self.drafter.model.devices()
    }

    /// Bytes of the drafter's weights.
    pub fn weight_bytes(&self) -> u64 {
        self.drafter.model.weight_bytes()
    }

    /// The graph that computes the drafter's forward.
    pub fn draft_graph(&self) -> DraftGraph {
        self.drafter.model.graph()
    }

    /// Sequences the engine serves (ids 0 .. n_seq-1).
    pub fn n_seq(&self) -> usize {
        self.seqs.len()
    }

    fn seq_index(&self, seq: i32) -> Result<usize> {
        if seq >= 0 && (seq as usize) < self.seqs.len() {
            Ok(seq as usize)
        } else {
            Err(Error::unknown_sequence(seq, self.seqs.len()))
        }
    }

    pub fn seq_info(&self, seq: i32) -> Result<SeqInfo> {
        let s = self.seq_index(seq)?;
        let q = &self.seqs[s];
        Ok(SeqInfo {
            n_in_kv: q.map.in_kv().len(),
            n_queued: q.queued.len(),
            n_held: q.held.len(),
            outstanding: q.outstanding.as_ref().map(|o| o.tokens.len()),
            next_draft_pos: q.map.next_draft_pos(),
            last_target_pos: q.last_target_pos(),
            kv_pos_min: self.drafter.model.seq_pos_min(seq),
            kv_pos_max: self.drafter.model.seq_pos_max(seq),
        })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.link.detach(&self.target);
    }
}
