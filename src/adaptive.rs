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
//!
//! On top of that marginal model, the two arms are compared directly: the
//! tokens per second of the steps that drafted against those of the steps that
//! did not. Where the drafting steps are measured slower, drafting stays off
//! whatever the model expects (it never loses to not drafting by more than
//! the rare exploring steps, at most one in `EXPLORE_LAST`).
//! Pure bookkeeping: the engine reports what happened (with the time it
//! happened) and asks; the policy keeps its own clocks.

use std::time::Instant;

use crate::tree::Tree;

/// Confidence bins of the lattice softmax at a pick.
const BINS: usize = 10;

/// Weight of the newest observation in the running averages.
const DECAY: f64 = 0.05;

/// Steps drafted at full length before the model is trusted.
const WARMUP_STEPS: u64 = 8;

/// After this many steps without drafting, draft once to keep learning; the
/// interval doubles each time the exploring draft confirms it did not pay.
const EXPLORE_FIRST: u32 = 8;
const EXPLORE_LAST: u32 = 512;

/// Most tokens a warm-up draft keeps: enough to see the verify cost at two row
/// counts and the first positions' acceptance, cheap where drafting does not pay.
const WARMUP_KEEP: usize = 2;

/// Steps of each arm (drafting, not drafting) measured before the arms are
/// compared.
const ARM_MIN_STEPS: u32 = 4;

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

    /// One token the target reached at `position`: accepted or not
    /// (`crate::calibration` observes every child of a tree's reached nodes).
    pub fn observe_trial(&mut self, position: usize, confidence: f32, accepted: bool) {
        let last = self.counts.len() - 1;
        let cell = &mut self.counts[position.min(last)][bin(confidence)];
        cell.0 += 1.0;
        cell.1 += accepted as u8 as f64;
    }

    /// Draft positions measured (deeper ones count in the last).
    pub fn n_positions(&self) -> usize {
        self.counts.len()
    }

    /// (reached, accepted) per confidence bin at `position` (bin b holds
    /// confidences in [b, b + 1) / bins, the last one also 1).
    pub fn counts(&self, position: usize) -> &[(f64, f64)] {
        &self.counts[position.min(self.counts.len() - 1)]
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

/// Tokens per second of one kind of step: running means of tokens and of
/// seconds (their ratio weighs long steps as they weigh in wall time).
#[derive(Clone, Copy, Debug, Default)]
struct ArmRate {
    tokens: Mean,
    seconds: Mean,
    steps: u32,
}

impl ArmRate {
    fn add(&mut self, tokens: usize, seconds: f64) {
        self.tokens.add(tokens as f64);
        self.seconds.add(seconds);
        self.steps = self.steps.saturating_add(1);
    }

    fn rate(&self) -> Option<f64> {
        (self.steps >= ARM_MIN_STEPS && self.seconds.value > 0.0).then(|| self.tokens.value / self.seconds.value)
    }
}

/// The host's verify time as a + b * rows, fitted by weighted least squares.
#[derive(Clone, Copy, Debug, Default)]
pub struct CostModel {
    n: Mean,
    t: Mean,
    nn: Mean,
    nt: Mean,
    /// The slope when rows last varied enough to tell: kept while drafting is
    /// off and every verify is one row (the running variance then fades, the
    /// cost of a row does not).
    slope: Option<f64>,
}

impl CostModel {
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        let n = rows as f64;
        self.n.add(n);
        self.t.add(seconds);
        self.nn.add(n * n);
        self.nt.add(n * seconds);
        let var = self.nn.value - self.n.value * self.n.value;
        if var >= 0.25 {
            self.slope = Some(((self.nt.value - self.n.value * self.t.value) / var).max(0.0));
        }
    }

    /// Seconds per extra verified row, once rows have varied enough to tell.
    pub fn per_row(&self) -> Option<f64> {
        self.slope
    }
}

