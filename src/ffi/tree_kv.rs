//! The target's KV bookkeeping of tree verification in the C API: the engine
//! keeps each sequence's path and park sequence ids, tags and commits the
//! target's cells around the verify decode, and frees parked cells on demand,
//! so a host verifies trees without writing the protocol of
//! llama_spec_dflash2_draft_tree itself.

use super::boundary::{count, engine_status, engine_value, output, slice, slice_mut, value};
use super::engine::llama_spec_dflash2;
use crate::engine::tree_kv_seq_ids;
use crate::error::Error;
use crate::sys::{llama_pos, llama_seq_id, llama_token};

/// One row of a tree's verify batch: add it with its sequence ids
/// `seq_ids[seq_id_first .. seq_id_first + n_seq_id)` and logits on.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct llama_spec_dflash2_tree_row {
    pub token: llama_token,
    pub pos: llama_pos,
    pub seq_id_first: i32,
    pub n_seq_id: i32,
}

/// The n_seq_max a target context needs for `n_seq` sequences verifying trees
/// of at most `n_leaves` leaves with the engine's bookkeeping: n_seq x
/// (n_leaves + 1) (sequence k's own id k serves its first path; ids n_seq +
/// k (n_leaves - 1) on its other paths; n_seq x n_leaves + k parks its cells).
/// Returns that count, or _INVALID_ARGUMENT (a negative count, or more than
/// INT32_MAX ids).
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_tree_kv_seq_ids(n_seq: i32, n_leaves: i32) -> i32 {
    value(|| {
        let n = tree_kv_seq_ids(count(n_seq, "n_seq")?, count(n_leaves, "n_leaves")?);
        i32::try_from(n).map_err(|_| Error::invalid(format!("{n} sequence ids do not fit an int32_t")))
    })
}

/// Hands the target's KV bookkeeping of trees of at most `n_leaves` leaves to
/// the engine, for every sequence it serves (0 .. n_seq - 1). The target
/// context must be unified (kv_unified), pure attention (not recurrent or
/// hybrid) and hold llama_spec_dflash2_tree_kv_seq_ids(n_seq, n_leaves)
/// sequence ids; draft trees with max_leaves <= n_leaves. From then on the
/// engine's mirrors of the host's memory calls keep the parked cells with the
/// history: a seq_rm that cuts committed rows (not the trim of a rejected
/// draft's rows after an accept) frees the parked cells at those positions
/// (all of them for a whole sequence, p0 = p1 = -1), one that removes a tree's
/// anchor drops its path ids' cells, and seq_shift moves them.
/// Returns 0, or _INVALID_ARGUMENT (n_leaves < 1, a context that cannot hold
/// the ids or branch, named in the message) / _NULL_ARGUMENT; nothing changes then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_tree_kv_init(spec: *mut llama_spec_dflash2, n_leaves: i32) -> i32 {
    engine_status(spec, |e| e.tree_kv_init(count(n_leaves, "n_leaves")?))
}

