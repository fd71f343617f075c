//! The drafter behind the engine: the library's own draft graph
//! (`crate::draft`) or libllama's `dflash` graph on a draft context libllama
//! creates. The engine speaks to either in the same terms: inject feature
//! rows at dense positions, decode noise blocks into lattice rows, edit and
//! save a sequence's cells.

use crate::config::DraftGraph;
use crate::draft::{HeadTraffic, InjectRow, NoiseBlock, OwnDrafter};
use crate::error::{Error, Result};
use crate::sys::{Batch, Device, DraftContext, DraftModel, MemoryUse};

/// libllama's drafter: its model, context and batch (dropped in this order:
/// the batch and the context before the model).
pub struct LibllamaDrafter {
    pub batch: Batch,
    pub ctx: DraftContext,
    pub model: DraftModel,
    /// The drafter attends through a sliding window: libllama's iSWA cache
    /// aborts the process on a K shift (set_input_k_shift reads a buffer it
    /// never allocated), so its cells never move.
    pub sliding_window: bool,
}

pub enum Drafter {
    Own(Box<OwnDrafter>),
    Libllama(LibllamaDrafter),
}

impl Drafter {
    pub fn graph(&self) -> DraftGraph {
        match self {
            Drafter::Own(_) => DraftGraph::Own,
            Drafter::Libllama(_) => DraftGraph::Libllama,
        }
    }

    /// Rows one decode takes at most.
    pub fn n_ubatch(&self) -> u32 {
        match self {
            Drafter::Own(d) => d.n_ubatch(),
            Drafter::Libllama(d) => d.ctx.n_ubatch(),
        }
    }

    /// Cells per sequence: draft positions lie below it.
    pub fn n_ctx_seq(&self) -> u32 {
        match self {
            Drafter::Own(d) => d.n_cells(),
            Drafter::Libllama(d) => d.ctx.n_ctx_seq(),
        }
    }

    /// Whether rows can move to other positions (the own cache always can;
    /// libllama's cannot shift an M-RoPE draft's cells, nor a sliding-window
    /// cache's without aborting).
    pub fn can_shift(&self) -> bool {
        match self {
            Drafter::Own(_) => true,
            Drafter::Libllama(d) => d.ctx.can_shift() && !d.sliding_window,
        }
    }

    /// Writes rows of tap features into the draft KV at their positions.
    pub fn inject(&mut self, rows: &[InjectRow]) -> Result<()> {
        match self {
            Drafter::Own(d) => d.inject(rows),
            Drafter::Libllama(d) => {
                d.batch.clear();
                for r in rows {
                    d.batch.add_embd(r.stream as i32, r.features, r.pos)?;
                }
                d.ctx.decode(&d.batch).map_err(|rc| {
                    Error::backend(format!(
                        "draft injection decode failed (llama_process returned {rc}{})",
                        if rc == 1 { ": the draft KV is full" } else { "" }
                    ))
                })
            }
        }
    }

    /// What the last noise decode moved between devices to read a target head
    /// split by tensor (libllama's graph never reads one: whole, nothing moved).
    pub fn head_traffic(&self) -> HeadTraffic {
        match self {
            Drafter::Own(d) => d.head_traffic(),
            Drafter::Libllama(_) => HeadTraffic { slices: 1, ..HeadTraffic::default() },
        }
    }

    /// Decodes noise blocks of `width` rows and returns their lattice rows,
    /// block by block (`width` rows of n_embd floats each). The blocks leave
    /// the draft KV before this returns, whatever happens.
    pub fn noise(&mut self, blocks: &[NoiseBlock], width: usize, mask_token: i32) -> Result<Vec<f32>> {
        match self {
            Drafter::Own(d) => d.noise(blocks, width),
            Drafter::Libllama(d) => {
                d.batch.clear();
                let filled = (|| {
                    for b in blocks {
                        for p in 0..width {
                            let token = if p == 0 { b.id_last } else { mask_token };
                            d.batch.add_token(b.stream as i32, token, b.anchor + p as i32)?;
                        }
                    }
                    Ok::<(), Error>(())
                })();
                let decoded = filled.and_then(|()| {
                    d.ctx.decode(&d.batch).map_err(|rc| {
                        Error::backend(format!("draft noise-block decode failed (llama_process returned {rc})"))
                    })
                });
                let rows = decoded.and_then(|()| {
                    d.ctx
                        .lattice(blocks.len() * width)
                        .map(<[f32]>::to_vec)
                        .ok_or_else(|| Error::backend("the drafter produced no lattice"))
                });
                for b in blocks {
                    d.ctx.seq_rm(b.stream as i32, b.anchor, -1);
                }
                rows
            }
        }
    }

