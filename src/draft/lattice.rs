//! The lattice rows the walks read (`crate::selector::Lattice`): per block
//! position p, its top-k candidate ids (as f32) and a k x k score matrix
//! (predecessor index outer, successor inner), zero-padded to n_embd; row 0
//! of each block (the anchor) all zeros.
//!
//! DFlash2 (libllama's `build_dflash2_selector`, same ops): score[i][j] =
//! logit of candidate j + its successor code . (gate_p * predecessor code of
//! i), the gate a projection of the position's final hidden state; the
//! predecessor of position 1 is the block's anchor token.
//!
//! Plain DFlash has no selector: score[i][j] is candidate j's logit for
//! every i, so the greedy walk drafts each position's argmax (what
//! llama.cpp's driver drafts for such a drafter) and trees branch on the
//! next-best logits.

use super::io;
use super::spec::Spec;
use crate::sys::ggml::{GraphCtx, Tensor};
use crate::sys::{GGML_TYPE_F32, GGML_TYPE_I32};

/// DFlash2's selector weights as a graph reads them: the gate projection of
/// the final hidden state, the successor and predecessor codes.
#[derive(Clone, Copy)]
pub struct SelectorWeights<'a> {
    pub gate: Tensor<'a>,
    pub successor: Tensor<'a>,
    pub predecessor: Tensor<'a>,
}

/// Each row's `k` candidates: their ids (I32 [k, n]) and logits (F32 [k, n]).
#[derive(Clone, Copy)]
pub struct Candidates<'a> {
    pub ids: Tensor<'a>,
    pub logits: Tensor<'a>,
}

/// The top `k` of logits [n_vocab, n] (ggml's top-k: in no particular order),
/// and the logits at them.
pub fn select<'a>(g: &'a GraphCtx, logits: Tensor<'a>, k: i64) -> Candidates<'a> {
    let n = logits.ne()[1];
    let ids = g.top_k(logits, k as i32);
    let rows = g.reshape(logits, &[1, logits.ne()[0], n]);
    Candidates { ids, logits: g.reshape(g.get_rows(rows, ids), &[k, n]) }
}

