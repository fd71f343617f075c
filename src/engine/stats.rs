//! Counters and timings of an engine, as C reads them.

/// Draft positions tracked per position in the statistics.
pub const LLAMA_SPEC_DFLASH2_MAX_DRAFT: usize = 64;

/// What an engine has done since it was created or its statistics were reset.
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
    /// accept() calls.
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
}

impl Default for llama_spec_dflash2_stats {
    fn default() -> Self {
        llama_spec_dflash2_stats {
            n_draft_calls: 0,
            n_drafts: 0,
            n_drafted: 0,
            n_accept_calls: 0,
            n_accepted: 0,
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
        }
    }
}

impl llama_spec_dflash2_stats {
    pub fn record_draft(&mut self, n: usize) {
        if n > 0 {
            self.n_drafts += 1;
            self.n_drafted += n as u64;
        }
        for slot in &mut self.drafted_at[..n.min(LLAMA_SPEC_DFLASH2_MAX_DRAFT)] {
            *slot += 1;
        }
    }

    pub fn record_accept(&mut self, n: usize) {
        self.n_accept_calls += 1;
        self.n_accepted += n as u64;
        for slot in &mut self.accepted_at[..n.min(LLAMA_SPEC_DFLASH2_MAX_DRAFT)] {
            *slot += 1;
        }
    }
}

/// Microseconds since `t`.
pub fn us_since(t: std::time::Instant) -> u64 {
    t.elapsed().as_micros() as u64
}
