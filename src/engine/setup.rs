//! Creating an engine: check the drafter against the target, settle block size
//! and draft limits, place and load the drafter, size and configure its context.

use std::path::Path;

use crate::checkpoint::{self, Checkpoint, Opened, TargetFacts};
use crate::config::{Config, DraftGraph};
use crate::draft::{OwnDrafter, OwnSetup};
use crate::error::{Error, Result};
use crate::log;
use crate::params::LLAMA_SPEC_DFLASH2_MAX_DRAFT;
use crate::sys::DeviceKind;
use crate::sys::{
    Batch, ContextSetup, Device, DraftContext, DraftModel, ModelLoad, TargetContext, TargetHead, ggml_backend_dev_t,
    registered_devices,
};

use super::drafter::{Drafter, LibllamaDrafter};
use super::estimate::estimate_for;
use super::placement::{self, Placement, PlacementInput};

/// Candidate ids travel through the lattice as f32, exact below 2^24.
const MAX_VOCAB: u32 = 1 << 24;

/// Limits settled from the params and the drafter.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Noise block width (anchor + masks) in use; at most the trained one.
    pub block_size: usize,
    pub n_max: usize,
    pub n_min: usize,
    pub p_min: f32,
}

pub fn limits(config: &Config, ckpt: &Checkpoint) -> Result<Limits> {
    let trained = ckpt.block_size as usize;
    let block_size = match config.block_size {
        None => trained,
        Some(b) if b > trained => {
            return Err(Error::invalid(format!(
                "block_size {b} exceeds the drafter's trained block size {trained}; only smaller blocks are allowed"
            )));
        }
        Some(b) => b,
    };
    if block_size - 1 > LLAMA_SPEC_DFLASH2_MAX_DRAFT {
        return Err(Error::unsupported(format!(
            "block size {block_size} drafts more than {LLAMA_SPEC_DFLASH2_MAX_DRAFT} tokens; set a smaller block_size"
        )));
    }
    let most = block_size - 1;
    let n_max = match config.n_max {
        None => most,
        Some(n) if n > most => {
            log::warn(&format!("n_max {n} exceeds what a block of {block_size} drafts; clamping n_max to {most}"));
            most
        }
        Some(n) => n,
    };
    let mut n_min = config.n_min;
    if n_min > n_max {
        log::warn(&format!("n_min {n_min} exceeds the effective n_max {n_max}; clamping n_min to {n_max}"));
        n_min = n_max;
    }
    Ok(Limits { block_size, n_max, n_min, p_min: config.p_min })
}

/// The drafter's devices by the placement rule (`placement`), checked for room
/// on them against the drafter's estimate.
fn place_drafter(config: &Config, ckpt: &Checkpoint, target: &TargetContext, n_ctx_seq: u32) -> Result<Placement> {
    let named =
        config.devices.as_deref().map(|named| placement::resolve_named(named, &registered_devices())).transpose()?;
    let reads_target_head = !(ckpt.own_embd && ckpt.own_head);
    let head = target.output_device();
    let head_slices = match &head {
        Some(h) if h.kind == DeviceKind::Meta && reads_target_head => match TargetHead::split_devices(target) {
            Ok(devices) => devices.unwrap_or_default(),
            Err(e) => {
                log::warn(&format!("the target's head is split by tensor: {}", e.message));
                Vec::new()
            }
        },
        _ => Vec::new(),
    };
    let placement = placement::choose(PlacementInput {
        named,
        reads_target_head,
        head,
        target_devices: &target.devices(),
        head_slices: &head_slices,
    })?;
    // a drafter partly kept on the CPU (n_gpu_layers) needs less than the estimate there
    if config.n_gpu_layers.is_none() {
        let bytes = estimate_for(ckpt, Some(target.n_embd() as u32), config, n_ctx_seq)?.total();
        placement::check_room(&placement.layers, Device::memory, bytes)?;
    }
    log::info(&format!("drafter on {}", placement.describe()));
    Ok(placement)
}

