//! Checking a drafter file before anything loads it.

use std::ffi::c_char;

use super::guard::{guard, guard_status, path_arg};
use crate::checkpoint::{self, Checkpoint, MAX_TARGET_LAYERS};
use crate::sys::{self, llama_model};

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
/// With `model_tgt` (may be NULL) it also checks the drafter against that
/// target: same n_embd and vocabulary, tap layers the target's architecture can
/// capture. `info` (may be NULL) receives what the checkpoint declares.
///
/// Returns 0, or LLAMA_SPEC_DFLASH2_ERR_IO / _BAD_CHECKPOINT / _INCOMPATIBLE /
/// _UNSUPPORTED / _NULL_ARGUMENT with the reason in llama_spec_dflash2_last_error().
/// `info` is written only on success.
///
/// # Safety
/// `path_draft` must be NULL or a NUL-terminated string, `model_tgt` NULL or a
/// live model, `info` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_checkpoint_check(
    path_draft: *const c_char,
    model_tgt: *const llama_model,
    info: *mut llama_spec_dflash2_checkpoint_info,
) -> i32 {
    guard_status(|| {
        // SAFETY: per the function's contract.
        let path = unsafe { path_arg(path_draft, "path_draft") }?;
        let ckpt = checkpoint::open(&path)?;
        if !model_tgt.is_null() {
            // SAFETY: non-null, live per the contract.
            let facts = unsafe { sys::target_facts(model_tgt) };
            checkpoint::check_target(&ckpt, &facts)?;
        }
        // SAFETY: NULL or writable per the contract.
        if let Some(out) = unsafe { info.as_mut() } {
            *out = llama_spec_dflash2_checkpoint_info::from(&ckpt);
        }
        Ok(())
    })
}

/// True when `path` is a GGUF with architecture `dflash` and a DFlash2 selector.
/// Reads the header only (no full validation, no load); false for NULL, missing
/// or unreadable files.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_is_dflash2(path: *const c_char) -> bool {
    guard(false, || {
        // SAFETY: per the function's contract.
        let path = unsafe { path_arg(path, "path") }?;
        Ok(checkpoint::sniff(&path))
    })
    .0
}
