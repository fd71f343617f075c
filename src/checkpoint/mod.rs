//! Validating a DFlash2 drafter GGUF before libllama opens it.
//!
//! libllama aborts the process on some malformed drafters (zero layers, a tap
//! layer the target cannot capture, a missing mask token) and fails late or
//! vaguely on others. Everything here reads the file through a bounded GGUF
//! parser over a memory map and returns a named error instead.

mod forward;
pub(crate) mod keys;
mod target;
mod tensors;

use std::path::Path;

use dflash2_gguf::{Gguf, read};

use crate::error::{Error, Result};
use keys::Keys;

pub use forward::{Activation, Forward, RopeScaling};
pub use target::{TargetFacts, architecture_captures_layer_inputs, check_target};

/// libllama's LLAMA_MAX_LAYERS.
const MAX_LAYERS: u32 = 512;

/// Most tap layers a drafter may read (the C info struct holds this many).
/// cbindgen:ignore
pub const MAX_TARGET_LAYERS: usize = 64;

/// Candidates per position the library's own graph ranks for a plain DFlash
/// drafter (it has no selector of its own): its lattice rows hold each
/// position's top logits and no edge scores, so the walks pick the argmax
/// chain and trees branch on the next-best logits.
/// cbindgen:ignore
pub const PLAIN_DFLASH_TOP_K: u32 = 8;

/// A plain DFlash drafter without `dflash.block_size` drafts blocks of this
/// size, as llama.cpp's driver does.
const PLAIN_DFLASH_BLOCK_SIZE: u32 = 16;

/// The decoder hyperparameters the tensor shapes follow from.
#[derive(Clone, Debug, PartialEq)]
pub struct Hparams {
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub n_ff: Vec<u32>,
    pub n_vocab: u32,
    pub target_layers: Vec<i32>,
    /// 0 for a plain DFlash drafter (no selector).
    pub selector_rank: u32,
    /// The drafter's own for DFlash2; `PLAIN_DFLASH_TOP_K` (or fewer where
    /// n_embd or the head is small) for a plain DFlash drafter.
    pub selector_top_k: u32,
    /// 0 for a plain DFlash drafter (no convolution).
    pub conv_kernel: u32,
    pub conv_group: u32,
}

/// What a valid DFlash2 checkpoint declares.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub hparams: Hparams,
    /// Trained block size: anchor + masks.
    pub block_size: u32,
    /// Rows of the draft head (`d2t` length when present, else n_vocab).
    pub n_vocab_draft: u32,
    pub mask_token: u32,
    pub n_ctx_train: u32,
    /// Sliding window of the draft attention; 0 = full attention.
    pub n_swa: u32,
    /// Per layer: attends through the sliding window (empty when n_swa is 0).
    pub swa_layers: Vec<bool>,
    pub causal: bool,
    /// Rope sections written for an M-RoPE target (any non-zero entry).
    pub mrope: bool,
    pub own_embd: bool,
    pub own_head: bool,
    /// Bytes of all tensor data: what libllama allocates for the weights.
    pub weight_bytes: u64,
    /// DFlash2 (a selector and convolutions), else a plain DFlash drafter.
    pub selector: bool,
    /// What the forward pass computes with besides the shapes.
    pub forward: Forward,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

impl Checkpoint {
    /// Identifies the drafter's shape in saved state: every field that decides
    /// the layout of its draft KV and of the features it reads, hashed (FNV-1a)
    /// in a fixed order. A field added to `Checkpoint` changes nothing here
    /// unless it is added below, which must then bump the state blob version.
    pub fn fingerprint(&self) -> u64 {
        let hp = &self.hparams;
        let mut words: Vec<u32> = vec![
            hp.n_embd,
            hp.n_layer,
            hp.n_head,
            hp.n_head_kv,
            hp.head_dim,
            hp.n_vocab,
            hp.selector_rank,
            hp.selector_top_k,
            hp.conv_kernel,
            hp.conv_group,
            self.block_size,
            self.n_vocab_draft,
            self.mask_token,
            self.n_ctx_train,
            self.n_swa,
            self.causal as u32,
            self.mrope as u32,
            self.own_embd as u32,
            self.own_head as u32,
        ];
        words.push(hp.n_ff.len() as u32);
        words.extend(&hp.n_ff);
        words.push(hp.target_layers.len() as u32);
        words.extend(hp.target_layers.iter().map(|&l| l as u32));
        words.push(self.swa_layers.len() as u32);
        words.extend(self.swa_layers.iter().map(|&s| s as u32));
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        fnv1a(&bytes)
    }
}

