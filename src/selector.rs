//! Walks over the DFlash2 selector lattice: upstream's greedy chain, and a
//! sampled walk that also reports the draft distribution q of every token for
//! lossless verification (`crate::sampling`). Pure functions, no model needed.
//!
//! The drafter writes one lattice row per block position (block-major), each
//! `n_embd` floats wide. Row 0 of a block (the anchor) is unused. Row p holds:
//! - floats `[0, k)`: the top-k candidate ids of position p, as f32, in no
//!   particular order (ggml's top-k does not sort; slot 0 is not the best);
//! - float `k + i*k + j`: the edge score of predecessor candidate i (of
//!   position p-1; at p = 1 the anchor, repeated over i) and successor
//!   candidate j (of position p);
//! - zero padding up to `n_embd`.

use crate::error::{Error, Result};
use crate::sampling::{Dist, Rng, draw};
use crate::truncation::DraftQ;

/// Stopping rules of a walk, as upstream applies them.
#[derive(Clone, Copy, Debug)]
pub struct WalkLimits {
    /// Most tokens to emit (the block yields at most its width - 1).
    pub n_max: usize,
    /// A walk that emits fewer tokens than this returns none.
    pub n_min: usize,
    /// Stop before a token whose softmax over its k lattice scores is below
    /// this; 0 disables the rule.
    pub p_min: f32,
}

/// One block's lattice rows.
#[derive(Clone, Copy)]
pub struct Lattice<'a> {
    rows: &'a [f32],
    n_embd: usize,
    top_k: usize,
}

impl<'a> Lattice<'a> {
    /// `rows` holds the block's rows, anchor row first; `n_embd >= k*(k+1)`.
    pub fn new(rows: &'a [f32], n_embd: usize, top_k: usize) -> Option<Lattice<'a>> {
        let ok = top_k > 0 && n_embd >= top_k * (top_k + 1) && rows.len() % n_embd == 0;
        ok.then_some(Lattice { rows, n_embd, top_k })
    }

    /// Rows in the block, the anchor included.
    pub fn n_rows(&self) -> usize {
        self.rows.len() / self.n_embd
    }

    fn row(&self, p: usize) -> &'a [f32] {
        &self.rows[p * self.n_embd..(p + 1) * self.n_embd]
    }

    /// Candidate ids of position p (as stored: f32).
    pub fn candidates(&self, p: usize) -> &'a [f32] {
        &self.row(p)[..self.top_k]
    }

    /// Edge scores from predecessor candidate `pred` to every candidate of position p.
    pub fn scores(&self, p: usize, pred: usize) -> &'a [f32] {
        let k = self.top_k;
        &self.row(p)[k + pred * k..k + (pred + 1) * k]
    }
}

/// Index of the first maximum, with C++'s `std::max_element` semantics (a NaN
/// never replaces the running maximum, and one in front stays).
pub(crate) fn first_max(s: &[f32]) -> usize {
    let mut best = 0;
    for j in 1..s.len() {
        if s[best] < s[j] {
            best = j;
        }
    }
    best
}

/// Softmax of `s` at `at`: 1 / sum_j exp(s_j - s_at).
fn softmax_at(s: &[f32], at: usize) -> f32 {
    let sum: f32 = s.iter().map(|&x| (x - s[at]).exp()).sum();
    1.0 / sum
}

/// A drafted token and the softmax of its lattice scores at the pick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pick {
    pub token: i32,
    pub confidence: f32,
}

/// The greedy chain, exactly as upstream: start from the anchor, at each
/// position take the best successor of the previous pick. `n_vocab` bounds the
/// ids a row may produce: a corrupt candidate ends the walk instead of being
/// handed to the host.
pub fn greedy_walk_scored(lattice: &Lattice, limits: WalkLimits, n_vocab: usize) -> Vec<Pick> {
    let n_positions = lattice.n_rows().saturating_sub(1).min(limits.n_max);
    let mut picks = Vec::with_capacity(n_positions);
    let mut pred = 0;
    for p in 1..=n_positions {
        let scores = lattice.scores(p, pred);
        pred = first_max(scores);
        let confidence = softmax_at(scores, pred);
        if limits.p_min > 0.0 && confidence < limits.p_min {
            break;
        }
        let id = lattice.candidates(p)[pred];
        if !(id >= 0.0 && (id as usize) < n_vocab) {
            break;
        }
        picks.push(Pick { token: id as i32, confidence });
    }
    if picks.len() < limits.n_min {
        picks.clear();
    }
    picks
}

