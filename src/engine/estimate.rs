//! What an engine will allocate, computed before loading anything: the
//! drafter's weights, its KV cache and its compute buffers, summed over the
//! devices it goes on.

use std::path::Path;

use super::setup::{context_size, limits, open_drafter};
use crate::checkpoint::{Checkpoint, TargetFacts};
use crate::config::{Config, DraftGraph};
use crate::draft::StageBytes;
use crate::error::{Error, Result};

/// ggml type id of F16, the draft KV's default type.
const GGML_TYPE_F16: u32 = 1;

/// Bytes by kind, over all devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Tensor data of the drafter file (llama_model_size once loaded).
    pub weights: u64,
    /// K and V of every layer for every cell of every stream.
    pub kv: u64,
    /// The schedulers' compute buffers (an estimate, see `compute_bytes`).
    pub compute: u64,
    /// The own graph's compute by stage, what `compute` sums (None:
    /// libllama's graph, one scheduler).
    pub stages: Option<StageBytes>,
}

impl MemoryEstimate {
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.compute
    }
}

/// libllama rounds context sizes up to a multiple of 256 cells.
fn pad256(n: u64) -> u64 {
    n.div_ceil(256) * 256
}

/// Cells per KV stream and the number of streams, as llama_init_from_model
/// settles them: one stream per sequence unless there is a single sequence.
fn kv_cells(n_ctx_seq: u64, n_seq: u64) -> (u64, u64) {
    if n_seq == 1 {
        return (pad256(n_ctx_seq), 1);
    }
    (pad256(pad256(n_ctx_seq * n_seq) / n_seq), n_seq)
}

/// Bytes of one row of `n` values of ggml type `type_id`.
fn row_bytes(type_id: u32, n: u64) -> Result<u64> {
    let t = dflash2_gguf::ggml_type_from_id(type_id)
        .ok_or_else(|| Error::invalid(format!("{type_id} is not a ggml type")))?;
    Ok(n.div_ceil(t.block_size) * t.type_size)
}

/// The compute buffers of one ubatch of `n_ubatch` rows, the largest graph
/// libllama reserves. Per row: the head's logits in f32 (with a d2t map also
/// the full-vocabulary scatter), the row's tap features and its projection to
/// n_embd in f32, and the F16 attention mask over one stream's cells. A
/// quantized KV adds its F16 copy of one layer. Checked against libllama's own
/// accounting (llama_get_memory_breakdown) on CPU for the fixture and SmolLM2
/// drafters, ubatch 64..2048, 512..4352 cells: never below it, at most ~13%
/// above (the allocator reuses buffers between graph nodes; this sums the
/// largest ones).
fn compute_bytes(ckpt: &Checkpoint, n_feat: u64, n_ubatch: u64, cells: u64, streams: u64, quantized_kv: bool) -> u64 {
    let hp = &ckpt.hparams;
    let head = ckpt.n_vocab_draft as u64 + if ckpt.n_vocab_draft != hp.n_vocab { hp.n_vocab as u64 } else { 0 };
    let per_row = 4 * head + 4 * (n_feat + hp.n_embd as u64) + 2 * cells;
    let kv_copy = if quantized_kv { cells * streams * 2 * 2 * (hp.n_head_kv as u64 * hp.head_dim as u64) } else { 0 };
    n_ubatch * per_row + kv_copy
}

/// The own graph's compute buffers, by stage: one scheduler for injections,
/// one for noise decodes and one for the selection of a head merged on the
/// host (each keeps its graph between decodes), so the sum of all three.
/// An injection of `n_ubatch` rows holds each row's tap features and their
/// fusion to n_embd in f32; a noise decode of every sequence's block holds
/// each row's logits over the head (and the full-vocabulary scatter of a
/// `d2t` head), its F16 attention mask over the cells and about 32 n_embd-wide
/// f32 intermediates. Checked against the schedulers' buffers on CPU for the
/// fixture (SWA) and SmolLM2 drafters, n_seq 1 and 4, 4096-cell contexts:
/// never below them, at most 5% above.
///
/// The selection stage reserves buffers only when the target's head is split
/// by tensor and some slice's candidates are merged on the host, which the
/// estimate cannot see (a host sizes memory before it loads the target): it
/// is counted whenever the drafter reads the target's head. It holds, for
/// every sequence's block, each row's merged candidates, its hidden state,
/// the selector's gate and k x rank terms, the k x k scores and the lattice
/// row being packed, in f32 (`selection_bytes`): for the fixture drafter on
/// a target split over two RPC nodes and the CPU, n_seq 1 and 4, about 2.5x
/// the stage's buffers on the drafter's device (a few KB; tests/tensor_split.rs).
fn own_compute_bytes(ckpt: &Checkpoint, n_feat: u64, n_ubatch: u64, noise_rows: u64, cells: u64) -> StageBytes {
    let hp = &ckpt.hparams;
    let n_embd = hp.n_embd as u64;
    let head = ckpt.n_vocab_draft as u64 + if ckpt.n_vocab_draft != hp.n_vocab { hp.n_vocab as u64 } else { 0 };
    StageBytes {
        noise: noise_rows * (4 * head + 2 * cells + 32 * n_embd),
        selection: if ckpt.own_head { 0 } else { selection_bytes(ckpt, noise_rows) },
        injection: n_ubatch * (4 * (n_feat + n_embd) + 16),
    }
}

