//! The engine's C API: create, feed, draft, accept, memory operations, state,
//! statistics. A handle serves one thread at a time; a second thread calling
//! while another is inside gets LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE.

use std::ffi::c_char;

use parking_lot::Mutex;

use super::guard::{guard, guard_status, null_argument, path_arg};
use crate::engine::stats::llama_spec_dflash2_stats;
use crate::engine::{Engine, Request, Row};
use crate::error::{Error, Result, Status};
use crate::params::llama_spec_dflash2_params;
use crate::sys::{TargetContext, ggml_backend_dev_t, llama_batch, llama_context};

/// A DFlash2 engine bound to one target context (opaque).
#[allow(non_camel_case_types)]
pub struct llama_spec_dflash2 {
    engine: Mutex<Engine>,
}

/// One row of the batch the target just decoded.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llama_spec_dflash2_row {
    /// Index of the row in the target batch: the row of its captured layer inputs.
    pub i_batch: i32,
    /// Sequence of the row (a row shared by several sequences is passed once per sequence).
    pub seq_id: i32,
    /// Target position of the row; for M-RoPE its first (temporal) component.
    pub pos: i32,
    /// The row was decoded from an embedding (image, audio), not a token.
    pub embd: bool,
}

/// One sequence's part of a draft call.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llama_spec_dflash2_draft_request {
    pub seq_id: i32,
    /// The token the host sampled last: it anchors the block. The target has not
    /// decoded it yet; it is the first row of the verify batch.
    pub id_last: i32,
    /// Most tokens to draft for this sequence (> 0); capped at the engine's n_max.
    pub n_max: i32,
}

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

/// Runs `body` on the engine behind `spec`.
///
/// # Safety
/// `spec` must be NULL or a live handle from llama_spec_dflash2_init.
unsafe fn with_engine<T>(spec: *mut llama_spec_dflash2, body: impl FnOnce(&mut Engine) -> Result<T>) -> Result<T> {
    // SAFETY: NULL or live per the contract.
    let spec = unsafe { spec.as_ref() }.ok_or_else(|| null_argument("spec"))?;
    let mut engine = spec.engine.try_lock().ok_or_else(|| {
        Error::new(
            Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE,
            "another thread is inside a call on this engine; use one engine per thread at a time",
        )
    })?;
    body(&mut engine)
}

/// # Safety
/// `ptr` must be NULL (then `n` must be 0) or readable for `n` elements.
unsafe fn slice_arg<'a, T>(ptr: *const T, n: i32, name: &str) -> Result<&'a [T]> {
    if n < 0 {
        return Err(Error::invalid(format!("'{name}' count {n} is negative")));
    }
    if n == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(null_argument(name));
    }
    // SAFETY: non-null and readable for n elements per the contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n as usize) })
}

/// # Safety
/// As `slice_arg`, writable.
unsafe fn slice_mut_arg<'a, T>(ptr: *mut T, n: i32, name: &str) -> Result<&'a mut [T]> {
    if n < 0 {
        return Err(Error::invalid(format!("'{name}' capacity {n} is negative")));
    }
    if n == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(null_argument(name));
    }
    // SAFETY: non-null and writable for n elements per the contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, n as usize) })
}

/// Reads a NULL-terminated device list.
///
/// # Safety
/// `devices` must be NULL or a NULL-terminated array.
unsafe fn device_list(devices: *mut ggml_backend_dev_t) -> Result<Option<Vec<ggml_backend_dev_t>>> {
    if devices.is_null() {
        return Ok(None);
    }
    const MAX: usize = 256;
    let mut out = Vec::new();
    for i in 0..MAX {
        // SAFETY: NULL-terminated per the contract; read up to the terminator.
        let d = unsafe { *devices.add(i) };
        if d.is_null() {
            return Ok(Some(out));
        }
        out.push(d);
    }
    Err(Error::invalid(format!("params.devices has no NULL terminator within {MAX} entries")))
}

