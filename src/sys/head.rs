//! The target's token embeddings and output head, as tensors the library's
//! draft graph reads in place: a drafter without its own embeddings or head
//! uses the target's (libllama's dflash graph does the same through
//! ctx_other), in whatever buffer libllama placed them, never copied.

use std::ffi::CString;
use std::ptr::NonNull;

use super::ggml::Tensor;
use super::*;
use crate::error::{Error, Result};

/// Tensors of the target model, which outlives the engine (the host's
/// contract, as for `TargetContext`).
pub struct TargetHead {
    tok_embd: NonNull<ggml_tensor>,
    output: NonNull<ggml_tensor>,
    output_scale: Option<NonNull<ggml_tensor>>,
}

// SAFETY: pointers into a model the host keeps alive; read-only use by one
// engine at a time.
unsafe impl Send for TargetHead {}

/// The target's tensors named `name`, in libllama's order; None when this
/// libllama does not export its tensor list.
fn named(target: &TargetContext, name: &str) -> Option<Vec<NonNull<ggml_tensor>>> {
    let cname = CString::new(name).ok()?;
    let mut out = [std::ptr::null_mut(); 8];
    // SAFETY: live model; out holds 8 pointers.
    let n = unsafe { dflash2_shim_model_tensors(target.model(), cname.as_ptr(), out.as_mut_ptr(), out.len() as i32) };
    if n < 0 {
        return None;
    }
    Some(out[..(n as usize).min(out.len())].iter().filter_map(|&p| NonNull::new(p)).collect())
}

fn tensor<'a>(ptr: NonNull<ggml_tensor>) -> Tensor<'a> {
    // SAFETY: a tensor of the target model, live as long as the engine that holds it.
    unsafe { Tensor::from_raw(ptr.as_ptr()) }
}

impl TargetHead {
    /// Finds the target's token embeddings (the copy in host memory, where
    /// libllama keeps its input layer) and output head (`output.weight`, else
    /// the tied `token_embd.weight`: the copy on the head's device).
    pub fn find(target: &TargetContext) -> Result<TargetHead> {
        let missing = |what: &str| {
            Error::unsupported(format!(
                "this libllama does not expose the target's {what} (llama_internal_get_tensor_map): the library's \
                 draft graph cannot read it; use draft_graph libllama"
            ))
        };
        let embd = named(target, "token_embd.weight").ok_or_else(|| missing("tensors"))?;
        let tok_embd = embd
            .iter()
            .copied()
            .find(|&t| tensor(t).in_host_memory())
            .or_else(|| embd.first().copied())
            .ok_or_else(|| missing("token embeddings"))?;
        let head_dev = target.output_device().map(|d| d.dev);
        let output = match named(target, "output.weight").and_then(|v| v.first().copied()) {
            Some(t) => t,
            None => embd
                .iter()
                .copied()
                .find(|&t| head_dev.is_some() && tensor(t).device().map(|d| d.dev) == head_dev)
                .or_else(|| embd.last().copied())
                .ok_or_else(|| missing("output head"))?,
        };
        let output_scale = named(target, "output.scale").and_then(|v| v.first().copied());
        Ok(TargetHead { tok_embd, output, output_scale })
    }

    pub fn tok_embd(&self) -> Tensor<'_> {
        tensor(self.tok_embd)
    }

    pub fn output(&self) -> Tensor<'_> {
        tensor(self.output)
    }

    pub fn output_scale(&self) -> Option<Tensor<'_>> {
        self.output_scale.map(tensor)
    }
}
