//! What the draft graph is built from: the drafter's shapes and forward
//! metadata in the form the graph uses them, and whether the library's own
//! graph covers the drafter at all (else libllama's `dflash` graph serves it).

use crate::checkpoint::{Activation, Checkpoint, RopeScaling};
use crate::sys::ggml::Rope;
use crate::sys::{GGML_ROPE_TYPE_MROPE, GGML_ROPE_TYPE_NEOX, GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32};

/// DFlash2's convolutions and candidate selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selector {
    pub rank: i64,
    pub conv_kernel: i64,
    pub conv_group: i64,
}

/// The shapes and constants of one drafter's forward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub n_embd: i64,
    pub n_layer: usize,
    pub n_head: i64,
    pub n_head_kv: i64,
    pub head_dim: i64,
    /// Tap features per injected row: taps x the target's n_embd.
    pub n_feat: i64,
    /// The target's vocabulary (lattice candidate ids).
    pub n_vocab: i64,
    /// Rows of the draft head (`d2t` maps them into `n_vocab`).
    pub n_vocab_draft: i64,
    pub rms_eps: f32,
    pub rope: Rope,
    pub kq_scale: f32,
    /// 0: none (the same below).
    pub embedding_scale: f32,
    pub value_scale: f32,
    pub logit_scale: f32,
    pub final_logit_softcap: f32,
    pub activation: Activation,
    pub causal: bool,
    /// Sliding window of the layers marked in `swa_layers`; 0: none.
    pub n_swa: i32,
    pub swa_layers: Vec<bool>,
    /// DFlash2's parts; None for a plain DFlash drafter.
    pub selector: Option<Selector>,
    /// Candidates per lattice row.
    pub top_k: i64,
    /// The drafter's trained block: at most this many lattice rows per block.
    pub block_size: i64,
}

impl Spec {
    pub fn n_embd_q(&self) -> i64 {
        self.head_dim * self.n_head
    }

    pub fn n_embd_kv(&self) -> i64 {
        self.head_dim * self.n_head_kv
    }

    pub fn is_swa(&self, layer: usize) -> bool {
        self.n_swa > 0 && self.swa_layers.get(layer).copied().unwrap_or(false)
    }

    /// Positions per row the rope reads: four for M-RoPE ([p, p, p, 0]).
    pub fn n_pos_per_row(&self) -> usize {
        if self.rope.mode == GGML_ROPE_TYPE_MROPE as i32 { 4 } else { 1 }
    }
}

/// Why the library's own graph does not serve a drafter (libllama's does).
pub fn not_covered(ckpt: &Checkpoint, type_k: Option<u32>, type_v: Option<u32>) -> Option<String> {
    if ckpt.forward.rope_scaling == RopeScaling::Other {
        return Some("the drafter's rope scaling (YaRN / LongRoPE) is not in the library's draft graph".into());
    }
    for (name, ty) in [("type_k", type_k), ("type_v", type_v)] {
        if let Some(t) = ty.filter(|&t| ![GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16].contains(&t)) {
            return Some(format!(
                "draft KV {name} {} is quantized: the library's draft cache stores f32, f16 or bf16 (libllama \
                 rotates quantized K/V)",
                crate::sys::ggml::type_name(t)
            ));
        }
    }
    None
}

impl Spec {
    /// The spec of a validated checkpoint for a target of `n_embd_tgt`.
    pub fn new(ckpt: &Checkpoint, n_embd_tgt: usize) -> Spec {
        let hp = &ckpt.hparams;
        let f = &ckpt.forward;
        let mrope = f.rope_sections.iter().any(|&s| s != 0);
        let head_dim = hp.head_dim as i64;
        Spec {
            n_embd: hp.n_embd as i64,
            n_layer: hp.n_layer as usize,
            n_head: hp.n_head as i64,
            n_head_kv: hp.n_head_kv as i64,
            head_dim,
            n_feat: (hp.target_layers.len() * n_embd_tgt) as i64,
            n_vocab: hp.n_vocab as i64,
            n_vocab_draft: ckpt.n_vocab_draft as i64,
            rms_eps: f.rms_eps,
            rope: Rope {
                n_dims: f.n_rot as i32,
                mode: if mrope { GGML_ROPE_TYPE_MROPE as i32 } else { GGML_ROPE_TYPE_NEOX as i32 },
                n_ctx_orig: f.n_ctx_orig as i32,
                freq_base: f.rope_freq_base,
                freq_scale: f.rope_freq_scale,
                // no YaRN (not covered): libllama's context sets ext_factor 0 then
                ext_factor: 0.0,
                attn_factor: f.rope_attn_factor,
                beta_fast: 32.0,
                beta_slow: 1.0,
                sections: f.rope_sections,
            },
            kq_scale: if f.attention_scale != 0.0 { f.attention_scale } else { 1.0 / (head_dim as f32).sqrt() },
            embedding_scale: f.embedding_scale,
            value_scale: f.value_scale,
            logit_scale: if ckpt.selector { f.logit_scale } else { 0.0 },
            final_logit_softcap: if ckpt.selector { f.final_logit_softcap } else { 0.0 },
            activation: f.activation,
            causal: ckpt.causal,
            n_swa: ckpt.n_swa as i32,
            swa_layers: ckpt.swa_layers.clone(),
            selector: ckpt.selector.then_some(Selector {
                rank: hp.selector_rank as i64,
                conv_kernel: hp.conv_kernel as i64,
                conv_group: hp.conv_group as i64,
            }),
            top_k: hp.selector_top_k as i64,
            block_size: ckpt.block_size as i64,
        }
    }
}
