//! The metadata the drafter's forward pass computes with beyond its shapes:
//! norms, rope, scales and the activation, with libllama's defaults for what
//! a file leaves out (llama-model.cpp's general hparams, dflash.cpp's own).

use crate::error::{Error, Result};

use super::Hparams;
use super::keys::Keys;

/// The FFN's gate activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    #[default]
    Silu,
    /// `gelu` and `gelu_pytorch_tanh` (ggml's tanh approximation for both, as libllama).
    Gelu,
}

/// How the file scales rope positions (`dflash.rope.scaling.type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RopeScaling {
    #[default]
    None,
    Linear,
    /// YaRN, LongRoPE: libllama's graph serves them, the library's does not.
    Other,
}

/// Forward-pass metadata of a drafter.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    pub rms_eps: f32,
    /// Rotary dimensions (`dflash.rope.dimension_count`, else the head size).
    pub n_rot: u32,
    pub rope_freq_base: f32,
    /// 1 / the linear scaling factor (1 without scaling).
    pub rope_freq_scale: f32,
    pub rope_scaling: RopeScaling,
    pub rope_attn_factor: f32,
    /// Context the rope was trained on (`rope.scaling.original_context_length`,
    /// else the training context).
    pub n_ctx_orig: u32,
    /// `dflash.rope.dimension_sections`, zeros when absent.
    pub rope_sections: [i32; 4],
    /// 0: none.
    pub embedding_scale: f32,
    /// 0: 1 / sqrt(head size).
    pub attention_scale: f32,
    /// 0: none.
    pub value_scale: f32,
    /// 0: none (DFlash2 only, as libllama).
    pub logit_scale: f32,
    /// 0: none (DFlash2 only, as libllama).
    pub final_logit_softcap: f32,
    pub activation: Activation,
}

impl Default for Forward {
    fn default() -> Self {
        Forward {
            rms_eps: 1e-6,
            n_rot: 0,
            rope_freq_base: 10_000.0,
            rope_freq_scale: 1.0,
            rope_scaling: RopeScaling::None,
            rope_attn_factor: 1.0,
            n_ctx_orig: 0,
            rope_sections: [0; 4],
            embedding_scale: 0.0,
            attention_scale: 0.0,
            value_scale: 0.0,
            logit_scale: 0.0,
            final_logit_softcap: 0.0,
            activation: Activation::Silu,
        }
    }
}

/// Reads the forward metadata; the keys' types were checked by `validate`.
pub(super) fn read(keys: &Keys, hp: &Hparams) -> Result<Forward> {
    let f = |k: &str| keys.f32_opt(k).map(|v| v.unwrap_or(0.0));
    let rope_scaling = match keys.str_opt("dflash.rope.scaling.type")?.unwrap_or("linear") {
        "none" => RopeScaling::None,
        "linear" => RopeScaling::Linear,
        "yarn" | "longrope" => RopeScaling::Other,
        other => {
            return Err(Error::bad_checkpoint(format!(
                "dflash.rope.scaling.type '{other}' is not a rope scaling type"
            )));
        }
    };
    let factor = match keys.f32_opt("dflash.rope.scaling.factor")? {
        Some(x) => x,
        None => f("dflash.rope.scale_linear")?,
    };
    if factor < 0.0 {
        return Err(Error::bad_checkpoint(format!("rope scaling factor {factor}")));
    }
    let activation = match keys.str_opt("dflash.hidden_activation")? {
        None | Some("silu") => Activation::Silu,
        Some(_) => Activation::Gelu,
    };
    let n_ctx_train = keys.u32("dflash.context_length")?;
    let mut rope_sections = [0i32; 4];
    if let Some(s) = keys.i32_array_opt("dflash.rope.dimension_sections")? {
        for (d, v) in rope_sections.iter_mut().zip(s) {
            *d = v;
        }
    }
    Ok(Forward {
        rms_eps: keys.f32("dflash.attention.layer_norm_rms_epsilon")?,
        n_rot: keys.u32_opt("dflash.rope.dimension_count")?.unwrap_or(hp.head_dim),
        rope_freq_base: keys.f32_opt("dflash.rope.freq_base")?.unwrap_or(10_000.0),
        rope_freq_scale: if factor == 0.0 { 1.0 } else { 1.0 / factor },
        rope_scaling,
        rope_attn_factor: keys.f32_opt("dflash.rope.scaling.attn_factor")?.unwrap_or(1.0),
        n_ctx_orig: keys.u32_opt("dflash.rope.scaling.original_context_length")?.unwrap_or(n_ctx_train),
        rope_sections,
        embedding_scale: f("dflash.embedding_scale")?,
        attention_scale: f("dflash.attention.scale")?,
        value_scale: f("dflash.attention.value_scale")?,
        logit_scale: f("dflash.logit_scale")?,
        final_logit_softcap: f("dflash.final_logit_softcapping")?,
        activation,
    })
}