fn positive(keys: &Keys, key: &str) -> Result<u32> {
    let v = keys.u32(key)?;
    if v == 0 {
        return Err(Error::bad_checkpoint(format!("metadata '{key}' is 0")));
    }
    Ok(v)
}

/// Checks the metadata and tensors of a GGUF already parsed from `bytes`.
pub fn validate(gguf: &Gguf, bytes: &[u8]) -> Result<Checkpoint> {
    let keys = Keys::new(gguf);

    match keys.str_opt("general.architecture")? {
        Some("dflash") => {}
        Some(other) => {
            return Err(Error::bad_checkpoint(format!(
                "general.architecture is '{other}', not 'dflash': this is not a DFlash2 drafter"
            )));
        }
        None => return Err(Error::bad_checkpoint("general.architecture is missing")),
    }
    if gguf.tensor("markov_w1.weight").is_some() || keys.u32_opt("dflash.hyper_connection_count")?.unwrap_or(0) > 0 {
        return Err(Error::unsupported("this is a DSpark drafter; dflash2 serves DFlash2 drafters only"));
    }
    let selector = gguf.tensor("selector_hidden.weight").is_some();

    let n_ctx_train = keys.u32("dflash.context_length")?;
    let n_embd = positive(&keys, "dflash.embedding_length")?;
    let n_layer = positive(&keys, "dflash.block_count")?;
    if n_layer > MAX_LAYERS {
        return Err(Error::bad_checkpoint(format!("dflash.block_count = {n_layer} exceeds {MAX_LAYERS}")));
    }
    let n_ff = keys
        .u32_per_layer_opt("dflash.feed_forward_length", n_layer)?
        .ok_or_else(|| Error::bad_checkpoint("required metadata 'dflash.feed_forward_length' is missing"))?;
    let heads = keys
        .u32_per_layer_opt("dflash.attention.head_count", n_layer)?
        .ok_or_else(|| Error::bad_checkpoint("required metadata 'dflash.attention.head_count' is missing"))?;
    let heads_kv = keys.u32_per_layer_opt("dflash.attention.head_count_kv", n_layer)?.unwrap_or(heads.clone());
    if n_ff.contains(&0) {
        return Err(Error::bad_checkpoint("dflash.feed_forward_length is 0 for some layer"));
    }
    // the dflash graph builds every layer with the same head layout
    let (n_head, n_head_kv) = (heads[0], heads_kv[0]);
    if heads.iter().any(|&h| h != n_head) || heads_kv.iter().any(|&h| h != n_head_kv) {
        return Err(Error::bad_checkpoint("attention head counts differ between layers"));
    }
    if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
        return Err(Error::bad_checkpoint(format!(
            "attention heads {n_head} / kv heads {n_head_kv}: both must be > 0 and kv heads must divide heads"
        )));
    }
    let head_dim = keys.u32_opt("dflash.attention.key_length")?.unwrap_or(n_embd / n_head);
    let head_dim_v = keys.u32_opt("dflash.attention.value_length")?.unwrap_or(n_embd / n_head);
    if head_dim == 0 || head_dim % 2 != 0 || head_dim != head_dim_v {
        return Err(Error::bad_checkpoint(format!(
            "head size: key {head_dim}, value {head_dim_v} (must be equal, even and > 0)"
        )));
    }
    if let Some(n_rot) = keys.u32_opt("dflash.rope.dimension_count")? {
        if n_rot == 0 || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(Error::bad_checkpoint(format!(
                "dflash.rope.dimension_count = {n_rot} for head size {head_dim}"
            )));
        }
    }
    keys.f32("dflash.attention.layer_norm_rms_epsilon")?;
    for key in [
        "dflash.rope.freq_base",
        "dflash.embedding_scale",
        "dflash.attention.scale",
        "dflash.attention.value_scale",
        "dflash.logit_scale",
        "dflash.final_logit_softcapping",
    ] {
        keys.f32_opt(key)?;
    }
    if let Some(act) = keys.str_opt("dflash.hidden_activation")? {
        if !matches!(act, "silu" | "gelu" | "gelu_pytorch_tanh") {
            return Err(Error::bad_checkpoint(format!("dflash.hidden_activation '{act}' is not silu or gelu")));
        }
    }
    let causal = keys.bool_opt("dflash.attention.causal")?.unwrap_or(false);

    let block_size = if selector {
        keys.u32("dflash.block_size")?
    } else {
        keys.u32_opt("dflash.block_size")?.unwrap_or(PLAIN_DFLASH_BLOCK_SIZE)
    };
    if block_size < 2 {
        return Err(Error::bad_checkpoint(format!(
            "dflash.block_size = {block_size}: a block needs the anchor and at least one mask"
        )));
    }
    let (conv_kernel, conv_group, selector_rank, selector_top_k) = if selector {
        let conv_kernel = positive(&keys, "dflash.conv_kernel_size")?;
        let conv_group = positive(&keys, "dflash.conv_group_size")?;
        let selector_rank = positive(&keys, "dflash.selector_rank")?;
        let selector_top_k = positive(&keys, "dflash.selector_top_k")?;
        if n_embd % conv_group != 0 {
            return Err(Error::bad_checkpoint(format!(
                "n_embd {n_embd} is not a multiple of dflash.conv_group_size {conv_group}"
            )));
        }
        let lattice_width = selector_top_k as u64 * (selector_top_k as u64 + 1);
        if (n_embd as u64) < lattice_width {
            return Err(Error::bad_checkpoint(format!(
                "n_embd {n_embd} cannot hold the selector lattice row of top-k {selector_top_k} ({lattice_width} \
                 floats)"
            )));
        }
        (conv_kernel, conv_group, selector_rank, selector_top_k)
    } else {
        // the widest k whose lattice row (k candidates + k x k scores) fits n_embd
        let mut k = PLAIN_DFLASH_TOP_K;
        while k > 1 && (k as u64) * (k as u64 + 1) > n_embd as u64 {
            k -= 1;
        }
        if (n_embd as u64) < 2 {
            return Err(Error::bad_checkpoint(format!("n_embd {n_embd} cannot hold a lattice row")));
        }
        (0, 0, 0, k)
    };

    let target_layers = keys.i32_array("dflash.target_layers")?;
    if target_layers.is_empty() || target_layers.len() > MAX_TARGET_LAYERS {
        return Err(Error::bad_checkpoint(format!(
            "dflash.target_layers has {} entries (1..={MAX_TARGET_LAYERS} allowed)",
            target_layers.len()
        )));
    }
    if let Some(&bad) = target_layers.iter().find(|&&l| l < 0 || l as u32 > MAX_LAYERS) {
        return Err(Error::bad_checkpoint(format!("dflash.target_layers holds layer {bad}")));
    }

    let n_swa = keys.u32_opt("dflash.attention.sliding_window")?.unwrap_or(0);
    let mut swa_layers = Vec::new();
    if n_swa > 0 {
        swa_layers = keys.bool_array("dflash.attention.sliding_window_pattern")?;
        if swa_layers.len() != n_layer as usize {
            return Err(Error::bad_checkpoint(format!(
                "dflash.attention.sliding_window_pattern has {} entries for {n_layer} layers",
                swa_layers.len()
            )));
        }
    }
    let mrope = match keys.i32_array_opt("dflash.rope.dimension_sections")? {
        None => false,
        Some(s) if s.len() <= 4 && s.iter().all(|&x| x >= 0) => s.iter().any(|&x| x != 0),
        Some(s) => return Err(Error::bad_checkpoint(format!("dflash.rope.dimension_sections = {s:?}"))),
    };

    keys.str_opt("tokenizer.ggml.model")?
        .ok_or_else(|| Error::bad_checkpoint("required metadata 'tokenizer.ggml.model' is missing"))?;
    let n_vocab = keys.str_array_len("tokenizer.ggml.tokens")?;
    if n_vocab == 0 || n_vocab > i32::MAX as u64 {
        return Err(Error::bad_checkpoint(format!("tokenizer has {n_vocab} tokens")));
    }
    let n_vocab = n_vocab as u32;
    if selector && selector_top_k > n_vocab {
        return Err(Error::bad_checkpoint(format!(
            "dflash.selector_top_k {selector_top_k} exceeds the vocabulary ({n_vocab})"
        )));
    }
    let mask_token = keys.u32_opt("tokenizer.ggml.mask_token_id")?.ok_or_else(|| {
        Error::bad_checkpoint("no 'tokenizer.ggml.mask_token_id': the drafter has no mask token to fill its block with")
    })?;
    if mask_token >= n_vocab {
        return Err(Error::bad_checkpoint(format!(
            "mask token id {mask_token} is outside the vocabulary ({n_vocab} tokens)"
        )));
    }

    let hparams = Hparams {
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_vocab,
        target_layers,
        selector_rank,
        selector_top_k,
        conv_kernel,
        conv_group,
    };

    let n_vocab_draft = match gguf.tensor("d2t") {
        None => n_vocab,
        Some(d2t) => check_d2t(gguf, d2t, bytes, n_vocab)?,
    };
    let mut hparams = hparams;
    if !selector {
        hparams.selector_top_k = hparams.selector_top_k.min(n_vocab_draft).max(1);
    }
    tensors::check(gguf, &tensors::expected(&hparams, n_vocab_draft as u64, selector))?;
    if n_vocab_draft < hparams.selector_top_k {
        return Err(Error::bad_checkpoint(format!(
            "draft head has {n_vocab_draft} rows, fewer than top-k {}",
            hparams.selector_top_k
        )));
    }
    let forward = forward::read(&keys, &hparams)?;

    let own_embd = gguf.tensor("token_embd.weight").is_some();
    let own_head = own_embd || gguf.tensor("output.weight").is_some();
    if !own_head && n_vocab_draft != n_vocab {
        return Err(Error::bad_checkpoint("a d2t mapping needs the drafter's own output head"));
    }

    Ok(Checkpoint {
        hparams,
        block_size,
        n_vocab_draft,
        mask_token,
        n_ctx_train,
        n_swa,
        swa_layers,
        causal,
        mrope,
        own_embd,
        own_head,
        weight_bytes: gguf.tensors().iter().map(|t| t.nbytes).sum(),
        selector,
        forward,
    })
}

