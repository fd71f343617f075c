//! What an engine counts and times; the C API converts it to
//! `llama_spec_dflash2_stats`.

use crate::params::LLAMA_SPEC_DFLASH2_MAX_DRAFT;

/// Counters and timings since the engine was created or its stats were reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    pub n_draft_calls: u64,
    /// Per-sequence drafts with at least one token.
    pub n_drafts: u64,
    pub n_drafted: u64,
    pub n_accept_calls: u64,
    pub n_accepted: u64,
    /// accept() calls that closed a draft of at least one token.
    pub n_verify_steps: u64,
    /// [i]: drafts with a token at draft position i.
    pub drafted_at: [u64; LLAMA_SPEC_DFLASH2_MAX_DRAFT],
    /// [i]: drafts whose token at draft position i was accepted.
    pub accepted_at: [u64; LLAMA_SPEC_DFLASH2_MAX_DRAFT],
    pub n_injected: u64,
    pub n_inject_decodes: u64,
    pub n_skipped_rows: u64,
    pub n_rejected_rows: u64,
    pub t_process_us: u64,
    pub t_inject_us: u64,
    pub t_draft_us: u64,
    pub t_walk_us: u64,
    /// Tree nodes an n-gram branch proposed (alone or with the lattice), and
    /// of those the target reached and accepted.
    pub n_ngram_nodes: u64,
    pub n_ngram_reached: u64,
    pub n_ngram_accepted: u64,
    /// Sampled drafts whose draft temperature the engine chose, and the sum
    /// of their draft temperature / request temperature in thousandths.
    pub n_tuned_drafts: u64,
    pub tuned_ratio_milli: u64,
    /// Noise-block decodes (one per draft call that ran the drafter).
    pub n_noise_decodes: u64,
    /// The target's head as the draft graph reads it (`HeadTraffic`): slices,
    /// bytes moved between devices over all noise decodes, what a full-logit
    /// gather would have moved, what a mirrored head would take.
    pub head_slices: u64,
    pub head_bytes_moved: u64,
    pub head_bytes_full_gather: u64,
    pub head_bytes_mirrored: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            n_draft_calls: 0,
            n_drafts: 0,
            n_drafted: 0,
            n_accept_calls: 0,
            n_accepted: 0,
            n_verify_steps: 0,
            drafted_at: [0; LLAMA_SPEC_DFLASH2_MAX_DRAFT],
            accepted_at: [0; LLAMA_SPEC_DFLASH2_MAX_DRAFT],
            n_injected: 0,
            n_inject_decodes: 0,
            n_skipped_rows: 0,
            n_rejected_rows: 0,
            t_process_us: 0,
            t_inject_us: 0,
            t_draft_us: 0,
            t_walk_us: 0,
            n_ngram_nodes: 0,
            n_ngram_reached: 0,
            n_ngram_accepted: 0,
            n_tuned_drafts: 0,
            tuned_ratio_milli: 0,
            n_noise_decodes: 0,
            head_slices: 0,
            head_bytes_moved: 0,
            head_bytes_full_gather: 0,
            head_bytes_mirrored: 0,
        }
    }
}

impl Stats {
    /// A noise decode and what it moved to read the target's head.
    pub fn record_noise(&mut self, t: &crate::draft::HeadTraffic) {
        self.n_noise_decodes += 1;
        self.head_slices = t.slices;
        self.head_bytes_moved += t.moved;
        self.head_bytes_full_gather += t.full_gather;
        self.head_bytes_mirrored = t.mirrored;
    }

    pub fn record_draft(&mut self, n: usize) {
        if n > 0 {
            self.n_drafts += 1;
            self.n_drafted += n as u64;
        }
        for slot in &mut self.drafted_at[..n.min(LLAMA_SPEC_DFLASH2_MAX_DRAFT)] {
            *slot += 1;
        }
    }

    /// An accept() of `n_accepted` tokens of a draft of `n_drafted`.
    pub fn record_accept(&mut self, n_drafted: usize, n_accepted: usize) {
        self.n_accept_calls += 1;
        self.n_accepted += n_accepted as u64;
        if n_drafted > 0 {
            self.n_verify_steps += 1;
        }
        for slot in &mut self.accepted_at[..n_accepted.min(LLAMA_SPEC_DFLASH2_MAX_DRAFT)] {
            *slot += 1;
        }
    }

    /// Mean tokens a verify step of a non-empty draft yields: its accepted
    /// tokens plus the one the target adds; 0 before the first such step.
    pub fn tau(&self) -> f64 {
        if self.n_verify_steps == 0 {
            return 0.0;
        }
        (self.n_accepted + self.n_verify_steps) as f64 / self.n_verify_steps as f64
    }
}

/// Microseconds since `t`.
pub fn us_since(t: std::time::Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tau_counts_the_bonus_token_of_every_verified_draft_and_ignores_empty_ones() {
        let mut s = Stats::default();
        assert_eq!(s.tau(), 0.0);
        s.record_accept(3, 3); // 4 tokens
        s.record_accept(3, 0); // 1 token
        s.record_accept(0, 0); // no draft: no verify step
        assert_eq!((s.n_accept_calls, s.n_verify_steps, s.n_accepted), (3, 2, 3));
        assert_eq!(s.tau(), 2.5);
        assert_eq!(&s.accepted_at[..4], &[1, 1, 1, 0]);
    }
}
