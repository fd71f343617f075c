//! Lossless speculative sampling: verify a sampled draft against the target's
//! sampling distributions. Pure and seeded; no model needed.
//!
//! For each drafted position i the caller gives the drafted token t_i, the
//! draft distribution q_i it was drawn from (given everything before it), and
//! the target's final sampling distribution p_i (after the host's whole sampler
//! chain); plus p_n for the position after the last drafted token. Then:
//! - accept t_i with probability min(1, p_i(t_i) / q_i(t_i));
//! - on the first rejection emit a replacement drawn from
//!   r_i = max(0, p_i - q_i) / sum(max(0, p_i - q_i)) and stop;
//! - if every drafted token is accepted, emit a bonus token drawn from p_n.
//!
//! Every emitted token is then distributed exactly as p at its position
//! (P(emit x) = q(x) min(1, p(x)/q(x)) + (1 - sum_t min(p(t), q(t))) r(x) = p(x)),
//! so the output is the target's, whatever q is. A good q only raises the
//! expected acceptance per position, sum_t min(p(t), q(t)).
//!
//! Two conditions are the caller's, because this module cannot see them:
//! - the verifier's random numbers must be independent of the draft's (use
//!   [`Rng::with_stream`] with [`STREAM_VERIFY`] and [`STREAM_DRAFT`], never two
//!   generators with the same seed), and a sequence's generator is carried
//!   across steps, not re-seeded each step;
//! - whether position i is drafted at all may depend on anything up to
//!   t_{i-1}, never on t_i or later: cutting a draft before a token because of
//!   that token (its q, the walk it leads to) biases the output.
//!
//! Distributions ([`Dist`]) are dense (one probability per vocabulary id) or
//! sparse (ids + probabilities, as a host's truncated candidate list). Inputs
//! are checked: every probability finite and >= 0, ids in the vocabulary, and
//! the sum within [`SUM_TOLERANCE`] of 1 (then renormalized to exactly 1 in
//! f64). Sparse duplicate ids are summed; ids absent have probability 0.

use crate::error::{Error, Result};

/// How far from 1 a distribution's sum may be (absolute, which for a target of
/// 1 is also relative). Within it the distribution is renormalized; beyond it
/// the input is refused: it is not a distribution, or it was truncated without
/// renormalizing.
pub const SUM_TOLERANCE: f64 = 1e-3;

/// Residual mass max(0, p - q) at or below this is rounding: p = q (p <= q
/// pointwise and both sum to 1), so a replacement is drawn from p itself.
pub const RESIDUAL_EPSILON: f64 = 1e-12;

/// Stream of the draft walk's random numbers, for [`Rng::with_stream`].
pub const STREAM_DRAFT: u64 = 1;
/// Stream of the verifier's random numbers, for [`Rng::with_stream`].
pub const STREAM_VERIFY: u64 = 2;

/// xoshiro256** (Blackman & Vigna), seeded through SplitMix64: small, fast,
/// 2^256 - 1 period, and the same sequence on every platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

/// One SplitMix64 step: advances `state`, returns a well-mixed output.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator for `seed`. SplitMix64 fills the state, so nearby seeds give
    /// unrelated sequences and the state is never all zero.
    pub fn new(seed: u64) -> Rng {
        let mut sm = seed;
        Rng { s: [splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm)] }
    }

    /// Generator number `stream` of one request seed: draft and verifier get
    /// different streams of the same seed so their numbers are independent.
    pub fn with_stream(seed: u64, stream: u64) -> Rng {
        let mut sm = stream ^ 0x5851_f42d_4c95_7f2d;
        Rng::new(seed ^ splitmix64(&mut sm))
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1), a multiple of 2^-53.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A probability distribution over token ids, borrowed from the caller.
#[derive(Clone, Copy, Debug)]
pub enum Dist<'a> {
    /// `probs[id]` for every id of the vocabulary (length = n_vocab).
    Dense(&'a [f32]),
    /// Parallel ids and probabilities; absent ids have probability 0,
    /// duplicate ids are summed.
    Sparse { ids: &'a [i32], probs: &'a [f32] },
}

/// A checked distribution, normalized to sum 1 (in f64).
#[derive(Clone, Debug)]
pub(crate) enum Checked<'a> {
    /// p(id) = probs[id] * scale; not copied, a vocabulary can be large.
    Dense { probs: &'a [f32], scale: f64 },
    /// Distinct ids, sorted, with their probabilities (zeros dropped).
    Sparse(Vec<(i32, f64)>),
}