/// `greedy_walk_scored` without the confidences.
pub fn greedy_walk(lattice: &Lattice, limits: WalkLimits, n_vocab: usize) -> Vec<i32> {
    greedy_walk_scored(lattice, limits, n_vocab).into_iter().map(|p| p.token).collect()
}

/// The draft temperature of a request: `draft` when the caller sets one, else
/// the request's own temperature.
///
/// Why the request's: the drafter is trained so that its edge scores rank the
/// target's next tokens like the target's logits do, so softmax(S / T) is its
/// best guess of the target's distribution at temperature T, and the closer q
/// is to p the higher the acceptance, sum_t min(p(t), q(t)). Why overridable:
/// the host's chain also truncates p (top-k, top-p, min-p) and the drafter is
/// not perfectly calibrated, so a somewhat lower draft temperature can do
/// better; 0 drafts the greedy chain with a one-hot q, which verifies exactly
/// like upstream's sample-and-match. Either way the output stays the target's.
pub fn draft_temperature(request: f32, draft: Option<f32>) -> Result<f32> {
    check_temperature("request temperature", request)?;
    if let Some(t) = draft {
        check_temperature("draft temperature", t)?;
    }
    Ok(draft.unwrap_or(request))
}

fn check_temperature(what: &str, t: f32) -> Result<()> {
    if t.is_finite() && t >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(format!("{what} {t} (must be finite and >= 0)")))
    }
}

/// Applies `q`'s truncation to a row's candidate weights: the cut reads the
/// temperature-1 masses exp(score - max) of the usable candidates.
pub(crate) fn truncate(q: &DraftQ, scores: &[f32], ids: &[Option<i32>], max: f64, weight: &mut [f64]) {
    if q.truncation.is_none() {
        return;
    }
    let mass: Vec<f64> =
        ids.iter().zip(scores).map(|(id, &s)| if id.is_some() { (s as f64 - max).exp() } else { 0.0 }).collect();
    q.truncation.apply(ids, &mass, weight);
}

/// A sampled draft token, its position's draft distribution q and the row's
/// confidence.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledPick {
    pub token: i32,
    /// Softmax of the row's scores (temperature 1) at its best candidate: the
    /// quantity greedy calls `confidence`, but fixed before the token is
    /// drawn. Any rule that cuts the draft before this token may use it;
    /// cutting on `q(token)` instead would bias the verified output.
    pub confidence: f32,
    /// q(· | previous pick): the distinct in-vocabulary candidate ids of the
    /// position with positive probability, in candidate order, and their
    /// probabilities (summing to 1 up to f32 rounding). q is 0 elsewhere.
    pub q_ids: Vec<i32>,
    pub q_probs: Vec<f32>,
}

impl SampledPick {
    /// q as the verifier reads it.
    pub fn q(&self) -> Dist<'_> {
        Dist::Sparse { ids: &self.q_ids, probs: &self.q_probs }
    }

    /// q(token) for any token: 0 outside the candidates.
    pub fn q_of(&self, token: i32) -> f32 {
        self.q_ids.iter().position(|&t| t == token).map_or(0.0, |i| self.q_probs[i])
    }
}

/// The candidate id at `j` if it is a vocabulary id and its score is finite.
pub(crate) fn usable(lattice: &Lattice, p: usize, scores: &[f32], j: usize, n_vocab: usize) -> Option<i32> {
    let id = lattice.candidates(p)[j];
    (id >= 0.0 && (id as usize) < n_vocab && scores[j].is_finite()).then_some(id as i32)
}

