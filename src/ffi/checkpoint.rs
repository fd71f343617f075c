//! A drafter file before anything loads it: is it one, is it valid for this
//! target, how much memory will it take.

use std::ffi::c_char;

use super::boundary::{self, optional_output, output, path, target_model};
use crate::checkpoint::{self, Checkpoint, MAX_TARGET_LAYERS};
use crate::config::Config;
use crate::engine::estimate_memory;
use crate::params::llama_spec_dflash2_params;
use crate::sys::llama_model;

/// Capacity of `llama_spec_dflash2_checkpoint_info.target_layers`.
pub const LLAMA_SPEC_DFLASH2_MAX_TARGET_LAYERS: usize = 64;
const _: () = assert!(LLAMA_SPEC_DFLASH2_MAX_TARGET_LAYERS == MAX_TARGET_LAYERS);

/// What a DFlash2 drafter checkpoint declares, filled by
/// `llama_spec_dflash2_checkpoint_check()`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llama_spec_dflash2_checkpoint_info {
    /// Hidden size of the drafter (equal to the target's).
    pub n_embd: u32,
    /// Decoder layers of the drafter.
    pub n_layer: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    /// Feed-forward width of the first layer.
    pub n_ff: u32,
    /// Tokens in the drafter's vocabulary (the target's).
    pub n_vocab: u32,
    /// Rows of the draft head: the d2t length when present, else n_vocab.
    pub n_vocab_draft: u32,
    /// Trained block size: anchor + masks; at most block_size-1 tokens per draft.
    pub block_size: u32,
    /// Candidates per block position in the selector lattice.
    pub selector_top_k: u32,
    pub selector_rank: u32,
    pub conv_kernel_size: u32,
    pub conv_group_size: u32,
    /// Target layer inputs the drafter reads (llama.cpp layer-input indices).
    pub n_target_layers: u32,
    pub target_layers: [i32; LLAMA_SPEC_DFLASH2_MAX_TARGET_LAYERS],
    /// Sliding window of the draft attention; 0 = full attention.
    pub n_swa: u32,
    pub n_ctx_train: u32,
    /// Token that fills the masked block positions.
    pub mask_token: i32,
    /// Causal attention inside the block (non-causal by default).
    pub causal: bool,
    /// The drafter carries M-RoPE sections (made for an M-RoPE target).
    pub mrope: bool,
    /// The drafter has its own token embeddings (else it reads the target's).
    pub own_embd: bool,
    /// The drafter has its own output head (else it uses the target's).
    pub own_head: bool,
}

impl From<&Checkpoint> for llama_spec_dflash2_checkpoint_info {
    fn from(c: &Checkpoint) -> Self {
        let hp = &c.hparams;
        let mut target_layers = [0i32; LLAMA_SPEC_DFLASH2_MAX_TARGET_LAYERS];
        target_layers[..hp.target_layers.len()].copy_from_slice(&hp.target_layers);
        llama_spec_dflash2_checkpoint_info {
            n_embd: hp.n_embd,
            n_layer: hp.n_layer,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            n_ff: hp.n_ff[0],
            n_vocab: hp.n_vocab,
            n_vocab_draft: c.n_vocab_draft,
            block_size: c.block_size,
            selector_top_k: hp.selector_top_k,
            selector_rank: hp.selector_rank,
            conv_kernel_size: hp.conv_kernel,
            conv_group_size: hp.conv_group,
            n_target_layers: hp.target_layers.len() as u32,
            target_layers,
            n_swa: c.n_swa,
            n_ctx_train: c.n_ctx_train,
            mask_token: c.mask_token as i32,
            causal: c.causal,
            mrope: c.mrope,
            own_embd: c.own_embd,
            own_head: c.own_head,
        }
    }
}

