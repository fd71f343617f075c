//! Adaptive draft length: how many drafted tokens are worth verifying.
//!
//! A drafted token at position m pays for itself when the probability that the
//! target reaches and accepts it is at least the rate the host already achieves
//! (tokens per second) times the cost of verifying one more row (seconds): with
//! long-run rate rho and marginal verify cost b, keep token m iff
//! P(tokens 1..m accepted) >= rho * b (renewal-reward). Drafting at all pays when
//! the expected accepted tokens exceed rho times the draft decode plus the extra
//! verify rows. Everything here is measured online: acceptance per draft position
//! and lattice-confidence bin, the host's verify time against the rows it
//! verified, the draft decode time, the tokens per second of whole steps.
//! Pure bookkeeping: the engine reports what happened (with the time it
//! happened) and asks; the policy keeps its own clocks.

use std::time::Instant;

/// Confidence bins of the lattice softmax at a pick.
const BINS: usize = 10;

/// Weight of the newest observation in the running averages.
const DECAY: f64 = 0.05;

/// Steps drafted at full length before the model is trusted.
const WARMUP_STEPS: u64 = 8;

/// After this many steps without drafting, draft once to keep learning; the
/// interval doubles each time the exploring draft confirms it did not pay.
const EXPLORE_FIRST: u32 = 8;
const EXPLORE_LAST: u32 = 64;

fn bin(confidence: f32) -> usize {
    ((confidence.clamp(0.0, 1.0) * BINS as f32) as usize).min(BINS - 1)
}

/// P(accept | the target reached this draft position), per position and bin.
#[derive(Clone, Debug)]
pub struct AcceptanceModel {
    /// [position][bin] -> (reached, accepted)
    counts: Vec<[(f64, f64); BINS]>,
}

impl AcceptanceModel {
    pub fn new(n_positions: usize) -> Self {
        AcceptanceModel { counts: vec![[(0.0, 0.0); BINS]; n_positions] }
    }

    /// Probability that a token at `position` with lattice softmax `confidence`
    /// is accepted when reached; a Beta(1, 1) prior for what has not been seen,
    /// falling back on the position's other bins.
    pub fn p_accept(&self, position: usize, confidence: f32) -> f64 {
        let row = &self.counts[position.min(self.counts.len() - 1)];
        let (reached, accepted) = row[bin(confidence)];
        if reached >= 1.0 {
            return (accepted + 1.0) / (reached + 2.0);
        }
        let (r, a) = row.iter().fold((0.0, 0.0), |(r, a), &(x, y)| (r + x, a + y));
        (a + 1.0) / (r + 2.0)
    }

    /// A verified draft: tokens before the first rejection were accepted, the
    /// first rejected one was reached, the rest were never reached.
    pub fn observe(&mut self, confidences: &[f32], n_accepted: usize) {
        let last = self.counts.len() - 1;
        for (m, &c) in confidences.iter().enumerate().take(n_accepted + 1) {
            let cell = &mut self.counts[m.min(last)][bin(c)];
            cell.0 += 1.0;
            if m < n_accepted {
                cell.1 += 1.0;
            }
        }
    }
}

/// An exponentially weighted running mean.
#[derive(Clone, Copy, Debug, Default)]
struct Mean {
    value: f64,
    seen: bool,
}

impl Mean {
    fn add(&mut self, x: f64) {
        self.value = if self.seen { self.value + DECAY * (x - self.value) } else { x };
        self.seen = true;
    }
}

/// The host's verify time as a + b * rows, fitted by weighted least squares.
#[derive(Clone, Copy, Debug, Default)]
pub struct CostModel {
    n: Mean,
    t: Mean,
    nn: Mean,
    nt: Mean,
}

impl CostModel {
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        let n = rows as f64;
        self.n.add(n);
        self.t.add(seconds);
        self.nn.add(n * n);
        self.nt.add(n * seconds);
    }

    /// Seconds per extra verified row, once rows have varied enough to tell.
    pub fn per_row(&self) -> Option<f64> {
        let var = self.nn.value - self.n.value * self.n.value;
        if !self.n.seen || var < 0.25 {
            return None;
        }
        Some(((self.nt.value - self.n.value * self.t.value) / var).max(0.0))
    }
}