/// The sampled walk: from the anchor, at each position draw the next candidate
/// from q(j | a) = softmax_j(S[a][j] / t_draft) over the row's usable
/// candidates, where a is the previous pick, and report q for every token.
///
/// - Usable candidates: an in-vocabulary id and a finite score. The others
///   get q = 0 and the rest is renormalized (NaN, +inf or a corrupt id is a
///   bad row entry, not a sure thing); a row with none ends the walk.
/// - Duplicate ids are one token: q(t) sums their probabilities. The walk
///   still continues from the drawn candidate (chosen among the duplicates in
///   proportion to their weights), and that is still lossless: given
///   everything drawn so far, each token is distributed as the q reported.
/// - `t_draft = 0` takes the first best usable candidate and reports a
///   one-hot q (no random number drawn).
/// - Limits: `n_max` as in greedy. `p_min` ends the walk before a position
///   whose `confidence` is below it; on clean rows that is greedy's rule, and
///   it is decided before the token is drawn. `n_min` applies only at
///   `t_draft = 0`: dropping a sampled draft because it came out short makes
///   its kept tokens depend on what they lead to, which biases the output
///   (q = (A: .5, B: .5), p = q, A leads on, B ends the walk, n_min = 2:
///   then A is emitted 3/4 of the time).
///
/// One uniform per drawn token (two where the drawn id has duplicates).
pub fn sampled_walk(
    lattice: &Lattice,
    limits: WalkLimits,
    n_vocab: usize,
    t_draft: f32,
    rng: &mut Rng,
) -> Result<Vec<SampledPick>> {
    sampled_walk_q(lattice, limits, n_vocab, DraftQ::at(t_draft), rng)
}

