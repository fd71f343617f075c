//! Reading facts about a libllama model.

use std::ffi::CStr;

use super::*;

/// What libllama says about a target model that a drafter must match
/// (`crate::checkpoint::check_target` checks it): plain data, no judgement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetFacts {
    pub architecture: String,
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_vocab: u32,
}

/// Reads the metadata string `key` of a model; `None` when absent.
///
/// # Safety
/// `model` must be a live `llama_model`.
unsafe fn meta_str(model: *const llama_model, key: &CStr) -> Option<String> {
    let mut buf = vec![0u8; 256];
    // SAFETY: the caller guarantees the model; buf outlives the call and its size is passed.
    let n = unsafe { llama_model_meta_val_str(model, key.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return None;
    }
    let n = (n as usize).min(buf.len() - 1);
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Architecture, sizes and vocabulary of a target model.
///
/// # Safety
/// `model` must be a live `llama_model`.
pub unsafe fn target_facts(model: *const llama_model) -> TargetFacts {
    // SAFETY: the caller guarantees the model for all reads below.
    unsafe {
        let vocab = llama_model_get_vocab(model);
        TargetFacts {
            architecture: meta_str(model, c"general.architecture").unwrap_or_default(),
            n_embd: llama_model_n_embd(model).max(0) as u32,
            n_layer: llama_model_n_layer(model).max(0) as u32,
            n_vocab: if vocab.is_null() { 0 } else { llama_vocab_n_tokens(vocab).max(0) as u32 },
        }
    }
}
