//! The draft temperature of a sampled request that leaves it to the engine
//! ([`DraftTemperatures`]): chosen per request temperature and draft shape
//! from the acceptance the target's own distributions say each candidate
//! temperature would have had.
//!
//! Why: a sampled child is accepted with the overlap of the target's p and
//! the draft's q, and which q overlaps best depends on the draft's shape. A
//! chain's one child wants q shaped like p; a tree's siblings are drawn from q
//! without replacement and verified by recursive rejection, so a flatter q
//! covers more of p with them (measured: T = 0.8, 15-node trees, q at 1.2
//! gives tau 1.84 against 1.68 at 0.8). The drafter's scores are not the
//! target's logits either, so "q at the target's temperature" is a guess.
//!
//! How: every verified node whose children were drawn gives the target's p at
//! that node, q's candidates and their probabilities. q at temperature t' is
//! q^(t / t') renormalized (q was softmax(S / t) over the candidates), so for
//! each candidate factor the probability that one of the node's m drawn
//! children would have been accepted is computed against p: exactly for one
//! child (sum of min(p, q')), by drawing the m children from q' without
//! replacement with the engine's own estimation generator otherwise (never
//! the sequences' generators: those carry the losslessness). Every factor is
//! scored on every node, so nothing is explored at a cost. The scores decay
//! (a window of a few hundred nodes) and a class uses its best factor once it
//! has seen enough nodes; until then the request's own temperature.
//!
//! Choosing q from earlier steps' p keeps verification lossless: the draft
//! distribution depends on nothing drawn in the step it drafts, and the
//! verifier checks against the q the tokens were actually drawn from.

use std::collections::HashMap;

use crate::sampling::{RESIDUAL_EPSILON, Rng, acceptance_probability, residual_weight};

/// Draft temperatures scored, as multiples of the request's temperature.
pub const FACTORS: [f32; 7] = [0.7, 0.85, 1.0, 1.25, 1.5, 1.75, 2.0];
/// The factor a class uses before it has seen [`MIN_SEEN`] nodes: the
/// request's temperature.
const PLAIN: usize = 2;
/// Nodes (decayed weight) a class needs before its scores choose.
const MIN_SEEN: f64 = 16.0;
/// Weight an older node keeps per new node (a window of ~1 / (1 - KEEP)).
const KEEP: f64 = 0.995;
/// Orders drawn per first child, node and factor where a node has too many
/// orders of its children to enumerate.
const DRAWS: usize = 2;
/// Of the nodes whose orders are drawn (three or more children of a dozen
/// candidates: ~20-40 us each), one in this many is scored, weighing as many:
/// a score window needs a few hundred nodes, not every one, and a host whose
/// steps take milliseconds should not pay for it.
const DRAWN_ORDERS_EVERY: u64 = 4;

/// Which scores a request's choice reads: its temperature (to 0.05) and its
/// draft's shape (a chain, or a tree by its node budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Class {
    temperature: u16,
    shape: u8,
}

impl Class {
    /// `tree_nodes`: None for a chain, else the tree's node budget.
    pub fn new(temperature: f32, tree_nodes: Option<usize>) -> Class {
        let shape = match tree_nodes {
            None => 0,
            // 1: up to 3 nodes, 2: up to 7, 3: up to 15, 4: up to 31, 5: more
            Some(n) => ((n.max(1) + 1).next_power_of_two().trailing_zeros() - 1).clamp(1, 5) as u8,
        };
        Class { temperature: (temperature * 20.0).round().clamp(0.0, u16::MAX as f32) as u16, shape }
    }
}

/// How the engine chose a draft's temperature, kept with the draft so that
/// its verification can score the other factors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tuning {
    pub class: Class,
    /// The temperature q was drawn at.
    pub t_draft: f32,
}

#[derive(Clone, Debug, Default)]
struct Scores {
    sum: [f64; FACTORS.len()],
    seen: f64,
}

impl Scores {
    fn best(&self) -> usize {
        if self.seen < MIN_SEEN {
            return PLAIN;
        }
        (0..FACTORS.len()).fold(PLAIN, |b, i| if self.sum[i] > self.sum[b] { i } else { b })
    }
}

/// The engine's draft-temperature scores, per [`Class`].
#[derive(Clone, Debug)]
pub struct DraftTemperatures {
    scores: HashMap<Class, Scores>,
    rng: Rng,
    /// Observations per class, for `DFLASH2_TRACE_TEMPERATURE`.
    traced: HashMap<Class, u64>,
    /// Nodes whose orders would be drawn, seen so far (`DRAWN_ORDERS_EVERY`).
    n_drawn_orders: u64,
}