/// The decisions of one engine.
#[derive(Clone, Debug)]
pub struct AdaptivePolicy {
    acceptance: AcceptanceModel,
    verify_cost: CostModel,
    draft_seconds: Mean,
    rate: Mean,
    /// expected accepted tokens and kept length of the drafts chosen lately
    gain: Mean,
    kept: Mean,
    steps: u64,
    skipped_in_a_row: u32,
    explore_every: u32,
    /// during warm-up, every other step drafts nothing so that the verify cost
    /// is seen at two row counts (full drafts alone cannot give its slope)
    warmup_skip: bool,
    /// when the current step began (its draft call) and when its draft was handed out
    step_start: Option<Instant>,
    draft_end: Option<Instant>,
    /// tokens the sequences of the current step gained so far
    step_tokens: usize,
}

impl AdaptivePolicy {
    pub fn new(n_positions: usize) -> Self {
        AdaptivePolicy {
            acceptance: AcceptanceModel::new(n_positions.max(1)),
            verify_cost: CostModel::default(),
            draft_seconds: Mean::default(),
            rate: Mean::default(),
            gain: Mean::default(),
            kept: Mean::default(),
            steps: 0,
            skipped_in_a_row: 0,
            explore_every: EXPLORE_FIRST,
            warmup_skip: false,
            step_start: None,
            draft_end: None,
            step_tokens: 0,
        }
    }

    /// A draft call for `n_requests` sequences began at `now`: closes the
    /// previous step (tokens gained over its wall time) and says whether this
    /// step drafts at all.
    pub fn begin_step(&mut self, now: Instant, n_requests: usize) -> bool {
        if let Some(t) = self.step_start.replace(now) {
            self.observe_step(self.step_tokens, (now - t).as_secs_f64());
        }
        // every requesting sequence gains at least its anchor's successor this step
        self.step_tokens = n_requests;
        self.should_draft(n_requests)
    }

    /// The noise-block decode took `seconds`.
    pub fn draft_decode_seen(&mut self, seconds: f64) {
        self.draft_seconds.add(seconds);
    }

    /// The drafts were handed to the host at `now`; its verify decode follows.
    pub fn draft_done(&mut self, now: Instant) {
        self.draft_end = Some(now);
    }

    /// The first rows after a draft arrived at `now`: the host's verify decode
    /// of `rows` rows took the time since the draft was handed out.
    pub fn verify_seen(&mut self, now: Instant, rows: usize) {
        if let Some(t) = self.draft_end.take() {
            self.verify_cost.observe(rows, (now - t).as_secs_f64());
        }
    }

    /// A draft with these lattice confidences was verified and its first
    /// `n_accepted` tokens kept.
    pub fn accepted(&mut self, confidences: &[f32], n_accepted: usize) {
        self.acceptance.observe(confidences, n_accepted);
        self.step_tokens += n_accepted;
    }

    fn warm(&self) -> bool {
        self.steps >= WARMUP_STEPS && self.rate.seen && self.verify_cost.per_row().is_some()
    }

    /// The price of one verified row in tokens: rho * b (0 until measured).
    fn row_price(&self) -> f64 {
        match (self.warm(), self.verify_cost.per_row()) {
            (true, Some(b)) => self.rate.value * b,
            _ => 0.0,
        }
    }

    /// Whether drafting this step is expected to pay, for `n_seqs` sequences.
    fn should_draft(&mut self, n_seqs: usize) -> bool {
        if !self.warm() || !self.draft_seconds.seen || !self.gain.seen {
            self.warmup_skip = !self.warmup_skip;
            return self.warmup_skip;
        }
        let gain = n_seqs as f64 * (self.gain.value - self.row_price() * self.kept.value);
        let cost = self.rate.value * self.draft_seconds.value;
        if gain > cost {
            self.skipped_in_a_row = 0;
            self.explore_every = EXPLORE_FIRST;
            true
        } else if self.skipped_in_a_row >= self.explore_every {
            self.skipped_in_a_row = 0;
            self.explore_every = (self.explore_every * 2).min(EXPLORE_LAST);
            true
        } else {
            self.skipped_in_a_row += 1;
            false
        }
    }

    /// How many tokens of a walked draft to keep, given the lattice softmax of
    /// each pick: keep token m while P(tokens 1..m accepted) >= rho * b.
    pub fn keep(&mut self, confidences: &[f32]) -> usize {
        let price = self.row_price();
        let mut reach = 1.0;
        let mut expected = 0.0;
        let mut kept = 0;
        for (m, &c) in confidences.iter().enumerate() {
            reach *= self.acceptance.p_accept(m, c);
            if reach < price {
                break;
            }
            expected += reach;
            kept = m + 1;
        }
        self.gain.add(expected);
        self.kept.add(kept as f64);
        kept
    }

