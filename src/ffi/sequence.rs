//! Per-sequence C API: the host's memory operations mirrored, state save and
//! restore, what the engine holds for a sequence.

use super::boundary::{engine_status, output, slice, slice_mut};
use super::engine::llama_spec_dflash2;

/// What the engine holds for one sequence.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct llama_spec_dflash2_seq_info {
    /// Rows in the draft KV.
    pub n_in_kv: i32,
    /// Committed rows waiting for injection (done by the next process() or draft()).
    pub n_queued: i32,
    /// Verify rows held until accept().
    pub n_held: i32,
    /// Tokens of the draft awaiting accept(), or -1 when none.
    pub n_outstanding: i32,
    /// Draft position the next row (or noise block) takes.
    pub next_draft_pos: i32,
    /// Target position of the newest committed row, or -1.
    pub last_target_pos: i32,
    /// Lowest and highest draft positions of the sequence in the draft KV (-1 when empty),
    /// as libllama reports them.
    pub kv_pos_min: i32,
    pub kv_pos_max: i32,
}

/// Mirrors llama_memory_seq_rm on the target: removes the rows at target
/// positions [p0, p1) (p0 < 0: from 0; p1 < 0: to the end; seq_id < 0: every
/// sequence). Rows after a removed span keep dense draft positions. Removing
/// every position from an outstanding draft's anchor on drops that draft (no
/// accept() follows then).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_rm(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    p0: i32,
    p1: i32,
) -> i32 {
    engine_status(spec, |e| e.seq_rm(seq_id, p0, p1))
}

/// Mirrors llama_memory_seq_cp on the target: `dst` becomes a copy of the rows
/// of `src` at target positions [p0, p1); what `dst` held is replaced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_cp(
    spec: *mut llama_spec_dflash2,
    seq_id_src: i32,
    seq_id_dst: i32,
    p0: i32,
    p1: i32,
) -> i32 {
    engine_status(spec, |e| e.seq_cp(seq_id_src, seq_id_dst, p0, p1))
}

/// Mirrors llama_memory_seq_add on the target (context shift, cache reuse): the
/// rows at target positions [p0, p1) now sit at position + delta. The draft KV
/// is unchanged: its positions are dense and do not follow the target's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_shift(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    p0: i32,
    p1: i32,
    delta: i32,
) -> i32 {
    engine_status(spec, |e| e.seq_shift(seq_id, p0, p1, delta))
}

/// Forgets a sequence entirely, a draft awaiting accept() included (seq_id < 0:
/// every sequence).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_clear(spec: *mut llama_spec_dflash2, seq_id: i32) -> i32 {
    engine_status(spec, |e| e.seq_clear(seq_id))
}

/// Writes to `*size` the size in bytes of the state blob of `seq_id` (its draft
/// KV cells, position map, queued rows and text, the tokens its n-gram branches
/// match; grows with the sequence, not with the context). Returns 0, or _INVALID_STATE when verify rows await accept().
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_state_size(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    size: *mut usize,
) -> i32 {
    engine_status(spec, |e| {
        let out = output(size, "size")?;
        *out = e.state_size(seq_id)?;
        Ok(())
    })
}

/// Writes the state blob of `seq_id` into `dst`, which has room for `dst_size`
/// bytes; `*written` receives its length. _BUFFER_TOO_SMALL when it does not fit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_state_get(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    dst: *mut u8,
    dst_size: usize,
    written: *mut usize,
) -> i32 {
    engine_status(spec, |e| {
        let written = output(written, "written")?;
        let dst = slice_mut(dst, dst_size.max(1), "dst")?;
        *written = e.state_get(seq_id, &mut dst[..dst_size])?;
        Ok(())
    })
}

/// Replaces the state of `seq_id` with a blob of `size` bytes at `src`, from
/// llama_spec_dflash2_state_get (this engine or another with the same drafter).
/// A blob from another drafter or a corrupt one is refused before anything
/// changes; if libllama then fails to load the KV, the sequence is left empty.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_state_set(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    src: *const u8,
    size: usize,
) -> i32 {
    engine_status(spec, |e| {
        let src = slice(src, size.max(1), "src")?;
        e.state_set(seq_id, &src[..size])
    })
}

/// Writes to `*info` what the engine holds for `seq_id` (for checks and debugging).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_info(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    info: *mut llama_spec_dflash2_seq_info,
) -> i32 {
    engine_status(spec, |e| {
        let out = output(info, "info")?;
        let i = e.seq_info(seq_id)?;
        *out = llama_spec_dflash2_seq_info {
            n_in_kv: i.n_in_kv as i32,
            n_queued: i.n_queued as i32,
            n_held: i.n_held as i32,
            n_outstanding: i.outstanding.map_or(-1, |n| n as i32),
            next_draft_pos: i.next_draft_pos,
            last_target_pos: i.last_target_pos.unwrap_or(-1),
            kv_pos_min: i.kv_pos_min,
            kv_pos_max: i.kv_pos_max,
        };
        Ok(())
    })
}