/// `DFLASH2_TRACE_TEMPERATURE` set: each class's scores every 100 nodes go
/// to stderr (a debugging aid; read once per process).
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("DFLASH2_TRACE_TEMPERATURE").is_some())
}

impl Default for DraftTemperatures {
    fn default() -> Self {
        DraftTemperatures {
            scores: HashMap::new(),
            rng: Rng::new(0x0d1f_7e3b),
            traced: HashMap::new(),
            n_drawn_orders: 0,
        }
    }
}

impl DraftTemperatures {
    /// The draft temperature for a request at `temperature` (> 0) of `class`.
    pub fn choose(&self, temperature: f32, class: Class) -> f32 {
        temperature * FACTORS[self.scores.get(&class).map_or(PLAIN, Scores::best)]
    }

    /// The factor each class uses now, and the nodes it has seen (for traces
    /// and statistics).
    pub fn factor(&self, class: Class) -> (f32, f64) {
        self.scores.get(&class).map_or((FACTORS[PLAIN], 0.0), |s| (FACTORS[s.best()], s.seen))
    }

    /// A verified node of a draft tuned as `tuning` says: q's probabilities
    /// (drawn at `tuning.t_draft`), the target's probability of each of q's
    /// tokens (`p_at`, same order), and how many children were drawn from q.
    pub fn observe(&mut self, tuning: Tuning, q: &[f32], p_at: &[f64], n_drawn: usize) {
        if n_drawn == 0 || q.is_empty() || q.len() != p_at.len() || tuning.t_draft <= 0.0 {
            return;
        }
        let t_request = tuning.class.temperature as f32 / 20.0;
        if t_request <= 0.0 {
            return;
        }
        let m = n_drawn.min(q.len());
        let weight = if exact_orders(q.len(), m) {
            1.0
        } else {
            self.n_drawn_orders += 1;
            if self.n_drawn_orders % DRAWN_ORDERS_EVERY != 1 {
                return;
            }
            DRAWN_ORDERS_EVERY as f64
        };
        let scores = self.scores.entry(tuning.class).or_default();
        let keep = KEEP.powf(weight);
        for (i, &f) in FACTORS.iter().enumerate() {
            let q2 = retempered(q, (tuning.t_draft / (t_request * f)) as f64);
            let a = node_acceptance(&q2, p_at, m, &mut self.rng);
            scores.sum[i] = scores.sum[i] * keep + weight * a;
        }
        scores.seen = scores.seen * keep + weight;
        if trace() {
            let n = self.traced.entry(tuning.class).or_default();
            *n += 1;
            if *n % 100 == 0 {
                let sums: Vec<String> = scores.sum.iter().map(|x| format!("{:.3}", x / scores.seen)).collect();
                eprintln!(
                    "TRACE draft temperature {:?} n_drawn {n_drawn} best {} scores {}",
                    tuning.class,
                    FACTORS[scores.best()],
                    sums.join(" ")
                );
            }
        }
    }
}

/// q^power renormalized: q drawn at temperature t, re-tempered to t / power.
fn retempered(q: &[f32], power: f64) -> Vec<f64> {
    let w: Vec<f64> = q.iter().map(|&x| if x > 0.0 { (x as f64).powf(power) } else { 0.0 }).collect();
    let total: f64 = w.iter().sum();
    if total > 0.0 { w.iter().map(|x| x / total).collect() } else { w }
}

/// Probability that one of `m` children drawn from `q` without replacement is
/// accepted by recursive rejection (`crate::tree::verify_children`) against a
/// target whose probabilities at q's tokens are `p_at` (the rest of its mass
/// outside q's support). Exact over every order of the children where there
/// are at most [`EXACT_ORDERS`]; else exact over the first child and the
/// later ones drawn ([`DRAWS`] per first child).
fn node_acceptance(q: &[f64], p_at: &[f64], m: usize, rng: &mut Rng) -> f64 {
    let n = q.iter().filter(|&&x| x > 0.0).count();
    let m = m.min(n);
    if m == 0 {
        return 0.0;
    }
    let exact = exact_orders(n, m);
    let state = Rejection::new(q, p_at);
    let draws = if exact { 1 } else { DRAWS };
    let mut sum = 0.0;
    for _ in 0..draws {
        sum += state.accepted(m, exact, true, rng);
    }
    sum / draws as f64
}

