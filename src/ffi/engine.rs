//! The engine's C API: create, feed, draft, verify, accept. A handle serves one
//! thread at a time; a second thread calling while another is inside gets
//! LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE.

use std::ffi::c_char;

use parking_lot::Mutex;

use super::boundary::{self, count, engine_status, engine_value, slice, slice_mut};
use crate::config::Config;
use crate::engine::{Engine, Request, Row};
use crate::error::Error;
use crate::params::llama_spec_dflash2_params;
use crate::sys::{llama_batch, llama_context, llama_token};
use crate::truncation::Truncation;

/// A DFlash2 engine bound to one target context (opaque).
///
/// Threads: different engines (each on its own target context) may be used
/// from different threads at the same time. One engine serves one call at a
/// time: a call that arrives while another thread is inside a call on the same
/// engine returns LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE at once ("another thread
/// is inside a call on this engine"), without waiting and without changing
/// anything; the host may retry it. llama_spec_dflash2_free is the exception:
/// it must not run while any other call on the engine is in progress. Calls
/// that read the target context (process, draft, verify) also need the host not
/// to decode that context at the same time, as with any libllama context.
#[allow(non_camel_case_types)]
pub struct llama_spec_dflash2 {
    pub(super) engine: Mutex<Engine>,
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

/// One sequence's part of a draft call. Zero-initialized sampling fields (a
/// `{ seq_id, id_last, n_max }` initializer) draft greedily, as API version 2 did.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct llama_spec_dflash2_draft_request {
    pub seq_id: i32,
    /// The token the host sampled last: it anchors the block. The target has not
    /// decoded it yet; it is the first row of the verify batch.
    pub id_last: i32,
    /// Most tokens to draft for this sequence (> 0); capped at the engine's n_max.
    pub n_max: i32,
    /// The host's sampling temperature for this sequence (finite, >= 0).
    /// 0: the greedy chain, bit for bit the drafts of a greedy engine (the
    /// fields below are ignored). > 0: a sampled draft: each token is drawn from
    /// the lattice distribution q = softmax(S[previous pick] / draft_temperature)
    /// over the drafter's top_k candidates of its position, and q is kept for
    /// lossless verification (llama_spec_dflash2_draft_q,
    /// llama_spec_dflash2_verify_sampled[_step]). p_min cuts on the row's
    /// temperature-1 softmax at its best candidate, known before the token is
    /// drawn; n_min does not apply to sampled drafts (dropping a short sampled
    /// draft would bias the output).
    pub temperature: f32,
    /// Temperature of the draft walk when temperature > 0: < 0 or 0 (unset) =
    /// the engine's choice for this temperature and draft shape
    /// (params.adapt_sampled_drafts; with it off, temperature); > 0 = this
    /// value. Whatever it is, the verified output is the target's. NaN and
    /// infinities are refused.
    pub draft_temperature: f32,
    /// Seed of the sequence's two generators (the draft walk's and the
    /// verifier's, independent streams of (seed, seq_id)), used as given
    /// (resolve llama.cpp's LLAMA_DEFAULT_SEED to a number first). They are
    /// seeded by the first sampled draft of the sequence after it was created
    /// or emptied (seq_clear, a seq_rm of all its rows, state_set, being the
    /// destination of seq_cp), and reseeded by a sampled draft whose seed
    /// differs from theirs; otherwise they carry on across steps. So the same
    /// seed and the same calls give the same drafts and the same verified output.
    pub seed: u32,
    /// The host sampler's top-k, top-p and min-p for this sequence (API
    /// version 8), applied to q as well when temperature > 0: the candidates
    /// the host's chain would drop (by the lattice's temperature-1 softmax,
    /// top-k, then top-p, then min-p, as llama.cpp orders them) get q = 0
    /// before the draft temperature applies, so draws are not spent on
    /// tokens p cannot accept. Lossless whatever they are. Off at 0 (a
    /// zero-initialized request cuts nothing): top_k <= 0, top_p <= 0 or >= 1,
    /// min_p <= 0. NaN and infinities, and min_p > 1, are refused.
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
}

/// A request's top-k / top-p / min-p, or why they are refused.
pub(super) fn request_truncation(seq: i32, top_k: i32, top_p: f32, min_p: f32) -> Result<Truncation, Error> {
    Truncation::new(top_k, top_p, min_p).map_err(|e| Error::invalid(format!("sequence {seq}: {}", e.message)))
}

