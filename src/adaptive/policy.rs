//! The decisions of one engine ([`AdaptivePolicy`]): what each step drafts
//! ([`Plan`]) and how much of each draft it keeps, as one model.
//!
//! The model: a step's verify decode costs `verify(rows)` seconds for the
//! batch's total rows (all sequences together), a noise-block decode
//! `draft(rows)`, both curves learned online ([`StepCurve`]: flat, linear or
//! in steps, whatever the backend does), and a drafting step first injects
//! the rows that waited for it (a curve by rows too, learned from every
//! injection: plain steps' bulk ones and the prompts' re-measure it while
//! nothing drafts); a drafted token at position m is accepted with P(accept |
//! reached), learned per position and lattice-confidence bin
//! ([`AcceptanceModel`], weighing its last `MEMORY` trials). Each step
//! takes the plan with the most expected tokens per second: no draft, one
//! sequence (in turn) drafting, or every sequence drafting, each at every
//! draft length. Its rate rho is then the price of time: a draft (a
//! chain or a tree in best-first order) keeps the first k tokens that
//! maximize expected accepted tokens - rho * (verify(R + k) - verify(R)),
//! R the rows the step's earlier cuts committed. On a curve flat from 8 to
//! 16 rows the free rows are kept; where the next row is dear, the draft
//! stops.
//!
//! Exploration is Thompson sampling: every step draws the acceptance of
//! each position from its posterior, and the cost of row counts past the
//! widest seen from anywhere between the measured curve carried on and time
//! in proportion to the rows; the plan and the cuts are the best under that
//! draw. A sure model drafts what pays; an unsure one tries what might.
//!
//! One safety rail: every drafting step is charged its time minus what
//! plain steps would have taken to gain its tokens, and a plan is only taken
//! while what it loses at worst (nothing accepted, rows not seen yet at their
//! dearest) keeps the charged total within `LOSS_BUDGET` of the time
//! measured (a quarter of it in steps whose draw found no plan that beats
//! plain steps) and `LOSS_START` plain steps, and its cuts keep no more
//! rows than that allows (a tree may keep more rows than its depth). A
//! plain step is priced with the recent median of the host's time between
//! decodes (a host away now and then does not make it dearer). Exploration
//! grows from cheap plans to dear ones as the curves are seen. Gains earn
//! credit up to `CREDIT` plain steps: a prompt whose drafts paid rides out
//! an unlucky streak, and a draft that stops paying (a prompt whose easy
//! start is behind it) spends no more than that of what it gained.
//!
//! The engine reports what happened (with the time it happened) and asks;
//! the policy keeps its own clocks.

use std::time::Instant;

use super::AcceptanceModel;
use super::curve::StepCurve;
use super::mean::RecentMedian;
use crate::tree::{Node, Tree};

/// Share of the measured time that drafting may lose against plain steps,
/// and plain steps' time it may lose from the start: two, since every probe
/// is charged what it lost as seen (one unlucky first draft where a draft
/// decode is cheap must not hold drafting off for a hundred steps, and on a
/// curve whose rows are dear up to 8, as an M4 Pro's, the probes that find
/// the plan for all sequences must fit). A step whose draw found no plan
/// that beats plain steps earns `HOPELESS` of its share: where the
/// posterior says drafting loses (a CPU whose verify rows and draft decodes
/// are dear), probes come a quarter as often; a drafter that starts paying
/// later is still found.
const LOSS_BUDGET: f64 = 0.015;
const HOPELESS: f64 = 0.25;
const LOSS_START: f64 = 2.0;

/// Plain steps' time that gains may earn as credit against later losses:
/// a prompt whose drafts paid can ride out an unlucky streak without
/// stopping, while a draft that stops paying (an easy start behind it)
/// spends no more than this of what it gained.
const CREDIT: f64 = 2.0;

/// Acceptance trials each draft position weighs, and steps its trials last
/// without new ones (a drafter that stopped paying is tried again now and
/// then: its posterior widens as its trials age).
const MEMORY: f64 = 64.0;
const MEMORY_STEPS: f64 = 2000.0;

/// Plain steps measured before the model decides (the first decode after a
/// prompt's is often slowed down): the median of three.
const YARDSTICK: u32 = 3;