/// Whether the orders of `m` children of `n` candidates are few enough to
/// enumerate (m = 1 and 2 of 16).
fn exact_orders(n: usize, m: usize) -> bool {
    m <= n && (n + 1 - m..=n).try_fold(1usize, |a, x| a.checked_mul(x).filter(|&v| v <= EXACT_ORDERS)).is_some()
}

/// Orders of a node's children enumerated exactly at most.
const EXACT_ORDERS: usize = 256;

/// The recursive rejection at one node after some children were rejected:
/// the target p^(k) (w / total on q's support, outside * p / total elsewhere,
/// with `out_mass` p's mass outside) and what is left of q.
#[derive(Clone)]
struct Rejection {
    w: Vec<f64>,
    total: f64,
    outside: f64,
    out_mass: f64,
    left: Vec<f64>,
}

impl Rejection {
    fn new(q: &[f64], p_at: &[f64]) -> Rejection {
        let out_mass = (1.0 - p_at.iter().sum::<f64>()).max(0.0);
        Rejection { w: p_at.to_vec(), total: 1.0, outside: 1.0, out_mass, left: q.to_vec() }
    }

    /// The probability that one of the next `m` children is accepted: every
    /// next child weighed by q where `exact` (or `first`), else one drawn.
    fn accepted(&self, m: usize, exact: bool, first: bool, rng: &mut Rng) -> f64 {
        let left_mass: f64 = self.left.iter().sum();
        if m == 0 || left_mass <= 0.0 {
            return 0.0;
        }
        if exact || first {
            let mut sum = 0.0;
            for (i, &l) in self.left.iter().enumerate().filter(|e| *e.1 > 0.0) {
                sum += l / left_mass * self.after(i, left_mass, m, exact, rng);
            }
            sum
        } else {
            let i = draw_index(&self.left, left_mass, rng);
            self.after(i, left_mass, m, exact, rng)
        }
    }

    /// Child `i` tested: accepted, or rejected and the rest tried.
    fn after(&self, i: usize, left_mass: f64, m: usize, exact: bool, rng: &mut Rng) -> f64 {
        let a = acceptance_probability(self.w[i] / self.total, self.left[i] / left_mass);
        if m == 1 || a >= 1.0 {
            return a;
        }
        let r: Vec<f64> =
            self.w.iter().zip(&self.left).map(|(&wj, &lj)| residual_weight(wj / self.total, lj / left_mass)).collect();
        let r_total = self.outside / self.total * self.out_mass + r.iter().sum::<f64>();
        let mut next = self.clone();
        if r_total > RESIDUAL_EPSILON {
            next.outside /= self.total;
            (next.w, next.total) = (r, r_total);
        }
        next.left[i] = 0.0;
        a + (1.0 - a) * next.accepted(m - 1, exact, false, rng)
    }
}

