//! Sampled drafts (a request with temperature > 0): the two random generators
//! every sequence keeps, the draft distribution q of every drafted token kept
//! until accept(), and lossless verification of a sampled draft, whole or
//! position by position. The pure pieces are `selector::sampled_walk` and
//! `sampling`; this file holds what the engine keeps between calls.
//!
//! Losslessness rests on three things kept here: the draft and the verifier
//! draw from different streams of the request's seed; both generators live
//! with the sequence across steps (seeded once, not every step); the q handed
//! to the verifier is exactly the distribution the walk drew the token from.

use super::sequence::Outstanding;
use super::{Engine, Request};
use crate::draft_temperature::Tuning;
use crate::error::{Error, Result};
use crate::sampling::{self, Dist, Rng, STREAM_DRAFT, STREAM_VERIFY, Step};
use crate::selector::{Lattice, Pick, SampledPick, WalkLimits, draft_temperature, greedy_walk_scored, sampled_walk_q};
use crate::truncation::{DraftQ, Truncation};

/// How one request drafts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Mode {
    /// Temperature 0: the greedy chain, exactly as before sampling existed.
    Greedy,
    /// The sampled walk at `t_draft`, q cut by `truncation`, with the
    /// sequence's generators for `seed`; `tuning` when the engine chose `t_draft`.
    Sampled { t_draft: f32, seed: u32, truncation: Truncation, tuning: Option<Tuning> },
}

/// Whether a sampled request leaves its draft temperature to the engine
/// (<= 0, a zero-initialized field included; NaN is refused by `mode`).
pub(super) fn leaves_draft_temperature(r: &Request) -> bool {
    !(r.draft_temperature.is_nan() || r.draft_temperature > 0.0)
}

/// Checks a request's sampling fields and says how it drafts.
pub(super) fn mode(r: &Request) -> Result<Mode> {
    let t = r.temperature;
    if !(t.is_finite() && t >= 0.0) {
        return Err(Error::invalid(format!(
            "sequence {}: temperature {t} (must be finite and >= 0; 0 = greedy)",
            r.seq
        )));
    }
    if t == 0.0 {
        return Ok(Mode::Greedy);
    }
    // < 0 (and 0, a zero-initialized field) take the request's temperature;
    // NaN is not "unset": it is refused with the infinities.
    let d = r.draft_temperature;
    let draft = (d.is_nan() || d > 0.0).then_some(d);
    let t_draft =
        draft_temperature(t, draft).map_err(|e| Error::invalid(format!("sequence {}: {}", r.seq, e.message)))?;
    Ok(Mode::Sampled { t_draft, seed: r.seed, truncation: r.truncation, tuning: None })
}

impl Mode {
    /// How the engine chose the draft temperature, if it did.
    pub fn tuning(self) -> Option<Tuning> {
        match self {
            Mode::Greedy => None,
            Mode::Sampled { tuning, .. } => tuning,
        }
    }
}

/// A sequence's generators: the walk's and the verifier's, two streams of one
/// seed (and the sequence id, so that sequences with equal seeds differ).
#[derive(Clone, Debug)]
pub struct SeqRng {
    seed: u32,
    pub(super) draft: Rng,
    pub(super) verify: Rng,
}

impl SeqRng {
    fn new(seed: u32, seq: i32) -> SeqRng {
        let s = (u64::from(seq as u32) << 32) | u64::from(seed);
        SeqRng { seed, draft: Rng::with_stream(s, STREAM_DRAFT), verify: Rng::with_stream(s, STREAM_VERIFY) }
    }
}

/// The generators of sequence `seq` for `seed`: the ones it holds when they
/// were seeded with `seed`, else freshly seeded ones (the first sampled draft
/// since the sequence was created or emptied, or a request with another seed).
pub(super) fn seeded(slot: &mut Option<SeqRng>, seed: u32, seq: i32) -> &mut SeqRng {
    if slot.as_ref().is_none_or(|r| r.seed != seed) {
        *slot = Some(SeqRng::new(seed, seq));
    }
    slot.as_mut().expect("seeded above")
}

