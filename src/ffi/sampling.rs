//! Sampled drafts through C: the draft distribution q of each drafted token,
//! and lossless verification against the host's own sampling distribution p,
//! position by position (llama.cpp's `cur_p` after its sampler chain) or for a
//! whole draft at once (dense rows).

use super::boundary::{count, engine_status, engine_value, input, optional_output, output, slice, slice_mut};
use super::engine::llama_spec_dflash2;
use crate::sampling::Dist;
use crate::sys::{llama_token, llama_token_data_array};

/// Candidates per drafted token in a sampled draft's q (the drafter's selector
/// top-k, K), or a negative status. llama_spec_dflash2_draft_q writes K
/// entries per drafted token.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_top_k(spec: *mut llama_spec_dflash2) -> i32 {
    engine_value(spec, |e| Ok(e.top_k() as i32))
}

/// The draft distribution q of every token of the sampled draft of `seq_id`
/// that awaits accept(): for drafted token i (in draft order), entries
/// [i*K, (i+1)*K) of `ids` and `probs` (K = llama_spec_dflash2_top_k) hold the
/// distinct candidate ids the token was drawn from and their probabilities
/// (given the tokens drafted before it), those with probability > 0 first, in
/// candidate order, then padding (id -1, probability 0). Each token's
/// probabilities sum to 1 up to float rounding; q is 0 outside its ids. The
/// verifier uses exactly this q.
///
/// `ids` and `probs` have room for `n_cap` >= n_drafted * K entries each;
/// `*k` (NULL allowed) receives K. Returns 0, or _INVALID_STATE (no draft
/// awaiting accept, or a greedy one: temperature 0 drafts have no q) /
/// _BUFFER_TOO_SMALL / _NULL_ARGUMENT / _UNKNOWN_SEQUENCE; nothing is written then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_draft_q(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    ids: *mut llama_token,
    probs: *mut f32,
    n_cap: i32,
    k: *mut i32,
) -> i32 {
    engine_status(spec, |e| {
        let n = count(n_cap, "n_cap")?;
        let ids = slice_mut(ids, n, "ids")?;
        let probs = slice_mut(probs, n, "probs")?;
        e.draft_q(seq_id, ids, probs)?;
        if let Some(k) = optional_output(k) {
            *k = e.top_k() as i32;
        }
        Ok(())
    })
}

/// Lossless verification of one position of the sampled draft of `seq_id`,
/// for a host that computes the target's distribution row by row (llama-server
/// runs its sampler chain per verify row). `p` is that distribution at draft
/// position `i`, i.e. after id_last and drafted tokens 0..i-1 (the verify
/// row of id_last for i = 0, of drafted token i-1 otherwise): the candidates as
/// llama.cpp's sampler chain leaves `cur_p` (`p->data[0 .. p->size)`, any order,
/// possibly a truncated list such as after top-k), read through their `.id`
/// and `.p` only (`.logit`, `selected` and `sorted` are ignored). Every `.p`
/// must be finite and >= 0, every id in the vocabulary, and they must sum to 1
/// within 1e-3 (they are then renormalized; duplicate ids add up; ids absent
/// have probability 0). A chain whose last samplers truncate without
/// renormalizing (top-p, min-p leave the kept p summing below 1) must be
/// followed by a softmax (llama.cpp's final `dist` sampler does it).
///
/// With the sequence's verify generator:
/// - 0 <= i < n_drafted: accepts drafted token i with probability
///   min(1, p(t) / q(t)): `*token` = t, `*accepted` = true, go on with i + 1;
///   otherwise `*token` = a replacement drawn from max(0, p - q) (normalized),
///   `*accepted` = false, and the verification of this draft ends.
/// - i == n_drafted (every drafted token accepted, or a draft of 0 tokens):
///   `*token` = the bonus token drawn from p, `*accepted` = false, the end.
///
/// The tokens written are what the host emits, in order; every one is
/// distributed as the target's p at its position, whatever the draft.
///
/// Call it for i = 0, 1, ... until `*accepted` is false (a call out of order,
/// or after the end, is _INVALID_STATE); then call
/// llama_spec_dflash2_accept(spec, seq_id, n) with n = the number of positions
/// accepted (the last i), which accept() checks. Returns 0, or _INVALID_STATE
/// (no draft awaiting accept, a greedy draft, the wrong position) /
/// _INVALID_ARGUMENT (i outside 0..n_drafted, a bad p) / _NULL_ARGUMENT /
/// _UNKNOWN_SEQUENCE; on error nothing changes (no random number is used) and
/// the same position may be retried.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_verify_sampled_step(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    i: i32,
    p: *const llama_token_data_array,
    token: *mut llama_token,
    accepted: *mut bool,
) -> i32 {
    engine_status(spec, |e| {
        let (ids, probs) = sparse_dist(p)?;
        let token = output(token, "token")?;
        let accepted = output(accepted, "accepted")?;
        let (t, a) = e.verify_sampled_step(seq_id, i, Dist::Sparse { ids: &ids, probs: &probs })?;
        *token = t;
        *accepted = a;
        Ok(())
    })
}

