//! Creating an engine: check the drafter against the target, settle block size
//! and draft limits, place and load the drafter, size and configure its context.

use std::path::Path;

use crate::checkpoint::{self, Checkpoint};
use crate::error::{Error, Result};
use crate::log;
use crate::params::{llama_spec_dflash2_image_rows, llama_spec_dflash2_params};
use crate::sys::{ContextSetup, DraftContext, DraftModel, ModelLoad, TargetContext, ggml_backend_dev_t};

use super::stats::LLAMA_SPEC_DFLASH2_MAX_DRAFT;

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

pub fn limits(params: &llama_spec_dflash2_params, ckpt: &Checkpoint) -> Result<Limits> {
    let trained = ckpt.block_size as usize;
    let block_size = match params.block_size {
        0 => trained,
        b if b as usize > trained => {
            return Err(Error::invalid(format!(
                "block_size {b} exceeds the drafter's trained block size {trained}; only smaller blocks are allowed"
            )));
        }
        b => b as usize,
    };
    if block_size - 1 > LLAMA_SPEC_DFLASH2_MAX_DRAFT {
        return Err(Error::unsupported(format!(
            "block size {block_size} drafts more than {LLAMA_SPEC_DFLASH2_MAX_DRAFT} tokens; set a smaller block_size"
        )));
    }
    let most = block_size - 1;
    let n_max = match params.n_max {
        -1 => most,
        n if n as usize > most => {
            log::warn(&format!("n_max {n} exceeds what a block of {block_size} drafts; clamping n_max to {most}"));
            most
        }
        n => n as usize,
    };
    let mut n_min = params.n_min as usize;
    if n_min > n_max {
        log::warn(&format!("n_min {n_min} exceeds the effective n_max {n_max}; clamping n_min to {n_max}"));
        n_min = n_max;
    }
    Ok(Limits { block_size, n_max, n_min, p_min: params.p_min })
}

/// The drafter goes on the target's devices by default: a drafter that shares
/// the target's output head and embeddings reads those tensors in its own graph,
/// so its scheduler must have the device that holds them (the crash of upstream's
/// drafter-on-another-GPU). Named devices must then include all of the target's.
fn choose_devices(
    named: Option<Vec<ggml_backend_dev_t>>,
    ckpt: &Checkpoint,
    target: &TargetContext,
) -> Result<Vec<ggml_backend_dev_t>> {
    let target_devices = target.devices();
    let Some(named) = named else {
        return Ok(target_devices);
    };
    let shares_target_tensors = !(ckpt.own_embd && ckpt.own_head);
    if shares_target_tensors {
        if let Some(missing) = target_devices.iter().find(|d| !named.contains(d)) {
            return Err(Error::incompatible(format!(
                "the drafter has no output head / token embeddings of its own and reads the target's, \
                 but params.devices leaves out a device of the target ({missing:?}); name every target \
                 device, or use a drafter with its own head"
            )));
        }
    }
    Ok(named)
}

/// Everything an engine owns once created.
pub struct Setup {
    pub ckpt: Checkpoint,
    pub limits: Limits,
    pub model: DraftModel,
    pub ctx: DraftContext,
    pub n_seq: usize,
    pub skip_image_rows: bool,
}

/// `devices` are the devices named in params (None: the default placement).
pub fn create(
    target: &TargetContext,
    path: &Path,
    params: &llama_spec_dflash2_params,
    devices: Option<Vec<ggml_backend_dev_t>>,
) -> Result<Setup> {
    params.validate()?;
    let ckpt = checkpoint::open(path)?;
    checkpoint::check_target(&ckpt, &target.facts())?;
    if ckpt.hparams.n_vocab > MAX_VOCAB {
        return Err(Error::unsupported(format!(
            "vocabulary of {} tokens: candidate ids travel as f32 and are exact only below 2^24",
            ckpt.hparams.n_vocab
        )));
    }
    let limits = limits(params, &ckpt)?;
    let devices = choose_devices(devices, &ckpt, target)?;
    let n_seq = params.n_seq as usize;

    // every sequence's noise block must fit one ubatch: non-causal attention
    // needs the whole block in one pass
    let n_noise = n_seq * limits.block_size;
    let n_ubatch = match params.n_ubatch {
        0 => n_noise.max(512) as u32,
        n if (n as usize) < n_noise => {
            return Err(Error::invalid(format!(
                "n_ubatch {n} cannot hold one block of every sequence ({n_seq} x {})",
                limits.block_size
            )));
        }
        n => n,
    };

    let model = DraftModel::load(
        path,
        &ModelLoad { devices: &devices, n_gpu_layers: params.n_gpu_layers, use_extra_bufts: params.use_extra_bufts },
    )?;
    if model.selector_top_k() != ckpt.hparams.selector_top_k as i32 {
        return Err(Error::new(
            crate::Status::LLAMA_SPEC_DFLASH2_ERR_BACKEND,
            format!(
                "libllama loaded the drafter with selector top-k {}, the file says {}",
                model.selector_top_k(),
                ckpt.hparams.selector_top_k
            ),
        ));
    }

    // one KV stream per sequence (a noise block attends to its own sequence
    // only), each as long as the target's plus room for a noise block
    let n_ctx_seq = target.n_ctx_seq() + limits.block_size as u32;
    let (tgt_threads, tgt_threads_batch) = target.n_threads();
    let pick = |v: i32, dflt: i32| if v > 0 { v } else { dflt };
    let ctx = DraftContext::new(
        &model,
        &ContextSetup {
            n_ctx: n_ctx_seq * params.n_seq,
            n_batch: n_ubatch,
            n_ubatch,
            n_seq: params.n_seq,
            kv_unified: params.n_seq == 1,
            type_k: (params.type_k >= 0).then_some(params.type_k),
            type_v: (params.type_v >= 0).then_some(params.type_v),
            n_threads: pick(params.n_threads, tgt_threads),
            n_threads_batch: pick(params.n_threads_batch, tgt_threads_batch),
            ctx_other: target.as_ptr(),
        },
    )?;
    ctx.configure(ckpt.causal);

    let skip_image_rows =
        params.image_rows_kind() == Some(llama_spec_dflash2_image_rows::LLAMA_SPEC_DFLASH2_IMAGE_ROWS_SKIP);
    Ok(Setup { ckpt, limits, model, ctx, n_seq, skip_image_rows })
}