/// The verify rows of `seq_id`'s tree (from llama_spec_dflash2_draft_tree),
/// its anchor `id_last` at `n_past`: row 0 the anchor, row i + 1 node i, each
/// with its sequence ids in `seq_ids` (room for `n_seq_ids_max`); `rows` has
/// room for `n_rows_max` (>= the tree's nodes + 1). Before returning, the
/// tree's path ids are tagged with the sequence's cells on the target (call it
/// before the verify decode, once per tree). Add the rows to the batch in
/// this order, logits on, and pass them to llama_spec_dflash2_process with
/// the sequence's own id; after verification (verify_tree_greedy, or the
/// sampled steps and accept_tree) call llama_spec_dflash2_tree_kv_commit.
/// Returns 0, or _INVALID_STATE (no bookkeeping, no tree awaiting
/// verification, its rows already out) / _INVALID_ARGUMENT (more leaves than
/// the bookkeeping's) / _BUFFER_TOO_SMALL / _NULL_ARGUMENT /
/// _UNKNOWN_SEQUENCE / _BACKEND; nothing changes on an argument error.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn llama_spec_dflash2_tree_kv_rows(
    spec: *mut llama_spec_dflash2,
    seq_id: llama_seq_id,
    id_last: llama_token,
    n_past: llama_pos,
    rows: *mut llama_spec_dflash2_tree_row,
    n_rows_max: i32,
    seq_ids: *mut llama_seq_id,
    n_seq_ids_max: i32,
    n_rows: *mut i32,
) -> i32 {
    engine_status(spec, |e| {
        let rows_out = slice_mut(rows, count(n_rows_max, "rows")?, "rows")?;
        let ids_out = slice_mut(seq_ids, count(n_seq_ids_max, "seq_ids")?, "seq_ids")?;
        let n_rows = output(n_rows, "n_rows")?;
        let verify = e.tree_kv_rows(seq_id, id_last, n_past, (rows_out.len(), ids_out.len()))?;
        let mut at = 0;
        for (slot, row) in rows_out.iter_mut().zip(&verify) {
            ids_out[at..at + row.seq_ids.len()].copy_from_slice(&row.seq_ids);
            *slot = llama_spec_dflash2_tree_row {
                token: row.token,
                pos: row.pos,
                seq_id_first: at as i32,
                n_seq_id: row.seq_ids.len() as i32,
            };
            at += row.seq_ids.len();
        }
        *n_rows = verify.len() as i32;
        Ok(())
    })
}

/// After `seq_id`'s tree was verified and the path `path[0 .. n_path)`
/// accepted (node indices from depth 1 down, as verify_tree_greedy writes
/// them; empty: no node): every cell of the step is parked under the
/// sequence's park id, the sequence keeps its prefix, the anchor and the path,
/// its other path ids are emptied. The next anchor goes to n_past + 1 + n_path.
/// Returns 0, or _INVALID_STATE (no rows out for this sequence) /
/// _INVALID_ARGUMENT (not a path of the tree) / _NULL_ARGUMENT /
/// _UNKNOWN_SEQUENCE / _BACKEND.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_tree_kv_commit(
    spec: *mut llama_spec_dflash2,
    seq_id: llama_seq_id,
    path: *const i32,
    n_path: i32,
) -> i32 {
    engine_status(spec, |e| {
        let path = slice(path, count(n_path, "path")?, "path")?;
        let path = path
            .iter()
            .map(|&i| usize::try_from(i).map_err(|_| Error::invalid(format!("path node {i} is negative"))))
            .collect::<Result<Vec<usize>, Error>>()?;
        e.tree_kv_commit(seq_id, &path)
    })
}

/// Frees every parked cell of the engine's sequences on the target (a decode
/// found the cache short of cells: retry it after this). Later rows reuse
/// those cells out of position order, so T = 0 outputs may then differ from
/// target-only decoding in the last bits (`*n_parked` of
/// llama_spec_dflash2_tree_kv_parked says how many were held; `unparked` that
/// it happened, until every sequence is emptied).
/// Returns 0, or _INVALID_STATE (no bookkeeping) / _NULL_ARGUMENT / _BACKEND.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_tree_kv_unpark(spec: *mut llama_spec_dflash2) -> i32 {
    engine_status(spec, |e| e.tree_kv_unpark())
}

/// Cells the engine's sequences hold parked on the target, and whether parked
/// cells were freed (tree_kv_unpark) since every sequence was last emptied.
/// Returns 0, or _INVALID_STATE (no bookkeeping) / _NULL_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_tree_kv_parked(
    spec: *mut llama_spec_dflash2,
    n_parked: *mut i64,
    unparked: *mut bool,
) -> i32 {
    engine_status(spec, |e| {
        let (n_out, u_out) = (output(n_parked, "n_parked")?, output(unparked, "unparked")?);
        let (n, u) = e.tree_kv_parked()?;
        (*n_out, *u_out) = (n as i64, u);
        Ok(())
    })
}