/// Everything an engine owns once created.
pub struct Setup {
    pub ckpt: Checkpoint,
    pub limits: Limits,
    pub drafter: Drafter,
}

/// Sizes the draft context needs for these limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextSize {
    /// Cells asked for per sequence: the target's context plus a noise block.
    pub n_ctx_seq: u32,
    pub n_ubatch: u32,
}

/// Every sequence's noise block must fit one ubatch (non-causal attention needs
/// the whole block in one pass); each sequence's KV stream is as long as the
/// target's plus room for a noise block.
pub fn context_size(config: &Config, limits: &Limits, n_ctx_seq_target: u32) -> Result<ContextSize> {
    let n_noise = config.n_seq * limits.block_size;
    let n_ubatch = match config.n_ubatch {
        None => n_noise.max(512) as u32,
        Some(n) if (n as usize) < n_noise => {
            return Err(Error::invalid(format!(
                "n_ubatch {n} cannot hold one block of every sequence ({} x {})",
                config.n_seq, limits.block_size
            )));
        }
        Some(n) => n,
    };
    Ok(ContextSize { n_ctx_seq: n_ctx_seq_target + limits.block_size as u32, n_ubatch })
}

/// Opens and checks a drafter, against the target when one is given; the
/// file stays open for loading its tensors.
pub fn open_drafter_file(path: &Path, target: Option<&TargetFacts>) -> Result<Opened> {
    let opened = checkpoint::open_file(path)?;
    let ckpt = &opened.ckpt;
    if let Some(target) = target {
        checkpoint::check_target(ckpt, target)?;
    }
    if ckpt.hparams.n_vocab > MAX_VOCAB {
        return Err(Error::unsupported(format!(
            "vocabulary of {} tokens: candidate ids travel as f32 and are exact only below 2^24",
            ckpt.hparams.n_vocab
        )));
    }
    Ok(opened)
}

/// Opens and checks a drafter, against the target when one is given.
pub fn open_drafter(path: &Path, target: Option<&TargetFacts>) -> Result<Checkpoint> {
    open_drafter_file(path, target).map(|o| o.ckpt)
}

/// The graph that serves this drafter: the one asked for, except that the
/// own graph falls back to libllama's (said in one log line) for what it
/// does not cover; a plain DFlash drafter has only the own graph.
fn choose_graph(config: &Config, ckpt: &Checkpoint, target: &TargetContext) -> Result<DraftGraph> {
    let reads_target = !(ckpt.own_embd && ckpt.own_head);
    let split_head = reads_target && target.output_device().is_some_and(|d| d.kind == DeviceKind::Meta);
    let split_refusal = |why: &str| {
        Error::unsupported(format!(
            "the target's output head is split by tensor (-sm tensor) and only the library's own draft graph reads \
             it by slices; {why}"
        ))
    };
    if split_head && config.draft_graph == DraftGraph::Libllama {
        return Err(split_refusal("draft_graph libllama asked for libllama's, which cannot"));
    }
    if config.draft_graph == DraftGraph::Libllama {
        if !ckpt.selector {
            return Err(Error::unsupported(
                "a plain DFlash drafter (no candidate selector) runs on the library's own draft graph only; \
                 draft_graph libllama serves DFlash2 drafters",
            ));
        }
        return Ok(DraftGraph::Libllama);
    }
    let why_not =
        crate::draft::spec::not_covered(ckpt, config.type_k, config.type_v).or_else(|| {
            match TargetHead::find(target, None) {
                Err(e) if reads_target => Some(e.message),
                _ => None,
            }
        });
    match why_not {
        None => Ok(DraftGraph::Own),
        Some(why) if split_head => Err(split_refusal(&format!("the own graph cannot serve this drafter: {why}"))),
        Some(why) if ckpt.selector => {
            log::warn(&format!("draft graph: libllama's, not the library's own: {why}"));
            Ok(DraftGraph::Libllama)
        }
        Some(why) => {
            Err(Error::unsupported(format!("a plain DFlash drafter needs the library's own draft graph: {why}")))
        }
    }
}