/// `d2t` maps draft rows to target ids and libllama uses its entries as row
/// indices unchecked, so every entry is checked here.
fn check_d2t(gguf: &Gguf, d2t: &dflash2_gguf::TensorInfo, bytes: &[u8], n_vocab: u32) -> Result<u32> {
    if d2t.ggml_type.name != "i64" || d2t.dims.len() != 1 {
        return Err(Error::bad_checkpoint(format!(
            "tensor 'd2t' must be a 1-d i64 tensor, it is {} {:?}",
            d2t.ggml_type.name, d2t.dims
        )));
    }
    let n = d2t.dims[0];
    if n > n_vocab as u64 {
        return Err(Error::bad_checkpoint(format!("d2t has {n} rows for a vocabulary of {n_vocab}")));
    }
    // the reader checked that data_offset + offset + nbytes lies inside the file
    let start = (gguf.data_offset + d2t.offset) as usize;
    let data = &bytes[start..start + d2t.nbytes as usize];
    for (row, chunk) in data.chunks_exact(8).enumerate() {
        let id = i64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
        if id < 0 || id >= n_vocab as i64 {
            return Err(Error::bad_checkpoint(format!(
                "d2t row {row} maps to token {id}, outside the vocabulary ({n_vocab})"
            )));
        }
    }
    Ok(n as u32)
}