/// A step's wall time counts as this many times its decodes and usual host
/// time at most (the prompt decode of a new sequence, a host away between
/// requests).
const OUTLIER: f64 = 4.0;

/// Verify rows a step may take at most (a bound for the search of what the
/// rail allows; the host's batch limits it further).
const MOST_ROWS: usize = 4096;

/// A draft decode counts as this many times its prediction at most.
const SPIKE: f64 = 2.0;

/// What a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No draft.
    Plain,
    /// Every request drafts up to its own cap (an engine without a controller).
    All,
    /// Request `only` (an index into the call's requests), or every request
    /// when None, drafts at most `n_max` tokens.
    Draft { only: Option<usize>, n_max: usize },
}

impl Plan {
    /// The most tokens request `i` of a call may draft this step, given its own cap.
    pub fn cap(self, i: usize, cap: usize) -> usize {
        match self {
            Plan::Plain => 0,
            Plan::All => cap,
            Plan::Draft { only, n_max } if only.is_none_or(|r| r == i) => cap.min(n_max),
            Plan::Draft { .. } => 0,
        }
    }

    /// Rows of each noise block, given the widest cap of the call (0: none drafts).
    pub fn block_rows(self, max_cap: usize) -> usize {
        if max_cap == 0 { 0 } else { max_cap + 1 }
    }
}

/// The current step: its draws, what it committed, what it measured.
#[derive(Clone, Debug, Default)]
struct Step {
    start: Option<Instant>,
    draft_end: Option<Instant>,
    requests: usize,
    /// tokens its sequences gained, and the verify rows its cuts committed
    tokens: usize,
    rows: usize,
    draft_seconds: f64,
    draft_rows: usize,
    /// the injection of the rows that waited for this draft
    flush_rows: usize,
    flush_seconds: f64,
    verify: Option<(usize, f64)>,
    /// tokens per second of the plan taken: the price of a second in the cuts
    rho: f64,
    /// drafts of the plan not cut yet, the tokens the plan gives each, and
    /// the tokens each keeps at least
    pending: usize,
    cap: usize,
    min_keep: usize,
    /// the most verify rows the cuts may commit in all: what the rail
    /// allows at worst (a tree may keep more rows than its depth)
    max_rows: usize,
    /// the Thompson draw: an offset of P(accept) per position, and where
    /// row counts past the widest seen cost (0: the curve carried on, 1:
    /// proportional)
    offsets: Vec<f64>,
    cost_draw: f64,
    /// whether the draw found a plan that beats plain steps (the rail aside)
    hopeful: bool,
}

/// The decisions of one engine.
#[derive(Clone, Debug)]
pub struct AdaptivePolicy {
    n_positions: usize,
    acceptance: AcceptanceModel,
    verify: StepCurve,
    draft: StepCurve,
    /// an injection of rows into the draft KV, by its rows: every one the
    /// engine runs (a drafting step's of the rows that waited for it, plain
    /// steps' 64 at a time, a prompt's), so a slow one is outvoted by the
    /// next ones even while nothing drafts
    flush: StepCurve,
    /// a step's host time besides its decodes: the recent median, since a
    /// host away now and then (between requests, another job's turn) would
    /// make every step's price dearer in a mean and credit each drafted
    /// token with host time plain steps would not have spent
    overhead: RecentMedian,
    /// seconds drafting steps lost against plain steps (negative: gained),
    /// and all the seconds measured
    loss: f64,
    elapsed: f64,
    /// the seconds of the steps whose draw found a plan that beats plain
    /// steps (the budget's full share accrues in them)
    hopeful: f64,
    /// the request the next one-sequence plan drafts for
    turn: usize,
    plain_steps: u32,
    rng: u64,
    plan: Plan,
    step: Step,
}

impl AdaptivePolicy {
    pub fn new(n_positions: usize) -> Self {
        let n_positions = n_positions.max(1);
        AdaptivePolicy {
            n_positions,
            acceptance: AcceptanceModel::with_memory(n_positions, MEMORY),
            verify: StepCurve::default(),
            draft: StepCurve::default(),
            flush: StepCurve::default(),
            overhead: RecentMedian::default(),
            loss: 0.0,
            elapsed: 0.0,
            hopeful: 0.0,
            turn: 0,
            plain_steps: 0,
            rng: 0x2545_f491_4f6c_dd1d,
            plan: Plan::Plain,
            step: Step::default(),
        }
    }

