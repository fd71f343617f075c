//! Whether a target split by tensor (`-sm tensor`) decodes on memory it wrote.
//!
//! llama.cpp rounds each device's slice of a weight down to the tensor's
//! granularity (whole groups of attention heads, quantization blocks), so a
//! device may hold none of a tensor: SmolLM2's attention (576 columns in units
//! of 384) goes all to one of two devices, alternating by layer. That device's
//! partial result is then never computed, and ggml's meta backend "zeroes" it
//! before the all-reduce by scaling it by 0 (ggml-backend-meta.cpp). Memory
//! nothing wrote may hold NaN or Inf — an attention mask's -inf left in the
//! compute buffer, or what an RPC server's earlier client left in reused
//! memory — and 0 x NaN is NaN: every logit NaN, greedy decoding answers
//! "........", depending only on where the allocator put that partial. The
//! engine's taps change the target graph's allocation, so attaching a drafter
//! moved it onto such bytes (issue 43); the target alone is as exposed.
//!
//! A ggml with dflash2's fix (scripts/ggml-fixes.py, meta-zero-fill) fills
//! those partials with 0. On any other ggml, a target with an empty slice is
//! refused: the engine would serve answers that depend on leftover memory.

use std::ffi::CStr;
use std::ptr::NonNull;

use super::ggml::Tensor;
use super::ggml::meta;
use super::{TargetContext, dflash2_shim_model_tensor_at};
use crate::error::{Error, Result};
use crate::log;

/// A tensor of the target with an empty slice on some devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmptySlice {
    pub tensor: String,
    /// The devices' names.
    pub devices: Vec<String>,
}

/// The target's tensors that leave a device without a slice, in the model's
/// order; empty when the target is not split by tensor (or this libllama does
/// not export its tensor list).
pub fn empty_slices(target: &TargetContext) -> Vec<EmptySlice> {
    let mut found = Vec::new();
    for i in 0.. {
        let mut name = std::ptr::null();
        // SAFETY: a live model; name receives a pointer into the model's tensor map.
        let Some(t) = NonNull::new(unsafe { dflash2_shim_model_tensor_at(target.model(), i, &mut name) }) else {
            break;
        };
        // SAFETY: a tensor of the live model.
        let tensor = unsafe { Tensor::from_raw(t.as_ptr()) };
        if let Some(devices) = meta::empty_slices(tensor).filter(|e| !e.is_empty()) {
            // SAFETY: a NUL-terminated name owned by the model's tensor map.
            let tensor =
                if name.is_null() { tensor.name() } else { unsafe { CStr::from_ptr(name) }.to_string_lossy().into() };
            found.push(EmptySlice { tensor, devices });
        }
    }
    found
}

/// Refuses a target split by tensor with an empty slice on a ggml that scales
/// the never-written partials by 0; says in one log line when the loaded ggml
/// fills them.
pub fn check(target: &TargetContext) -> Result<()> {
    let empty = empty_slices(target);
    let Some(first) = empty.first() else {
        return Ok(());
    };
    let summary = format!(
        "the target is split by tensor (-sm tensor) and {} of its tensors leave a device without a slice (first: {} \
         on {})",
        empty.len(),
        first.tensor,
        first.devices.join(", ")
    );
    if meta::fills_empty_slices() {
        log::info(&format!(
            "{summary}; this ggml fills those devices' partial results with 0 (dflash2's meta-zero-fill)"
        ));
        return Ok(());
    }
    Err(Error::unsupported(format!(
        "{summary}: llama.cpp rounds each slice down to the tensor's granularity, that device computes nothing there, \
         and this ggml zeroes its partial result by scaling memory nothing wrote by 0, which keeps NaN and Inf \
         (ggml-backend-meta.cpp, all-reduce fallback): T = 0 answers would depend on leftover memory (a target that \
         answers \"....\"). Use a ggml with dflash2's fix (the pinned build of scripts/llama-cpp.sh carries \
         scripts/ggml-fixes.py meta-zero-fill), a split that gives every device a slice of every tensor, or -sm layer"
    )))
}