/// The sampled part of an outstanding draft: q of every drafted token, and how
/// far the step-by-step verification went.
#[derive(Clone, Debug, Default)]
pub struct SampledDraft {
    pub picks: Vec<SampledPick>,
    /// Next draft position verify_sampled_step expects.
    next: usize,
    /// Drafted tokens accepted, once verification ended (a rejection or the bonus).
    verdict: Option<usize>,
}

impl SampledDraft {
    /// accept() after (or without) step-by-step verification: the count must
    /// be the verifier's, and a verification in progress must finish first.
    pub(super) fn check_accept(&self, seq: i32, n_accepted: usize) -> Result<()> {
        match self.verdict {
            Some(v) if v != n_accepted => Err(Error::invalid(format!(
                "accept({seq}, {n_accepted}): llama_spec_dflash2_verify_sampled_step accepted {v} drafted tokens; \
                 pass {v}"
            ))),
            None if self.next > 0 => Err(Error::invalid_state(format!(
                "accept({seq}, {n_accepted}) while llama_spec_dflash2_verify_sampled_step is at position {}: \
                 go on until a rejection or the bonus token",
                self.next
            ))),
            _ => Ok(()),
        }
    }
}

/// One request's walk: greedy picks, or sampled ones with their q.
pub(super) enum Walked {
    Greedy(Vec<Pick>),
    Sampled(Vec<SampledPick>),
}

impl Walked {
    /// No tokens (the block was not decoded), in the request's mode: a sampled
    /// request's empty draft still verifies (its bonus token).
    pub fn empty(mode: Mode) -> Walked {
        match mode {
            Mode::Greedy => Walked::Greedy(Vec::new()),
            Mode::Sampled { .. } => Walked::Sampled(Vec::new()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Walked::Greedy(p) => p.len(),
            Walked::Sampled(p) => p.len(),
        }
    }

    /// The rows' confidences, known before each token was drawn (what the
    /// adaptive walk may cut on without biasing a sampled draft).
    pub fn confidences(&self) -> Vec<f32> {
        match self {
            Walked::Greedy(p) => p.iter().map(|p| p.confidence).collect(),
            Walked::Sampled(p) => p.iter().map(|p| p.confidence).collect(),
        }
    }

    pub fn truncate(&mut self, n: usize) {
        match self {
            Walked::Greedy(p) => p.truncate(n),
            Walked::Sampled(p) => p.truncate(n),
        }
    }

    pub fn tokens(&self) -> Vec<i32> {
        match self {
            Walked::Greedy(p) => p.iter().map(|p| p.token).collect(),
            Walked::Sampled(p) => p.iter().map(|p| p.token).collect(),
        }
    }

    /// The draft awaiting accept(), made after target position `after_target`
    /// in `mode`.
    pub fn into_outstanding(self, after_target: Option<i32>, mode: Mode) -> Outstanding {
        let (tokens, confidences) = (self.tokens(), self.confidences());
        let sampled = match self {
            Walked::Greedy(_) => None,
            Walked::Sampled(picks) => Some(SampledDraft { picks, next: 0, verdict: None }),
        };
        Outstanding {
            tokens,
            confidences,
            after_target,
            sampled,
            tree: None,
            sampled_tree: None,
            tuning: mode.tuning(),
        }
    }
}

/// Walks one block's lattice as `mode` says. A sampled walk draws from the
/// sequence's draft generator (`rng`), seeding it when needed.
pub(super) fn walk(
    lattice: &Lattice,
    limits: WalkLimits,
    n_vocab: usize,
    mode: Mode,
    seq: i32,
    rng: &mut Option<SeqRng>,
) -> Result<Walked> {
    match mode {
        Mode::Greedy => Ok(Walked::Greedy(greedy_walk_scored(lattice, limits, n_vocab))),
        Mode::Sampled { t_draft, seed, truncation, .. } => {
            let rng = &mut seeded(rng, seed, seq).draft;
            let q = DraftQ { t: t_draft, truncation };
            Ok(Walked::Sampled(sampled_walk_q(lattice, limits, n_vocab, q, rng)?))
        }
    }
}

impl Engine {
    /// Most candidates a drafted token's q has (the drafter's selector top-k).
    pub fn top_k(&self) -> usize {
        self.drafter.top_k
    }