/// The decisions of one engine.
#[derive(Clone, Debug)]
pub struct AdaptivePolicy {
    acceptance: AcceptanceModel,
    verify_cost: CostModel,
    draft_seconds: Mean,
    rate: Mean,
    /// tokens per second of the steps that drafted and of those that did not
    drafting: ArmRate,
    plain: ArmRate,
    /// whether the current step drafts (its time goes to that arm), and
    /// whether only to keep learning (then each draft keeps one token at least)
    step_drafts: bool,
    exploring: bool,
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
            drafting: ArmRate::default(),
            plain: ArmRate::default(),
            step_drafts: false,
            exploring: false,
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
        self.exploring = false;
        self.step_drafts = self.should_draft(n_requests);
        self.step_drafts
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
        if gain > cost && !self.drafting_measured_slower() {
            self.skipped_in_a_row = 0;
            self.explore_every = EXPLORE_FIRST;
            true
        } else if self.skipped_in_a_row >= self.explore_every {
            self.skipped_in_a_row = 0;
            self.explore_every = (self.explore_every * 2).min(EXPLORE_LAST);
            self.exploring = true;
            true
        } else {
            self.skipped_in_a_row += 1;
            false
        }
    }

    /// The drafting steps were measured slower than the plain ones.
    fn drafting_measured_slower(&self) -> bool {
        matches!((self.drafting.rate(), self.plain.rate()), (Some(d), Some(p)) if d < p)
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
        self.bounded(kept, confidences.len())
    }

    /// A draft length chosen by the model, bounded while learning: a warm-up
    /// draft keeps at most WARMUP_KEEP tokens, an exploring one at least one
    /// (a draft of none would teach nothing).
    fn bounded(&self, kept: usize, len: usize) -> usize {
        let kept = if self.warm() { kept } else { kept.min(WARMUP_KEEP) };
        if self.exploring { kept.max(1).min(len) } else { kept }
    }

    /// How many nodes of a grown tree to keep (its first k, a tree in best-
    /// first order): the k that maximizes the expected accepted tokens minus
    /// the price of k verify rows, each node reached with the product of the
    /// measured acceptance at its depth and edge probability along its path.
    /// A tree whose siblings do not pay is cut to its chain; one whose first
    /// node does not, to nothing.
    pub fn keep_tree(&mut self, tree: &Tree) -> usize {
        let price = self.row_price();
        let reach = tree.reach(|n| self.acceptance.p_accept(n.depth - 1, n.prob));
        let (mut best, mut best_k, mut sum) = (0.0, 0, 0.0);
        for (k, r) in reach.iter().enumerate() {
            sum += r - price;
            if sum > best {
                (best, best_k) = (sum, k + 1);
            }
        }
        self.gain.add(reach[..best_k].iter().sum());
        self.kept.add(best_k as f64);
        self.bounded(best_k, tree.len())
    }

    /// A whole step: `tokens` gained by all sequences in `seconds` of wall time.
    fn observe_step(&mut self, tokens: usize, seconds: f64) {
        if seconds > 0.0 {
            self.rate.add(tokens as f64 / seconds);
            self.steps += 1;
            let arm = if self.step_drafts { &mut self.drafting } else { &mut self.plain };
            arm.add(tokens, seconds);
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
        // one-row verifies only (drafting off): the slope stays known
        for _ in 0..1000 {
            c.observe(1, 0.011);
        }
        assert!(c.per_row().is_some_and(|x| (x - b).abs() < 1e-3), "{:?}", c.per_row());
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
    fn warm_up_alternates_short_drafts_and_none_until_the_costs_are_known() {
        let mut p = AdaptivePolicy::new(7);
        let decisions: Vec<bool> = (0..4).map(|_| p.should_draft(1)).collect();
        assert_eq!(decisions, vec![true, false, true, false]);
        assert_eq!(p.keep(&[0.9; 7]), WARMUP_KEEP);
    }

    #[test]
    fn an_exploring_step_drafts_a_token_even_when_none_is_expected_to_pay() {
        let mut p = warmed(170.0, 0.003, 0.007);
        for _ in 0..100 {
            p.acceptance.observe(&[0.3; 7], 0);
            p.keep(&[0.3; 7]);
        }
        assert_eq!(p.keep(&[0.3; 7]), 0);
        while !p.begin_step(Instant::now(), 1) {}
        assert!(p.exploring);
        assert_eq!(p.keep(&[0.3; 7]), 1);
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
        // explores after 8 skipped steps, then 16, 32, ..., 512, 512, ...
        let drafted: Vec<usize> = (0..2000).filter(|_| p.should_draft(1)).collect();
        assert_eq!(drafted, vec![8, 25, 58, 123, 252, 509, 1022, 1535], "{drafted:?}");
    }

    fn node(parent: i32, depth: usize, prob: f32) -> crate::tree::Node {
        // distinct tokens for siblings: the probability's bits will do
        crate::tree::Node { token: (prob * 100.0) as i32, parent, depth, prob, path_prob: prob, candidate: 0 }
    }

    #[test]
    fn trees_are_cut_to_the_nodes_that_pay_for_their_rows() {
        // best-first: a confident chain 0 -> 1, then a weak sibling of node 0
        let tree = Tree::from_nodes(vec![node(-1, 1, 0.9), node(0, 2, 0.9), node(-1, 1, 0.05)]).unwrap();
        // rows nearly free: every node pays
        let mut cheap = warmed(50.0, 1e-6, 0.002);
        assert_eq!(cheap.keep_tree(&tree), 3);
        // rows at a third of a token: the weak sibling does not pay; the tree is its chain
        let mut dear = warmed(50.0, 0.006, 0.002);
        for _ in 0..100 {
            dear.acceptance.observe(&[0.9, 0.9, 0.9], 3);
            dear.acceptance.observe(&[0.05], 0);
        }
        assert_eq!(dear.keep_tree(&tree), 2);
        // a weak node before a strong one is kept when the strong one pays for both
        let deep = Tree::from_nodes(vec![node(-1, 1, 0.9), node(-1, 1, 0.05), node(0, 2, 0.9)]).unwrap();
        assert_eq!(dear.keep_tree(&deep), 3);
        // and a first node that does not pay leaves no tree
        let weak = Tree::from_nodes(vec![node(-1, 1, 0.05)]).unwrap();
        assert_eq!(dear.keep_tree(&weak), 0);
    }

    #[test]
    fn drafting_measured_slower_than_not_drafting_stays_off() {
        // the model expects drafting to pay (cheap rows, accepted drafts) ...
        let mut p = warmed(50.0, 1e-5, 0.002);
        for _ in 0..100 {
            p.acceptance.observe(&[0.9; 7], 7);
            p.keep(&[0.9; 7]);
        }
        assert!(p.should_draft(1));
        // ... but the steps that drafted were measured at 30 tok/s, the others at 50
        for _ in 0..ARM_MIN_STEPS {
            p.step_drafts = true;
            p.observe_step(3, 0.1);
            p.step_drafts = false;
            p.observe_step(1, 0.02);
        }
        assert!(p.drafting_measured_slower());
        let drafted = (0..100).filter(|_| p.should_draft(1)).count();
        assert!(drafted <= 3, "drafted {drafted} of 100 steps");
        // once drafting steps measure faster again, it drafts
        for _ in 0..200 {
            p.step_drafts = true;
            p.observe_step(6, 0.05);
        }
        assert!(!p.drafting_measured_slower());
        assert!(p.should_draft(1));
    }
}