/// The selection graph of `rows` rows (`draft::graph::select_lattice`).
fn selection_bytes(ckpt: &Checkpoint, rows: u64) -> u64 {
    let hp = &ckpt.hparams;
    let (n_embd, k, rank) = (hp.n_embd as u64, hp.selector_top_k as u64, hp.selector_rank as u64);
    rows * 4 * (2 * k + 3 * n_embd + rank + 3 * rank * k + 2 * k * k)
}

/// Estimates what an engine for the drafter at `path` allocates next to a
/// target with `target` facts whose context has `n_ctx_seq` cells per sequence.
/// Fails as engine creation would on a bad file, params or target. Without a
/// target (a host sizing memory before loading it) the drafter is not checked
/// against one, and the tap features take the drafter's n_embd, which a
/// compatible target shares.
pub fn estimate_memory(
    target: Option<&TargetFacts>,
    path: &Path,
    config: &Config,
    n_ctx_seq: u32,
) -> Result<MemoryEstimate> {
    let ckpt = open_drafter(path, target)?;
    estimate_for(&ckpt, target.map(|t| t.n_embd), config, n_ctx_seq)
}

/// The estimate for a drafter already opened and checked; `n_embd_target`
/// None: the drafter's own n_embd.
pub fn estimate_for(
    ckpt: &Checkpoint,
    n_embd_target: Option<u32>,
    config: &Config,
    n_ctx_seq: u32,
) -> Result<MemoryEstimate> {
    let limits = limits(config, ckpt)?;
    let size = context_size(config, &limits, n_ctx_seq)?;
    let hp = &ckpt.hparams;
    let n_embd_kv = hp.n_head_kv as u64 * hp.head_dim as u64;
    let type_k = config.type_k.unwrap_or(GGML_TYPE_F16);
    let type_v = config.type_v.unwrap_or(GGML_TYPE_F16);
    let kv_row = row_bytes(type_k, n_embd_kv)? + row_bytes(type_v, n_embd_kv)?;
    let n_feat = hp.target_layers.len() as u64 * n_embd_target.unwrap_or(hp.n_embd) as u64;
    let own = config.draft_graph == DraftGraph::Own
        && crate::draft::spec::not_covered(ckpt, config.type_k, config.type_v).is_none();
    if own {
        // one stream per sequence of exactly the cells asked for
        let cells = size.n_ctx_seq as u64;
        let kv = hp.n_layer as u64 * cells * config.n_seq as u64 * kv_row;
        let noise_rows = (config.n_seq * limits.block_size) as u64;
        let stages = own_compute_bytes(ckpt, n_feat, size.n_ubatch as u64, noise_rows, cells);
        return Ok(MemoryEstimate { weights: ckpt.weight_bytes, kv, compute: stages.total(), stages: Some(stages) });
    }
    let (cells, streams) = kv_cells(size.n_ctx_seq as u64, config.n_seq as u64);
    let kv = hp.n_layer as u64 * cells * streams * kv_row;
    let quantized_kv = type_k != GGML_TYPE_F16 || type_v != GGML_TYPE_F16;
    let compute = compute_bytes(ckpt, n_feat, size.n_ubatch as u64, cells, streams, quantized_kv);
    Ok(MemoryEstimate { weights: ckpt.weight_bytes, kv, compute, stages: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_cells_follow_libllamas_padding() {
        assert_eq!(kv_cells(516, 1), (768, 1));
        assert_eq!(kv_cells(2052, 1), (2304, 1));
        // 4 x 516 = 2064 -> 2304 in all, 576 per stream -> 768
        assert_eq!(kv_cells(516, 4), (768, 4));
        assert_eq!(kv_cells(516, 8), (768, 8));
    }

    #[test]
    fn kv_rows_take_the_type_block_size_into_account() {
        assert_eq!(row_bytes(GGML_TYPE_F16, 192).unwrap(), 384);
        assert_eq!(row_bytes(8, 192).unwrap(), 6 * 34); // q8_0: blocks of 32 in 34 bytes
    }
}
