//! Sampled drafts verified losslessly through the C API, on real libllama:
//! the tokens a host emits with dflash2's sampled speculation are distributed
//! exactly as target-only sampling, a deliberately lossy host is caught by the
//! same check, bad input is refused with a status and changes nothing, and the
//! same seed gives the same output.

mod common;

use std::path::{Path, PathBuf};
use std::ptr;

use common::reference::{self, Reference, decode_rows, host_p, logits};
use common::spec::{Spec, default_params, prefill};
use common::target::{TRow, Target};
use common::{fixtures, last_error, smollm2, status_code};
use dflash2::ffi::*;
use dflash2::sampling::{Dist, Rng, expected_acceptance, sample};
use dflash2::sys::{self, llama_token_data, llama_token_data_array};

// ---- the host's side ------------------------------------------------------

/// `p` as llama.cpp's chain leaves `cur_p`: the candidates left (p > 0), in
/// no particular order (here: by descending id).
fn cur_p(p: &[f32], logits: &[f32]) -> Vec<llama_token_data> {
    (0..p.len())
        .rev()
        .filter(|&i| p[i] > 0.0)
        .map(|i| llama_token_data { id: i as i32, logit: logits[i], p: p[i] })
        .collect()
}

fn request(seq: i32, id_last: i32, n_max: i32, temperature: f32, seed: u32) -> llama_spec_dflash2_draft_request {
    llama_spec_dflash2_draft_request {
        seq_id: seq,
        id_last,
        n_max,
        temperature,
        draft_temperature: 0.0,
        seed,
        ..Default::default()
    }
}

/// llama_spec_dflash2_draft for one request; the drafted tokens, or the status.
fn draft(spec: &Spec, req: llama_spec_dflash2_draft_request) -> Result<Vec<i32>, i32> {
    draft_all(spec, &[req]).map(|mut d| d.remove(0))
}

/// llama_spec_dflash2_draft for several requests; each one's draft, or the status.
fn draft_all(spec: &Spec, reqs: &[llama_spec_dflash2_draft_request]) -> Result<Vec<Vec<i32>>, i32> {
    let cap: i32 = reqs.iter().map(|r| r.n_max.max(0)).sum();
    let mut tokens = vec![0i32; cap as usize];
    let mut n = vec![0i32; reqs.len()];
    let rc = unsafe {
        llama_spec_dflash2_draft(spec.0, reqs.as_ptr(), reqs.len() as i32, tokens.as_mut_ptr(), cap, n.as_mut_ptr())
    };
    if rc != 0 {
        return Err(rc);
    }
    let mut at = 0;
    Ok(n.iter()
        .map(|&k| {
            at += k as usize;
            tokens[at - k as usize..at].to_vec()
        })
        .collect())
}

/// llama_spec_dflash2_verify_sampled with dense rows; the emitted tokens or the status.
fn verify_sampled(spec: &Spec, seq: i32, p_rows: &[f32], n_rows: usize, n_vocab: usize) -> Result<Vec<i32>, i32> {
    let mut out = vec![0i32; n_rows];
    let mut n = -1;
    let rc = unsafe {
        llama_spec_dflash2_verify_sampled(
            spec.0,
            seq,
            p_rows.as_ptr(),
            n_rows as i32,
            n_vocab as i32,
            out.as_mut_ptr(),
            out.len() as i32,
            &mut n,
        )
    };
    if rc != 0 {
        return Err(rc);
    }
    out.truncate(n as usize);
    Ok(out)
}

/// llama_spec_dflash2_verify_sampled_step with `cands` as cur_p.
fn step(spec: &Spec, seq: i32, i: i32, cands: &mut [llama_token_data]) -> Result<(i32, bool), i32> {
    let arr = llama_token_data_array { data: cands.as_mut_ptr(), size: cands.len(), selected: -1, sorted: false };
    let (mut token, mut accepted) = (-1, false);
    let rc = unsafe { llama_spec_dflash2_verify_sampled_step(spec.0, seq, i, &arr, &mut token, &mut accepted) };
    if rc != 0 {
        return Err(rc);
    }
    Ok((token, accepted))
}

/// One drafted token's q: candidate ids and their probabilities.
type Q = (Vec<i32>, Vec<f32>);

/// q of the outstanding sampled draft: per drafted token, without padding.
fn draft_q(spec: &Spec, seq: i32, n_drafted: usize) -> Result<Vec<Q>, i32> {
    let k = unsafe { llama_spec_dflash2_top_k(spec.0) };
    assert!(k > 0, "top_k: {}", last_error());
    let k = k as usize;
    let (mut ids, mut probs) = (vec![0i32; n_drafted * k], vec![0f32; n_drafted * k]);
    let mut k_out = 0;
    let rc = unsafe {
        llama_spec_dflash2_draft_q(spec.0, seq, ids.as_mut_ptr(), probs.as_mut_ptr(), ids.len() as i32, &mut k_out)
    };
    if rc != 0 {
        return Err(rc);
    }
    assert_eq!(k_out as usize, k);
    Ok((0..n_drafted)
        .map(|i| {
            let n = ids[i * k..(i + 1) * k].iter().take_while(|&&t| t >= 0).count();
            (ids[i * k..i * k + n].to_vec(), probs[i * k..i * k + n].to_vec())
        })
        .collect())
}

fn accept(spec: &Spec, seq: i32, n: i32) -> i32 {
    unsafe { llama_spec_dflash2_accept(spec.0, seq, n) }
}