/// Validates a DFlash2 drafter GGUF without loading it: architecture `dflash`,
/// every required key with its type, every tensor present with the shape the
/// keys imply and none that libllama would not claim, the mask token inside the
/// vocabulary. Truncated, corrupt or hostile files give an error, never a crash.
///
/// `path_draft` is a NUL-terminated path. With `model_tgt` (NULL allowed) it
/// also checks the drafter against that target: same n_embd and vocabulary,
/// tap layers the target's architecture can capture. `info` (NULL allowed)
/// receives what the checkpoint declares, on success only.
///
/// Returns 0, or LLAMA_SPEC_DFLASH2_ERR_IO / _BAD_CHECKPOINT / _INCOMPATIBLE /
/// _UNSUPPORTED / _NULL_ARGUMENT with the reason in llama_spec_dflash2_last_error().
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_checkpoint_check(
    path_draft: *const c_char,
    model_tgt: *const llama_model,
    info: *mut llama_spec_dflash2_checkpoint_info,
) -> i32 {
    boundary::status(|| {
        let ckpt = checkpoint::open(&path(path_draft, "path_draft")?)?;
        if !model_tgt.is_null() {
            checkpoint::check_target(&ckpt, &target_model(model_tgt, "model_tgt")?)?;
        }
        if let Some(out) = optional_output(info) {
            *out = llama_spec_dflash2_checkpoint_info::from(&ckpt);
        }
        Ok(())
    })
}

/// True when `path` (a NUL-terminated path) is a GGUF with architecture
/// `dflash` and a DFlash2 selector. Reads the header only (no full validation,
/// no load); false for NULL, missing or unreadable files.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_is_dflash2(path: *const c_char) -> bool {
    boundary::boolean(|| Ok(checkpoint::sniff(&boundary::path(path, "path")?)))
}

/// Writes to `*bytes` an estimate of the memory llama_spec_dflash2_init will
/// allocate for the drafter at `path_draft` (a NUL-terminated path) next to
/// the target `model_tgt`, with these `params`, for a target context of
/// `n_ctx_seq` cells per sequence (llama_n_ctx_seq of the target context). The
/// drafter goes on the target's devices (or params.devices); the bytes are the
/// total over them of three parts.
///
/// Weights: the drafter's tensor data, exactly (llama_model_size once loaded);
/// tensors it reads from the target stay the target's.
///
/// Draft KV, exactly: every layer's K and V rows (n_head_kv x head_dim values
/// in type_k / type_v, F16 by default) for params.n_seq streams of
/// n_ctx_seq + block_size cells each, rounded up to 256 cells as libllama does.
///
/// Compute buffers, estimated from above: per row of one ubatch (n_ubatch,
/// 512 by default) the head's logits in f32, the row's tap features and their
/// projection in f32 and the F16 attention mask over one stream; a quantized
/// KV type adds an F16 copy of one layer's K and V. libllama's allocator reuses
/// buffers between graph nodes, so it allocates up to about 15% less.
///
/// The host's own target KV and compute buffers are not included. Checks the
/// file and the params as llama_spec_dflash2_init would (same errors), without
/// loading anything. `model_tgt` may be NULL (a host sizing memory before it
/// loads its target, as llama-server does): the drafter is then not checked
/// against a target. Returns 0, or a negative status with the reason in
/// llama_spec_dflash2_last_error(); `*bytes` is written on success only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_estimate_memory(
    model_tgt: *const llama_model,
    path_draft: *const c_char,
    params: llama_spec_dflash2_params,
    n_ctx_seq: u32,
    bytes: *mut usize,
) -> i32 {
    boundary::status(|| {
        let facts = if model_tgt.is_null() { None } else { Some(target_model(model_tgt, "model_tgt")?) };
        let path = path(path_draft, "path_draft")?;
        let out = output(bytes, "bytes")?;
        let config = Config::from_c(&params, boundary::devices(params.devices)?)?;
        *out = estimate_memory(facts.as_ref(), &path, &config, n_ctx_seq)?.total() as usize;
        Ok(())
    })
}