    /// A draft call for `n_requests` sequences began at `now`: closes the
    /// previous step and says what this one drafts.
    pub fn begin_step(&mut self, now: Instant, n_requests: usize) -> Plan {
        if let Some(t) = self.step.start {
            self.observe_step((now - t).as_secs_f64());
        }
        self.acceptance.fade(1.0 / MEMORY_STEPS);
        // every requesting sequence gains at least its anchor's successor
        // and verifies its anchor's row
        // (the draw's buffer is kept: this runs every draft call)
        let mut offsets = std::mem::take(&mut self.step.offsets);
        self.step =
            Step { start: Some(now), requests: n_requests, tokens: n_requests, rows: n_requests, ..Step::default() };
        offsets.clear();
        for m in 0..self.n_positions {
            let sd = self.acceptance.sd_position(m);
            offsets.push(sd * self.normal());
        }
        self.step.offsets = offsets;
        self.step.cost_draw = self.uniform();
        self.plan = self.decide(n_requests);
        self.trace_plan(n_requests);
        self.plan
    }

    /// The noise-block decode of `rows` rows took `seconds`.
    pub fn draft_decode_seen(&mut self, rows: usize, seconds: f64) {
        self.draft.observe(rows, seconds);
        self.step.draft_seconds += seconds;
        self.step.draft_rows += rows;
    }

    /// An injection of `rows` rows into the draft KV took `seconds`.
    pub fn inject_seen(&mut self, rows: usize, seconds: f64) {
        self.flush.observe(rows, seconds);
    }

    /// The `rows` rows waiting for this step's draft were injected in
    /// `seconds` (each injection decode already told by `inject_seen`).
    pub fn flush_seen(&mut self, rows: usize, seconds: f64) {
        self.step.flush_rows += rows;
        self.step.flush_seconds += seconds;
    }

    /// The drafts were handed to the host at `now`; its verify decode follows.
    pub fn draft_done(&mut self, now: Instant) {
        self.step.draft_end = Some(now);
    }

    /// The first rows after a draft arrived at `now`: the host's verify decode
    /// of `rows` rows took the time since the draft was handed out.
    pub fn verify_seen(&mut self, now: Instant, rows: usize) {
        if let Some(t) = self.step.draft_end.take() {
            let seconds = (now - t).as_secs_f64();
            self.verify.observe(rows, seconds);
            self.step.verify = Some((rows, seconds));
        }
    }

    /// A draft with these lattice confidences was verified and its first
    /// `n_accepted` tokens kept.
    pub fn accepted(&mut self, confidences: &[f32], n_accepted: usize) {
        self.accepted_path(confidences, n_accepted, n_accepted);
    }

    /// A tree was verified: of these lattice confidences along its accepted
    /// path (`Tree::path_confidences`) the first `n_lattice` were accepted,
    /// and `n_tokens` tokens kept in all (n-gram branch nodes included).
    pub fn accepted_path(&mut self, confidences: &[f32], n_lattice: usize, n_tokens: usize) {
        self.acceptance.observe(confidences, n_lattice);
        self.step.tokens += n_tokens;
    }

    /// How many tokens of a walked draft to keep, given the lattice softmax
    /// of each pick.
    pub fn keep(&mut self, confidences: &[f32]) -> usize {
        let mut reach = Vec::with_capacity(confidences.len());
        let mut r = 1.0;
        for (m, &c) in confidences.iter().enumerate() {
            r *= self.p_drawn(m, c);
            reach.push(r);
        }
        self.cut(&reach)
    }

    /// How many nodes of a grown tree to keep (its first k, a tree in
    /// best-first order), each node reached with the product of the
    /// acceptance along its path, siblings sharing what the first pick leaves
    /// (`Tree::reach`). A parent's first lattice child (the chain's pick)
    /// takes the step's draw; a later one `sibling_p(node)`, the engine's
    /// per-child measure: the picks' model knows a bin only from picks, and
    /// a sibling in a bin no pick fell in would take the position's rate.
    /// `branch_p(node)` is the measured acceptance of a node an n-gram branch
    /// proposed (0 for the others); a node both proposed counts with the
    /// larger estimate.
    pub fn keep_tree(
        &mut self,
        tree: &Tree,
        branch_p: impl Fn(&Node) -> f64,
        sibling_p: impl Fn(&Node) -> f64,
    ) -> usize {
        // per parent (0 the anchor, i + 1 node i): whether its first lattice child came
        let mut picked = vec![false; tree.nodes().len() + 1];
        let reach = tree.reach(|n| {
            let lattice = if !n.in_lattice() {
                0.0
            } else if !std::mem::replace(&mut picked[n.parent().map_or(0, |i| i + 1)], true) {
                self.p_drawn(n.depth - 1, n.prob)
            } else {
                sibling_p(n)
            };
            lattice.max(branch_p(n))
        });
        self.cut(&reach)
    }

