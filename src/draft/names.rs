//! The drafter's weights by role, resolved from their GGUF names once.

use super::weights::{WeightId, Weights};
use crate::error::{Error, Result};

/// DFlash2's convolution weights of one layer.
#[derive(Clone, Copy, Debug)]
pub struct ConvIds {
    pub attn_base: WeightId,
    pub attn_proj: WeightId,
    pub ffn_base: WeightId,
    pub ffn_proj: WeightId,
}

/// One decoder layer.
#[derive(Clone, Copy, Debug)]
pub struct LayerIds {
    pub attn_norm: WeightId,
    pub wq: WeightId,
    pub wk: WeightId,
    /// None: V is the K projection, RMS-normed (`shared_kv`).
    pub wv: Option<WeightId>,
    pub wo: WeightId,
    pub q_norm: WeightId,
    pub k_norm: WeightId,
    pub attn_post_norm: Option<WeightId>,
    pub ffn_post_norm: Option<WeightId>,
    pub out_scale: Option<WeightId>,
    pub sinks: Option<WeightId>,
    pub ffn_norm: WeightId,
    pub ffn_gate: WeightId,
    pub ffn_up: WeightId,
    pub ffn_down: WeightId,
    pub conv: Option<ConvIds>,
}

/// DFlash2's candidate selector.
#[derive(Clone, Copy, Debug)]
pub struct SelectorIds {
    pub predecessor: WeightId,
    pub successor: WeightId,
    pub hidden: WeightId,
}

/// Every weight of the drafter, by role.
#[derive(Clone, Debug)]
pub struct ModelIds {
    /// The drafter's own token embeddings (else the target's).
    pub tok_embd: Option<WeightId>,
    /// The drafter's own head (else the target's); a tied own head is its
    /// token embeddings.
    pub output: Option<WeightId>,
    pub d2t: Option<WeightId>,
    pub fc: WeightId,
    pub fc_scale: Option<WeightId>,
    pub enc_norm: WeightId,
    pub output_norm: WeightId,
    pub rope_freqs: Option<WeightId>,
    pub selector: Option<SelectorIds>,
    pub layers: Vec<LayerIds>,
}

impl ModelIds {
    pub fn resolve(w: &Weights, n_layer: usize, selector: bool) -> Result<ModelIds> {
        let req = |name: &str| w.id(name).ok_or_else(|| Error::invalid(format!("the drafter has no tensor '{name}'")));
        let opt = |name: &str| w.id(name);
        let mut layers = Vec::with_capacity(n_layer);
        for il in 0..n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let conv = if selector {
                Some(ConvIds {
                    attn_base: req(&b("attn_conv_base"))?,
                    attn_proj: req(&b("attn_conv_proj.weight"))?,
                    ffn_base: req(&b("ffn_conv_base"))?,
                    ffn_proj: req(&b("ffn_conv_proj.weight"))?,
                })
            } else {
                None
            };
            layers.push(LayerIds {
                attn_norm: req(&b("attn_norm.weight"))?,
                wq: req(&b("attn_q.weight"))?,
                wk: req(&b("attn_k.weight"))?,
                wv: opt(&b("attn_v.weight")),
                wo: req(&b("attn_output.weight"))?,
                q_norm: req(&b("attn_q_norm.weight"))?,
                k_norm: req(&b("attn_k_norm.weight"))?,
                attn_post_norm: opt(&b("post_attention_norm.weight")),
                ffn_post_norm: opt(&b("post_ffw_norm.weight")),
                out_scale: opt(&b("layer_output_scale.weight")),
                sinks: opt(&b("attn_sinks.weight")),
                ffn_norm: req(&b("ffn_norm.weight"))?,
                ffn_gate: req(&b("ffn_gate.weight"))?,
                ffn_up: req(&b("ffn_up.weight"))?,
                ffn_down: req(&b("ffn_down.weight"))?,
                conv,
            });
        }
        let tok_embd = opt("token_embd.weight");
        Ok(ModelIds {
            tok_embd,
            output: opt("output.weight").or(tok_embd),
            d2t: opt("d2t"),
            fc: req("fc.weight")?,
            fc_scale: opt("fc.scale"),
            enc_norm: req("enc.output_norm.weight")?,
            output_norm: req("output_norm.weight")?,
            rope_freqs: opt("rope_freqs.weight"),
            selector: if selector {
                Some(SelectorIds {
                    predecessor: req("selector_predecessor.weight")?,
                    successor: req("selector_successor.weight")?,
                    hidden: req("selector_hidden.weight")?,
                })
            } else {
                None
            },
            layers,
        })
    }
}