/// A drafter file, validated, kept open: its tensors are read from this
/// handle (the same file even if the path is replaced meanwhile).
pub struct Opened {
    pub ckpt: Checkpoint,
    pub file: std::fs::File,
    pub tensors: Vec<dflash2_gguf::TensorInfo>,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
}

/// Opens `path`, parses its header through a memory map (dropped before
/// returning) and validates it as a DFlash drafter.
pub fn open_file(path: &Path) -> Result<Opened> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(format!("cannot open '{}': {e}", path.display())))?;
    let meta = file.metadata().map_err(|e| Error::io(format!("cannot stat '{}': {e}", path.display())))?;
    if !meta.is_file() {
        return Err(Error::io(format!("'{}' is not a regular file", path.display())));
    }
    if meta.len() == 0 {
        return Err(Error::bad_checkpoint(format!("'{}' is empty", path.display())));
    }
    let map = crate::sys::map_file(&file).map_err(|e| Error::io(format!("cannot map '{}': {e}", path.display())))?;
    let gguf = read(&map).map_err(|e| Error::bad_checkpoint(format!("'{}': {e}", path.display())))?;
    let ckpt =
        validate(&gguf, &map).map_err(|e| Error::new(e.status, format!("'{}': {}", path.display(), e.message)))?;
    let (tensors, data_offset) = (gguf.tensors().to_vec(), gguf.data_offset);
    drop(gguf);
    drop(map);
    Ok(Opened { ckpt, file, tensors, data_offset })
}