/// Creates a DFlash2 engine for the host's target context: checks the drafter
/// (llama_spec_dflash2_checkpoint_check against the target), loads it on the
/// target's devices (or params.devices), creates its context (ctx_other = ctx_tgt)
/// and turns on capture of the drafter's tap layers on the target.
///
/// The target context must outlive the engine. Returns NULL on failure, with the
/// reason in llama_spec_dflash2_last_error(); nothing is changed on the target then.
///
/// # Safety
/// `ctx_tgt` must be NULL or a live context, `path_draft` NULL or a NUL-terminated
/// string, `params.devices` NULL or a NULL-terminated array.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_init(
    ctx_tgt: *mut llama_context,
    path_draft: *const c_char,
    params: llama_spec_dflash2_params,
) -> *mut llama_spec_dflash2 {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the function's contract.
        let target = unsafe { TargetContext::from_raw(ctx_tgt) }.ok_or_else(|| null_argument("ctx_tgt"))?;
        // SAFETY: per the function's contract.
        let path = unsafe { path_arg(path_draft, "path_draft") }?;
        // SAFETY: per the function's contract.
        let devices = unsafe { device_list(params.devices) }?;
        let engine = Engine::new(target, &path, &params, devices)?;
        Ok(Box::into_raw(Box::new(llama_spec_dflash2 { engine: Mutex::new(engine) })))
    })
    .0
}

/// Frees an engine (NULL is ignored): the draft context and model, and the tap
/// capture it turned on in the target context.
///
/// # Safety
/// `spec` must be NULL or a handle from llama_spec_dflash2_init, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_free(spec: *mut llama_spec_dflash2) {
    guard((), || {
        if !spec.is_null() {
            // SAFETY: a handle from init, owned by the caller until now.
            drop(unsafe { Box::from_raw(spec) });
        }
        Ok(())
    });
}

/// Feeds the rows the target just decoded (call after every successful target
/// decode, image sub-batches included). Reads their tap features from the target
/// context. Rows of a sequence with a draft awaiting accept() are held; the
/// others are committed at the sequence's next dense draft positions and
/// injected into the draft KV before the call returns once 64 or more rows wait
/// (prompt chunks), else by the next draft call, with every sequence's rows in
/// one decode.
///
/// Returns 0, or _NULL_ARGUMENT / _INVALID_ARGUMENT (bad row index or position) /
/// _UNKNOWN_SEQUENCE / _INVALID_STATE (no target decode yet) / _BACKEND. A row
/// error is found before anything changes.
///
/// # Safety
/// `spec` NULL or live; `rows` readable for `n_rows` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_process(
    spec: *mut llama_spec_dflash2,
    rows: *const llama_spec_dflash2_row,
    n_rows: i32,
) -> i32 {
    guard_status(|| {
        // SAFETY: per the function's contract.
        let rows = unsafe { slice_arg(rows, n_rows, "rows") }?;
        let rows: Vec<Row> =
            rows.iter().map(|r| Row { i_batch: r.i_batch, seq: r.seq_id, pos: r.pos, embd: r.embd }).collect();
        // SAFETY: per the function's contract.
        unsafe { with_engine(spec, |e| e.process(&rows)) }
    })
}

/// llama_spec_dflash2_process for a legacy llama_batch the host just decoded:
/// one row per token and sequence id; `batch.pos` must be set (for M-RoPE its
/// first n_tokens entries are the temporal positions); a batch with `embd` is
/// treated as embedding rows.
///
/// # Safety
/// `spec` NULL or live; the batch arrays readable for `batch.n_tokens` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_process_batch(spec: *mut llama_spec_dflash2, batch: llama_batch) -> i32 {
    guard_status(|| {
        if batch.pos.is_null() {
            return Err(Error::invalid("batch.pos is NULL: pass explicit positions"));
        }
        let n = batch.n_tokens;
        // SAFETY: per the function's contract.
        let pos = unsafe { slice_arg(batch.pos, n, "batch.pos") }?;
        let mut rows = Vec::with_capacity(n.max(0) as usize);
        for (i, &p) in pos.iter().enumerate() {
            let embd = !batch.embd.is_null();
            if batch.seq_id.is_null() {
                rows.push(Row { i_batch: i as i32, seq: 0, pos: p, embd });
                continue;
            }
            // SAFETY: seq_id and n_seq_id are arrays of n_tokens per the contract.
            let (n_seq, ids) = unsafe {
                let n_seq = if batch.n_seq_id.is_null() { 1 } else { *batch.n_seq_id.add(i) };
                (n_seq, *batch.seq_id.add(i))
            };
            // SAFETY: each seq_id[i] holds n_seq_id[i] ids.
            for &seq in unsafe { slice_arg(ids, n_seq, "batch.seq_id[i]") }? {
                rows.push(Row { i_batch: i as i32, seq, pos: p, embd });
            }
        }
        // SAFETY: per the function's contract.
        unsafe { with_engine(spec, |e| e.process(&rows)) }
    })
}

