//! The host-side inputs of one draft decode: positions, the KV cells the
//! rows write, and the attention masks. Pure: no ggml here.

use super::kv::KvCache;
use super::spec::Spec;
use crate::error::{Error, Result};

/// A row of tap features to inject at a draft position of a stream.
#[derive(Clone, Copy, Debug)]
pub struct InjectRow<'a> {
    pub stream: usize,
    pub pos: i32,
    pub features: &'a [f32],
}

/// One sequence's noise block: `[id_last, mask, mask, ...]` at `anchor..`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoiseBlock {
    pub stream: usize,
    pub anchor: i32,
    pub id_last: i32,
}

/// Blocks of consecutive streams: one attention op reads their streams as
/// one strided view of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub first_block: usize,
    pub n_blocks: usize,
    pub first_stream: usize,
}

/// Cells attention views per stream: enough for every row the batch sees,
/// padded as libllama pads (a stable shape, and what some backends' kernels
/// want), never past the cache.
const KV_PAD: usize = 256;

/// Positions for the rope: one per row, or four per row for M-RoPE, in
/// ggml's component-major order ([p...], [p...], [p...], [0...]).
pub fn rope_positions(pos: &[i32], n_pos_per_row: usize) -> Vec<i32> {
    if n_pos_per_row == 1 {
        return pos.to_vec();
    }
    let mut out = Vec::with_capacity(pos.len() * 4);
    for component in 0..4 {
        out.extend(pos.iter().map(|&p| if component < 3 { p } else { 0 }));
    }
    out
}

/// What an injection decode writes.
pub struct InjectInputs {
    pub features: Vec<f32>,
    pub positions: Vec<i32>,
    /// Global cell index per row: stream * n_cells + position.
    pub cells: Vec<i64>,
}

impl InjectInputs {
    pub fn new(rows: &[InjectRow], spec: &Spec, kv: &KvCache) -> Result<InjectInputs> {
        let mut features = Vec::with_capacity(rows.len() * spec.n_feat as usize);
        let mut pos = Vec::with_capacity(rows.len());
        let mut cells = Vec::with_capacity(rows.len());
        for r in rows {
            if r.features.len() != spec.n_feat as usize {
                return Err(Error::internal(format!(
                    "a feature row of {} floats, the drafter reads {}",
                    r.features.len(),
                    spec.n_feat
                )));
            }
            if r.pos < 0 || r.pos as usize >= kv.n_cells || r.stream >= kv.n_stream {
                return Err(Error::backend(format!(
                    "draft position {} of sequence {} is outside the draft KV ({} cells): the draft KV is full",
                    r.pos, r.stream, kv.n_cells
                )));
            }
            features.extend_from_slice(r.features);
            pos.push(r.pos);
            cells.push((r.stream * kv.n_cells + r.pos as usize) as i64);
        }
        Ok(InjectInputs { features, positions: rope_positions(&pos, spec.n_pos_per_row()), cells })
    }
}

/// What a noise-block decode reads and writes.
pub struct NoiseInputs {
    pub width: usize,
    pub tokens: Vec<i32>,
    pub positions: Vec<i32>,
    pub cells: Vec<i64>,
    pub runs: Vec<Run>,
    /// Cells each stream's attention reads.
    pub n_kv: usize,
    /// Per run: [n_kv, width, 1, n_blocks] of 0 (attend) or -inf, for the
    /// full-attention layers and the windowed ones (each empty when no layer
    /// attends so).
    pub masks: Vec<Vec<f32>>,
    pub masks_swa: Vec<Vec<f32>>,
}

impl NoiseInputs {
    pub fn new(blocks: &[NoiseBlock], width: usize, mask_token: i32, spec: &Spec, kv: &KvCache) -> Result<NoiseInputs> {
        let mut tokens = Vec::with_capacity(blocks.len() * width);
        let mut pos = Vec::with_capacity(blocks.len() * width);
        let mut cells = Vec::with_capacity(blocks.len() * width);
        let mut n_kv = 0;
        for b in blocks {
            let end = b.anchor as usize + width;
            if b.anchor < 0 || end > kv.n_cells || b.stream >= kv.n_stream {
                return Err(Error::internal(format!(
                    "noise block at {} of stream {} does not fit the draft KV ({} cells)",
                    b.anchor, b.stream, kv.n_cells
                )));
            }
            for p in 0..width {
                tokens.push(if p == 0 { b.id_last } else { mask_token });
                pos.push(b.anchor + p as i32);
                cells.push((b.stream * kv.n_cells + b.anchor as usize + p) as i64);
            }
            n_kv = n_kv.max(end).max(kv.end(b.stream));
        }
        let n_kv = n_kv.div_ceil(KV_PAD).saturating_mul(KV_PAD).min(kv.n_cells).max(n_kv);

        let mut runs: Vec<Run> = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            match runs.last_mut() {
                Some(r) if r.first_stream + r.n_blocks == b.stream => r.n_blocks += 1,
                _ => runs.push(Run { first_block: i, n_blocks: 1, first_stream: b.stream }),
            }
        }
        let has_swa = (0..spec.n_layer).any(|il| spec.is_swa(il));
        let mask = |swa: bool| -> Vec<Vec<f32>> {
            runs.iter()
                .map(|r| {
                    let mut m = vec![f32::NEG_INFINITY; n_kv * width * r.n_blocks];
                    for (bi, b) in blocks[r.first_block..r.first_block + r.n_blocks].iter().enumerate() {
                        let block = b.anchor as usize..b.anchor as usize + width;
                        for row in 0..width {
                            let t = b.anchor as i64 + row as i64;
                            let at = (bi * width + row) * n_kv;
                            for c in 0..n_kv {
                                let visible = (kv.is_used(b.stream, c) || block.contains(&c))
                                    && (!spec.causal || c as i64 <= t)
                                    && (!swa || t - (c as i64) < spec.n_swa as i64);
                                if visible {
                                    m[at + c] = 0.0;
                                }
                            }
                        }
                    }
                    m
                })
                .collect()
        };
        // only the kinds some layer reads: an input no node reads is never allocated
        let has_full = (0..spec.n_layer).any(|il| !spec.is_swa(il));
        let masks = if has_full { mask(false) } else { Vec::new() };
        let masks_swa = if has_swa { mask(true) } else { Vec::new() };
        Ok(NoiseInputs {
            width,
            tokens,
            positions: rope_positions(&pos, spec.n_pos_per_row()),
            cells,
            runs,
            n_kv,
            masks,
            masks_swa,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mrope_positions_are_component_major_with_a_zero_fourth() {
        assert_eq!(rope_positions(&[5, 6], 1), vec![5, 6]);
        assert_eq!(rope_positions(&[5, 6], 4), vec![5, 6, 5, 6, 5, 6, 0, 0]);
    }
}
