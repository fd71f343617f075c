//! The exact tensor set libllama's `dflash` loader creates for a DFlash2 drafter
//! with given hyperparameters, so a file can be checked tensor by tensor.

use dflash2_gguf::{Gguf, TensorInfo};

use crate::error::{Error, Result};

use super::Hparams;

/// One tensor the loader would create.
pub struct Expected {
    pub name: String,
    pub dims: Vec<u64>,
    pub required: bool,
}

fn req(name: impl Into<String>, dims: &[u64]) -> Expected {
    Expected { name: name.into(), dims: dims.to_vec(), required: true }
}

fn opt(name: impl Into<String>, dims: &[u64]) -> Expected {
    Expected { name: name.into(), dims: dims.to_vec(), required: false }
}

/// The tensors of a DFlash drafter (dflash arch, no DSV4 backbone): DFlash2
/// with `selector` (its convolutions and candidate selector), else plain.
pub fn expected(hp: &Hparams, n_vocab_draft: u64, selector: bool) -> Vec<Expected> {
    let n_embd = hp.n_embd as u64;
    let n_vocab = hp.n_vocab as u64;
    let rank = hp.selector_rank as u64;
    let head_dim = hp.head_dim as u64;
    let q_dim = head_dim * hp.n_head as u64;
    let kv_dim = head_dim * hp.n_head_kv as u64;
    let kernel = hp.conv_kernel as u64;
    let projected = if selector { 2 * kernel * (n_embd / hp.conv_group as u64) } else { 0 };
    let n_feat = hp.target_layers.len() as u64 * n_embd;

    let mut t = vec![
        opt("token_embd.weight", &[n_embd, n_vocab]),
        opt("d2t", &[n_vocab_draft]),
        req("fc.weight", &[n_feat, n_embd]),
        opt("fc.scale", &[1]),
        req("enc.output_norm.weight", &[n_embd]),
        req("output_norm.weight", &[n_embd]),
        opt("output.weight", &[n_embd, n_vocab_draft]),
        opt("rope_freqs.weight", &[head_dim / 2]),
    ];
    if selector {
        t.extend([
            req("selector_predecessor.weight", &[rank, n_vocab]),
            req("selector_successor.weight", &[rank, n_vocab]),
            req("selector_hidden.weight", &[n_embd, rank]),
        ]);
    }
    for (i, &n_ff) in hp.n_ff.iter().enumerate() {
        let n_ff = n_ff as u64;
        let b = |s: &str| format!("blk.{i}.{s}");
        t.extend([
            req(b("attn_norm.weight"), &[n_embd]),
            req(b("attn_q.weight"), &[n_embd, q_dim]),
            req(b("attn_k.weight"), &[n_embd, kv_dim]),
            opt(b("attn_v.weight"), &[n_embd, kv_dim]),
            req(b("attn_output.weight"), &[q_dim, n_embd]),
            req(b("attn_q_norm.weight"), &[head_dim]),
            req(b("attn_k_norm.weight"), &[head_dim]),
            opt(b("post_attention_norm.weight"), &[n_embd]),
            opt(b("post_ffw_norm.weight"), &[n_embd]),
            opt(b("layer_output_scale.weight"), &[1]),
            opt(b("attn_sinks.weight"), &[hp.n_head as u64]),
            req(b("ffn_norm.weight"), &[n_embd]),
            req(b("ffn_gate.weight"), &[n_embd, n_ff]),
            req(b("ffn_down.weight"), &[n_ff, n_embd]),
            req(b("ffn_up.weight"), &[n_embd, n_ff]),
        ]);
        if selector {
            t.extend([
                req(b("attn_conv_base"), &[n_embd, kernel, 2]),
                req(b("attn_conv_proj.weight"), &[n_embd, projected]),
                req(b("ffn_conv_base"), &[n_embd, kernel, 2]),
                req(b("ffn_conv_proj.weight"), &[n_embd, projected]),
            ]);
        }
    }
    t
}

/// ggml compares shapes over all four dimensions, padding with 1.
fn same_shape(a: &[u64], b: &[u64]) -> bool {
    (0..4).all(|i| a.get(i).copied().unwrap_or(1) == b.get(i).copied().unwrap_or(1))
}

fn list(names: &[&str]) -> String {
    const SHOWN: usize = 8;
    let mut s = names.iter().take(SHOWN).map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        s.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    s
}

/// Checks the file's tensors against `expected`: nothing required missing, no
/// tensor the loader would not claim, every shape exact.
pub fn check(gguf: &Gguf, expected: &[Expected]) -> Result<()> {
    let find = |name: &str| expected.iter().find(|e| e.name == name);

    let unknown: Vec<&str> = gguf.tensors().iter().map(|t| t.name.as_str()).filter(|n| find(n).is_none()).collect();
    if !unknown.is_empty() {
        return Err(Error::bad_checkpoint(format!(
            "the file has tensors a DFlash2 drafter does not have: {} (libllama would fail \
             with 'wrong number of tensors')",
            list(&unknown)
        )));
    }

    let missing: Vec<&str> =
        expected.iter().filter(|e| e.required && gguf.tensor(&e.name).is_none()).map(|e| e.name.as_str()).collect();
    if !missing.is_empty() {
        return Err(Error::bad_checkpoint(format!("required tensors are missing: {}", list(&missing))));
    }

    for TensorInfo { name, dims, .. } in gguf.tensors() {
        let e = find(name).expect("unknown tensors were rejected above");
        if !same_shape(dims, &e.dims) {
            return Err(Error::bad_checkpoint(format!(
                "tensor '{name}' has shape {dims:?}, the metadata implies {:?}",
                e.dims
            )));
        }
    }
    Ok(())
}
