//! The target's token embeddings and output head, as tensors the library's
//! draft graph reads in place: a drafter without its own embeddings or head
//! uses the target's (libllama's dflash graph does the same through
//! ctx_other), in whatever buffer libllama placed them, never copied.

use std::ffi::CString;
use std::ptr::NonNull;

use super::ggml::Tensor;
use super::ggml::meta::{self, Layout};
use super::*;
use crate::error::{Error, Result};

/// A part of the target's output head (`crate::draft`'s `HeadSlice`).
struct HeadPart {
    weight: NonNull<ggml_tensor>,
    scale: Option<NonNull<ggml_tensor>>,
    /// Vocabulary id of its first row.
    first: i64,
}

/// Tensors of the target model, which outlives the engine (the host's
/// contract, as for `TargetContext`).
pub struct TargetHead {
    tok_embd: NonNull<ggml_tensor>,
    /// The whole head, or (split by tensor) its vocabulary slices in order.
    output: Vec<HeadPart>,
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

fn raw(t: Tensor<'_>) -> NonNull<ggml_tensor> {
    NonNull::new(t.as_ptr()).expect("a live tensor")
}

/// A tensor of a model split by tensor that every device holds whole: the
/// copy on `prefer` (else the first device's).
fn mirrored_on(t: NonNull<ggml_tensor>, prefer: Option<ggml_backend_dev_t>) -> Result<NonNull<ggml_tensor>> {
    let t = tensor(t);
    if !meta::is_meta(t) {
        return Ok(raw(t));
    }
    let pieces = meta::pieces(t)?;
    if pieces.layout != Layout::Mirrored {
        return Err(Error::unsupported(format!(
            "the target's {} is split by tensor over its devices; the draft graph reads it whole",
            t.name()
        )));
    }
    let piece = pieces.pieces.iter().find(|p| Some(p.device) == prefer).unwrap_or(&pieces.pieces[0]);
    Ok(raw(piece.tensor))
}

/// The target's token embeddings (the copy in host memory, where libllama
/// keeps its input layer), output head (`output.weight`, else the tied
/// `token_embd.weight`: the copy on the head's device) and its scale.
#[allow(clippy::type_complexity)]
fn locate(
    target: &TargetContext,
) -> Result<(NonNull<ggml_tensor>, NonNull<ggml_tensor>, Option<NonNull<ggml_tensor>>)> {
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
    let scale = named(target, "output.scale").and_then(|v| v.first().copied());
    Ok((tok_embd, output, scale))
}

impl TargetHead {
    /// Finds the target's token embeddings (the copy in host memory, where
    /// libllama keeps its input layer) and output head (`output.weight`, else
    /// the tied `token_embd.weight`: the copy on the head's device). A head
    /// split by tensor (`-sm tensor`) is read as its per-device slices: by
    /// vocabulary rows, or the copy on `prefer` when every device holds it all.
    pub fn find(target: &TargetContext, prefer: Option<ggml_backend_dev_t>) -> Result<TargetHead> {
        let (tok_embd, output, scale) = locate(target)?;
        let tok_embd = mirrored_on(tok_embd, prefer)?;
        let output = if !meta::is_meta(tensor(output)) {
            vec![HeadPart { weight: output, scale, first: 0 }]
        } else {
            let pieces = meta::pieces(tensor(output))?;
            match pieces.layout {
                Layout::Mirrored => {
                    let weight = mirrored_on(output, prefer)?;
                    let dev = tensor(weight).device().map(|d| d.dev);
                    let scale = scale.map(|s| mirrored_on(s, dev)).transpose()?;
                    vec![HeadPart { weight, scale, first: 0 }]
                }
                // output.weight is [n_embd, n_vocab]: its rows are the vocabulary
                Layout::Split { axis: 1 } => pieces
                    .pieces
                    .iter()
                    .map(|p| {
                        let scale = scale.map(|s| mirrored_on(s, Some(p.device))).transpose()?;
                        Ok(HeadPart { weight: raw(p.tensor), scale, first: p.first })
                    })
                    .collect::<Result<Vec<_>>>()?,
                Layout::Split { axis } => {
                    return Err(Error::unsupported(format!(
                        "the target's output head is split by tensor along axis {axis}, not by vocabulary rows: \
                         the draft graph cannot read it"
                    )));
                }
            }
        };
        Ok(TargetHead { tok_embd, output })
    }

    /// The devices that hold the target's output head, in order, when the
    /// target is split by tensor (every device of the split: each holds a
    /// slice or a copy); None when it is not.
    pub fn split_devices(target: &TargetContext) -> Result<Option<Vec<Device>>> {
        let (_, output, _) = locate(target)?;
        if !meta::is_meta(tensor(output)) {
            return Ok(None);
        }
        let pieces = meta::pieces(tensor(output))?;
        // SAFETY: devices of a live model.
        Ok(Some(pieces.pieces.iter().map(|p| unsafe { Device::describe(p.device) }).collect()))
    }

    pub fn tok_embd(&self) -> Tensor<'_> {
        tensor(self.tok_embd)
    }

    /// The head's parts: (weight, scale on its device, first vocabulary id).
    pub fn output(&self) -> Vec<(Tensor<'_>, Option<Tensor<'_>>, i64)> {
        self.output.iter().map(|p| (tensor(p.weight), p.scale.map(tensor), p.first)).collect()
    }
}