fn check_prob(x: f32, what: &str, at: usize) -> Result<f64> {
    if x.is_finite() && x >= 0.0 {
        Ok(x as f64)
    } else {
        Err(Error::invalid(format!("{what}: probability {x} at index {at} (must be finite and >= 0)")))
    }
}

fn normalizer(sum: f64, what: &str) -> Result<f64> {
    if (sum - 1.0).abs() <= SUM_TOLERANCE {
        Ok(1.0 / sum)
    } else {
        Err(Error::invalid(format!("{what}: probabilities sum to {sum} (must be 1 within {SUM_TOLERANCE})")))
    }
}

impl<'a> Checked<'a> {
    pub(crate) fn new(d: Dist<'a>, n_vocab: usize, what: &str) -> Result<Checked<'a>> {
        match d {
            Dist::Dense(probs) => {
                if probs.len() != n_vocab || n_vocab == 0 {
                    return Err(Error::invalid(format!(
                        "{what}: dense distribution has {} entries (must be n_vocab = {n_vocab})",
                        probs.len()
                    )));
                }
                let mut sum = 0.0;
                for (i, &x) in probs.iter().enumerate() {
                    sum += check_prob(x, what, i)?;
                }
                Ok(Checked::Dense { probs, scale: normalizer(sum, what)? })
            }
            Dist::Sparse { ids, probs } => {
                if ids.len() != probs.len() || ids.is_empty() {
                    return Err(Error::invalid(format!(
                        "{what}: sparse distribution has {} ids and {} probabilities (must be equal, > 0)",
                        ids.len(),
                        probs.len()
                    )));
                }
                let mut entries = Vec::with_capacity(ids.len());
                let mut sum = 0.0;
                for (i, (&id, &x)) in ids.iter().zip(probs).enumerate() {
                    if !(id >= 0 && (id as usize) < n_vocab) {
                        return Err(Error::invalid(format!("{what}: token id {id} at index {i} outside 0..{n_vocab}")));
                    }
                    let x = check_prob(x, what, i)?;
                    sum += x;
                    entries.push((id, x));
                }
                let scale = normalizer(sum, what)?;
                // Sort by id (stable, so equal ids sum in input order) and merge.
                entries.sort_by_key(|e| e.0);
                let mut merged: Vec<(i32, f64)> = Vec::with_capacity(entries.len());
                for (id, x) in entries {
                    match merged.last_mut() {
                        Some(last) if last.0 == id => last.1 += x,
                        _ => merged.push((id, x)),
                    }
                }
                merged.retain(|e| e.1 > 0.0);
                merged.iter_mut().for_each(|e| e.1 *= scale);
                Ok(Checked::Sparse(merged))
            }
        }
    }

    /// Probability of `token` (0 outside the support).
    pub(crate) fn prob(&self, token: i32) -> f64 {
        match self {
            Checked::Dense { probs, scale } => {
                usize::try_from(token).ok().and_then(|t| probs.get(t)).map_or(0.0, |&x| x as f64 * scale)
            }
            Checked::Sparse(e) => e.binary_search_by_key(&token, |e| e.0).map_or(0.0, |i| e[i].1),
        }
    }

    /// (id, probability) for every id that may have mass, in id order.
    pub(crate) fn entries(&self) -> Box<dyn Iterator<Item = (i32, f64)> + '_> {
        match self {
            Checked::Dense { probs, scale } => {
                Box::new(probs.iter().enumerate().map(move |(i, &x)| (i as i32, x as f64 * scale)))
            }
            Checked::Sparse(e) => Box::new(e.iter().copied()),
        }
    }
}

/// Inverse-CDF draw over `weights` (item, weight >= 0) whose sum is `total >
/// 0`; one uniform. Never returns an item of zero weight: if rounding runs
/// past the end, the last item with positive weight is taken.
pub(crate) fn draw<T: Copy>(weights: impl Iterator<Item = (T, f64)>, total: f64, rng: &mut Rng) -> T {
    let target = rng.next_f64() * total;
    let mut acc = 0.0;
    let mut last = None;
    for (id, w) in weights {
        if w > 0.0 {
            acc += w;
            last = Some(id);
            if target < acc {
                return id;
            }
        }
    }
    last.expect("a positive total has a positive weight")
}

/// Probability of accepting a drafted token: min(1, p(t) / q(t)), for q(t) > 0.
pub fn acceptance_probability(p_t: f64, q_t: f64) -> f64 {
    if p_t >= q_t { 1.0 } else { p_t / q_t }
}