/// Drafts for `n_requests` sequences with one noise-block decode (after one
/// injection decode for any rows still waiting). `tokens` receives the drafts
/// concatenated in request order; `n_drafted[i]` the length of request i's draft
/// (0 when the walk stopped before its first token, or below n_min).
/// `n_tokens_max` must hold the sum of the requests' n_max (capped at the
/// engine's n_max), else _BUFFER_TOO_SMALL and nothing changes.
///
/// Every requested sequence then has a draft awaiting accept(); the rows the
/// host decodes for it next (the verify batch: id_last, then the draft) are held
/// until then. A previous draft never accepted is taken as fully kept.
///
/// # Safety
/// `spec` NULL or live; `requests` readable for `n_requests`; `tokens` writable
/// for `n_tokens_max`; `n_drafted` writable for `n_requests`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_draft(
    spec: *mut llama_spec_dflash2,
    requests: *const llama_spec_dflash2_draft_request,
    n_requests: i32,
    tokens: *mut i32,
    n_tokens_max: i32,
    n_drafted: *mut i32,
) -> i32 {
    guard_status(|| {
        // SAFETY: per the function's contract.
        let reqs = unsafe { slice_arg(requests, n_requests, "requests") }?;
        // SAFETY: per the function's contract.
        let tokens = unsafe { slice_mut_arg(tokens, n_tokens_max, "tokens") }?;
        // SAFETY: per the function's contract.
        let n_drafted = unsafe { slice_mut_arg(n_drafted, n_requests, "n_drafted") }?;
        let reqs: Vec<Request> =
            reqs.iter().map(|r| Request { seq: r.seq_id, id_last: r.id_last, n_max: r.n_max }).collect();
        // SAFETY: per the function's contract.
        unsafe { with_engine(spec, |e| e.draft(&reqs, tokens, n_drafted)) }
    })
}

/// The host verified the last draft of `seq_id` and kept its first `n_accepted`
/// tokens (0 ..= draft length). The anchor row and the accepted rows of the
/// verify batch enter the draft KV; the rejected rows never do.
/// Returns 0, or _INVALID_STATE (no draft, or the verify rows were not passed to
/// process()) / _INVALID_ARGUMENT (n_accepted out of range) / _UNKNOWN_SEQUENCE.
///
/// # Safety
/// `spec` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_accept(spec: *mut llama_spec_dflash2, seq_id: i32, n_accepted: i32) -> i32 {
    // SAFETY: per the function's contract.
    guard_status(|| unsafe { with_engine(spec, |e| e.accept(seq_id, n_accepted)) })
}

/// Mirrors llama_memory_seq_rm on the target: removes the rows at target
/// positions [p0, p1) (p0 < 0: from 0; p1 < 0: to the end; seq_id < 0: every
/// sequence). Rows after a removed span keep dense draft positions.
///
/// # Safety
/// `spec` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_rm(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    p0: i32,
    p1: i32,
) -> i32 {
    // SAFETY: per the function's contract.
    guard_status(|| unsafe { with_engine(spec, |e| e.seq_rm(seq_id, p0, p1)) })
}

/// Mirrors llama_memory_seq_cp on the target: `dst` becomes a copy of the rows
/// of `src` at target positions [p0, p1); what `dst` held is replaced.
///
/// # Safety
/// `spec` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_cp(
    spec: *mut llama_spec_dflash2,
    seq_id_src: i32,
    seq_id_dst: i32,
    p0: i32,
    p1: i32,
) -> i32 {
    // SAFETY: per the function's contract.
    guard_status(|| unsafe { with_engine(spec, |e| e.seq_cp(seq_id_src, seq_id_dst, p0, p1)) })
}

/// Mirrors llama_memory_seq_add on the target (context shift, cache reuse): the
/// rows at target positions [p0, p1) now sit at position + delta. The draft KV
/// is unchanged: its positions are dense and do not follow the target's.
///
/// # Safety
/// `spec` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_shift(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    p0: i32,
    p1: i32,
    delta: i32,
) -> i32 {
    // SAFETY: per the function's contract.
    guard_status(|| unsafe { with_engine(spec, |e| e.seq_shift(seq_id, p0, p1, delta)) })
}

/// Forgets a sequence entirely, a draft awaiting accept() included (seq_id < 0:
/// every sequence).
///
/// # Safety
/// `spec` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_clear(spec: *mut llama_spec_dflash2, seq_id: i32) -> i32 {
    // SAFETY: per the function's contract.
    guard_status(|| unsafe { with_engine(spec, |e| e.seq_clear(seq_id)) })
}

