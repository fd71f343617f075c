//! The DFlash2 engine: one per target context. It owns the draft model and
//! context, maps every committed target row to a dense draft position, injects
//! the target's tap features into the draft KV, decodes the noise blocks of all
//! drafting sequences together, walks the selector lattice, and keeps the draft
//! KV equal to the accepted prefix of every sequence.
//!
//! This file holds the engine and what it reports; each step lives in its own
//! file: `feed` (target rows in: process, accept), `draft_step`, `verify`,
//! `memory` (the host's memory operations), `state` (save and restore),
//! `tree_step` (tree drafts over the same decode, accept_tree), `tree_sampled`
//! (trees at temperature > 0 and their lossless verification).

mod claim;
mod draft_step;
pub mod drafter;
mod estimate;
mod feed;
mod memory;
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

use crate::adaptive::{AcceptanceModel, AdaptivePolicy};
use crate::config::{Config, ImageRows, Walk};
use crate::error::{Error, Result};
use crate::log;
use crate::ngram::NgramAcceptance;
use crate::sys::{Device, MemoryUse, TargetContext};

pub use crate::config::DraftGraph;
pub use drafter::Drafter;
pub use estimate::{MemoryEstimate, estimate_memory};
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

pub struct Engine {
    drafter: Drafter,
    target: TargetContext,
    taps: Vec<u32>,
    n_embd_tgt: usize,
    n_feat: usize,
    n_embd_draft: usize,
    top_k: usize,
    n_vocab: usize,
    mask_token: i32,
    limits: Limits,
    can_shift: bool,
    skip_image_rows: bool,
    seqs: Vec<Sequence>,
    fingerprint: u64,
    decode_marker_at_init: u64,
    target_decoded: bool,
    stats: Stats,
    scratch: Vec<f32>,
    /// The adaptive walk's model; it keeps its own clocks.
    policy: Option<AdaptivePolicy>,
    /// Every child of a greedy tree's reached nodes, accepted or not: what
    /// calibrates the growth key of the next trees (`crate::calibration`).
    tree_acceptance: AcceptanceModel,
    /// The same for sampled trees, per depth and sibling index, from the
    /// children their verification tested (`calibration::sampled_model`).
    sampled_tree_acceptance: AcceptanceModel,
    /// Whether sampled trees grow by it (else by the raw expected q).
    calibrate_sampled_trees: bool,
    /// N-gram branches per tree draft (0: none) and what the target
    /// accepted of them (`crate::ngram`).
    ngram_branches: usize,
    ngram_acceptance: NgramAcceptance,
    /// How a sampled tree's parents choose their first child.
    /// None: by each tree's size (`FirstChild::for_tree`).
    first_child: Option<crate::tree::FirstChild>,
    /// Scores of candidate draft temperatures, for sampled requests that
    /// leave theirs unset (None: tuning off, they take their temperature).
    draft_temperatures: Option<crate::draft_temperature::DraftTemperatures>,
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
        let n_embd_tgt = target.n_embd();
        let n_feat = taps.len() * n_embd_tgt;
        for &lid in &taps {
            target.set_layer_capture(lid, true);
        }
        let decode_marker_at_init = target.decode_marker();
        let can_shift = s.drafter.can_shift();
        log::info(&format!(
            "drafter '{}': block {} (n_max {}), top-k {}, taps {:?}, {} sequence(s), {} draft graph",
            path.display(),
            s.limits.block_size,
            s.limits.n_max,
            s.ckpt.hparams.selector_top_k,
            taps,
            config.n_seq,
            s.drafter.graph().name()
        ));
        Ok(Engine {
            n_feat,
            n_embd_draft: s.drafter.n_embd(),
            top_k: s.ckpt.hparams.selector_top_k as usize,
            n_vocab: s.ckpt.hparams.n_vocab as usize,
            mask_token: s.ckpt.mask_token as i32,
            limits: s.limits,
            can_shift,
            skip_image_rows: config.image_rows == ImageRows::Skip,
            seqs: (0..config.n_seq).map(|_| Sequence::new(n_feat)).collect(),
            drafter: s.drafter,
            target,
            taps,
            n_embd_tgt,
            fingerprint: s.ckpt.fingerprint(),
            decode_marker_at_init,
            target_decoded: false,
            tree_kv: None,
            _claim: claim,
            stats: Stats::default(),
            scratch: Vec::new(),
            policy: (config.walk == Walk::Adaptive).then(|| AdaptivePolicy::new(s.limits.n_max)),
            tree_acceptance: AcceptanceModel::new(s.limits.n_max.max(1)),
            sampled_tree_acceptance: crate::calibration::sampled_model(),
            ngram_branches: config.ngram_branches,
            ngram_acceptance: NgramAcceptance::default(),
            first_child: config.first_child,
            draft_temperatures: config.adapt_sampled_drafts.then(Default::default),
            calibrate_sampled_trees: config.adapt_sampled_drafts,
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
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
            .memory_use(device)
            .ok_or_else(|| Error::backend("libllama could not report the draft context's memory"))
    }

    /// The devices the drafter was placed on (empty: the CPU only).
    pub fn draft_devices(&self) -> Vec<Device> {
        self.drafter.devices()
    }

    /// Bytes of the drafter's weights.
    pub fn weight_bytes(&self) -> u64 {
        self.drafter.weight_bytes()
    }

    /// The graph that computes the drafter's forward.
    pub fn draft_graph(&self) -> DraftGraph {
        self.drafter.graph()
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
            kv_pos_min: self.drafter.seq_pos_min(seq),
            kv_pos_max: self.drafter.seq_pos_max(seq),
        })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for &lid in &self.taps {
            self.target.set_layer_capture(lid, false);
        }
    }
}