/// Creates a DFlash2 engine for the host's target context: checks the drafter
/// (llama_spec_dflash2_checkpoint_check against the target), loads it on the
/// target's devices (or params.devices), creates its context (ctx_other = ctx_tgt)
/// and turns on capture of the drafter's tap layers on the target.
///
/// `ctx_tgt` must be a live context that outlives the engine; `path_draft` a
/// NUL-terminated path; `params.devices` NULL or a NULL-terminated array.
/// Returns NULL on failure, with the reason in llama_spec_dflash2_last_error();
/// nothing is changed on the target then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_init(
    ctx_tgt: *mut llama_context,
    path_draft: *const c_char,
    params: llama_spec_dflash2_params,
) -> *mut llama_spec_dflash2 {
    boundary::pointer(|| {
        let target = boundary::target_context(ctx_tgt)?;
        let path = boundary::path(path_draft, "path_draft")?;
        let config = Config::from_c(&params, boundary::devices(params.devices)?)?;
        Ok(boundary::new_handle(Engine::new(target, &path, &config)?))
    })
}

/// Frees an engine (NULL is ignored): the draft context and model, and the tap
/// capture it turned on in the target context. `spec` must not be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_free(spec: *mut llama_spec_dflash2) {
    boundary::quiet(|| {
        boundary::free_handle(spec);
        Ok(())
    });
}

/// Feeds the rows the target just decoded (call after every successful target
/// decode, image sub-batches included); `rows` points to `n_rows` entries.
/// Reads their tap features from the target context. Rows of a sequence with a
/// draft awaiting accept() are held (at most the draft's length + 1: its verify
/// rows); the others are committed at the sequence's next dense draft positions
/// and injected into the draft KV before the call returns once 64 or more rows
/// wait (prompt chunks), else by the next draft call, with every sequence's
/// rows in one decode.
///
/// Returns 0, or _NULL_ARGUMENT / _INVALID_ARGUMENT (bad row index or position) /
/// _UNKNOWN_SEQUENCE / _BACKEND, or _INVALID_STATE when the call order is wrong:
/// no target decode yet; more rows for a sequence than its outstanding draft's
/// verify batch (the host skipped accept()); a row whose position is below the
/// sequence's newest row (positions may repeat, as for M-RoPE image rows, but
/// not go back without llama_spec_dflash2_seq_rm; a tree's verify rows follow
/// llama_spec_dflash2_draft_tree instead). Any error is found before anything
/// changes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_process(
    spec: *mut llama_spec_dflash2,
    rows: *const llama_spec_dflash2_row,
    n_rows: i32,
) -> i32 {
    // SAFETY: the caller's contract, forwarded.
    unsafe { llama_spec_dflash2_process_tokens(spec, rows, std::ptr::null(), n_rows) }
}

/// llama_spec_dflash2_process with each row's token: `tokens[i]` (room for
/// `n_rows`) is the token row i decoded, negative for an embedding row or one
/// the host does not know; NULL = none known. The engine reads text for
/// n-gram branches (params.ngram_branches) from the tokens of committed rows:
/// pass them for prompt rows at least. A verify row's token is the draft's,
/// whatever is passed (the engine drafted it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_process_tokens(
    spec: *mut llama_spec_dflash2,
    rows: *const llama_spec_dflash2_row,
    tokens: *const llama_token,
    n_rows: i32,
) -> i32 {
    engine_status(spec, |e| {
        let n = count(n_rows, "rows")?;
        let rows = slice(rows, n, "rows")?;
        let tokens = if tokens.is_null() { None } else { Some(slice(tokens, n, "tokens")?) };
        let rows: Vec<Row> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| Row {
                i_batch: r.i_batch,
                seq: r.seq_id,
                pos: r.pos,
                embd: r.embd,
                token: tokens.map(|t| t[i]).filter(|&t| t >= 0 && !r.embd),
            })
            .collect();
        e.process(&rows)
    })
}

