//! The parts of an engine's state besides its sequences: what it reads from
//! the target (`TargetLink`), the drafter and the facts of its checkpoint
//! (`DraftSide`), what sizes and heats each step's drafts (`Controller`) and
//! what grows and calibrates its trees (`TreeGrowth`). `Engine` holds one of
//! each, with the target context, the sequences and the statistics.

use crate::adaptive::{AcceptanceModel, AdaptivePolicy};
use crate::config::{Config, ImageRows, Walk};
use crate::draft_temperature::DraftTemperatures;
use crate::ngram::NgramAcceptance;
use crate::sys::TargetContext;
use crate::tree::FirstChild;

use super::drafter::Drafter;
use super::setup::{Limits, Setup};

/// What the engine reads from the host's target context: the layers it taps
/// (their capture is on while the engine lives), the size of a row's
/// features, and whether the target has decoded since the engine began (rows
/// of a batch decoded before would carry no features).
pub(super) struct TargetLink {
    /// Target layers whose inputs make a row's features, in feature order.
    pub taps: Vec<u32>,
    /// The target's embedding size: floats of one tapped layer's row.
    pub n_embd: usize,
    /// Floats of a row's features: taps × n_embd.
    pub n_feat: usize,
    /// The target's decode marker when the engine began, and whether it has
    /// moved since (process() checks it until then).
    pub decode_marker_at_init: u64,
    pub decoded: bool,
    /// Image and audio rows are skipped, not injected (`ImageRows::Skip`).
    pub skip_image_rows: bool,
    /// One row's features while process() gathers them from the taps.
    pub scratch: Vec<f32>,
}

impl TargetLink {
    /// Turns on the capture of `taps` in `target` and notes its decode marker.
    pub fn attach(target: &TargetContext, taps: Vec<u32>, config: &Config) -> TargetLink {
        let n_embd = target.n_embd();
        for &lid in &taps {
            target.set_layer_capture(lid, true);
        }
        TargetLink {
            n_feat: taps.len() * n_embd,
            taps,
            n_embd,
            decode_marker_at_init: target.decode_marker(),
            decoded: false,
            skip_image_rows: config.image_rows == ImageRows::Skip,
            scratch: Vec::new(),
        }
    }

    /// Turns the capture of the taps off again.
    pub fn detach(&self, target: &TargetContext) {
        for &lid in &self.taps {
            target.set_layer_capture(lid, false);
        }
    }
}

/// The drafter (the draft model and its context) with the facts of its
/// checkpoint that each step reads: the lattice's shape, the mask token, the
/// draft limits settled at creation, whether its cells may move, and the
/// fingerprint saved states are checked against.
pub(super) struct DraftSide {
    pub model: Drafter,
    /// The drafter's embedding size: floats of one lattice row.
    pub n_embd: usize,
    /// Candidates per lattice position (the selector's k).
    pub top_k: usize,
    pub n_vocab: usize,
    /// The token of a noise block's masked rows.
    pub mask_token: i32,
    pub limits: Limits,
    /// Whether the draft KV's cells may shift (`Drafter::can_shift`).
    pub can_shift: bool,
    /// The checkpoint's fingerprint, written into and checked in saved states.
    pub fingerprint: u64,
}

impl DraftSide {
    pub fn new(s: Setup) -> DraftSide {
        DraftSide {
            n_embd: s.drafter.n_embd(),
            top_k: s.ckpt.hparams.selector_top_k as usize,
            n_vocab: s.ckpt.hparams.n_vocab as usize,
            mask_token: s.ckpt.mask_token as i32,
            limits: s.limits,
            can_shift: s.drafter.can_shift(),
            fingerprint: s.ckpt.fingerprint(),
            model: s.drafter,
        }
    }
}

/// What decides each step's drafts from what the engine measured: the
/// adaptive walk (how much to draft, and for whom) and the draft
/// temperatures of sampled requests that leave theirs to the engine.
pub(super) struct Controller {
    /// The adaptive walk's model (None: the walk is not adaptive); it keeps
    /// its own clocks.
    pub policy: Option<AdaptivePolicy>,
    /// Scores of candidate draft temperatures, for sampled requests that
    /// leave theirs unset (None: tuning off, they take their temperature).
    pub draft_temperatures: Option<DraftTemperatures>,
}

impl Controller {
    pub fn new(config: &Config, limits: &Limits) -> Controller {
        Controller {
            policy: (config.walk == Walk::Adaptive).then(|| AdaptivePolicy::new(limits.n_max)),
            draft_temperatures: config.adapt_sampled_drafts.then(Default::default),
        }
    }
}

/// How tree drafts grow, and what the verified trees taught: the measured
/// acceptance of their edges (greedy and sampled) and of their n-gram
/// branches, which order and price the next trees' nodes.
pub(super) struct TreeGrowth {
    /// Every child of a greedy tree's reached nodes, accepted or not: what
    /// calibrates the growth key of the next trees (`crate::calibration`).
    pub acceptance: AcceptanceModel,
    /// The same for sampled trees, per depth and sibling index, from the
    /// children their verification tested (`calibration::sampled_model`).
    pub sampled_acceptance: AcceptanceModel,
    /// Whether sampled trees grow by it (else by the raw expected q).
    pub calibrate_sampled: bool,
    /// N-gram branches per tree draft (0: none) and what the target
    /// accepted of them (`crate::ngram`).
    pub ngram_branches: usize,
    pub ngram_acceptance: NgramAcceptance,
    /// How a sampled tree's parents choose their first child.
    /// None: by each tree's size (`FirstChild::for_tree`).
    pub first_child: Option<FirstChild>,
}

impl TreeGrowth {
    pub fn new(config: &Config, limits: &Limits) -> TreeGrowth {
        TreeGrowth {
            acceptance: AcceptanceModel::new(limits.n_max.max(1)),
            sampled_acceptance: crate::calibration::sampled_model(),
            calibrate_sampled: config.adapt_sampled_drafts,
            ngram_branches: config.ngram_branches,
            ngram_acceptance: NgramAcceptance::default(),
            first_child: config.first_child,
        }
    }
}