/// An index drawn with probability weights[i] / total.
fn draw_index(weights: &[f64], total: f64, rng: &mut Rng) -> usize {
    let mut u = rng.next_f64() * total;
    let mut last = 0;
    for (j, &x) in weights.iter().enumerate().filter(|e| *e.1 > 0.0) {
        if u < x {
            return j;
        }
        u -= x;
        last = j;
    }
    last // rounding: the last positive weight
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_split_by_temperature_and_shape() {
        assert_eq!(Class::new(0.8, None).shape, 0);
        let shapes: Vec<u8> =
            [1, 3, 4, 7, 8, 15, 16, 31, 32, 64].iter().map(|&n| Class::new(0.8, Some(n)).shape).collect();
        assert_eq!(shapes, [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
        assert_eq!(Class::new(0.8, None), Class::new(0.81, None));
        assert_ne!(Class::new(0.8, None), Class::new(0.9, None));
    }

    #[test]
    fn one_child_scores_the_overlap_and_more_children_accept_more() {
        let q = [0.7, 0.2, 0.1];
        let p = [0.3, 0.3, 0.3];
        let mut rng = Rng::new(1);
        assert!((node_acceptance(&q, &p, 1, &mut rng) - 0.6).abs() < 1e-12);
        // every candidate drawn: the emitted token follows p, so a child is
        // accepted exactly when p's token is on q's support
        let all = node_acceptance(&q, &p, 3, &mut rng);
        assert!((all - 0.9).abs() < 1e-9, "{all}");
        let two = node_acceptance(&q, &p, 2, &mut rng);
        assert!(two > 0.6 && two < 0.9, "{two}");
    }

    /// The score matches the rejection rule's own acceptance, enumerated over
    /// both children's draws.
    #[test]
    fn two_children_score_as_the_rejection_rule_accepts() {
        let q = [0.5, 0.3, 0.2];
        let p = [0.1, 0.6, 0.2];
        let mut exact = 0.0;
        for a in 0..3 {
            for b in (0..3).filter(|&b| b != a) {
                let pr = q[a] * q[b] / (1.0 - q[a]);
                let a1 = acceptance_probability(p[a], q[a]);
                // after rejecting a: p' = max(p - q, 0) renormalized (outside mass 0.1 kept), q' = q without a
                let out = 1.0 - p.iter().sum::<f64>();
                let r: Vec<f64> = (0..3).map(|j| residual_weight(p[j], q[j])).collect();
                let rt = out + r.iter().sum::<f64>();
                let a2 = acceptance_probability(r[b] / rt, q[b] / (1.0 - q[a]));
                exact += pr * (a1 + (1.0 - a1) * a2);
            }
        }
        let score = node_acceptance(&q, &p, 2, &mut Rng::new(7));
        assert!((score - exact).abs() < 1e-12, "score {score} exact {exact}");
    }

    /// The score is what the verifier's own rule accepts: children drawn
    /// without replacement and verified by `verify_children`, counted.
    #[test]
    fn scores_match_the_verifier_s_acceptance() {
        use crate::sampling::Dist;
        use crate::tree::{Outcome, verify_children};
        let ids = [1, 2, 3, 4, 5, 6, 7, 8];
        let q = [0.3f32, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02];
        let p_dense = [0.05f32, 0.1, 0.3, 0.05, 0.2, 0.05, 0.05, 0.1, 0.1];
        let p_at: Vec<f64> = ids.iter().map(|&i| p_dense[i as usize] as f64).collect();
        let qf: Vec<f64> = q.iter().map(|&x| x as f64).collect();
        let (mut draw, mut verify) = (Rng::new(3), Rng::new(4));
        for m in [2, 3] {
            let n = 40_000;
            let mut hits = 0;
            for _ in 0..n {
                let mut left = qf.clone();
                let children: Vec<i32> = (0..m)
                    .map(|_| {
                        let i = draw_index(&left, left.iter().sum(), &mut draw);
                        left[i] = 0.0;
                        ids[i]
                    })
                    .collect();
                let qd = Dist::Sparse { ids: &ids, probs: &q };
                let out = verify_children(&children, qd, Dist::Dense(&p_dense), 9, &mut verify).unwrap();
                hits += matches!(out, Outcome::Child(_)) as usize;
            }
            let measured = hits as f64 / n as f64;
            let exact = Rejection::new(&qf, &p_at).accepted(m, true, true, &mut Rng::new(0));
            // m = 3 of 8: 336 orders, drawn (unbiased: its mean is the exact score)
            let mut rng = Rng::new(5);
            let scored = (0..50).map(|_| node_acceptance(&qf, &p_at, m, &mut rng)).sum::<f64>() / 50.0;
            // 4 standard errors of the count
            assert!((measured - exact).abs() < 0.01, "m {m}: verifier {measured}, exact {exact}");
            assert!((scored - exact).abs() < 0.01, "m {m}: scored {scored}, exact {exact}");
        }
    }

    /// A target flatter than q: siblings want a hotter q, and the scores say so.
    #[test]
    fn a_flat_target_and_several_children_choose_a_hotter_draft() {
        let mut t = DraftTemperatures::default();
        let tuning = Tuning { class: Class::new(0.8, Some(15)), t_draft: 0.8 };
        let q = [0.8f32, 0.1, 0.05, 0.03, 0.02];
        let p = [0.3, 0.25, 0.2, 0.15, 0.05];
        assert_eq!(t.choose(0.8, tuning.class), 0.8);
        for _ in 0..40 {
            t.observe(tuning, &q, &p, 3);
        }
        assert!(t.choose(0.8, tuning.class) > 1.0, "{}", t.choose(0.8, tuning.class));
        // a sharp target and one child: q as sharp as it is, or sharper
        let chain = Tuning { class: Class::new(0.8, None), t_draft: 0.8 };
        for _ in 0..40 {
            t.observe(chain, &[0.6, 0.3, 0.1], &[0.9, 0.05, 0.05], 1);
        }
        assert!(t.choose(0.8, chain.class) < 0.8, "{}", t.choose(0.8, chain.class));
        // untouched classes keep the request's temperature
        assert_eq!(t.choose(0.3, Class::new(0.3, None)), 0.3);
    }
}