    /// The k that maximizes sum(reach[..k]) - rho * (verify(R + k) - verify(R)),
    /// committing its rows to the step. R: the rows of the cuts before this
    /// one, and the plan's rows for the drafts after it: a jump in the curve
    /// that the plan takes for every sequence is shared by them (the first
    /// sequence's cut alone would not pay for it).
    fn cut(&mut self, reach: &[f64]) -> usize {
        let s = &self.step;
        let (rho, draw) = (s.rho, s.cost_draw);
        let rows = s.rows + s.pending.saturating_sub(1) * s.cap;
        let base = self.verify.predict(rows, draw);
        let (mut best, mut best_k, mut gain) = (0.0, 0, 0.0);
        for (k, r) in reach.iter().enumerate() {
            if rows + k + 1 > s.max_rows {
                break;
            }
            gain += r;
            let value = gain - rho * (self.verify.predict(rows + k + 1, draw) - base);
            if value > best {
                (best, best_k) = (value, k + 1);
            }
        }
        let best_k = best_k.max(self.step.min_keep.min(reach.len()));
        self.step.rows += best_k;
        self.step.pending = self.step.pending.saturating_sub(1);
        best_k
    }

    /// This step's draw of P(accept | reached) for a pick at `position`.
    fn p_drawn(&self, position: usize, confidence: f32) -> f64 {
        let offset = self.step.offsets.get(position.min(self.n_positions - 1)).copied().unwrap_or(0.0);
        (self.acceptance.p_accept(position, confidence) + offset).clamp(0.0, 1.0)
    }

    /// Tokens per second of a plain step for `n` sequences.
    fn plain_rate(&self, n: usize) -> f64 {
        let seconds = self.overhead.value + self.verify.predict(n, 0.0);
        if seconds > 0.0 { n as f64 / seconds } else { 0.0 }
    }

    /// Expected tokens per second, under this step's draw, of `drafting` of
    /// `n` sequences drafting `cap` tokens each.
    fn drafting_rate(&self, n: usize, drafting: usize, cap: usize) -> f64 {
        let (mut reach, mut gain) = (1.0, 0.0);
        for m in 0..cap {
            reach *= (self.acceptance.p_position(m) + self.step.offsets[m]).clamp(0.0, 1.0);
            gain += reach;
        }
        let draw = self.step.cost_draw;
        // steady drafting injects the rows the step before gained
        let injected = (n as f64 + drafting as f64 * gain).round() as usize;
        let seconds = self.overhead.value
            + self.flush.predict(injected, draw)
            + self.draft.predict(drafting * (cap + 1), draw)
            + self.verify.predict(n + drafting * cap, draw);
        (n as f64 + drafting as f64 * gain) / seconds
    }

    /// The seconds `drafting` of `n` sequences drafting `cap` tokens each
    /// lose against a plain step if nothing is accepted, the verify takes
    /// `rows` rows in all and the rows not seen yet cost the most they may.
    fn worst_loss(&self, n: usize, drafting: usize, cap: usize, rows: usize) -> f64 {
        self.flush.predict(n + drafting * cap, 1.0)
            + self.draft.predict(drafting * (cap + 1), 1.0)
            + self.verify.predict(rows, 1.0)
            - self.verify.predict(n, 0.0)
    }