/// Unnormalized residual weight of a token: max(0, p(t) - q(t)).
pub fn residual_weight(p_t: f64, q_t: f64) -> f64 {
    (p_t - q_t).max(0.0)
}

/// The replacement distribution after a rejection, as (id, weight) with its
/// total: r = max(0, p - q), or p itself when the residual is rounding. Only
/// p's support can carry residual mass, so only p's entries are visited.
fn residual<'b>(p: &'b Checked, q: &'b Checked) -> (Box<dyn Iterator<Item = (i32, f64)> + 'b>, f64) {
    let total: f64 = p.entries().map(|(id, p_t)| residual_weight(p_t, q.prob(id))).sum();
    if total > RESIDUAL_EPSILON {
        (Box::new(p.entries().map(move |(id, p_t)| (id, residual_weight(p_t, q.prob(id))))), total)
    } else {
        (p.entries(), 1.0)
    }
}

/// Outcome of verifying one drafted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Accepted,
    /// Rejected; the replacement token to emit instead (and stop).
    Rejected(i32),
}

fn check_drafted(token: i32, q: &Checked, at: usize) -> Result<f64> {
    let q_t = q.prob(token);
    if q_t > 0.0 {
        Ok(q_t)
    } else {
        Err(Error::invalid(format!("draft position {at}: drafted token {token} has q = 0 (not drawn from q)")))
    }
}

fn verify_checked(token: i32, q: &Checked, p: &Checked, at: usize, rng: &mut Rng) -> Result<Step> {
    let q_t = check_drafted(token, q, at)?;
    if rng.next_f64() < acceptance_probability(p.prob(token), q_t) {
        return Ok(Step::Accepted);
    }
    let (weights, total) = residual(p, q);
    Ok(Step::Rejected(draw(weights, total, rng)))
}

/// Verifies one drafted `token` drawn from `q` against the target's `p` at the
/// same position. One uniform for the accept test, one more on rejection. For
/// hosts that compute p lazily, position by position.
pub fn verify_token(token: i32, q: Dist, p: Dist, n_vocab: usize, rng: &mut Rng) -> Result<Step> {
    let q = Checked::new(q, n_vocab, "q")?;
    let p = Checked::new(p, n_vocab, "p")?;
    verify_checked(token, &q, &p, 0, rng)
}

/// Draws one token from `p` (the bonus token, or plain sampling). One uniform.
pub fn sample(p: Dist, n_vocab: usize, rng: &mut Rng) -> Result<i32> {
    let p = Checked::new(p, n_vocab, "p")?;
    Ok(draw(p.entries(), 1.0, rng))
}

/// Result of verifying a whole draft.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Drafted tokens accepted (a prefix of the draft).
    pub n_accepted: usize,
    /// Tokens to emit: the accepted ones, then the replacement or the bonus
    /// token (always `n_accepted + 1` of them).
    pub tokens: Vec<i32>,
}

/// Verifies a draft: `draft[i]` was drawn from `q[i]`; `p[i]` is the target's
/// distribution at draft position i and `p[draft.len()]` the one after the
/// last drafted token (so `p.len() == draft.len() + 1`). An empty draft just
/// samples `p[0]`. Every input is checked before any random number is drawn,
/// so a bad input fails the same way whatever the draw.
pub fn verify(draft: &[i32], q: &[Dist], p: &[Dist], n_vocab: usize, rng: &mut Rng) -> Result<Verdict> {
    if q.len() != draft.len() || p.len() != draft.len() + 1 {
        return Err(Error::invalid(format!(
            "{} drafted tokens need as many q and one more p; got {} q and {} p",
            draft.len(),
            q.len(),
            p.len()
        )));
    }
    let qs =
        q.iter().enumerate().map(|(i, &d)| Checked::new(d, n_vocab, &format!("q[{i}]"))).collect::<Result<Vec<_>>>()?;
    let ps =
        p.iter().enumerate().map(|(i, &d)| Checked::new(d, n_vocab, &format!("p[{i}]"))).collect::<Result<Vec<_>>>()?;
    for (i, (&t, q)) in draft.iter().zip(&qs).enumerate() {
        check_drafted(t, q, i)?;
    }
    let mut tokens = Vec::with_capacity(draft.len() + 1);
    for (i, &t) in draft.iter().enumerate() {
        match verify_checked(t, &qs[i], &ps[i], i, rng)? {
            Step::Accepted => tokens.push(t),
            Step::Rejected(x) => {
                tokens.push(x);
                return Ok(Verdict { n_accepted: i, tokens });
            }
        }
    }
    tokens.push(draw(ps[draft.len()].entries(), 1.0, rng));
    Ok(Verdict { n_accepted: draft.len(), tokens })
}