/// Lossless verification and accept() in one call for a sampled draft, with
/// the target's distributions as dense rows, for a host that has them at once.
/// After the verify batch was decoded and passed to process(): `p_rows` holds
/// `n_rows` = n_drafted + 1 rows of `n_vocab` floats (row-major; n_vocab the
/// model's vocabulary size), row k the host's sampling distribution after
/// id_last and drafted tokens 0..k-1 (the target's logits of verify row k put
/// through the host's sampler chain, e.g. softmax(logits / temperature)), each
/// row finite, >= 0, summing to 1 within 1e-3 (then renormalized).
///
/// With the sequence's verify generator it accepts drafted token i with
/// probability min(1, p_i(t) / q_i(t)), on the first rejection draws the
/// replacement from max(0, p_i - q_i) and stops, and after a fully accepted
/// draft draws the bonus token from the last row; then accepts the kept
/// tokens (llama_spec_dflash2_accept). `emitted` (room for `n_emitted_max` >=
/// n_rows tokens) receives what the host emits this step: the n accepted
/// drafted tokens, then the replacement or the bonus token; `*n_emitted` =
/// n + 1. The last of them is the next step's id_last. The host still trims
/// its target's memory to the rows it keeps (id_last's and the n accepted
/// ones): llama_memory_seq_rm(mem, seq_id, n_past + *n_emitted, -1), where
/// n_past is id_last's position.
///
/// Returns 0, or _INVALID_STATE (no draft awaiting accept, a greedy draft, one
/// that llama_spec_dflash2_verify_sampled_step began, or its verify rows not
/// passed to process()) / _INVALID_ARGUMENT (n_rows not the draft's length plus
/// one, n_vocab not the model's, a row that is not a distribution) /
/// _BUFFER_TOO_SMALL / _NULL_ARGUMENT / _UNKNOWN_SEQUENCE; nothing changes then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_verify_sampled(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    p_rows: *const f32,
    n_rows: i32,
    n_vocab: i32,
    emitted: *mut llama_token,
    n_emitted_max: i32,
    n_emitted: *mut i32,
) -> i32 {
    engine_status(spec, |e| {
        let (p, rows, vocab) = dense_rows(p_rows, n_rows, n_vocab)?;
        let out = slice_mut(emitted, count(n_emitted_max, "emitted")?, "emitted")?;
        let n_out = output(n_emitted, "n_emitted")?;
        *n_out = e.verify_sampled(seq_id, p, rows, vocab, out)? as i32;
        Ok(())
    })
}

/// A host's sparse distribution (`llama_token_data_array`, ids and p) as the
/// engine's ids and probabilities.
pub(super) fn sparse_dist(p: *const llama_token_data_array) -> crate::error::Result<(Vec<i32>, Vec<f32>)> {
    let p = input(p, "p")?;
    let data = slice(p.data.cast_const(), p.size, "p->data")?;
    Ok((data.iter().map(|d| d.id).collect(), data.iter().map(|d| d.p).collect()))
}

/// `n_rows` dense rows of `n_vocab` probabilities, with both counts checked.
pub(super) fn dense_rows<'a>(
    p_rows: *const f32,
    n_rows: i32,
    n_vocab: i32,
) -> crate::error::Result<(&'a [f32], usize, usize)> {
    let (rows, vocab) = (count(n_rows, "n_rows")?, count(n_vocab, "n_vocab")?);
    let len = rows.checked_mul(vocab).ok_or_else(|| crate::Error::invalid("n_rows * n_vocab overflows"))?;
    Ok((slice(p_rows, len, "p_rows")?, rows, vocab))
}