/// [`sampled_walk`] with q also truncated as the host's sampler truncates p
/// (`crate::truncation`): candidates the cut drops get q = 0.
pub fn sampled_walk_q(
    lattice: &Lattice,
    limits: WalkLimits,
    n_vocab: usize,
    q: DraftQ,
    rng: &mut Rng,
) -> Result<Vec<SampledPick>> {
    let t_draft = q.t;
    check_temperature("draft temperature", t_draft)?;
    let k = lattice.top_k;
    let n_positions = lattice.n_rows().saturating_sub(1).min(limits.n_max);
    let mut picks = Vec::with_capacity(n_positions);
    let mut pred = 0;
    let mut weight = vec![0.0f64; k];
    for p in 1..=n_positions {
        let scores = lattice.scores(p, pred);
        let ids: Vec<Option<i32>> = (0..k).map(|j| usable(lattice, p, scores, j, n_vocab)).collect();
        // The first best usable candidate; none usable ends the walk.
        let Some(best) = (0..k).filter(|&j| ids[j].is_some()).reduce(|b, j| if scores[b] < scores[j] { j } else { b })
        else {
            break;
        };
        let max = scores[best] as f64;
        let exp_sum: f64 = (0..k).filter(|&j| ids[j].is_some()).map(|j| (scores[j] as f64 - max).exp()).sum();
        let confidence = (1.0 / exp_sum) as f32;
        if limits.p_min > 0.0 && confidence < limits.p_min {
            break;
        }
        // Candidate weights, shifted by the max so the best weighs 1 and
        // nothing overflows however small t_draft is.
        for j in 0..k {
            weight[j] = match ids[j] {
                Some(_) if t_draft == 0.0 => (j == best) as u8 as f64,
                Some(_) => ((scores[j] as f64 - max) / t_draft as f64).exp(),
                None => 0.0,
            };
        }
        truncate(&q, scores, &ids, max, &mut weight);
        let total: f64 = weight.iter().sum();
        // q over tokens: duplicates summed (in f64, then rounded once).
        let mut q_ids: Vec<i32> = Vec::with_capacity(k);
        let mut mass: Vec<f64> = Vec::with_capacity(k);
        for j in 0..k {
            if let (Some(id), true) = (ids[j], weight[j] > 0.0) {
                match q_ids.iter().position(|&t| t == id) {
                    Some(m) => mass[m] += weight[j],
                    None => {
                        q_ids.push(id);
                        mass.push(weight[j]);
                    }
                }
            }
        }
        let q_probs: Vec<f32> = mass.iter().map(|&m| (m / total) as f32).collect();
        // Draw the token from the q reported, as rounded, so the verifier
        // sees exactly the distribution the token came from; f32 underflow
        // to 0 simply drops a candidate from the support.
        let (q_ids, q_probs): (Vec<i32>, Vec<f32>) = q_ids.into_iter().zip(q_probs).filter(|e| e.1 > 0.0).unzip();
        let m = if t_draft == 0.0 {
            0
        } else {
            let q_total: f64 = q_probs.iter().map(|&x| x as f64).sum();
            draw(q_probs.iter().map(|&x| x as f64).enumerate(), q_total, rng)
        };
        let token = q_ids[m];
        // The candidate to continue from: the one drawn, among duplicates in
        // proportion to their weights.
        let dups: Vec<usize> = (0..k).filter(|&j| ids[j] == Some(token) && weight[j] > 0.0).collect();
        pred = if dups.len() == 1 {
            dups[0]
        } else {
            let w_total: f64 = dups.iter().map(|&j| weight[j]).sum();
            draw(dups.iter().map(|&j| (j, weight[j])), w_total, rng)
        };
        picks.push(SampledPick { token, confidence, q_ids, q_probs });
    }
    if t_draft == 0.0 && picks.len() < limits.n_min {
        picks.clear();
    }
    Ok(picks)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 3;
    const N_EMBD: usize = 16; // >= k*(k+1) = 12

    /// Builds a block: `cands[p]` and `scores[p][i][j]` for p >= 1.
    fn block(cands: &[[f32; K]], scores: &[[[f32; K]; K]]) -> Vec<f32> {
        let mut rows = vec![0.0; N_EMBD]; // anchor row
        for (c, s) in cands.iter().zip(scores) {
            let mut row = vec![0.0; N_EMBD];
            row[..K].copy_from_slice(c);
            for i in 0..K {
                row[K + i * K..K + (i + 1) * K].copy_from_slice(&s[i]);
            }
            rows.extend(row);
        }
        rows
    }

    fn limits(n_max: usize) -> WalkLimits {
        WalkLimits { n_max, n_min: 0, p_min: 0.0 }
    }

    fn same(s: [f32; K]) -> [[f32; K]; K] {
        [s; K]
    }

    #[test]
    fn follows_the_best_successor_of_each_pick_not_slot_zero() {
        let rows = block(
            &[[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]],
            &[same([0.1, 0.9, 0.2]), [[5.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 9.0, 0.0]]],
        );
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        // position 1 picks candidate 1 (id 11); position 2 reads predecessor row 1 -> candidate 2 (id 22)
        assert_eq!(greedy_walk(&lat, limits(8), 100), vec![11, 22]);
    }

    #[test]
    fn ties_break_on_the_first_maximum() {
        let rows = block(&[[7.0, 8.0, 9.0]], &[same([1.0, 1.0, 1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert_eq!(greedy_walk(&lat, limits(8), 100), vec![7]);
    }

    #[test]
    fn nan_scores_never_win() {
        let rows = block(&[[7.0, 8.0, 9.0]], &[same([0.5, f32::NAN, 2.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert_eq!(greedy_walk(&lat, limits(8), 100), vec![9]);
    }

    #[test]
    fn n_max_limits_the_positions_walked() {
        let rows = block(&[[1.0, 2.0, 3.0]; 3], &[same([0.0, 1.0, 0.0]); 3]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert_eq!(greedy_walk(&lat, limits(2), 100), vec![2, 2]);
        assert_eq!(greedy_walk(&lat, limits(9), 100), vec![2, 2, 2]);
    }

    #[test]
    fn p_min_is_the_softmax_over_the_lattice_scores() {
        // confident first position, flat second
        let rows = block(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &[same([0.0, 10.0, 0.0]), same([1.0, 1.1, 1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let walk = |p_min| greedy_walk(&lat, WalkLimits { n_max: 8, n_min: 0, p_min }, 100);
        assert_eq!(walk(0.0), vec![2, 5]);
        // softmax at the second pick is ~0.356
        assert_eq!(walk(0.3), vec![2, 5]);
        assert_eq!(walk(0.4), vec![2]);
        // softmax at the first pick is 1 / (1 + 2e^-10) = 0.99991
        assert_eq!(walk(0.9999), vec![2]);
        assert_eq!(walk(0.99995), Vec::<i32>::new());
    }

    #[test]
    fn scored_walk_reports_the_softmax_of_each_pick() {
        let rows = block(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &[same([0.0, 10.0, 0.0]), same([1.0, 1.1, 1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let picks = greedy_walk_scored(&lat, limits(8), 100);
        assert_eq!(picks.iter().map(|p| p.token).collect::<Vec<_>>(), vec![2, 5]);
        assert!((picks[0].confidence - 0.99991).abs() < 1e-4);
        assert!((picks[1].confidence - 0.3559).abs() < 1e-3);
    }

    #[test]
    fn a_walk_shorter_than_n_min_drafts_nothing() {
        let rows = block(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &[same([0.0, 10.0, 0.0]), same([1.0, 1.1, 1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let walk = |n_min| greedy_walk(&lat, WalkLimits { n_max: 8, n_min, p_min: 0.4 }, 100);
        assert_eq!(walk(1), vec![2]);
        assert_eq!(walk(2), Vec::<i32>::new());
    }

    #[test]
    fn out_of_vocabulary_candidates_end_the_walk() {
        let rows = block(&[[1.0, 2.0, 3.0], [4.0, 500.0, 6.0]], &[same([0.0, 1.0, 0.0]); 2]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert_eq!(greedy_walk(&lat, limits(8), 100), vec![2]);
    }

    #[test]
    fn rows_too_narrow_for_the_lattice_are_refused() {
        assert!(Lattice::new(&[0.0; 22], 11, K).is_none());
        assert!(Lattice::new(&[0.0; 17], N_EMBD, K).is_none());
    }

    // ---- sampled walk ----------------------------------------------------

    use crate::sampling::{self, STREAM_DRAFT, STREAM_VERIFY};

    fn softmax(s: &[f64], t: f64) -> Vec<f64> {
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| ((x - max) / t).exp()).collect();
        let sum: f64 = e.iter().sum();
        e.iter().map(|x| x / sum).collect()
    }

    /// Same threshold as in `sampling`: TV over m outcomes from n samples
    /// exceeds it with probability <= 1e-9 (Hoeffding, union over 2^m events).
    fn tv_threshold(n: usize, m: usize) -> f64 {
        ((m as f64 + 1.0) * 2f64.ln() + 1e9f64.ln()).sqrt() / (2.0 * n as f64).sqrt()
    }

    fn sample_walk(lat: &Lattice, n_max: usize, t: f32, rng: &mut Rng) -> Vec<SampledPick> {
        sampled_walk(lat, limits(n_max), 100, t, rng).unwrap()
    }

    #[test]
    fn sampled_q_is_the_tempered_softmax_of_the_previous_picks_row() {
        let rows = block(&[[10.0, 11.0, 12.0]], &[same([0.5, 1.5, -1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        for t in [0.3f32, 0.8, 1.0, 2.5] {
            let pick = &sample_walk(&lat, 1, t, &mut Rng::new(1))[0];
            let want = softmax(&[0.5, 1.5, -1.0], t as f64);
            assert_eq!(pick.q_ids, vec![10, 11, 12]);
            for (q, w) in pick.q_probs.iter().zip(&want) {
                assert!((*q as f64 - w).abs() < 1e-6, "t={t}: {:?} vs {want:?}", pick.q_probs);
            }
            assert!((pick.q_probs.iter().map(|&x| x as f64).sum::<f64>() - 1.0).abs() < 1e-6);
            assert_eq!(pick.q_of(11), pick.q_probs[1]);
            assert_eq!(pick.q_of(99), 0.0);
            // the row's confidence is temperature-free: greedy's softmax at the best
            assert!((pick.confidence as f64 - softmax(&[0.5, 1.5, -1.0], 1.0)[1]).abs() < 1e-6);
        }
    }

    #[test]
    fn sampled_picks_follow_the_q_they_report_given_the_previous_pick() {
        // Position 1 has a duplicated id (10 twice): the walk continues from
        // the candidate drawn, so position 2's q depends on which one.
        let rows = block(
            &[[10.0, 10.0, 11.0], [20.0, 21.0, 22.0]],
            &[same([1.0, 0.5, 0.0]), [[3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0]]],
        );
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let t = 0.8;
        let w1 = softmax(&[1.0, 0.5, 0.0], t);
        let rows2 = [softmax(&[3.0, 0.0, 0.0], t), softmax(&[0.0, 2.0, 0.0], t), softmax(&[0.0, 0.0, 1.0], t)];
        // exact joint of (token 1, token 2) over the latent candidate index
        let mut want = [[0.0; 3]; 2]; // [10 or 11][20, 21, 22]
        for j in 0..3 {
            for c in 0..3 {
                want[(j == 2) as usize][c] += w1[j] * rows2[j][c];
            }
        }
        let n = 200_000;
        let mut counts = [[0usize; 3]; 2];
        let mut rng = Rng::with_stream(9, STREAM_DRAFT);
        for _ in 0..n {
            let picks = sample_walk(&lat, 2, t as f32, &mut rng);
            assert_eq!(picks.len(), 2);
            // position 1 reports the merged q: 10 -> w0 + w1
            assert_eq!(picks[0].q_ids, vec![10, 11]);
            assert!((picks[0].q_probs[0] as f64 - (w1[0] + w1[1])).abs() < 1e-6);
            // position 2 reports the row of the candidate drawn
            let row = rows2.iter().find(|r| (r[0] - picks[1].q_probs[0] as f64).abs() < 1e-6).unwrap();
            assert!(picks[1].q_probs.iter().zip(row).all(|(a, b)| (*a as f64 - b).abs() < 1e-6));
            counts[(picks[0].token == 11) as usize][(picks[1].token - 20) as usize] += 1;
        }
        let tv: f64 = (0..2)
            .flat_map(|a| (0..3).map(move |b| (a, b)))
            .map(|(a, b)| (counts[a][b] as f64 / n as f64 - want[a][b]).abs())
            .sum::<f64>()
            / 2.0;
        assert!(tv < tv_threshold(n, 6), "TV {tv}"); // 6 outcomes: ~0.0080
    }

    /// End to end on the pure pieces: sampled walk over a lattice with a
    /// duplicated candidate, verified against a prefix-dependent target, the
    /// emitted pair (completed by target sampling) matches the target's own.
    #[test]
    fn sampled_walk_then_verification_emits_the_target_distribution() {
        const V: usize = 4;
        fn target(prefix: &[i32]) -> [f32; V] {
            match prefix {
                [] => [0.1, 0.4, 0.2, 0.3],
                [.., 0] | [.., 1] => [0.5, 0.0, 0.25, 0.25],
                _ => [0.0, 0.3, 0.3, 0.4],
            }
        }
        let rows = block(
            &[[1.0, 1.0, 3.0], [0.0, 2.0, 3.0]],
            &[same([0.8, 0.1, 0.0]), [[2.0, 0.0, 0.0], [0.0, 0.0, 2.0], [0.0, 1.0, 0.0]]],
        );
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let n = 200_000;
        let mut draft_rng = Rng::with_stream(3, STREAM_DRAFT);
        let mut rng = Rng::with_stream(3, STREAM_VERIFY);
        let mut counts = [0usize; V * V * V];
        let mut accepted = 0;
        for _ in 0..n {
            let picks = sampled_walk(&lat, limits(2), V, 0.9, &mut draft_rng).unwrap();
            let draft: Vec<i32> = picks.iter().map(|p| p.token).collect();
            let q: Vec<Dist> = picks.iter().map(|p| p.q()).collect();
            let ps: Vec<[f32; V]> = (0..=draft.len()).map(|i| target(&draft[..i])).collect();
            let pd: Vec<Dist> = ps.iter().map(|p| Dist::Dense(p)).collect();
            let v = sampling::verify(&draft, &q, &pd, V, &mut rng).unwrap();
            accepted += v.n_accepted;
            let mut out = v.tokens;
            while out.len() < 3 {
                let p = target(&out);
                out.push(sampling::sample(Dist::Dense(&p), V, &mut rng).unwrap());
            }
            counts[out.iter().fold(0, |i, &t| i * V + t as usize)] += 1;
        }
        let mut tv = 0.0;
        for (i, &c) in counts.iter().enumerate() {
            let seq = [(i / 16) as i32, (i / 4 % 4) as i32, (i % 4) as i32];
            let want: f64 = (0..3).map(|k| target(&seq[..k])[seq[k] as usize] as f64).product();
            tv += (c as f64 / n as f64 - want).abs() / 2.0;
        }
        assert!(tv < tv_threshold(n, V * V * V), "TV {tv}"); // 64 outcomes: ~0.0128
        assert!(accepted > 0);
    }

    #[test]
    fn seeds_reproduce_and_different_seeds_differ() {
        let rows = block(&[[1.0, 2.0, 3.0]; 6], &[same([0.0, 0.1, 0.2]); 6]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..20).flat_map(|_| sample_walk(&lat, 6, 1.0, &mut rng)).map(|p| p.token).collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    /// q cut like the host's p: the dropped candidate gets q = 0 and is never
    /// drawn, the others keep their proportions.
    #[test]
    fn a_truncated_walk_draws_only_what_the_host_s_chain_keeps() {
        use crate::truncation::Truncation;
        // temperature-1 masses .59, .27, .13
        let rows = block(&[[1.0, 2.0, 3.0]], &[same([1.0, 0.2, -0.5])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let full = sampled_walk(&lat, limits(1), 10, 1.0, &mut Rng::new(1)).unwrap();
        assert_eq!(full[0].q_ids, [1, 2, 3]);
        let ratio = full[0].q_probs[0] / full[0].q_probs[1];
        for (k, p, m) in [(2, 0.0, 0.0), (0, 0.8, 0.0), (0, 0.0, 0.3)] {
            let truncation = Truncation::new(k, p, m).unwrap();
            for seed in 0..50 {
                let q = DraftQ { t: 1.0, truncation };
                let w = sampled_walk_q(&lat, limits(1), 10, q, &mut Rng::new(seed)).unwrap();
                assert_eq!(w[0].q_ids, [1, 2], "{truncation:?}");
                assert!((w[0].q_probs[0] / w[0].q_probs[1] - ratio).abs() < 1e-5);
                assert!(w[0].token == 1 || w[0].token == 2);
            }
        }
    }

    #[test]
    fn zero_draft_temperature_is_the_greedy_chain_with_a_one_hot_q() {
        let rows = block(
            &[[10.0, 11.0, 12.0], [20.0, 21.0, 22.0], [30.0, 31.0, 32.0]],
            &[same([0.1, 0.9, 0.2]), [[5.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 9.0, 0.0]], same([1.0, 1.0, 0.5])],
        );
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let mut rng = Rng::new(0);
        let before = rng.clone();
        for l in
            [limits(8), WalkLimits { n_max: 8, n_min: 4, p_min: 0.0 }, WalkLimits { n_max: 8, n_min: 0, p_min: 0.6 }]
        {
            let greedy = greedy_walk_scored(&lat, l, 100);
            let sampled = sampled_walk(&lat, l, 100, 0.0, &mut rng).unwrap();
            assert_eq!(
                greedy.iter().map(|p| p.token).collect::<Vec<_>>(),
                sampled.iter().map(|p| p.token).collect::<Vec<_>>()
            );
            for (g, s) in greedy.iter().zip(&sampled) {
                assert!((g.confidence - s.confidence).abs() < 1e-6);
                assert_eq!((s.q_ids.as_slice(), s.q_probs.as_slice()), (&[s.token][..], &[1.0f32][..]));
            }
        }
        assert_eq!(rng, before, "a zero-temperature walk draws no random numbers");
    }

    #[test]
    fn duplicates_merge_and_unusable_candidates_get_no_mass() {
        let rows = block(
            &[[5.0, 5.0, 500.0], [1.0, 2.0, 3.0], [1.0, 2.0, -1.0]],
            &[same([0.0, 0.0, 10.0]), same([f32::NAN, f32::INFINITY, 0.0]), same([0.0, 0.0, 0.0])],
        );
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let picks = sample_walk(&lat, 8, 1.0, &mut Rng::new(2));
        // 500 is outside the vocabulary: excluded though it scores best
        assert_eq!((picks[0].token, picks[0].q_ids.clone(), picks[0].q_probs.clone()), (5, vec![5], vec![1.0]));
        assert_eq!(picks[0].confidence, 0.5); // two usable candidates, equal scores
        // NaN and +inf scores are excluded
        assert_eq!((picks[1].token, picks[1].q_probs.clone()), (3, vec![1.0]));
        // a negative id is excluded, the rest renormalized
        assert_eq!(picks[2].q_ids, vec![1, 2]);
        assert!(picks[2].q_probs.iter().all(|&q| (q - 0.5).abs() < 1e-6));
    }

    #[test]
    fn rows_without_a_usable_candidate_end_the_walk_without_panicking() {
        for bad in
            [[f32::NAN; K], [f32::INFINITY; K], [f32::NEG_INFINITY; K], [f32::NAN, f32::NEG_INFINITY, f32::INFINITY]]
        {
            let rows = block(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &[same([0.0, 1.0, 0.0]), same(bad)]);
            let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
            for t in [0.0, 0.5, 1.0] {
                assert_eq!(sample_walk(&lat, 8, t, &mut Rng::new(1)).len(), 1);
            }
        }
        let rows = block(&[[-1.0, 1e9, f32::NAN]], &[same([0.0, 1.0, 2.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert!(sample_walk(&lat, 8, 1.0, &mut Rng::new(1)).is_empty());
        // extreme but valid temperatures stay finite: argmax-like and uniform
        let rows = block(&[[1.0, 2.0, 3.0]], &[same([-3e38, 0.0, 3e38])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert_eq!(sample_walk(&lat, 1, 1e-30, &mut Rng::new(1))[0].q_probs, vec![1.0]);
        let flat = &sample_walk(&lat, 1, 3e38, &mut Rng::new(1))[0];
        assert!(flat.q_probs.iter().all(|q| q.is_finite()) && flat.q_probs.len() >= 2);
    }

    #[test]
    fn sampled_limits_p_min_on_the_row_and_n_min_only_without_sampling() {
        // confident first row, flat second (confidence ~0.356)
        let rows = block(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &[same([0.0, 10.0, 0.0]), same([1.0, 1.1, 1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        for seed in 0..50 {
            let walk = |l| sampled_walk(&lat, l, 100, 1.0, &mut Rng::new(seed)).unwrap().len();
            assert_eq!(walk(WalkLimits { n_max: 8, n_min: 0, p_min: 0.3 }), 2);
            // stops before position 2 whatever would have been drawn there
            assert_eq!(walk(WalkLimits { n_max: 8, n_min: 0, p_min: 0.4 }), 1);
            assert_eq!(walk(WalkLimits { n_max: 1, n_min: 0, p_min: 0.0 }), 1);
            // n_min does not drop a sampled draft (that would bias it) ...
            assert_eq!(walk(WalkLimits { n_max: 8, n_min: 2, p_min: 0.4 }), 1);
        }
        // ... but does at zero temperature, as greedy
        let l = WalkLimits { n_max: 8, n_min: 2, p_min: 0.4 };
        assert!(sampled_walk(&lat, l, 100, 0.0, &mut Rng::new(0)).unwrap().is_empty());
    }

    #[test]
    fn temperatures_are_checked_and_the_draft_one_defaults_to_the_requests() {
        assert_eq!(draft_temperature(0.8, None), Ok(0.8));
        assert_eq!(draft_temperature(0.8, Some(0.5)), Ok(0.5));
        assert_eq!(draft_temperature(0.8, Some(0.0)), Ok(0.0));
        for (r, d) in [(-0.1, None), (f32::NAN, None), (0.8, Some(-1.0)), (0.8, Some(f32::INFINITY))] {
            let e = draft_temperature(r, d).unwrap_err();
            assert_eq!(e.status, crate::error::Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
        }
        let rows = block(&[[1.0, 2.0, 3.0]], &[same([0.0, 1.0, 0.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert!(sampled_walk(&lat, limits(8), 100, -0.5, &mut Rng::new(0)).unwrap_err().message.contains("-0.5"));
    }
}