/// llama_spec_dflash2_process for a legacy llama_batch the host just decoded:
/// one row per token and sequence id; `batch.pos` must be set (for M-RoPE its
/// first n_tokens entries are the temporal positions); a batch with `embd` is
/// treated as embedding rows. The batch's arrays must hold `batch.n_tokens`
/// entries, as llama_decode reads them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_process_batch(spec: *mut llama_spec_dflash2, batch: llama_batch) -> i32 {
    engine_status(spec, |e| {
        if batch.pos.is_null() {
            return Err(crate::Error::invalid("batch.pos is NULL: pass explicit positions"));
        }
        let n = count(batch.n_tokens, "batch.n_tokens")?;
        let pos = slice(batch.pos, n, "batch.pos")?;
        let n_seq_id = if batch.n_seq_id.is_null() { None } else { Some(slice(batch.n_seq_id, n, "batch.n_seq_id")?) };
        let embd = !batch.embd.is_null();
        let tokens = if embd || batch.token.is_null() { None } else { Some(slice(batch.token, n, "batch.token")?) };
        let mut rows = Vec::with_capacity(n);
        for (i, &p) in pos.iter().enumerate() {
            let token = tokens.map(|t| t[i]);
            if batch.seq_id.is_null() {
                rows.push(Row { i_batch: i as i32, seq: 0, pos: p, embd, token });
                continue;
            }
            let ids = slice(batch.seq_id, n, "batch.seq_id")?[i];
            let n_ids = n_seq_id.map_or(1, |n| n[i]);
            for &seq in slice(ids.cast_const(), count(n_ids, "batch.n_seq_id[i]")?, "batch.seq_id[i]")? {
                rows.push(Row { i_batch: i as i32, seq, pos: p, embd, token });
            }
        }
        e.process(&rows)
    })
}

/// Drafts for `n_requests` sequences (`requests` points to that many) with one
/// noise-block decode (after one injection decode for any rows still waiting).
/// `tokens` (room for `n_tokens_max`) receives the drafts concatenated in
/// request order; `n_drafted` (room for `n_requests`) the length of each
/// request's draft: 0 when the walk stopped before its first token, or below
/// n_min (greedy requests). `n_tokens_max` must hold the sum of the requests'
/// n_max (capped at the engine's n_max), else _BUFFER_TOO_SMALL and nothing
/// changes. A request with temperature > 0 drafts by sampling (see
/// llama_spec_dflash2_draft_request); a bad temperature, draft_temperature or
/// id_last is _INVALID_ARGUMENT, found before anything changes.
///
/// Every requested sequence then has a draft awaiting accept(); the rows the
/// host decodes for it next (the verify batch: id_last, then the draft) are held
/// until then. A draft of 0 tokens needs no accept(): the host may call
/// accept(seq, 0) or go on to its next draft. A sequence whose previous draft
/// of one token or more was never accepted is refused with _INVALID_STATE, and
/// nothing changes: call llama_spec_dflash2_accept (or seq_clear / a seq_rm
/// from the draft's anchor on, which drop the draft).
///
/// Recurrent and hybrid targets (qwen35, qwen3next, mamba, ...) roll back
/// through recurrent-state snapshots: a context created with
/// `llama_context_params.n_rs_seq` = D rolls a sequence back by at most D rows
/// after a decode, once (llama_memory_seq_rm returns false beyond that, and
/// with D = 0), and the pinned libllama wrongly accepts rolling back every row
/// the sequence had in its last decode, then goes on from a stale state. So
/// the host keeps each rollback at most D rows and short of its last decode:
/// it asks for drafts of at most D tokens (request n_max), or verifies a
/// longer draft in chunks of at most D + 1 rows where each chunk after the
/// first starts with a drafted token the previous chunk's last row already
/// accepted (and stops at the first rejection), or restores a state it saved
/// before the verify batch (llama-server's checkpoints). dflash2 does not
/// touch the target's memory and does not cap drafts for it: it takes the
/// verify rows through any number of process() calls before accept(), keeps
/// rejected rows out of the draft KV, and its seq_rm / seq_cp / state calls
/// mirror the host's. A target seq_cp of a sequence with a pending rollback
/// copies the state before that rollback (pinned libllama); copy such a
/// sequence with llama_state_seq_get_data / _set_data instead.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_draft(
    spec: *mut llama_spec_dflash2,
    requests: *const llama_spec_dflash2_draft_request,
    n_requests: i32,
    tokens: *mut i32,
    n_tokens_max: i32,
    n_drafted: *mut i32,
) -> i32 {
    engine_status(spec, |e| {
        let n_requests = count(n_requests, "requests")?;
        // a sequence drafts once per call: more requests than sequences is a
        // bad count, refused before the arrays are read
        if n_requests > e.n_seq() {
            return Err(Error::invalid(format!("{n_requests} requests for an engine of {} sequence(s)", e.n_seq())));
        }
        let reqs = slice(requests, n_requests, "requests")?;
        let tokens = slice_mut(tokens, count(n_tokens_max, "tokens")?, "tokens")?;
        let n_drafted = slice_mut(n_drafted, n_requests, "n_drafted")?;
        let reqs: Vec<Request> = reqs
            .iter()
            .map(|r| {
                Ok(Request {
                    seq: r.seq_id,
                    id_last: r.id_last,
                    n_max: r.n_max,
                    temperature: r.temperature,
                    draft_temperature: r.draft_temperature,
                    seed: r.seed,
                    truncation: request_truncation(r.seq_id, r.top_k, r.top_p, r.min_p)?,
                })
            })
            .collect::<Result<_, Error>>()?;
        e.draft(&reqs, tokens, n_drafted)
    })
}