/// Opens `path`, parses it and validates it as a DFlash drafter.
pub fn open(path: &Path) -> Result<Checkpoint> {
    open_file(path).map(|o| o.ckpt)
}

/// True when `path` looks like a drafter this library serves: a GGUF with
/// architecture `dflash`, DFlash2 (a selector tensor) or plain DFlash, not
/// DSpark. Reads the header only; no full validation.
pub fn sniff(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else { return false };
    let Ok(map) = crate::sys::map_file(&file) else { return false };
    match read(&map) {
        Ok(g) => {
            g.architecture() == Some("dflash")
                && g.tensor("markov_w1.weight").is_none()
                && g.get("dflash.hyper_connection_count").and_then(|v| v.as_u32()).unwrap_or(0) == 0
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            hparams: Hparams {
                n_embd: 64,
                n_layer: 2,
                n_head: 4,
                n_head_kv: 2,
                head_dim: 16,
                n_ff: vec![128, 96],
                n_vocab: 100,
                target_layers: vec![1, 3],
                selector_rank: 8,
                selector_top_k: 4,
                conv_kernel: 2,
                conv_group: 16,
            },
            block_size: 4,
            n_vocab_draft: 100,
            mask_token: 3,
            n_ctx_train: 256,
            n_swa: 8,
            swa_layers: vec![true, false],
            causal: false,
            mrope: false,
            own_embd: false,
            own_head: true,
            weight_bytes: 12345,
            selector: true,
            forward: Forward::default(),
        }
    }

    #[test]
    fn the_fingerprint_is_pinned_for_fixed_fields() {
        // saved state blobs carry this value: it must not change by accident
        assert_eq!(sample().fingerprint(), 0xd8f3_dfe7_5411_048b);
    }

    #[test]
    fn the_fingerprint_follows_the_shape_only() {
        let base = sample().fingerprint();
        let mut c = sample();
        c.weight_bytes = 1;
        assert_eq!(c.fingerprint(), base, "weight bytes do not change the draft KV layout");
        let changes: Vec<fn(&mut Checkpoint)> = vec![
            |c| c.hparams.n_head_kv = 4,
            |c| c.hparams.target_layers = vec![1, 2],
            |c| c.hparams.n_ff = vec![96, 128],
            |c| c.swa_layers = vec![false, true],
            |c| c.block_size = 8,
            |c| c.own_head = false,
        ];
        for change in changes {
            let mut c = sample();
            change(&mut c);
            assert_ne!(c.fingerprint(), base, "{c:?}");
        }
    }
}