    /// Tokens in the vocabulary (of the drafter, equal to the target's).
    pub fn n_vocab(&self) -> usize {
        self.drafter.n_vocab
    }

    /// The draft awaiting its accept call on `seq` (`awaiting` names it in
    /// the error), and the sequence's index.
    pub(super) fn outstanding_draft(&self, seq: i32, what: &str, awaiting: &str) -> Result<(usize, &Outstanding)> {
        let s = self.seq_index(seq)?;
        match self.seqs[s].outstanding.as_ref() {
            Some(o) => Ok((s, o)),
            None => Err(Error::invalid_state(format!("{what} on sequence {seq}, which has no {awaiting}"))),
        }
    }

    /// The sampled draft awaiting accept() on `seq`.
    fn sampled_draft(&self, seq: i32, what: &str) -> Result<(usize, &Outstanding, &SampledDraft)> {
        let (s, o) = self.outstanding_draft(seq, what, "draft awaiting accept()")?;
        let Some(sd) = o.sampled.as_ref() else {
            return Err(Error::invalid_state(format!(
                "{what} on sequence {seq}, whose draft is greedy (temperature 0): it has no q; verify it with \
                 llama_spec_dflash2_verify_greedy or by sample-and-match"
            )));
        };
        Ok((s, o, sd))
    }

    /// A copy of the verify generator of sequence index `s` (committed back
    /// only when the call succeeds).
    pub(super) fn verify_rng(&self, s: usize, seq: i32) -> Result<Rng> {
        self.seqs[s]
            .rng
            .as_ref()
            .map(|r| r.verify.clone())
            .ok_or_else(|| Error::invalid_state(format!("sequence {seq} lost its sampling state; draft again")))
    }

    /// Writes q of every token of the sampled draft awaiting accept() on `seq`:
    /// `top_k` entries per drafted token, in draft order, the candidates with
    /// positive probability first (candidate order), then padding (id -1,
    /// probability 0). Returns the number of entries, n_drafted * top_k.
    pub fn draft_q(&self, seq: i32, ids: &mut [i32], probs: &mut [f32]) -> Result<usize> {
        let (_, o, sd) = self.sampled_draft(seq, "draft_q")?;
        let k = self.drafter.top_k;
        let n = o.tokens.len() * k;
        if ids.len() < n || probs.len() < n {
            return Err(Error::buffer_too_small(format!(
                "q of the draft of sequence {seq} has {} x {k} = {n} entries, the buffers hold {}",
                o.tokens.len(),
                ids.len().min(probs.len())
            )));
        }
        for (i, pick) in sd.picks.iter().enumerate() {
            let (ids, probs) = (&mut ids[i * k..(i + 1) * k], &mut probs[i * k..(i + 1) * k]);
            ids.fill(-1);
            probs.fill(0.0);
            ids[..pick.q_ids.len()].copy_from_slice(&pick.q_ids);
            probs[..pick.q_probs.len()].copy_from_slice(&pick.q_probs);
        }
        Ok(n)
    }

