//! The engine's statistics as C reads them.

use super::boundary::{engine_status, output};
use super::engine::llama_spec_dflash2;
use crate::engine::stats::Stats;
use crate::params::LLAMA_SPEC_DFLASH2_MAX_DRAFT;

/// What an engine has done since it was created or its statistics were reset.
/// Fields are only ever appended (API version 2 added n_verify_steps and tau).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llama_spec_dflash2_stats {
    /// draft() calls.
    pub n_draft_calls: u64,
    /// Per-sequence drafts that proposed at least one token.
    pub n_drafts: u64,
    /// Tokens proposed.
    pub n_drafted: u64,
    /// accept() calls (llama_spec_dflash2_verify_greedy included).
    pub n_accept_calls: u64,
    /// Drafted tokens the host accepted.
    pub n_accepted: u64,
    /// drafted_at[i]: drafts that proposed a token at draft position i.
    pub drafted_at: [u64; LLAMA_SPEC_DFLASH2_MAX_DRAFT],
    /// accepted_at[i]: drafts whose token at position i was accepted;
    /// accepted_at[i] / drafted_at[i] is the acceptance at position i.
    pub accepted_at: [u64; LLAMA_SPEC_DFLASH2_MAX_DRAFT],
    /// Target rows injected into the draft KV, and the decodes that did it.
    pub n_injected: u64,
    pub n_inject_decodes: u64,
    /// Image rows left out (image_rows = SKIP).
    pub n_skipped_rows: u64,
    /// Rows of verify batches dropped as rejected before reaching the draft KV.
    pub n_rejected_rows: u64,
    /// Microseconds copying tap features out of the target (process).
    pub t_process_us: u64,
    /// Microseconds of injection decodes.
    pub t_inject_us: u64,
    /// Microseconds of noise-block decodes.
    pub t_draft_us: u64,
    /// Microseconds walking the selector lattice.
    pub t_walk_us: u64,
    /// Verify steps: accept() calls that closed a draft of at least one token
    /// (an accept(seq, 0) of a 0-token draft, or skipping it, counts none).
    pub n_verify_steps: u64,
    /// Mean tokens per verify step, the bonus token included:
    /// (n_accepted + n_verify_steps) / n_verify_steps; 0 before the first step.
    pub tau: f64,
    /// Tree nodes an n-gram branch proposed (params.ngram_branches; alone or
    /// with the lattice), those of them the target reached (their parent was
    /// accepted) and those it accepted (API version 6).
    pub n_ngram_nodes: u64,
    pub n_ngram_reached: u64,
    pub n_ngram_accepted: u64,
    /// Sampled drafts whose draft temperature the engine chose
    /// (params.adapt_sampled_drafts), and their mean draft temperature as
    /// a multiple of the request's (0 when none; API version 8).
    pub n_tuned_drafts: u64,
    pub mean_draft_temperature_ratio: f64,
    /// Noise-block decodes: the drafter's forward passes (API version 10).
    pub n_noise_decodes: u64,
    /// How the draft graph reads the target's output head: 1 whole, N > 1 in
    /// N vocabulary slices where a target split by tensor (-sm tensor) keeps
    /// them, 0 when the drafter has its own head (API version 10).
    pub n_head_slices: u64,
    /// Bytes that crossed devices to read a sliced head, over all noise
    /// decodes: the hidden states to each slice's device, each slice's top-k
    /// candidates (ids and logits) to the merge (0 for a whole head).
    pub head_bytes_moved: u64,
    /// What gathering every slice's logits to the merge instead would have
    /// moved on the same decodes (hidden states' copies included).
    pub head_bytes_full_gather: u64,
    /// Bytes a copy of the whole head on every slice's device would take
    /// beyond the one head the target holds (memory, not per step).
    pub head_bytes_mirrored: u64,
}

impl From<&Stats> for llama_spec_dflash2_stats {
    fn from(s: &Stats) -> Self {
        llama_spec_dflash2_stats {
            n_draft_calls: s.n_draft_calls,
            n_drafts: s.n_drafts,
            n_drafted: s.n_drafted,
            n_accept_calls: s.n_accept_calls,
            n_accepted: s.n_accepted,
            drafted_at: s.drafted_at,
            accepted_at: s.accepted_at,
            n_injected: s.n_injected,
            n_inject_decodes: s.n_inject_decodes,
            n_skipped_rows: s.n_skipped_rows,
            n_rejected_rows: s.n_rejected_rows,
            t_process_us: s.t_process_us,
            t_inject_us: s.t_inject_us,
            t_draft_us: s.t_draft_us,
            t_walk_us: s.t_walk_us,
            n_verify_steps: s.n_verify_steps,
            tau: s.tau(),
            n_ngram_nodes: s.n_ngram_nodes,
            n_ngram_reached: s.n_ngram_reached,
            n_ngram_accepted: s.n_ngram_accepted,
            n_tuned_drafts: s.n_tuned_drafts,
            mean_draft_temperature_ratio: if s.n_tuned_drafts == 0 {
                0.0
            } else {
                s.tuned_ratio_milli as f64 / 1000.0 / s.n_tuned_drafts as f64
            },
            n_noise_decodes: s.n_noise_decodes,
            n_head_slices: s.head_slices,
            head_bytes_moved: s.head_bytes_moved,
            head_bytes_full_gather: s.head_bytes_full_gather,
            head_bytes_mirrored: s.head_bytes_mirrored,
        }
    }
}

/// Copies the engine's statistics into `*stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_get_stats(
    spec: *mut llama_spec_dflash2,
    stats: *mut llama_spec_dflash2_stats,
) -> i32 {
    engine_status(spec, |e| {
        *output(stats, "stats")? = llama_spec_dflash2_stats::from(&e.stats());
        Ok(())
    })
}

/// Zeroes the engine's statistics.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_reset_stats(spec: *mut llama_spec_dflash2) -> i32 {
    engine_status(spec, |e| {
        e.reset_stats();
        Ok(())
    })
}