/// A target context on one thread: ggml's threads spin at every barrier, and
/// on a loaded machine two of them can take a hundred times longer than one.
fn target_1t(model: &Path, n_seq: u32) -> Target {
    reference::target_1t(model, n_seq, 256 * n_seq)
}

fn params_1t(n_seq: u32) -> llama_spec_dflash2_params {
    llama_spec_dflash2_params { n_threads: 1, n_threads_batch: 1, ..default_params(n_seq) }
}

/// Decodes `tokens` at positions from `pos` on sequence `seq`, every row with
/// logits or none.
// ---- sampled speculation, honest and lossy -------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Verify {
    /// The host decodes every verify batch, passes it to process(), makes p
    /// from the rows' logits and calls llama_spec_dflash2_verify_sampled
    /// (which accepts).
    Whole,
    /// The host makes p of each position lazily and calls
    /// llama_spec_dflash2_verify_sampled_step with it as cur_p, position by
    /// position. Its p comes from the reference context (one decode per
    /// distinct prefix, memoized), and no verify batch is decoded: every
    /// sample is rolled back from the anchor on, which drops the draft without
    /// accept(). This is what makes thousands of samples on SmolLM2 cheap.
    Steps,
}

struct Outcome {
    n: usize,
    threshold: f64,
    n_bins: usize,
    /// TV of: the honest host, a host that keeps every drafted token
    /// ("accept always"), a host that redraws a rejected token from p
    /// instead of the residual.
    tv_honest: f64,
    tv_accept_all: f64,
    tv_resample_p: f64,
    /// Drafted tokens accepted per draft, and drafted per draft.
    acceptance: f64,
    drafted: f64,
}

/// Sequences drafted together: one draft call (one noise-block decode) gives
/// this many independent samples.
const N_PAR: usize = 16;

/// `n` (rounded up to a multiple of N_PAR) independent samples of the first
/// DEPTH tokens after `prompt` with dflash2 sampled speculation at
/// temperature `t` (and top-k `top_k`; 0 = off). Drafts have 2 tokens, so
/// the first three tokens go through draft positions 0 and 1 and the bonus.
/// N_PAR sequences hold the same prompt; each round drafts for all of them in
/// one call anchored at the prompt's last token, verifies, and rolls every
/// sequence back to the prompt (its generators carry on, so samples are
/// independent).
#[allow(clippy::too_many_arguments)]
fn speculate(
    model: &Path,
    drafter: &Path,
    prompt: &[i32],
    t: f32,
    top_k: usize,
    how: Verify,
    n: usize,
    seed: u32,
) -> Outcome {
    const N_MAX: usize = 2;
    let clock = std::time::Instant::now();
    let mut reference = Reference::new(model, prompt, t, top_k);
    let built = clock.elapsed().as_secs_f64();
    let clock = std::time::Instant::now();
    let mut target = target_1t(model, N_PAR as u32);
    let spec = Spec::new(&target, drafter, params_1t(N_PAR as u32));
    let n_ctx = prompt.len() as i32 - 1;
    let anchor = prompt[n_ctx as usize];
    for s in 0..N_PAR as i32 {
        decode_rows(&mut target, s, &prompt[..n_ctx as usize], 0, false);
        spec.process(&target);
    }
    let n_vocab = target.n_vocab;
    let mut rng = Rng::new(u64::from(seed) + 1000); // the harness's own draws
    let n_bins = reference.probs.len();
    let mut counts = [vec![0usize; n_bins], vec![0; n_bins], vec![0; n_bins]];
    let (mut n_drafted, mut n_accepted) = (0usize, 0usize);
    let stats0 = spec.stats();
    let rounds = n.div_ceil(N_PAR);
    for _ in 0..rounds {
        let reqs: Vec<_> = (0..N_PAR as i32).map(|s| request(s, anchor, N_MAX as i32, t, seed)).collect();
        let drafts = draft_all(&spec, &reqs).unwrap_or_else(|rc| panic!("draft {rc}: {}", last_error()));
        // p of every position of every draft: [sequence][position]
        let p_rows: Vec<Vec<Vec<f32>>> = match how {
            Verify::Whole => {
                let mut rows = Vec::new();
                for (s, d) in drafts.iter().enumerate() {
                    for (j, &token) in std::iter::once(&anchor).chain(d).enumerate() {
                        rows.push(TRow { seq: s as i32, token, pos: n_ctx + j as i32, logits: true });
                    }
                }
                target.decode(&rows);
                spec.process(&target);
                let mut at = 0;
                drafts
                    .iter()
                    .map(|d| {
                        at += d.len() + 1;
                        (at - d.len() - 1..at).map(|r| host_p(logits(&target, r), t, top_k)).collect()
                    })
                    .collect()
            }
            Verify::Steps => {
                drafts.iter().map(|d| (0..=d.len()).map(|j| reference.p(&d[..j]).to_vec()).collect()).collect()
            }
        };
        for (s, (d, p)) in drafts.iter().zip(&p_rows).enumerate() {
            let seq = s as i32;
            let emitted = match how {
                Verify::Whole => verify_sampled(&spec, seq, &p.concat(), d.len() + 1, n_vocab)
                    .unwrap_or_else(|rc| panic!("verify_sampled {rc}: {}", last_error())),
                Verify::Steps => {
                    let mut out = Vec::new();
                    for (i, p) in p.iter().enumerate() {
                        let logits: Vec<f32> = p.iter().map(|&x| x.ln()).collect();
                        let mut cands = cur_p(p, &logits);
                        let (x, accepted) = step(&spec, seq, i as i32, &mut cands)
                            .unwrap_or_else(|rc| panic!("step {rc}: {}", last_error()));
                        out.push(x);
                        if !accepted {
                            break;
                        }
                    }
                    out
                }
            };
            let n_acc = emitted.len() - 1;
            assert!(emitted.len() <= d.len() + 1 && emitted[..n_acc] == d[..n_acc]);
            n_drafted += d.len();
            n_accepted += n_acc;
            // lossy hosts, from the same draft and the same p
            let mut accept_all = d.clone();
            accept_all.push(sample(Dist::Dense(&p[d.len()]), n_vocab, &mut rng).unwrap());
            let mut resample_p = emitted.clone();
            if n_acc < d.len() {
                resample_p[n_acc] = sample(Dist::Dense(&p[n_acc]), n_vocab, &mut rng).unwrap();
            }
            for (c, e) in counts.iter_mut().zip([&emitted, &accept_all, &resample_p]) {
                c[reference.bin(e, &mut rng)] += 1;
            }
            if how == Verify::Whole {
                target.seq_rm(seq, n_ctx, -1);
            }
            spec.seq_rm(seq, n_ctx, -1);
        }
    }
    let st = spec.stats();
    if how == Verify::Whole {
        // sampled drafts are counted like greedy ones
        assert_eq!((st.n_drafted - stats0.n_drafted) as usize, n_drafted);
        assert_eq!((st.n_accepted - stats0.n_accepted) as usize, n_accepted);
        assert_eq!((st.n_verify_steps - stats0.n_verify_steps) as usize, rounds * N_PAR);
    }
    let n = rounds * N_PAR;
    eprintln!(
        "  reference: {n_bins} bins from {} decodes in {built:.1}s; {n} samples in {:.1}s",
        reference.memo.len(),
        clock.elapsed().as_secs_f64()
    );
    Outcome {
        n,
        threshold: reference.threshold(n),
        n_bins,
        tv_honest: reference.tv(&counts[0]),
        tv_accept_all: reference.tv(&counts[1]),
        tv_resample_p: reference.tv(&counts[2]),
        acceptance: n_accepted as f64 / n as f64,
        drafted: n_drafted as f64 / n as f64,
    }
}