pub fn create(target: &TargetContext, path: &Path, config: &Config) -> Result<Setup> {
    // before any llama.cpp struct is passed by value: the one it was built against?
    crate::sys::llama_check::check()?;
    // the host's sequence ids are the target's: more than it has cannot occur
    if config.n_seq > target.n_seq_max() as usize {
        return Err(Error::invalid(format!(
            "n_seq = {} exceeds the target context's n_seq_max ({})",
            config.n_seq,
            target.n_seq_max()
        )));
    }
    crate::sys::split::check(target)?;
    let opened = open_drafter_file(path, Some(&target.facts()))?;
    let ckpt = &opened.ckpt;
    let limits = limits(config, ckpt)?;
    let placement = place_drafter(config, ckpt, target, target.n_ctx_seq())?;
    let size = context_size(config, &limits, target.n_ctx_seq())?;
    let (_, tgt_threads_batch) = target.n_threads();

    let drafter = match choose_graph(config, ckpt, target)? {
        DraftGraph::Own => Drafter::Own(Box::new(OwnDrafter::new(
            &opened,
            &OwnSetup {
                target,
                layers: &placement.layers,
                head: placement.head.as_ref(),
                n_gpu_layers: config.n_gpu_layers,
                type_k: config.type_k,
                type_v: config.type_v,
                n_cells: size.n_ctx_seq,
                n_seq: config.n_seq,
                n_ubatch: size.n_ubatch,
                // every decode of the drafter is a batch of rows
                n_threads: config.n_threads_batch.unwrap_or(tgt_threads_batch),
            },
        )?)),
        DraftGraph::Libllama => Drafter::Libllama(libllama_drafter(path, config, ckpt, target, &placement, &size)?),
    };
    Ok(Setup { ckpt: opened.ckpt, limits, drafter })
}

/// The drafter on libllama's `dflash` graph: a model and context libllama
/// creates, the target as its ctx_other.
fn libllama_drafter(
    path: &Path,
    config: &Config,
    ckpt: &Checkpoint,
    target: &TargetContext,
    placement: &Placement,
    size: &ContextSize,
) -> Result<LibllamaDrafter> {
    let devices: Vec<ggml_backend_dev_t> = placement.layers.iter().map(|d| d.dev).collect();
    let model = DraftModel::load(
        path,
        &ModelLoad {
            devices: &devices,
            head_device: placement.head.as_ref().map(|d| d.dev),
            n_gpu_layers: config.n_gpu_layers.map_or(-1, |n| n as i32),
            use_extra_bufts: config.use_extra_bufts,
        },
    )?;
    if model.selector_top_k() != ckpt.hparams.selector_top_k as i32 {
        return Err(Error::backend(format!(
            "libllama loaded the drafter with selector top-k {}, the file says {}",
            model.selector_top_k(),
            ckpt.hparams.selector_top_k
        )));
    }

    // one KV stream per sequence: a noise block attends to its own sequence only
    let n_seq = config.n_seq as u32;
    let (tgt_threads, tgt_threads_batch) = target.n_threads();
    let ctx = DraftContext::new(
        &model,
        &ContextSetup {
            n_ctx: size.n_ctx_seq * n_seq,
            n_batch: size.n_ubatch,
            n_ubatch: size.n_ubatch,
            n_seq,
            kv_unified: n_seq == 1,
            type_k: config.type_k.map(|t| t as i32),
            type_v: config.type_v.map(|t| t as i32),
            n_threads: config.n_threads.unwrap_or(tgt_threads),
            n_threads_batch: config.n_threads_batch.unwrap_or(tgt_threads_batch),
            ctx_other: target.as_ptr(),
        },
    )?;
    ctx.configure(ckpt.causal);
    let batch = Batch::new(&ctx)?;
    Ok(LibllamaDrafter { batch, ctx, model, sliding_window: ckpt.n_swa > 0 })
}