/// The top `k` of logits split by vocabulary rows over devices (a head split
/// by tensor): `slices` are each slice's logits [rows, n] with the id of its
/// first row. Each slice's top k is taken where its logits are (the slice's
/// device); only those k ids and logits per slice and row travel, to be
/// merged by a top k of the union: the top k of every slice together holds
/// the top k of the whole row, so the merge picks the same candidates and
/// logits as a top k of the unsplit row (among tokens tied at the k-th logit,
/// ggml's top-k keeps any, split or not).
///
/// Nodes are named for the traffic count (`io::head_logits`, `io::head_part`,
/// `io::HEAD_MERGE`).
pub fn select_sharded<'a>(g: &'a GraphCtx, slices: &[(Tensor<'a>, i64)], k: i64) -> Candidates<'a> {
    let mut ids: Option<Tensor<'a>> = None;
    let mut logits: Option<Tensor<'a>> = None;
    for (j, &(slice, first)) in slices.iter().enumerate() {
        let k_slice = k.min(slice.ne()[0]);
        g.name(slice, &io::head_logits(j));
        if k_slice == 0 {
            continue;
        }
        let part = select(g, slice, k_slice);
        // ids travel as f32 from here (exact below 2^24, as in the lattice)
        let part_ids = g.scale_bias(g.cast(part.ids, GGML_TYPE_F32), 1.0, first as f32);
        g.name(part_ids, &io::head_part(j));
        ids = Some(ids.map_or(part_ids, |acc| g.concat(acc, part_ids, 0)));
        logits = Some(logits.map_or(part.logits, |acc| g.concat(acc, part.logits, 0)));
    }
    let (ids, logits) = (ids.expect("a head with rows"), logits.expect("a head with rows"));
    let (m, n) = (logits.ne()[0], logits.ne()[1]);
    let picked = g.top_k(logits, k as i32);
    g.name(picked, io::HEAD_MERGE);
    let pick = |t: Tensor<'a>| g.reshape(g.get_rows(g.reshape(t, &[1, m, n]), picked), &[k, n]);
    Candidates { ids: g.cast(pick(ids), GGML_TYPE_I32), logits: pick(logits) }
}

/// Lattice rows of the noise graph from each row's candidates (`select`) and
/// final hidden states [n_embd, n]; `tokens` [n] is the graph's token input;
/// `selector`: DFlash2's weights (None: plain DFlash).
pub fn build<'a>(
    g: &'a GraphCtx,
    s: &Spec,
    selector: Option<SelectorWeights<'a>>,
    picked: Candidates<'a>,
    hidden: Tensor<'a>,
    tokens: Tensor<'a>,
    width: i64,
) -> Tensor<'a> {
    let n = picked.ids.ne()[1];
    let k = s.top_k;
    let n_blocks = n / width;
    let rows = width.min(s.block_size);
    let row_used = k + k * k;

    let Candidates { ids: candidates, logits: unary } = picked;

    // everything below indexes [.., width, n_blocks]: the block position varies
    // fastest, sequences are the outer dimension
    let cand_blk = g.reshape(candidates, &[k, width, n_blocks]);
    let unary_blk = g.reshape(unary, &[k, width, n_blocks]);
    let run_of = |t: Tensor<'a>, beg: i64, n_pos: i64| {
        let nb = t.nb();
        g.cont(g.view(t, &[t.ne()[0], n_pos, n_blocks], &[nb[1], nb[2]], beg as usize * nb[1]))
    };
    let pack = |cand_run: Tensor<'a>, score: Tensor<'a>, n_pos: i64| {
        let row = g.concat(g.cast(cand_run, GGML_TYPE_F32), g.reshape(score, &[k * k, n_pos, n_blocks]), 0);
        g.pad(row, [(s.n_embd - row_used) as i32, 0, 0, 0])
    };

    let mut packed = g.fill(g.new_tensor(GGML_TYPE_F32, &[s.n_embd, 1, n_blocks]), 0.0);
    match selector {
        Some(sel) => {
            let gate = g.mul_mat(sel.gate, hidden);
            let gate_blk = g.reshape(gate, &[s.selector.expect("DFlash2").rank, width, n_blocks]);
            let rank = gate_blk.ne()[0];
            // a position's score reads only the candidate sets at p-1 and p, so a
            // run of positions has no internal dependency: one batched matmul
            let score_run = |beg: i64, n_pos: i64, pred_ids: Tensor<'a>| {
                let cand_run = run_of(cand_blk, beg, n_pos);
                let unary_run = run_of(unary_blk, beg, n_pos);
                let gate_run = run_of(gate_blk, beg, n_pos);
                let n_pred = pred_ids.ne()[0] / (n_pos * n_blocks);
                let successor = g.get_rows(sel.successor, g.reshape(cand_run, &[k * n_pos * n_blocks]));
                let successor = g.reshape(successor, &[rank, k, n_pos, n_blocks]);
                let predecessor = g.get_rows(sel.predecessor, pred_ids);
                let predecessor = g.reshape(predecessor, &[rank, n_pred, n_pos, n_blocks]);
                let gate_bcast = g.reshape(gate_run, &[rank, 1, n_pos, n_blocks]);
                let cond = g.mul(predecessor, g.repeat(gate_bcast, predecessor));
                let mut score = g.mul_mat(successor, cond);
                if n_pred == 1 {
                    score = g.repeat_4d(score, [k, k, n_pos, n_blocks]);
                }
                let unary_bcast = g.reshape(unary_run, &[k, 1, n_pos, n_blocks]);
                let score = g.add(score, g.repeat(unary_bcast, score));
                pack(cand_run, score, n_pos)
            };
            if rows > 1 {
                // position 1: its predecessor is the anchor token, one id per block
                let tn = tokens.nb();
                let anchors = g.view(tokens, &[1, n_blocks], &[width as usize * tn[0]], 0);
                let anchors = g.cont_shape(anchors, &[n_blocks]);
                packed = g.concat(packed, score_run(1, 1, anchors), 1);
            }
            if rows > 2 {
                let prev = run_of(cand_blk, 1, rows - 2);
                let prev = g.reshape(prev, &[k * (rows - 2) * n_blocks]);
                packed = g.concat(packed, score_run(2, rows - 2, prev), 1);
            }
        }
        None => {
            if rows > 1 {
                let cand_run = run_of(cand_blk, 1, rows - 1);
                let unary_run = run_of(unary_blk, 1, rows - 1);
                let unary_bcast = g.reshape(unary_run, &[k, 1, rows - 1, n_blocks]);
                let score = g.repeat_4d(unary_bcast, [k, k, rows - 1, n_blocks]);
                packed = g.concat(packed, pack(cand_run, score, rows - 1), 1);
            }
        }
    }
    debug_assert_eq!(tokens.ty(), GGML_TYPE_I32);
    g.reshape(packed, &[s.n_embd, rows * n_blocks])
}