/// The host verified the last draft of `seq_id` and kept its first `n_accepted`
/// tokens (0 to the draft length). The anchor row and the accepted rows of the
/// verify batch enter the draft KV; the rejected rows never do. The host still
/// removes the rejected rows from its target's memory
/// (llama_memory_seq_rm(mem, seq_id, n_past + n_accepted + 1, -1)); repeating
/// that seq_rm on the engine afterwards is harmless. A draft of 0 tokens held
/// no rows: accept(seq_id, 0) closes it, and skipping it is allowed too.
/// After llama_spec_dflash2_verify_sampled_step, n_accepted must be the number
/// of positions it accepted (_INVALID_ARGUMENT otherwise), and accept() in the
/// middle of that verification is _INVALID_STATE.
/// Returns 0, or _INVALID_STATE (no draft, or the verify rows were not passed to
/// process()) / _INVALID_ARGUMENT (n_accepted out of range) / _UNKNOWN_SEQUENCE.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_accept(spec: *mut llama_spec_dflash2, seq_id: i32, n_accepted: i32) -> i32 {
    engine_status(spec, |e| e.accept(seq_id, n_accepted))
}

/// Greedy verification and accept() in one call, for a host that samples the
/// target greedily. After the verify batch was decoded and passed to
/// process(), reads the target's logits at rows `i_batch[0 .. n_rows)` of that
/// decode (each row must have asked for logits): row 0 is id_last's row, row
/// k the row of drafted token k, so n_rows is the draft's length + 1 (1 for a
/// draft of 0 tokens). It takes the argmax of each row (first maximum), keeps
/// the drafted tokens while each equals the argmax of the row before it, and
/// accepts them.
///
/// `emitted` (room for `n_emitted_max` >= n_rows tokens) receives what the
/// host emits this step: the n accepted drafted tokens, then the target's token
/// at the first mismatch (or after the whole draft); `*n_emitted` = n + 1. The
/// last of them is the next step's id_last. The host still trims its target's
/// memory to the rows it keeps (id_last's and the n accepted ones):
/// llama_memory_seq_rm(mem, seq_id, n_past + *n_emitted, -1), where n_past is
/// id_last's position.
///
/// Returns 0, or _INVALID_STATE (no draft awaiting accept, or its verify rows
/// not passed to process()) / _INVALID_ARGUMENT (n_rows is not the draft's
/// length plus one, a row is outside the batch or has no logits) /
/// _BUFFER_TOO_SMALL / _NULL_ARGUMENT / _UNKNOWN_SEQUENCE; nothing changes then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_verify_greedy(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    i_batch: *const i32,
    n_rows: i32,
    emitted: *mut i32,
    n_emitted_max: i32,
    n_emitted: *mut i32,
) -> i32 {
    engine_status(spec, |e| {
        let rows = slice(i_batch, count(n_rows, "i_batch")?, "i_batch")?;
        let out = slice_mut(emitted, count(n_emitted_max, "emitted")?, "emitted")?;
        let n_out = boundary::output(n_emitted, "n_emitted")?;
        *n_out = e.verify_greedy(seq_id, rows, out)? as i32;
        Ok(())
    })
}

/// Most tokens one draft proposes, after the block-size clamps (> 0, at most
/// LLAMA_SPEC_DFLASH2_MAX_DRAFT), or a negative status.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_n_max(spec: *mut llama_spec_dflash2) -> i32 {
    engine_value(spec, |e| Ok(e.limits().n_max as i32))
}

/// Noise block width in use (anchor + masks), or a negative status.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_block_size(spec: *mut llama_spec_dflash2) -> i32 {
    engine_value(spec, |e| Ok(e.limits().block_size as i32))
}

/// The graph that computes the drafter's forward: an `enum
/// llama_spec_dflash2_draft_graph` value (the one `params.draft_graph` asked
/// for, or libllama's where the own graph fell back for a drafter it does not
/// cover), or a negative status.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_draft_graph(spec: *mut llama_spec_dflash2) -> i32 {
    engine_value(spec, |e| {
        Ok(match e.draft_graph() {
            crate::config::DraftGraph::Own => {
                crate::params::llama_spec_dflash2_draft_graph::LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_OWN
            }
            crate::config::DraftGraph::Libllama => {
                crate::params::llama_spec_dflash2_draft_graph::LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_LIBLLAMA
            }
        } as i32)
    })
}