    /// The most verify rows the step's plan may take in all before what it
    /// loses at worst exceeds `allowed`: at least the plan's own (a chain of
    /// its cap per drafting sequence), which passed.
    fn most_rows(&self, n: usize, allowed: f64) -> usize {
        let (drafting, cap) = (self.step.pending, self.step.cap);
        let fits = |rows: usize| self.worst_loss(n, drafting, cap, rows) <= allowed;
        let (mut lo, mut hi) = (n + drafting * cap, MOST_ROWS);
        if fits(hi) {
            return hi;
        }
        // fits(lo) or lo is the plan's own; !fits(hi)
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if fits(mid) { lo = mid } else { hi = mid }
        }
        lo
    }

    /// What a step for `n` sequences does, and the rate it is expected at.
    fn decide(&mut self, n: usize) -> Plan {
        if n == 0 || !self.verify.seen() {
            // a plain step's cost first
            return Plan::Plain;
        }
        if self.draft.seen() && self.plain_steps < YARDSTICK {
            return Plan::Plain;
        }
        let plain = self.plain_rate(n);
        self.step.rho = plain;
        let one = if n > 1 { Some(self.turn % n) } else { None };
        if !self.draft.seen() {
            // nothing tells what a draft decode costs: the cheapest draft
            // that times one, a verify row and an acceptance trial
            self.turn += 1;
            (self.step.pending, self.step.cap, self.step.min_keep, self.step.max_rows) = (1, 1, 1, n + 1);
            return Plan::Draft { only: one, n_max: 1 };
        }
        // the rail: what drafting may still lose, against what a plan loses
        // at worst (nothing accepted, rows not seen yet at their dearest)
        let earned = self.hopeful + HOPELESS * (self.elapsed - self.hopeful);
        let allowed = LOSS_BUDGET * earned + LOSS_START * n as f64 / plain - self.loss;
        let mut best = Plan::Plain;
        for (only, drafting) in [(one, 1), (None, n)] {
            for cap in 1..=self.n_positions {
                let rate = self.drafting_rate(n, drafting, cap);
                self.step.hopeful |= rate > plain;
                if rate > self.step.rho && self.worst_loss(n, drafting, cap, n + drafting * cap) <= allowed {
                    (best, self.step.rho) = (Plan::Draft { only, n_max: cap }, rate);
                    (self.step.pending, self.step.cap) = (drafting, cap);
                }
            }
        }
        if matches!(best, Plan::Draft { only: Some(_), .. }) {
            self.turn += 1;
        }
        if best != Plan::Plain {
            self.step.max_rows = self.most_rows(n, allowed);
        }
        best
    }

    /// The step that began at `step.start` took `wall` seconds: learns the
    /// host's time besides the decodes, and charges a drafting step against
    /// the rail: its decodes (its injection too) and host time, less what
    /// plain steps would have taken to gain its tokens at the same moment
    /// (its own verify decode scaled along the curve to the plain rows: a
    /// machine slowed down, or one slowed-down verify, slows both alike). A
    /// draft decode and an injection count as `SPIKE` times their prediction
    /// at most, as in the curves.
    fn observe_step(&mut self, wall: f64) {
        let s = &self.step;
        let Some((rows, verify)) = s.verify else { return };
        let decodes = s.draft_seconds + s.flush_seconds + verify;
        self.overhead.add((wall - decodes).max(0.0));
        let wall = wall.min(OUTLIER * (decodes + self.overhead.value));
        if self.plan == Plan::Plain {
            self.plain_steps += 1;
        }
        if self.plan != Plan::Plain && s.requests > 0 {
            // the curves as seen (draw 1): a row count seen fewer than five
            // times may be drawn as cheap as the one before it, which would
            // read this step's own verify as nearly a plain one's
            let draft = s.draft_seconds.min(SPIKE * self.draft.predict(s.draft_rows, 1.0))
                + s.flush_seconds.min(SPIKE * self.flush.predict(s.flush_rows, 1.0));
            let along = self.verify.predict(s.requests, 1.0) / self.verify.predict(rows, 1.0).max(f64::MIN_POSITIVE);
            let plain_step = self.overhead.value + verify * along.min(1.0);
            let lost = self.overhead.value + draft + verify - s.tokens as f64 / s.requests as f64 * plain_step;
            self.loss = (self.loss + lost).max(-CREDIT * plain_step);
            self.trace_charge(rows, [verify, draft, plain_step, wall, lost]);
        }
        self.elapsed += wall;
        if s.hopeful {
            self.hopeful += wall;
        }
    }

    /// A standard normal draw (Box-Muller over xorshift64).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(f64::MIN_POSITIVE), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    fn uniform(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[path = "policy_trace.rs"]
mod trace;

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