/// Samples per (model, temperature) distribution check: 5000 (rounded up to
/// N_PAR); DFLASH2_SAMPLING_SAMPLES overrides it for experiments.
fn n_samples() -> usize {
    std::env::var("DFLASH2_SAMPLING_SAMPLES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000)
}

/// Asserts the honest host passes and the accept-always host fails; with
/// `overlap` (a drafter whose q overlaps p, so that rejections are not just
/// draws from p anyway) also that the resample-from-p host fails.
fn check(what: &str, o: &Outcome, overlap: bool) {
    eprintln!(
        "{what}: {} samples, {} bins, threshold {:.4}: TV honest {:.4}, accept-always {:.4}, resample-from-p {:.4}; \
         {:.3} of {:.3} drafted tokens accepted per draft",
        o.n, o.n_bins, o.threshold, o.tv_honest, o.tv_accept_all, o.tv_resample_p, o.acceptance, o.drafted
    );
    assert!(o.tv_honest < o.threshold, "{what}: sampled speculation is not the target's distribution");
    assert!(o.tv_accept_all > o.threshold, "{what}: the check does not catch an accept-always host");
    if overlap {
        assert!(o.tv_resample_p > o.threshold, "{what}: the check does not catch a resample-from-p host");
    }
}

// The random fixture drafter's q hardly overlaps the target's p: nearly
// every drafted token is rejected, so these two mostly check the residual
// draws and the bonus-free path; the SmolLM2 pair below accepts most tokens.

fn fixture_prompt() -> Vec<i32> {
    Target::new(&fixtures().target, 1, 64, 64).tokenize("one two three", true)
}

#[test]
fn fixture_pair_at_t_0_8_verified_whole_emits_the_target_distribution_and_an_accept_always_host_does_not() {
    let fx = fixtures();
    let o = speculate(&fx.target, &fx.drafter, &fixture_prompt(), 0.8, 0, Verify::Whole, n_samples(), 1);
    check("fixture T=0.8 whole", &o, false);
}

#[test]
fn fixture_pair_at_t_1_top_k_40_verified_by_steps_emits_the_target_distribution_and_an_accept_always_host_does_not() {
    let fx = fixtures();
    let o = speculate(&fx.target, &fx.drafter, &fixture_prompt(), 1.0, 40, Verify::Steps, n_samples(), 2);
    check("fixture T=1.0 top-k 40 steps", &o, false);
}

fn smollm2_drafter(target: &Path) -> PathBuf {
    common::smollm2_drafter(target)
}

fn chat(question: &str) -> String {
    format!("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
}

const SMOL_QUESTION: &str = "What is the capital of France?";

fn smollm2_check(what: &str, t: f32, top_k: usize, seed: u32) {
    let model = smollm2();
    let drafter = smollm2_drafter(&model);
    let prompt = Target::new(&model, 1, 64, 64).tokenize(&chat(SMOL_QUESTION), false);
    let o = speculate(&model, &drafter, &prompt, t, top_k, Verify::Steps, n_samples(), seed);
    check(what, &o, true);
}

#[test]
fn smollm2_trained_drafter_at_t_0_8_emits_the_target_distribution_and_lossy_hosts_do_not() {
    smollm2_check("smollm2 T=0.8 steps", 0.8, 0, 3);
}

#[test]
fn smollm2_trained_drafter_at_t_1_top_k_40_emits_the_target_distribution_and_lossy_hosts_do_not() {
    smollm2_check("smollm2 T=1.0 top-k 40 steps", 1.0, 40, 4);
}

// ---- acceptance: sampled drafts vs greedy drafts with sample-and-match -----------

/// What one way of speculating achieved over some generations.
#[derive(Default)]
struct Acceptance {
    steps: usize,
    tokens: usize,
    drafted: usize,
    accepted: usize,
    /// Per draft position: expected acceptance given the path
    /// (sum min(p, q) for sampled drafts, p(t) for greedy ones), summed, and
    /// how many drafts reached the position.
    expected: Vec<f64>,
    reached: Vec<usize>,
    /// Sampled drafts only, on the same contexts: p(t) at draft position 0
    /// of the token a greedy draft would have put there (q's best candidate:
    /// the first row's argmax, which is what the greedy walk takes), summed.
    greedy_first: f64,
}

impl Acceptance {
    fn tau(&self) -> f64 {
        self.tokens as f64 / self.steps as f64
    }

    fn report(&self, what: &str, st: &llama_spec_dflash2_stats) {
        let by_pos: Vec<String> = (0..self.reached.len())
            .filter(|&i| st.drafted_at[i] > 0)
            .map(|i| {
                format!(
                    "{:.2} (E {:.2})",
                    st.accepted_at[i] as f64 / st.drafted_at[i] as f64,
                    self.expected[i] / self.reached[i] as f64
                )
            })
            .collect();
        if self.greedy_first > 0.0 {
            eprintln!(
                "  position 0 on the same {} contexts: sum min(p, q) {:.3} vs p(greedy token) {:.3}",
                self.reached[0],
                self.expected[0] / self.reached[0] as f64,
                self.greedy_first / self.reached[0] as f64
            );
        }
        eprintln!(
            "{what}: tau {:.3} ({} tokens in {} steps), accepted/drafted {}/{} = {:.3}, by position: {}",
            self.tau(),
            self.tokens,
            self.steps,
            self.accepted,
            self.drafted,
            self.accepted as f64 / self.drafted as f64,
            by_pos.join(", ")
        );
    }
}

/// Generates up to `n_gen` tokens after each prompt at temperature `t`,
/// speculating with sampled drafts verified by llama_spec_dflash2_verify_sampled
/// (`sampled`), or with greedy drafts verified by sample-and-match (what
/// llama.cpp does at temperature > 0: sample the target, keep drafted tokens
/// while they equal the sample).
fn generate_sampled(
    model: &Path,
    drafter: &Path,
    prompts: &[String],
    t: f32,
    draft_t: Option<f32>,
    n_gen: usize,
) -> Acceptance {
    let sampled = draft_t.is_some();
    let mut a = Acceptance { expected: vec![0.0; 64], reached: vec![0; 64], ..Default::default() };
    let mut target = reference::target_1t(model, 1, 2048);
    let spec = Spec::new(&target, drafter, params_1t(1));
    let vocab = unsafe { sys::llama_model_get_vocab(target.model.0) };
    let n_vocab = target.n_vocab;
    let n_max = spec.n_max();
    for (k, prompt) in prompts.iter().enumerate() {
        let seed = 100 + k as u32;
        let mut rng = Rng::new(u64::from(seed)); // the host's own sampler
        target.seq_rm(0, -1, -1);
        assert_eq!(unsafe { llama_spec_dflash2_seq_clear(spec.0, 0) }, 0);
        let toks = target.tokenize(prompt, false);
        let rows: Vec<TRow> = toks
            .iter()
            .enumerate()
            .map(|(i, &token)| TRow { seq: 0, token, pos: i as i32, logits: i + 1 == toks.len() })
            .collect();
        target.decode(&rows);
        spec.process(&target);
        // the first token is plain sampling
        let p = host_p(logits(&target, toks.len() - 1), t, 0);
        let mut id_last = sample(Dist::Dense(&p), n_vocab, &mut rng).unwrap();
        let mut n_past = toks.len() as i32;
        let mut out = 1;
        while out < n_gen && !unsafe { sys::llama_vocab_is_eog(vocab, id_last) } {
            let temperature = if sampled { t } else { 0.0 };
            let req = llama_spec_dflash2_draft_request {
                draft_temperature: draft_t.unwrap_or(0.0),
                ..request(0, id_last, n_max, temperature, seed)
            };
            let d = draft(&spec, req).unwrap();
            let mut rows = vec![id_last];
            rows.extend_from_slice(&d);
            decode_rows(&mut target, 0, &rows, n_past, true);
            spec.process(&target);
            let p: Vec<Vec<f32>> = (0..rows.len()).map(|i| host_p(logits(&target, i), t, 0)).collect();
            let emitted = if sampled {
                let q = draft_q(&spec, 0, d.len()).unwrap();
                if let Some((ids, probs)) = q.first() {
                    let best = (0..ids.len()).max_by(|&a, &b| probs[a].total_cmp(&probs[b]).then(b.cmp(&a))).unwrap();
                    a.greedy_first += p[0][ids[best] as usize] as f64;
                }
                for (i, (ids, probs)) in q.iter().enumerate() {
                    // the expected acceptance at i, given the path drafted so far
                    a.expected[i] +=
                        expected_acceptance(Dist::Dense(&p[i]), Dist::Sparse { ids, probs }, n_vocab).unwrap();
                    a.reached[i] += 1;
                }
                verify_sampled(&spec, 0, &p.concat(), rows.len(), n_vocab).unwrap()
            } else {
                let mut e = Vec::new();
                for (i, p) in p.iter().enumerate() {
                    if i < d.len() {
                        a.expected[i] += p[d[i] as usize] as f64;
                        a.reached[i] += 1;
                    }
                    let x = sample(Dist::Dense(p), n_vocab, &mut rng).unwrap();
                    e.push(x);
                    if i == d.len() || x != d[i] {
                        break;
                    }
                }
                assert_eq!(accept(&spec, 0, e.len() as i32 - 1), 0, "{}", last_error());
                e
            };
            a.steps += 1;
            a.tokens += emitted.len();
            a.drafted += d.len();
            a.accepted += emitted.len() - 1;
            out += emitted.len();
            n_past += emitted.len() as i32;
            target.seq_rm(0, n_past, -1);
            id_last = *emitted.last().unwrap();
        }
    }
    let what = match draft_t {
        Some(d) => format!("sampled drafts (draft T {d}) + rejection sampling"),
        None => "greedy drafts + sample-and-match".into(),
    };
    a.report(&what, &spec.stats());
    a
}

/// Measures, on SmolLM2 with the trained drafter at temperature 0.8, tokens
/// per verify step (tau) and acceptance by draft position of sampled drafts
/// vs greedy drafts verified by sample-and-match. A measurement, not a check
/// of correctness: `cargo test --release --test engine_sampling -- --ignored --nocapture`
/// (DFLASH2_SAMPLING_T: temperature, DFLASH2_SAMPLING_DRAFT_T: draft
/// temperatures to try, DFLASH2_SAMPLING_N_GEN: tokens per prompt).
#[test]
#[ignore]
fn measure_acceptance_sampled_vs_sample_and_match() {
    let model = smollm2();
    let drafter = smollm2_drafter(&model);
    let t: f32 = std::env::var("DFLASH2_SAMPLING_T").ok().and_then(|v| v.parse().ok()).unwrap_or(0.8);
    let prompts: Vec<String> = [
        "Write a Python function that reverses a string.",
        "What is 17 times 23?",
        "List three colors.",
        "Explain in one sentence why the sky is blue.",
        "Write a short poem about the sea.",
        "What is the capital of France?",
        "Give me three tips for learning to code.",
        "Summarize the plot of Romeo and Juliet in two sentences.",
    ]
    .iter()
    .map(|q| chat(q))
    .collect();
    let n_gen = std::env::var("DFLASH2_SAMPLING_N_GEN").ok().and_then(|v| v.parse().ok()).unwrap_or(96);
    // draft temperatures to try (0 = the request's); DFLASH2_SAMPLING_DRAFT_T="0,1.5"
    let draft_ts: Vec<f32> = std::env::var("DFLASH2_SAMPLING_DRAFT_T")
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|_| vec![0.0]);
    let matched = generate_sampled(&model, &drafter, &prompts, t, None, n_gen);
    for dt in draft_ts {
        let sampled = generate_sampled(&model, &drafter, &prompts, t, Some(dt), n_gen);
        eprintln!("T={t}, draft T {dt}: tau sampled / tau sample-and-match = {:.3}", sampled.tau() / matched.tau());
    }
}

// ---- the API's contract: bad input, call order, seeds ---------------------------

/// The fixture pair on one thread with `n_seq` sequences, the fixture prompt
/// decoded on sequence 0; returns its n_past and first greedy token.
fn fixture_engine(params: llama_spec_dflash2_params) -> (Target, Spec, i32, i32) {
    let fx = fixtures();
    let mut target = target_1t(&fx.target, params.n_seq);
    let spec = Spec::new(&target, &fx.drafter, params);
    let streams = prefill(&mut target, &spec, &[fixture_prompt()]);
    let (n_past, id_last) = (streams[0].n_past, streams[0].id_last);
    (target, spec, n_past, id_last)
}

/// Decodes a verify batch for sequence 0 and feeds it to the engine; returns
/// the host's p of every row at temperature `t`.
fn decode_verify(target: &mut Target, spec: &Spec, id_last: i32, d: &[i32], n_past: i32, t: f32) -> Vec<Vec<f32>> {
    let mut toks = vec![id_last];
    toks.extend_from_slice(d);
    decode_rows(target, 0, &toks, n_past, true);
    spec.process(target);
    (0..toks.len()).map(|i| host_p(logits(target, i), t, 0)).collect()
}

fn snapshot(spec: &Spec) -> (llama_spec_dflash2_seq_info, u64, u64, u64) {
    let st = spec.stats();
    (spec.info(0), st.n_draft_calls, st.n_accept_calls, st.n_accepted)
}

fn expect_err<T: std::fmt::Debug>(r: Result<T, i32>, status: &str, needle: &str) {
    assert_eq!(r.unwrap_err(), status_code(status), "{}", last_error());
    assert!(last_error().contains(needle), "'{}' lacks '{needle}'", last_error());
}

#[test]
fn bad_sampling_input_and_calls_out_of_order_are_refused_and_change_nothing() {
    let (mut target, spec, n_past, id_last) = fixture_engine(params_1t(2));
    let n_vocab = target.n_vocab;

    // bad temperatures are refused before anything changes
    let before = snapshot(&spec);
    for (t, dt, needle) in [
        (-1.0, 0.0, "temperature -1"),
        (f32::NAN, 0.0, "temperature NaN"),
        (f32::INFINITY, 0.0, "temperature inf"),
        (0.8, f32::NAN, "draft temperature NaN"),
        (0.8, f32::INFINITY, "draft temperature inf"),
    ] {
        let req = llama_spec_dflash2_draft_request { draft_temperature: dt, ..request(0, id_last, 3, t, 1) };
        expect_err(draft(&spec, req), "INVALID_ARGUMENT", needle);
        assert_eq!(snapshot(&spec), before);
    }
    // and a truncation that is not one
    for (top_p, min_p, needle) in [(f32::NAN, 0.0, "top_p NaN"), (0.9, 1.5, "min_p 1.5"), (0.9, f32::NAN, "min_p NaN")]
    {
        let req = llama_spec_dflash2_draft_request { top_k: 40, top_p, min_p, ..request(0, id_last, 3, 0.8, 1) };
        expect_err(draft(&spec, req), "INVALID_ARGUMENT", needle);
        assert_eq!(snapshot(&spec), before);
    }

    // temperature 0 is the greedy path whatever the other fields say, and its
    // draft has no q
    let greedy = draft(&spec, request(0, id_last, 3, 0.0, 0)).unwrap();
    spec.seq_rm(0, n_past, -1);
    let req = llama_spec_dflash2_draft_request { draft_temperature: 5.0, ..request(0, id_last, 3, 0.0, 99) };
    assert_eq!(draft(&spec, req).unwrap(), greedy);
    expect_err(draft_q(&spec, 0, 3), "INVALID_STATE", "greedy");
    let p = decode_verify(&mut target, &spec, id_last, &greedy, n_past, 0.8);
    expect_err(verify_sampled(&spec, 0, &p.concat(), 4, n_vocab), "INVALID_STATE", "greedy");
    expect_err(step(&spec, 0, 0, &mut cur_p(&p[0], &p[0])), "INVALID_STATE", "greedy");
    target.seq_rm(0, n_past, -1);
    spec.seq_rm(0, n_past, -1);

    // a sampled draft and its q
    let d = draft(&spec, request(0, id_last, 3, 0.8, 7)).unwrap();
    assert_eq!(d.len(), 3);
    let q = draft_q(&spec, 0, 3).unwrap();
    let k = unsafe { llama_spec_dflash2_top_k(spec.0) } as usize;
    for (t, (ids, probs)) in d.iter().zip(&q) {
        assert!(!ids.is_empty() && ids.len() <= k);
        assert!((probs.iter().map(|&x| x as f64).sum::<f64>() - 1.0).abs() < 1e-5);
        assert!(probs.iter().all(|&x| x > 0.0));
        let at = ids.iter().position(|x| x == t).expect("the drafted token is a candidate");
        assert!(probs[at] > 0.0);
    }
    let mut small = vec![0i32; 3 * k - 1];
    let rc = unsafe {
        llama_spec_dflash2_draft_q(
            spec.0,
            0,
            small.as_mut_ptr(),
            vec![0f32; 3 * k].as_mut_ptr(),
            3 * k as i32 - 1,
            ptr::null_mut(),
        )
    };
    assert_eq!(rc, status_code("BUFFER_TOO_SMALL"));
    let rc = unsafe {
        llama_spec_dflash2_draft_q(
            spec.0,
            0,
            ptr::null_mut(),
            vec![0f32; 3 * k].as_mut_ptr(),
            3 * k as i32,
            ptr::null_mut(),
        )
    };
    assert_eq!(rc, status_code("NULL_ARGUMENT"));
    expect_err(draft_q(&spec, 1, 0), "INVALID_STATE", "no draft");

    // whole-draft verification of bad p: refused, nothing changes
    let p = decode_verify(&mut target, &spec, id_last, &d, n_past, 0.8);
    let before = snapshot(&spec);
    let good = p.concat();
    let mut n_out = -1;
    let rc = unsafe {
        llama_spec_dflash2_verify_sampled(
            spec.0,
            0,
            ptr::null(),
            4,
            n_vocab as i32,
            [0i32; 4].as_mut_ptr(),
            4,
            &mut n_out,
        )
    };
    assert_eq!((rc, n_out), (status_code("NULL_ARGUMENT"), -1));
    expect_err(verify_sampled(&spec, 0, &good[..3 * n_vocab], 3, n_vocab), "INVALID_ARGUMENT", "3 rows of p");
    let wide = vec![1.0 / (n_vocab + 1) as f32; 4 * (n_vocab + 1)];
    expect_err(verify_sampled(&spec, 0, &wide, 4, n_vocab + 1), "INVALID_ARGUMENT", "n_vocab");
    let mut bad = p.clone();
    bad[2].iter_mut().for_each(|x| *x *= 0.5);
    expect_err(verify_sampled(&spec, 0, &bad.concat(), 4, n_vocab), "INVALID_ARGUMENT", "sum");
    let mut bad = p.clone();
    bad[3][0] = -0.25;
    bad[3][1] += 0.25;
    expect_err(verify_sampled(&spec, 0, &bad.concat(), 4, n_vocab), "INVALID_ARGUMENT", "finite and >= 0");
    let mut bad = p.clone();
    bad[0][7] = f32::NAN;
    expect_err(verify_sampled(&spec, 0, &bad.concat(), 4, n_vocab), "INVALID_ARGUMENT", "finite and >= 0");
    let rc = unsafe {
        llama_spec_dflash2_verify_sampled(
            spec.0,
            0,
            good.as_ptr(),
            4,
            n_vocab as i32,
            [0i32; 3].as_mut_ptr(),
            3,
            &mut n_out,
        )
    };
    assert_eq!((rc, n_out), (status_code("BUFFER_TOO_SMALL"), -1));
    assert_eq!(snapshot(&spec), before);

    // step by step: bad p and positions out of order are refused
    let mut cands = cur_p(&p[0], &p[0]);
    expect_err(step(&spec, 0, 1, &mut cands), "INVALID_STATE", "in order");
    expect_err(step(&spec, 0, 4, &mut cands), "INVALID_ARGUMENT", "positions 0..=3");
    expect_err(step(&spec, 0, -1, &mut cands), "INVALID_ARGUMENT", "positions 0..=3");
    expect_err(step(&spec, 0, 0, &mut []), "INVALID_ARGUMENT", "0 ids");
    let mut half: Vec<llama_token_data> = cands.iter().map(|c| llama_token_data { p: c.p / 2.0, ..*c }).collect();
    expect_err(step(&spec, 0, 0, &mut half), "INVALID_ARGUMENT", "sum");
    let mut outside = vec![llama_token_data { id: n_vocab as i32, logit: 0.0, p: 1.0 }];
    expect_err(step(&spec, 0, 0, &mut outside), "INVALID_ARGUMENT", "outside");
    let (mut token, mut accepted) = (-1, false);
    let rc = unsafe { llama_spec_dflash2_verify_sampled_step(spec.0, 0, 0, ptr::null(), &mut token, &mut accepted) };
    assert_eq!((rc, token), (status_code("NULL_ARGUMENT"), -1));
    assert_eq!(snapshot(&spec), before);

    // p = q at position 0 accepts for sure; a p that q cannot reach at
    // position 1 rejects for sure and its one token is the replacement
    let mut as_q: Vec<llama_token_data> =
        q[0].0.iter().zip(&q[0].1).map(|(&id, &p)| llama_token_data { id, logit: 0.0, p }).collect();
    assert_eq!(step(&spec, 0, 0, &mut as_q), Ok((d[0], true)));
    expect_err(step(&spec, 0, 0, &mut as_q), "INVALID_STATE", "the next one is 1");
    assert_eq!(accept(&spec, 0, 0), status_code("INVALID_STATE"));
    assert!(last_error().contains("at position 1"), "{}", last_error());
    expect_err(verify_sampled(&spec, 0, &good, 4, n_vocab), "INVALID_STATE", "verify_sampled_step");
    let x = (0..n_vocab as i32).find(|t| !q[1].0.contains(t)).unwrap();
    let mut point = vec![llama_token_data { id: x, logit: 0.0, p: 1.0 }];
    assert_eq!(step(&spec, 0, 1, &mut point), Ok((x, false)));
    expect_err(step(&spec, 0, 2, &mut point), "INVALID_STATE", "ended");
    assert_eq!(accept(&spec, 0, 2), status_code("INVALID_ARGUMENT"));
    assert!(last_error().contains("pass 1"), "{}", last_error());
    assert_eq!(accept(&spec, 0, 0), status_code("INVALID_ARGUMENT"));
    let before = spec.stats();
    assert_eq!(accept(&spec, 0, 1), 0, "{}", last_error());
    let after = spec.stats();
    assert_eq!((after.n_accepted - before.n_accepted, after.n_verify_steps - before.n_verify_steps), (1, 1));
    let info = spec.info(0);
    assert_eq!((info.n_held, info.n_outstanding, info.last_target_pos), (0, -1, n_past + 1));
}

#[test]
fn a_sampled_draft_of_no_tokens_still_verifies_its_bonus_token() {
    // no lattice softmax reaches 1: every walk stops before its first token
    let (mut target, spec, n_past, id_last) = fixture_engine(llama_spec_dflash2_params { p_min: 1.0, ..params_1t(1) });
    let n_vocab = target.n_vocab;
    let d = draft(&spec, request(0, id_last, 3, 1.0, 5)).unwrap();
    assert!(d.is_empty());
    assert_eq!(draft_q(&spec, 0, 0).unwrap().len(), 0);
    let p = decode_verify(&mut target, &spec, id_last, &d, n_past, 1.0);
    let emitted = verify_sampled(&spec, 0, &p.concat(), 1, n_vocab).unwrap();
    assert_eq!(emitted.len(), 1);
    assert!(p[0][emitted[0] as usize] > 0.0);
    assert_eq!(spec.info(0).n_outstanding, -1);
    let n_past = n_past + 1;
    let d = draft(&spec, request(0, emitted[0], 3, 1.0, 5)).unwrap();
    let p = decode_verify(&mut target, &spec, emitted[0], &d, n_past, 1.0);
    let (x, accepted) = step(&spec, 0, 0, &mut cur_p(&p[0], &p[0])).unwrap();
    assert!(!accepted && p[0][x as usize] > 0.0);
    assert_eq!(accept(&spec, 0, 0), 0, "{}", last_error());
}

/// Generates `n_gen` tokens on sequence `seq` after the fixture prompt at
/// temperature 1 with sampled drafts, from a cleared sequence; the host's own
/// first draw uses `seed` too.
fn sampled_run(target: &mut Target, spec: &Spec, seq: i32, seed: u32, n_gen: usize) -> Vec<i32> {
    target.seq_rm(seq, -1, -1);
    assert_eq!(unsafe { llama_spec_dflash2_seq_clear(spec.0, seq) }, 0);
    let prompt = fixture_prompt();
    let rows: Vec<TRow> = prompt
        .iter()
        .enumerate()
        .map(|(i, &token)| TRow { seq, token, pos: i as i32, logits: i + 1 == prompt.len() })
        .collect();
    target.decode(&rows);
    spec.process(target);
    let n_vocab = target.n_vocab;
    let p = host_p(logits(target, prompt.len() - 1), 1.0, 0);
    let mut out = vec![sample(Dist::Dense(&p), n_vocab, &mut Rng::new(u64::from(seed))).unwrap()];
    let mut n_past = prompt.len() as i32;
    while out.len() < n_gen {
        let id_last = *out.last().unwrap();
        let d = draft(spec, request(seq, id_last, 3, 1.0, seed)).unwrap();
        let rows: Vec<TRow> = std::iter::once(&id_last)
            .chain(&d)
            .enumerate()
            .map(|(j, &token)| TRow { seq, token, pos: n_past + j as i32, logits: true })
            .collect();
        target.decode(&rows);
        spec.process(target);
        let p: Vec<f32> = (0..rows.len()).flat_map(|i| host_p(logits(target, i), 1.0, 0)).collect();
        let emitted = verify_sampled(spec, seq, &p, rows.len(), n_vocab).unwrap();
        n_past += emitted.len() as i32;
        target.seq_rm(seq, n_past, -1);
        out.extend(emitted);
    }
    let info = spec.info(seq);
    assert_eq!(info.n_in_kv + info.n_queued, n_past);
    out.truncate(n_gen);
    out
}

/// A cleared sequence starts over only where the draft distribution does not
/// depend on what the engine learned: with the draft temperature tuned
/// (params.adapt_sampled_drafts, the default) later requests may draft at
/// another temperature, as the adaptive walk may draft another length.
fn params_untuned(n_seq: u32) -> llama_spec_dflash2_params {
    llama_spec_dflash2_params { adapt_sampled_drafts: 0, ..params_1t(n_seq) }
}

#[test]
fn the_same_seed_and_calls_give_the_same_output_and_a_cleared_sequence_starts_over() {
    let fx = fixtures();
    let mut target = target_1t(&fx.target, 2);
    let spec = Spec::new(&target, &fx.drafter, params_untuned(2));
    let a = sampled_run(&mut target, &spec, 0, 42, 40);
    // cleared: the generators are seeded again
    assert_eq!(sampled_run(&mut target, &spec, 0, 42, 40), a);
    assert_ne!(sampled_run(&mut target, &spec, 0, 43, 40), a, "another seed, another output");
    // the sequence id is part of the seed
    assert_ne!(sampled_run(&mut target, &spec, 1, 42, 40), a);
    // a new engine, the same calls
    drop(spec);
    let spec = Spec::new(&target, &fx.drafter, params_untuned(2));
    assert_eq!(sampled_run(&mut target, &spec, 0, 42, 40), a);
    assert_eq!(spec.stats().n_tuned_drafts, 0);
}

/// Requests that leave the draft temperature unset get the engine's choice
/// (counted, and a multiple of the request's temperature among the factors
/// scored); a set draft temperature, or tuning off, is never tuned; a new
/// engine with the same calls gives the same output (the choice is
/// deterministic).
#[test]
fn unset_draft_temperatures_are_tuned_and_set_ones_are_not() {
    let fx = fixtures();
    let mut target = target_1t(&fx.target, 1);
    let tuned = |target: &mut Target| {
        let spec = Spec::new(target, &fx.drafter, params_1t(1));
        let out = sampled_run(target, &spec, 0, 7, 60);
        let stats = spec.stats();
        (out, stats.n_tuned_drafts, stats.mean_draft_temperature_ratio)
    };
    let first = tuned(&mut target);
    let (_, n_tuned, r) = first.clone();
    assert!(n_tuned > 10, "{n_tuned}");
    assert!((0.7..=2.0).contains(&r), "mean draft temperature ratio {r}");
    assert_eq!(tuned(&mut target), first, "the same calls, the same choices");
    // tuning off: no tuned draft
    let spec = Spec::new(&target, &fx.drafter, params_untuned(1));
    sampled_run(&mut target, &spec, 0, 7, 20);
    assert_eq!((spec.stats().n_tuned_drafts, spec.stats().mean_draft_temperature_ratio), (0, 0.0));
    drop(spec);
    // a set draft temperature: not tuned
    let spec = Spec::new(&target, &fx.drafter, params_1t(1));
    let prompt = fixture_prompt();
    let rows: Vec<TRow> = prompt
        .iter()
        .enumerate()
        .map(|(i, &token)| TRow { seq: 0, token, pos: i as i32, logits: i + 1 == prompt.len() })
        .collect();
    target.seq_rm(0, -1, -1);
    target.decode(&rows);
    spec.process(&target);
    let req = llama_spec_dflash2_draft_request { draft_temperature: 0.9, ..request(0, prompt[0], 3, 1.0, 1) };
    draft(&spec, req).unwrap();
    assert_eq!(spec.stats().n_tuned_drafts, 0);
}