/// Size in bytes of the state blob of `seq_id` (its draft KV cells, position map
/// and queued rows; grows with the sequence, not with the context).
/// Returns 0, or _INVALID_STATE when verify rows await accept().
///
/// # Safety
/// `spec` NULL or live; `size` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_state_size(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    size: *mut usize,
) -> i32 {
    guard_status(|| {
        // SAFETY: per the function's contract.
        let out = unsafe { size.as_mut() }.ok_or_else(|| null_argument("size"))?;
        // SAFETY: per the function's contract.
        *out = unsafe { with_engine(spec, |e| e.state_size(seq_id)) }?;
        Ok(())
    })
}

/// Writes the state blob of `seq_id` into `dst` (capacity `dst_size`); `written`
/// receives its length. _BUFFER_TOO_SMALL when it does not fit.
///
/// # Safety
/// `spec` NULL or live; `dst` writable for `dst_size` bytes; `written` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_state_get(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    dst: *mut u8,
    dst_size: usize,
    written: *mut usize,
) -> i32 {
    guard_status(|| {
        // SAFETY: per the function's contract.
        let written = unsafe { written.as_mut() }.ok_or_else(|| null_argument("written"))?;
        if dst.is_null() {
            return Err(null_argument("dst"));
        }
        // SAFETY: non-null, writable for dst_size bytes per the contract.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, dst_size) };
        // SAFETY: per the function's contract.
        *written = unsafe { with_engine(spec, |e| e.state_get(seq_id, dst)) }?;
        Ok(())
    })
}

/// Replaces the state of `seq_id` with a blob from llama_spec_dflash2_state_get
/// (this engine or another with the same drafter). A blob from another drafter or
/// a corrupt one is refused before anything changes; if libllama then fails to
/// load the KV, the sequence is left empty.
///
/// # Safety
/// `spec` NULL or live; `src` readable for `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_state_set(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    src: *const u8,
    size: usize,
) -> i32 {
    guard_status(|| {
        if src.is_null() {
            return Err(null_argument("src"));
        }
        // SAFETY: non-null, readable for size bytes per the contract.
        let src = unsafe { std::slice::from_raw_parts(src, size) };
        // SAFETY: per the function's contract.
        unsafe { with_engine(spec, |e| e.state_set(seq_id, src)) }
    })
}

/// Most tokens one draft proposes, after the block-size clamps (> 0), or a
/// negative status.
///
/// # Safety
/// `spec` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_n_max(spec: *mut llama_spec_dflash2) -> i32 {
    // SAFETY: per the function's contract.
    let (v, rc) = guard(0, || unsafe { with_engine(spec, |e| Ok(e.limits().n_max as i32)) });
    if rc == 0 { v } else { rc }
}

/// Noise block width in use (anchor + masks), or a negative status.
///
/// # Safety
/// `spec` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_block_size(spec: *mut llama_spec_dflash2) -> i32 {
    // SAFETY: per the function's contract.
    let (v, rc) = guard(0, || unsafe { with_engine(spec, |e| Ok(e.limits().block_size as i32)) });
    if rc == 0 { v } else { rc }
}

/// Copies the engine's statistics into `stats`.
///
/// # Safety
/// `spec` NULL or live; `stats` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_get_stats(
    spec: *mut llama_spec_dflash2,
    stats: *mut llama_spec_dflash2_stats,
) -> i32 {
    guard_status(|| {
        // SAFETY: per the function's contract.
        let out = unsafe { stats.as_mut() }.ok_or_else(|| null_argument("stats"))?;
        // SAFETY: per the function's contract.
        *out = unsafe { with_engine(spec, |e| Ok(e.stats())) }?;
        Ok(())
    })
}

/// Zeroes the engine's statistics.
///
/// # Safety
/// `spec` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_reset_stats(spec: *mut llama_spec_dflash2) -> i32 {
    // SAFETY: per the function's contract.
    guard_status(|| unsafe {
        with_engine(spec, |e| {
            e.reset_stats();
            Ok(())
        })
    })
}

/// What the engine holds for `seq_id` (for checks and debugging).
///
/// # Safety
/// `spec` NULL or live; `info` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_seq_info(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    info: *mut llama_spec_dflash2_seq_info,
) -> i32 {
    guard_status(|| {
        // SAFETY: per the function's contract.
        let out = unsafe { info.as_mut() }.ok_or_else(|| null_argument("info"))?;
        // SAFETY: per the function's contract.
        let i = unsafe { with_engine(spec, |e| e.seq_info(seq_id)) }?;
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