/// Expected acceptance of a token drawn from q against p: sum_t min(p(t), q(t)).
pub fn expected_acceptance(p: Dist, q: Dist, n_vocab: usize) -> Result<f64> {
    let p = Checked::new(p, n_vocab, "p")?;
    let q = Checked::new(q, n_vocab, "q")?;
    Ok(q.entries().map(|(id, q_t)| q_t.min(p.prob(id))).sum())
}

/// The exact distribution (dense, n_vocab long) of the token that
/// [`verify_token`] emits at one position when the drafted token is drawn from
/// q: the accept/reject tree enumerated with the verifier's own pieces
/// (acceptance probability, residual). Equals p up to rounding; the tests hold
/// it to that, and it lets callers check a (p, q) pair.
pub fn emitted_distribution(p: Dist, q: Dist, n_vocab: usize) -> Result<Vec<f64>> {
    let p = Checked::new(p, n_vocab, "p")?;
    let q = Checked::new(q, n_vocab, "q")?;
    let mut out = vec![0.0; n_vocab];
    let mut rejected = 0.0;
    for (t, q_t) in q.entries().filter(|e| e.1 > 0.0) {
        let a = acceptance_probability(p.prob(t), q_t);
        out[t as usize] += q_t * a;
        rejected += q_t * (1.0 - a);
    }
    let (weights, total) = residual(&p, &q);
    for (x, w) in weights {
        out[x as usize] += rejected * w / total;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- helpers -------------------------------------------------------

    fn dense(p: &[f64]) -> Vec<f32> {
        p.iter().map(|&x| x as f32).collect()
    }

    /// The distribution the verifier is actually given for `p`: rounded to
    /// f32 and renormalized in f64. Exact checks compare against this, not
    /// against the decimal literals, which f32 cannot hold.
    fn given(p: &[f64]) -> Vec<f64> {
        let f = dense(p);
        let sum: f64 = f.iter().map(|&x| x as f64).sum();
        f.iter().map(|&x| x as f64 / sum).collect()
    }

    /// Hoeffding with a union bound over the 2^m events of m outcomes: the
    /// total variation between n samples and their distribution exceeds this
    /// with probability at most `fail` (1e-9 here: a seeded test that passes
    /// is not luck, and an honest one fails with a different seed only that
    /// rarely).
    fn tv_threshold(n: usize, m: usize) -> f64 {
        let fail: f64 = 1e-9;
        ((m as f64 + 1.0) * 2f64.ln() - fail.ln()).max(0.0).sqrt() / (2.0 * n as f64).sqrt()
    }

    fn tv(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / 2.0
    }

    fn freqs(counts: &[usize]) -> Vec<f64> {
        let n: usize = counts.iter().sum();
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    /// Small (p, q) pairs over vocabularies of 3-5 covering the cases that
    /// matter: q on a subset of p's support, disjoint supports, p = q, p with
    /// zeros where q has mass, q wider than p, point masses.
    fn pairs() -> Vec<(Vec<f64>, Vec<f64>)> {
        vec![
            (vec![0.5, 0.3, 0.2], vec![0.2, 0.3, 0.5]),
            (vec![0.5, 0.3, 0.2], vec![0.7, 0.3, 0.0]),
            (vec![0.0, 0.0, 0.6, 0.4], vec![0.5, 0.5, 0.0, 0.0]),
            (vec![0.1, 0.2, 0.3, 0.4], vec![0.1, 0.2, 0.3, 0.4]),
            (vec![0.6, 0.0, 0.4, 0.0, 0.0], vec![0.2, 0.2, 0.2, 0.2, 0.2]),
            (vec![0.2, 0.2, 0.2, 0.2, 0.2], vec![0.0, 0.9, 0.0, 0.1, 0.0]),
            (vec![1.0, 0.0, 0.0], vec![0.0, 0.0, 1.0]),
            (vec![0.0, 1.0, 0.0], vec![0.0, 1.0, 0.0]),
            (vec![0.05, 0.05, 0.9], vec![0.9, 0.05, 0.05]),
        ]
    }

    // ---- exact ---------------------------------------------------------

    #[test]
    fn one_position_emits_exactly_p() {
        for (p, q) in pairs() {
            let (pf, qf) = (dense(&p), dense(&q));
            let (p, q) = (given(&p), given(&q));
            let got = emitted_distribution(Dist::Dense(&pf), Dist::Dense(&qf), p.len()).unwrap();
            for (x, (&g, &want)) in got.iter().zip(&p).enumerate() {
                assert!((g - want).abs() < 1e-9, "p={p:?} q={q:?}: P(emit {x}) = {g}, want {want}");
            }
            // The closed form agrees: q(x) min(1, p/q) + (1 - sum min(p, q)) r(x).
            let beta = expected_acceptance(Dist::Dense(&pf), Dist::Dense(&qf), p.len()).unwrap();
            let rsum: f64 = p.iter().zip(&q).map(|(a, b)| (a - b).max(0.0)).sum();
            for x in 0..p.len() {
                let acc = if q[x] > 0.0 { q[x] * (p[x] / q[x]).min(1.0) } else { 0.0 };
                let r = if rsum > 0.0 { (p[x] - q[x]).max(0.0) / rsum } else { p[x] };
                assert!((acc + (1.0 - beta) * r - p[x]).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn expected_acceptance_is_the_overlap_of_p_and_q() {
        for (p, q) in pairs() {
            let (pf, qf) = (dense(&p), dense(&q));
            let (p, q) = (given(&p), given(&q));
            let want: f64 = p.iter().zip(&q).map(|(a, b)| a.min(*b)).sum();
            let got = expected_acceptance(Dist::Dense(&pf), Dist::Dense(&qf), p.len()).unwrap();
            assert!((got - want).abs() < 1e-9);
            // and it is the accept branch of the tree the verifier walks
            let tree: f64 =
                (0..q.len()).filter(|&t| q[t] > 0.0).map(|t| q[t] * acceptance_probability(p[t], q[t])).sum();
            assert!((tree - want).abs() < 1e-12);
        }
    }

    /// A toy target and drafter over `V` tokens whose distributions depend on
    /// the prefix, so a draft of several positions is conditioned honestly.
    const V: usize = 3;

    fn target(prefix: &[usize]) -> Vec<f64> {
        match prefix {
            [] => vec![0.5, 0.3, 0.2],
            [.., 0] => vec![0.0, 0.7, 0.3],
            [.., 1] => vec![0.6, 0.0, 0.4],
            _ => vec![0.2, 0.2, 0.6],
        }
    }

    fn drafter(prefix: &[usize]) -> Vec<f64> {
        match prefix {
            [] => vec![0.2, 0.8, 0.0],      // on a subset of p's support
            [.., 0] => vec![0.0, 0.0, 1.0], // overlaps p at one token
            [.., 1] => vec![0.0, 1.0, 0.0], // disjoint from p
            _ => vec![0.2, 0.2, 0.6],       // = p
        }
    }

    /// Exact probability of every emitted sequence of length n+1 for a draft
    /// of n positions, with shorter emissions completed by plain target
    /// sampling (as the next steps would), by walking the whole tree: draft
    /// draws, accept/reject, replacement, bonus, completion.
    fn speculative_joint(n: usize) -> Vec<f64> {
        let mut out = vec![0.0; V.pow(n as u32 + 1)];
        fn index(seq: &[usize]) -> usize {
            seq.iter().fold(0, |i, &t| i * V + t)
        }
        fn complete(seq: &mut Vec<usize>, len: usize, mass: f64, out: &mut [f64]) {
            if seq.len() == len {
                out[index(seq)] += mass;
                return;
            }
            for (x, px) in given(&target(seq)).into_iter().enumerate() {
                if px > 0.0 {
                    seq.push(x);
                    complete(seq, len, mass * px, out);
                    seq.pop();
                }
            }
        }
        fn walk(seq: &mut Vec<usize>, left: usize, len: usize, mass: f64, out: &mut [f64]) {
            let p = target(seq);
            if left == 0 {
                return complete(seq, len, mass, out); // the bonus draw is plain p
            }
            let q = drafter(seq);
            let (pf, qf) = (dense(&p), dense(&q));
            let (pc, qc) =
                (Checked::new(Dist::Dense(&pf), V, "p").unwrap(), Checked::new(Dist::Dense(&qf), V, "q").unwrap());
            for t in 0..V {
                let q_t = qc.prob(t as i32);
                if q_t == 0.0 {
                    continue;
                }
                let a = acceptance_probability(pc.prob(t as i32), q_t);
                seq.push(t);
                walk(seq, left - 1, len, mass * q_t * a, out);
                seq.pop();
                let (weights, total) = residual(&pc, &qc);
                for (x, w) in weights {
                    seq.push(x as usize);
                    complete(seq, len, mass * q_t * (1.0 - a) * w / total, out);
                    seq.pop();
                }
            }
        }
        walk(&mut Vec::new(), n, n + 1, 1.0, &mut out);
        out
    }

    fn target_joint(len: usize) -> Vec<f64> {
        (0..V.pow(len as u32))
            .map(|mut i| {
                let mut seq = vec![0; len];
                for s in seq.iter_mut().rev() {
                    *s = i % V;
                    i /= V;
                }
                (0..len).map(|k| given(&target(&seq[..k]))[seq[k]]).product()
            })
            .collect()
    }

    #[test]
    fn drafts_of_one_to_three_positions_emit_exactly_the_target_sequence_distribution() {
        for n in 1..=3 {
            let spec = speculative_joint(n);
            let want = target_joint(n + 1);
            assert!((spec.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            for (i, (s, w)) in spec.iter().zip(&want).enumerate() {
                assert!((s - w).abs() < 1e-9, "n={n} outcome {i}: {s} vs {w}");
            }
        }
    }

    // ---- Monte Carlo on the sampling functions themselves ---------------

    const N_SAMPLES: usize = 200_000;

    /// Draft n tokens from the toy drafter, verify with `verify`, complete by
    /// target sampling; returns the empirical joint of the n+1 tokens. With
    /// `lossy`, every drafted token is accepted instead (the bug to catch).
    fn speculative_samples(n: usize, seed: u64, lossy: bool) -> Vec<f64> {
        let mut draft_rng = Rng::with_stream(seed, STREAM_DRAFT);
        let mut rng = Rng::with_stream(seed, STREAM_VERIFY);
        let mut counts = vec![0; V.pow(n as u32 + 1)];
        for _ in 0..N_SAMPLES {
            let mut seq: Vec<usize> = Vec::new();
            let (mut qs, mut ps, mut draft) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..n {
                let q = dense(&drafter(&seq));
                let t = sample(Dist::Dense(&q), V, &mut draft_rng).unwrap();
                ps.push(dense(&target(&seq)));
                qs.push(q);
                draft.push(t);
                seq.push(t as usize);
            }
            ps.push(dense(&target(&seq)));
            let qd: Vec<Dist> = qs.iter().map(|q| Dist::Dense(q)).collect();
            let pd: Vec<Dist> = ps.iter().map(|p| Dist::Dense(p)).collect();
            let v = verify(&draft, &qd, &pd, V, &mut rng).unwrap();
            assert_eq!(v.tokens.len(), v.n_accepted + 1);
            assert_eq!(v.tokens[..v.n_accepted], draft[..v.n_accepted]);
            let mut out: Vec<usize> = if lossy {
                let mut d: Vec<usize> = draft.iter().map(|&t| t as usize).collect();
                d.push(sample(pd[n], V, &mut rng).unwrap() as usize);
                d
            } else {
                v.tokens.iter().map(|&t| t as usize).collect()
            };
            while out.len() < n + 1 {
                let p = dense(&target(&out));
                out.push(sample(Dist::Dense(&p), V, &mut rng).unwrap() as usize);
            }
            counts[out.iter().fold(0, |i, &t| i * V + t)] += 1;
        }
        freqs(&counts)
    }

    #[test]
    fn sampled_verification_matches_the_target_and_an_accept_always_verifier_does_not() {
        let n = 2;
        let want = target_joint(n + 1);
        let threshold = tv_threshold(N_SAMPLES, want.len()); // 27 outcomes: ~0.0101
        let honest = tv(&speculative_samples(n, 7, false), &want);
        assert!(honest < threshold, "honest verifier: TV {honest} >= {threshold}");
        let lossy = tv(&speculative_samples(n, 7, true), &want);
        assert!(lossy > threshold, "accept-always verifier: TV {lossy} <= {threshold}");
        assert!(lossy > 10.0 * threshold, "the check must fail by a wide margin, TV {lossy}");
    }

    #[test]
    fn one_position_monte_carlo_matches_p_and_measures_the_overlap() {
        let p = [0.6, 0.0, 0.25, 0.15, 0.0];
        let q = [0.1, 0.5, 0.2, 0.0, 0.2];
        let (pf, qf) = (dense(&p), dense(&q));
        let mut draft_rng = Rng::with_stream(11, STREAM_DRAFT);
        let mut rng = Rng::with_stream(11, STREAM_VERIFY);
        let (mut counts, mut accepted) = (vec![0; 5], 0);
        for _ in 0..N_SAMPLES {
            let t = sample(Dist::Dense(&qf), 5, &mut draft_rng).unwrap();
            let x = match verify_token(t, Dist::Dense(&qf), Dist::Dense(&pf), 5, &mut rng).unwrap() {
                Step::Accepted => {
                    accepted += 1;
                    t
                }
                Step::Rejected(x) => x,
            };
            counts[x as usize] += 1;
        }
        let emitted = freqs(&counts);
        assert!(tv(&emitted, &given(&p)) < tv_threshold(N_SAMPLES, 5)); // ~0.0079
        let beta = expected_acceptance(Dist::Dense(&pf), Dist::Dense(&qf), 5).unwrap();
        assert!((beta - 0.3).abs() < 1e-6); // min(p, q) = 0.1 + 0.2
        // Hoeffding, one event, failure 1e-9: |rate - beta| < sqrt(ln(2e9) / 2n) ~ 0.0073
        let rate = accepted as f64 / N_SAMPLES as f64;
        assert!((rate - beta).abs() < (2e9f64.ln() / (2.0 * N_SAMPLES as f64)).sqrt(), "rate {rate}");
    }

    // ---- API behaviour ---------------------------------------------------

    #[test]
    fn an_empty_draft_samples_p() {
        let p = [0.0f32, 0.0, 1.0];
        let v = verify(&[], &[], &[Dist::Dense(&p)], 3, &mut Rng::new(1)).unwrap();
        assert_eq!(v, Verdict { n_accepted: 0, tokens: vec![2] });
    }

    #[test]
    fn a_token_p_rules_out_is_always_replaced_and_a_sure_one_always_kept() {
        let q = [0.5f32, 0.5, 0.0];
        let p = [0.0f32, 0.4, 0.6];
        let mut rng = Rng::new(3);
        for _ in 0..1000 {
            let s = verify_token(0, Dist::Dense(&q), Dist::Dense(&p), 3, &mut rng).unwrap();
            // residual max(0, p - q) = (0, 0, 0.1): the replacement is 2
            assert_eq!(s, Step::Rejected(2));
            let s = verify_token(
                2,
                Dist::Sparse { ids: &[2], probs: &[1.0] },
                Dist::Sparse { ids: &[2], probs: &[1.0] },
                3,
                &mut rng,
            );
            assert_eq!(s.unwrap(), Step::Accepted);
        }
    }

    #[test]
    fn equal_p_and_q_accept_everything_and_a_residual_of_zero_falls_back_to_p() {
        let p = [0.25f32, 0.25, 0.5];
        let mut rng = Rng::new(5);
        let draft = [2, 0, 1];
        let v = verify(&draft, &[Dist::Dense(&p); 3], &[Dist::Dense(&p); 4], 3, &mut rng).unwrap();
        assert_eq!(v.n_accepted, 3);
        assert_eq!(v.tokens[..3], draft);
        // p = q: residual mass 0, the tree still sums to p
        let e = emitted_distribution(Dist::Dense(&p), Dist::Dense(&p), 3).unwrap();
        assert!(e.iter().zip(&p).all(|(a, &b)| (a - b as f64).abs() < 1e-12));
    }

    #[test]
    fn sparse_and_dense_inputs_give_the_same_result_and_duplicates_are_summed() {
        let p_dense = [0.0f32, 0.5, 0.0, 0.3, 0.2];
        let p_ids = [3, 1, 4, 1];
        let p_probs = [0.3f32, 0.25, 0.2, 0.25];
        let q_ids = [4, 0];
        let q_probs = [0.5f32, 0.5];
        for seed in 0..200 {
            let a = verify(
                &[4],
                &[Dist::Sparse { ids: &q_ids, probs: &q_probs }],
                &[Dist::Dense(&p_dense); 2],
                5,
                &mut Rng::new(seed),
            );
            let sparse_p = Dist::Sparse { ids: &p_ids, probs: &p_probs };
            let b =
                verify(&[4], &[Dist::Sparse { ids: &q_ids, probs: &q_probs }], &[sparse_p; 2], 5, &mut Rng::new(seed));
            assert_eq!(a.unwrap(), b.unwrap());
        }
        let e = emitted_distribution(Dist::Sparse { ids: &p_ids, probs: &p_probs }, Dist::Dense(&[0.2; 5]), 5).unwrap();
        let want = [0.0, 0.5, 0.0, 0.3, 0.2];
        assert!(e.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-7));
    }

    #[test]
    fn sums_within_the_tolerance_are_renormalized() {
        // sums 1.0008 and 0.9995: accepted and treated as exact distributions
        let p = [0.5004f32, 0.5004];
        let q = Dist::Sparse { ids: &[0, 1], probs: &[0.9995, 0.0] };
        let e = emitted_distribution(Dist::Dense(&p), q, 2).unwrap();
        assert!((e[0] - 0.5).abs() < 1e-7 && (e[1] - 0.5).abs() < 1e-7);
        assert!((expected_acceptance(Dist::Dense(&p), q, 2).unwrap() - 0.5).abs() < 1e-7);
    }

    #[test]
    fn seeds_reproduce_and_streams_differ() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        let mut c = Rng::new(43);
        assert_ne!(a.next_u64(), c.next_u64());
        let mut d = Rng::with_stream(42, STREAM_DRAFT);
        let mut v = Rng::with_stream(42, STREAM_VERIFY);
        assert_ne!(d, v);
        assert_ne!(d.next_u64(), v.next_u64());
        // xoshiro256** reference: state {1, 2, 3, 4} gives 11520, 0, 1509978240, 1215971899390074240
        let mut r = Rng { s: [1, 2, 3, 4] };
        assert_eq!(
            [r.next_u64(), r.next_u64(), r.next_u64(), r.next_u64()],
            [11520, 0, 1509978240, 1215971899390074240]
        );
        assert!((0..1000).map(|_| a.next_f64()).all(|u| (0.0..1.0).contains(&u)));
    }

    fn err(r: Result<impl std::fmt::Debug>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.status, crate::error::Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
        e.message
    }

    #[test]
    fn bad_inputs_are_refused_with_a_message() {
        let ok = [0.5f32, 0.5, 0.0];
        let d = Dist::Dense(&ok);
        let mut rng = Rng::new(0);
        let cases: Vec<(Result<Verdict>, &str)> = vec![
            (verify(&[], &[], &[Dist::Dense(&[])], 3, &mut rng), "entries"),
            (verify(&[], &[], &[Dist::Dense(&[0.5, 0.5])], 3, &mut rng), "entries"),
            (verify(&[0], &[d], &[d], 3, &mut rng), "one more p"),
            (verify(&[0], &[], &[d, d], 3, &mut rng), "one more p"),
            (verify(&[], &[], &[Dist::Dense(&[0.5, f32::NAN, 0.5])], 3, &mut rng), "finite"),
            (verify(&[], &[], &[Dist::Dense(&[1.5, -0.5, 0.0])], 3, &mut rng), "finite"),
            (verify(&[], &[], &[Dist::Dense(&[0.4, 0.4, 0.0])], 3, &mut rng), "sum"),
            (verify(&[], &[], &[Dist::Dense(&[0.0, 0.0, 0.0])], 3, &mut rng), "sum"),
            (verify(&[], &[], &[Dist::Sparse { ids: &[], probs: &[] }], 3, &mut rng), "sparse"),
            (verify(&[], &[], &[Dist::Sparse { ids: &[0, 1], probs: &[1.0] }], 3, &mut rng), "sparse"),
            (verify(&[], &[], &[Dist::Sparse { ids: &[3], probs: &[1.0] }], 3, &mut rng), "outside"),
            (verify(&[], &[], &[Dist::Sparse { ids: &[-1], probs: &[1.0] }], 3, &mut rng), "outside"),
            (verify(&[2], &[d], &[d, d], 3, &mut rng), "q = 0"),
            (verify(&[0], &[Dist::Dense(&[0.4, 0.4, 0.0])], &[d, d], 3, &mut rng), "sum"),
            (verify(&[], &[], &[Dist::Dense(&[1.0])], 0, &mut rng), "entries"),
        ];
        for (r, needle) in cases {
            let m = err(r);
            assert!(m.contains(needle), "message {m:?} lacks {needle:?}");
        }
        // a bad later p is refused even when the draw would stop earlier
        let bad = [0.2f32, 0.2, 0.2];
        assert!(
            verify(
                &[1],
                &[Dist::Dense(&[0.0, 1.0, 0.0])],
                &[Dist::Dense(&[1.0, 0.0, 0.0]), Dist::Dense(&bad)],
                3,
                &mut rng
            )
            .is_err()
        );
        assert!(err(sample(Dist::Dense(&bad), 3, &mut rng)).contains("sum"));
        assert!(
            err(verify_token(0, Dist::Dense(&[0.0, 1.0]), Dist::Dense(&[0.5, 0.5]), 2, &mut rng)).contains("q = 0")
        );
    }
}