/// Whether the target's cache has free cells for `n_trees` more trees of
/// `n_nodes` nodes this step beyond a tree's rows for every sequence (cells in
/// use: each sequence's span, shared prompt cells counted for each, and the
/// parked ones). When it does not, every parked cell is freed first (as
/// llama_spec_dflash2_tree_kv_unpark) and `*room` is false: draft chains
/// until the sequences' history is next cut.
/// Returns 0, or _INVALID_STATE (no bookkeeping) / _INVALID_ARGUMENT /
/// _NULL_ARGUMENT / _BACKEND.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_tree_kv_room(
    spec: *mut llama_spec_dflash2,
    n_trees: i32,
    n_nodes: i32,
    room: *mut bool,
) -> i32 {
    engine_status(spec, |e| {
        let (n_trees, n_nodes, room) = (count(n_trees, "n_trees")?, count(n_nodes, "n_nodes")?, output(room, "room")?);
        *room = e.tree_kv_room(n_trees, n_nodes)?;
        Ok(())
    })
}

/// The engine's sequence that sequence id `seq_id` of the bookkeeping belongs
/// to: a sequence's own id, one of its path ids or its park id (other ids are
/// returned as they are), for a host that tells llama_spec_dflash2_process
/// each row of a verify batch once, under its owner.
/// Returns the owner (>= 0), or _INVALID_STATE (no bookkeeping) / _NULL_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_tree_kv_owner(spec: *mut llama_spec_dflash2, seq_id: llama_seq_id) -> i32 {
    engine_value(spec, |e| e.tree_kv_owner(seq_id))
}

/// A row more for a target decode of `n_rows` rows (its batch holds
/// `n_rows_max`; `seq_id_last` is its last row's sequence id) that carries
/// the engine's tree rows: where the decode's last ubatch would hold one row
/// over 512 or more cells (parked ones among them) on a CPU target, ggml's
/// flash attention would split that row's cells across threads and sum the
/// parts, while target-only decoding (its sequence holding at most 256
/// cells) sums them in one pass, and T = 0 outputs could differ in the last
/// bits. The row keeps that ubatch at two rows: add `*row` with the one
/// sequence id `*seq_id` (the last row's sequence's park id, right after the
/// cells it holds) at the end of the batch, logits off, and leave it out of
/// llama_spec_dflash2_process; its cell is parked as it is decoded and no
/// query reads it. Call it after the step's rows are in the batch
/// (llama_spec_dflash2_tree_kv_rows), before the decode; a batch decoded in
/// several llama_decode calls asks for its last one. A quantized KV cache
/// never splits (the engine does not see the cache's type): a host that knows
/// its cache is quantized may skip the call; the row changes no output.
/// Returns 1 (a row to add), 0 (none needed, or the batch is full), or
/// _INVALID_STATE (no bookkeeping) / _INVALID_ARGUMENT (n_rows < 1) /
/// _UNKNOWN_SEQUENCE (seq_id_last is none of the engine's ids) / _NULL_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_tree_kv_pad(
    spec: *mut llama_spec_dflash2,
    n_rows: i32,
    n_rows_max: i32,
    seq_id_last: llama_seq_id,
    row: *mut llama_spec_dflash2_tree_row,
    seq_id: *mut llama_seq_id,
) -> i32 {
    engine_value(spec, |e| {
        let (n_rows, n_rows_max) = (count(n_rows, "n_rows")?, count(n_rows_max, "n_rows_max")?);
        let (row_out, id_out) = (output(row, "row")?, output(seq_id, "seq_id")?);
        let Some(pad) = e.tree_kv_pad(n_rows, n_rows_max, seq_id_last)? else { return Ok(0) };
        *row_out = llama_spec_dflash2_tree_row { token: pad.token, pos: pad.pos, seq_id_first: 0, n_seq_id: 1 };
        *id_out = pad.seq_ids[0];
        Ok(1)
    })
}