    /// Removes positions [p0, p1) of a sequence (llama's bounds).
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> bool {
        match self {
            Drafter::Own(d) => d.seq_rm(seq as usize, p0, p1),
            Drafter::Libllama(d) => d.ctx.seq_rm(seq, p0, p1),
        }
    }

    /// Adds `delta` to the positions of a sequence's rows in [p0, p1).
    pub fn seq_add(&mut self, seq: i32, p0: i32, p1: i32, delta: i32) -> Result<()> {
        match self {
            Drafter::Own(d) => d.seq_add(seq as usize, p0, p1, delta),
            Drafter::Libllama(d) => {
                d.ctx.seq_add(seq, p0, p1, delta);
                Ok(())
            }
        }
    }

    /// Makes `dst` a copy of all of `src`.
    pub fn seq_cp_all(&mut self, src: i32, dst: i32) -> Result<()> {
        match self {
            Drafter::Own(d) => d.seq_cp_all(src as usize, dst as usize),
            Drafter::Libllama(d) => {
                d.ctx.seq_cp_all(src, dst);
                Ok(())
            }
        }
    }

    /// Drops every row of every sequence.
    pub fn clear(&mut self) {
        match self {
            Drafter::Own(d) => d.clear(),
            Drafter::Libllama(d) => d.ctx.clear(),
        }
    }

    pub fn seq_pos_min(&self, seq: i32) -> i32 {
        match self {
            Drafter::Own(d) => d.pos_min(seq as usize),
            Drafter::Libllama(d) => d.ctx.seq_pos_min(seq),
        }
    }

    pub fn seq_pos_max(&self, seq: i32) -> i32 {
        match self {
            Drafter::Own(d) => d.pos_max(seq as usize),
            Drafter::Libllama(d) => d.ctx.seq_pos_max(seq),
        }
    }

    pub fn state_seq_size(&self, seq: i32) -> usize {
        match self {
            Drafter::Own(d) => d.state_size(seq as usize),
            Drafter::Libllama(d) => d.ctx.state_seq_size(seq),
        }
    }

    /// Writes a sequence's cells into `dst`; bytes written (0 on failure).
    pub fn state_seq_get(&self, seq: i32, dst: &mut [u8]) -> usize {
        match self {
            Drafter::Own(d) => d.state_get(seq as usize, dst),
            Drafter::Libllama(d) => d.ctx.state_seq_get(seq, dst),
        }
    }

    /// Loads a sequence's cells; bytes read (0 on failure).
    pub fn state_seq_set(&mut self, seq: i32, src: &[u8]) -> usize {
        match self {
            Drafter::Own(d) => d.state_set(seq as usize, src),
            Drafter::Libllama(d) => d.ctx.state_seq_set(seq, src),
        }
    }

    /// What the drafter holds on `device` (None: on all of them).
    pub fn memory_use(&self, device: Option<&Device>) -> Option<MemoryUse> {
        match self {
            Drafter::Own(own) => Some(own.memory_use(device.map(|x| x.dev))),
            Drafter::Libllama(d) => d.ctx.memory_use(device),
        }
    }

    /// The devices the drafter's layers are on (empty: the CPU only).
    pub fn devices(&self) -> Vec<Device> {
        match self {
            Drafter::Own(d) => d.devices(),
            Drafter::Libllama(d) => d.model.devices(),
        }
    }

    /// Bytes of the drafter's weights.
    pub fn weight_bytes(&self) -> u64 {
        match self {
            Drafter::Own(d) => d.weight_bytes(),
            Drafter::Libllama(d) => d.model.size(),
        }
    }

    /// Width of a lattice row.
    pub fn n_embd(&self) -> usize {
        match self {
            Drafter::Own(d) => d.n_embd(),
            Drafter::Libllama(d) => d.model.n_embd(),
        }
    }
}