    /// Verifies draft position `i` of the sampled draft on `seq` against the
    /// target's distribution `p` there, with the sequence's verify generator.
    /// At i < n_drafted: (token i, true) when accepted, else (the replacement
    /// drawn from max(0, p - q), false); at i == n_drafted: (the bonus drawn
    /// from p, false). Positions go in order from 0 until a `false`; the host
    /// then calls accept(seq, n) with the count of `true`s.
    pub fn verify_sampled_step(&mut self, seq: i32, i: i32, p: Dist) -> Result<(i32, bool)> {
        let (s, o, sd) = self.sampled_draft(seq, "verify_sampled_step")?;
        let n = o.tokens.len();
        if sd.verdict.is_some() {
            return Err(Error::invalid_state(format!(
                "verify_sampled_step({seq}, {i}): the verification of this draft ended at position {}; \
                 call llama_spec_dflash2_accept({seq}, {})",
                sd.next, sd.next
            )));
        }
        if i < 0 || i as usize > n {
            return Err(Error::invalid(format!(
                "verify_sampled_step({seq}, {i}): the draft has {n} tokens (positions 0..={n}, {n} = the bonus)"
            )));
        }
        if i as usize != sd.next {
            return Err(Error::invalid_state(format!(
                "verify_sampled_step({seq}, {i}): positions are verified in order; the next one is {}",
                sd.next
            )));
        }
        let i = i as usize;
        let mut rng = self.verify_rng(s, seq)?;
        let tuning = o.tuning;
        let (token, accepted) = if i < n {
            let pick = &sd.picks[i];
            match sampling::verify_token(pick.token, pick.q(), p, self.drafter.n_vocab, &mut rng)? {
                Step::Accepted => (pick.token, true),
                Step::Rejected(x) => (x, false),
            }
        } else {
            (sampling::sample(p, self.drafter.n_vocab, &mut rng)?, false)
        };
        // a tuned draft's verified position scores the other draft temperatures
        if let Some(pick) = sd.picks.get(i).filter(|_| tuning.is_some()).cloned() {
            self.observe_tuning(tuning, Some(pick.q()), p, 1);
        }
        let q = &mut self.seqs[s];
        q.rng.as_mut().expect("checked above").verify = rng;
        let sd = q.outstanding.as_mut().and_then(|o| o.sampled.as_mut()).expect("checked above");
        if accepted {
            sd.next = i + 1;
        } else {
            sd.next = i;
            sd.verdict = Some(i);
        }
        Ok((token, accepted))
    }