    /// A whole step: `tokens` gained by all sequences in `seconds` of wall time.
    fn observe_step(&mut self, tokens: usize, seconds: f64) {
        if seconds > 0.0 {
            self.rate.add(tokens as f64 / seconds);
            self.steps += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptance_is_learned_per_position_and_confidence() {
        let mut m = AcceptanceModel::new(4);
        for _ in 0..50 {
            m.observe(&[0.95, 0.2], 1); // confident first accepted, unsure second rejected
        }
        assert!(m.p_accept(0, 0.95) > 0.9);
        assert!(m.p_accept(1, 0.2) < 0.1);
        // an unseen bin falls back on the position's other bins
        assert!(m.p_accept(0, 0.05) > 0.9);
        // never reached: the prior
        assert_eq!(m.p_accept(3, 0.5), 0.5);
    }

    #[test]
    fn verify_cost_slope_is_fitted_once_rows_vary() {
        let mut c = CostModel::default();
        for _ in 0..10 {
            c.observe(8, 0.008 + 8.0 * 0.003);
        }
        assert!(c.per_row().is_none(), "one row count cannot give a slope");
        for i in 0..200 {
            let rows = 1 + i % 8;
            c.observe(rows, 0.008 + rows as f64 * 0.003);
        }
        let b = c.per_row().unwrap();
        assert!((b - 0.003).abs() < 3e-4, "{b}");
    }

    fn warmed(rate: f64, per_row: f64, draft: f64) -> AdaptivePolicy {
        let mut p = AdaptivePolicy::new(7);
        for i in 0..400 {
            let rows = 1 + i % 8;
            p.verify_cost.observe(rows, 0.003 + rows as f64 * per_row);
            p.observe_step(1, 1.0 / rate);
            p.draft_decode_seen(draft);
        }
        p
    }

    #[test]
    fn cheap_verification_keeps_the_whole_draft() {
        // a big target on a GPU: extra rows nearly free
        let mut p = warmed(50.0, 1e-5, 0.002);
        p.acceptance.observe(&[0.3; 7], 2);
        assert_eq!(p.keep(&[0.3; 7]), 7);
        assert!(p.should_draft(1));
    }

    #[test]
    fn expensive_verification_cuts_unlikely_tokens() {
        // a small target on a CPU: each extra row costs a third of a token's time
        let mut p = warmed(50.0, 0.003, 0.002);
        for _ in 0..100 {
            p.acceptance.observe(&[0.9, 0.9, 0.2, 0.2, 0.2, 0.2, 0.2], 2);
        }
        assert_eq!(p.keep(&[0.9, 0.9, 0.2, 0.2, 0.2, 0.2, 0.2]), 2);
    }

    #[test]
    fn warm_up_alternates_drafting_and_not_until_the_costs_are_known() {
        let mut p = AdaptivePolicy::new(7);
        let decisions: Vec<bool> = (0..4).map(|_| p.should_draft(1)).collect();
        assert_eq!(decisions, vec![true, false, true, false]);
    }

    #[test]
    fn the_policy_times_steps_and_verifies_itself() {
        use std::time::Duration;
        let mut p = AdaptivePolicy::new(3);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(p.begin_step(at(0), 1), "warm-up drafts first");
        p.draft_done(at(2));
        p.verify_seen(at(12), 4);
        p.verify_seen(at(15), 9); // only the first rows after a draft are its verify batch
        p.accepted(&[0.9, 0.9, 0.9], 3);
        p.begin_step(at(20), 1);
        // one step: 1 + 3 tokens in 20 ms
        assert!((p.rate.value - 200.0).abs() < 1e-6, "{}", p.rate.value);
        assert_eq!(p.verify_cost.n.value, 4.0);
        assert!((p.verify_cost.t.value - 0.010).abs() < 1e-9);
    }

    #[test]
    fn drafting_stops_when_it_does_not_pay_and_explores_now_and_then() {
        let mut p = warmed(170.0, 0.003, 0.007);
        for _ in 0..100 {
            p.acceptance.observe(&[0.3; 7], 0);
            p.keep(&[0.3; 7]);
        }
        // explores after 8 skipped steps, then 16, 32, 64, 64, ...
        let drafted: Vec<usize> = (0..300).filter(|_| p.should_draft(1)).collect();
        assert_eq!(drafted, vec![8, 25, 58, 123, 188, 253], "{drafted:?}");
    }
}