    /// Verifies the whole sampled draft on `seq` against dense target
    /// distributions (`p_rows`: n_drafted + 1 rows of `n_vocab` probabilities,
    /// row k the distribution after the anchor and k drafted tokens) and
    /// accepts what it kept. Writes the tokens the host emits this step into
    /// `out` (the accepted drafted tokens, then the replacement or the bonus)
    /// and returns their count, n_accepted + 1.
    pub fn verify_sampled(
        &mut self,
        seq: i32,
        p_rows: &[f32],
        n_rows: usize,
        n_vocab: usize,
        out: &mut [i32],
    ) -> Result<usize> {
        let (s, o, sd) = self.sampled_draft(seq, "verify_sampled")?;
        let n_drafted = o.tokens.len();
        if sd.next > 0 || sd.verdict.is_some() {
            return Err(Error::invalid_state(format!(
                "verify_sampled on sequence {seq}, whose draft llama_spec_dflash2_verify_sampled_step is verifying"
            )));
        }
        if n_vocab != self.drafter.n_vocab {
            return Err(Error::invalid(format!(
                "verify_sampled: n_vocab {n_vocab} (the model has {})",
                self.drafter.n_vocab
            )));
        }
        if n_rows != n_drafted + 1 {
            return Err(Error::invalid(format!(
                "verify_sampled of sequence {seq}: {n_rows} rows of p for a draft of {n_drafted} tokens (pass {})",
                n_drafted + 1
            )));
        }
        debug_assert_eq!(p_rows.len(), n_rows * n_vocab);
        self.check_verify_rows(s, seq, "verify_sampled", n_drafted, out.len())?;
        let qs: Vec<Dist> = sd.picks.iter().map(SampledPick::q).collect();
        let ps: Vec<Dist> = p_rows.chunks_exact(n_vocab).map(Dist::Dense).collect();
        let mut rng = self.verify_rng(s, seq)?;
        let verdict = sampling::verify(&o.tokens, &qs, &ps, n_vocab, &mut rng)?;
        let tuning = o.tuning;
        let n_reached = if tuning.is_some() { verdict.n_accepted + 1 } else { 0 };
        let reached: Vec<SampledPick> = sd.picks.iter().take(n_reached).cloned().collect();
        self.accept(seq, verdict.n_accepted as i32)?;
        for (pick, &p) in reached.iter().zip(&ps) {
            self.observe_tuning(tuning, Some(pick.q()), p, 1);
        }
        self.seqs[s].rng.as_mut().expect("accept keeps the generators").verify = rng;
        out[..verdict.tokens.len()].copy_from_slice(&verdict.tokens);
        Ok(verdict.tokens.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    fn req(temperature: f32, draft_temperature: f32) -> Request {
        Request { seq: 3, id_last: 1, n_max: 2, temperature, draft_temperature, seed: 9, ..Default::default() }
    }

    #[test]
    fn temperature_zero_is_greedy_whatever_the_other_fields_say() {
        assert_eq!(mode(&req(0.0, 0.0)).unwrap(), Mode::Greedy);
        assert_eq!(mode(&req(0.0, f32::NAN)).unwrap(), Mode::Greedy);
        assert_eq!(mode(&Request::default()).unwrap(), Mode::Greedy);
    }

    #[test]
    fn an_unset_draft_temperature_takes_the_request_s_and_a_set_one_wins() {
        assert_eq!(
            mode(&req(0.8, 0.0)).unwrap(),
            Mode::Sampled { t_draft: 0.8, seed: 9, truncation: Truncation::NONE, tuning: None }
        );
        assert_eq!(
            mode(&req(0.8, -1.0)).unwrap(),
            Mode::Sampled { t_draft: 0.8, seed: 9, truncation: Truncation::NONE, tuning: None }
        );
        assert_eq!(
            mode(&req(0.8, f32::NEG_INFINITY)).unwrap(),
            Mode::Sampled { t_draft: 0.8, seed: 9, truncation: Truncation::NONE, tuning: None }
        );
        assert_eq!(
            mode(&req(0.8, 0.3)).unwrap(),
            Mode::Sampled { t_draft: 0.3, seed: 9, truncation: Truncation::NONE, tuning: None }
        );
    }

    #[test]
    fn bad_temperatures_are_refused_with_the_sequence_named() {
        for (t, d, needle) in [
            (-0.5, 0.0, "temperature -0.5"),
            (f32::NAN, 0.0, "temperature NaN"),
            (f32::INFINITY, 0.0, "temperature inf"),
            (0.8, f32::NAN, "draft temperature NaN"),
            (0.8, f32::INFINITY, "draft temperature inf"),
        ] {
            let e = mode(&req(t, d)).unwrap_err();
            assert_eq!(e.status, Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
            assert!(e.message.contains(needle) && e.message.contains("sequence 3"), "{}", e.message);
        }
    }

    #[test]
    fn generators_are_kept_for_their_seed_and_differ_by_seed_stream_and_sequence() {
        let mut slot = None;
        let first = seeded(&mut slot, 5, 0).draft.next_u64();
        // kept: the stream goes on
        assert_ne!(seeded(&mut slot, 5, 0).draft.next_u64(), first);
        // another seed: fresh generators
        seeded(&mut slot, 6, 0);
        let mut again = None;
        assert_eq!(seeded(&mut again, 5, 0).draft.next_u64(), first);
        let r = SeqRng::new(5, 0);
        assert_ne!(r.draft, r.verify);
        assert_ne!(SeqRng::new(5, 1).draft, r.draft);
    }

    #[test]
    fn accept_after_step_verification_must_take_its_count() {
        let mut sd = SampledDraft::default();
        assert!(sd.check_accept(0, 2).is_ok(), "not verified by steps: any count");
        sd.next = 1;
        assert_eq!(sd.check_accept(0, 1).unwrap_err().status, Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE);
        sd.verdict = Some(1);
        assert!(sd.check_accept(0, 1).is_ok());
        let e = sd.check_accept(0, 2).unwrap_err();
        assert_eq!(e.status, Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
        assert!(e.message.contains("pass 1"));
    }

    #[test]
    fn an_empty_walk_keeps_its_mode() {
        let o = Walked::empty(Mode::Sampled { t_draft: 1.0, seed: 0, truncation: Truncation::NONE, tuning: None })
            .into_outstanding(Some(4), Mode::Greedy);
        assert!(o.tokens.is_empty() && o.sampled.is_some());
        assert!(Walked::empty(Mode::Greedy).into_outstanding(None, Mode::Greedy).sampled.is_none());
    }
}
