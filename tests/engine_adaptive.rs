//! The adaptive walk's controller on the real SmolLM2 pair: where drafting
//! pays it drafts for every sequence and keeps drafting; where it cannot pay it
//! stops; outputs equal target-only's either way.
//!
//! "Pays" needs a target whose decode hardly depends on its rows (a big target
//! on a GPU). The target here is SmolLM2-135M on the CPU with every decode
//! padded to a fixed time (`Target::min_decode`): verify rows become nearly
//! free against the draft decode, as with a big memory-bound target. The
//! padding is a multiple of a decode of as many rows as the drafts' noise
//! blocks (the drafter is smaller than its target: an upper bound on a draft
//! decode), measured at the start, so that a loaded machine (slower draft
//! decodes) keeps the same proportions. Every context runs on one thread:
//! ggml's threads spin at every barrier, and on a loaded machine two of them
//! make a decode take anything from one to a hundred times its time.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::smollm2;
use common::spec::{Spec, Verifier, default_params, generate_traced, prefill};
use common::target::{TRow, Target};
use dflash2::ffi::llama_spec_dflash2_walk;
use dflash2::sys;

/// Tokens a draft may have (the drafter's block is 8).
const N_MAX: i32 = 7;

const PROMPTS: [&str; 2] =
    ["Write a Python function that reverses a string.", "Explain in two sentences why the sky is blue."];

fn drafter(name: &str) -> PathBuf {
    let p = common::shared_models().join(name);
    assert!(p.exists(), "{} is missing: this test needs the shared SmolLM2 drafters", p.display());
    p
}

/// The time of a decode of `rows` rows (all with logits) on the target: the
/// median of a few, after one that warms the context up (then all removed
/// again).
fn block_decode(target: &mut Target, token: i32, rows: usize) -> Duration {
    let mut times: Vec<Duration> = (0..6)
        .map(|i| {
            let batch: Vec<TRow> =
                (0..rows).map(|j| TRow { seq: 0, token, pos: (i * rows + j) as i32, logits: true }).collect();
            let t = Instant::now();
            target.decode(&batch);
            t.elapsed()
        })
        .skip(1)
        .collect();
    target.seq_rm(0, -1, -1);
    times.sort();
    times[times.len() / 2]
}

/// Target-only greedy outputs, one prompt at a time, on one thread.
fn greedy_reference_1t(path: &Path, prompts: &[Vec<i32>], n_gen: usize) -> Vec<Vec<i32>> {
    prompts
        .iter()
        .map(|prompt| {
            let mut t = Target::new(path, 1, 1024, 512);
            unsafe { sys::llama_set_n_threads(t.ctx, 1, 1) };
            let rows: Vec<TRow> = (0..prompt.len())
                .map(|i| TRow { seq: 0, token: prompt[i], pos: i as i32, logits: i + 1 == prompt.len() })
                .collect();
            let mut out = vec![t.decode(&rows)[0]];
            while out.len() < n_gen {
                let pos = (prompt.len() + out.len() - 1) as i32;
                out.push(t.decode(&[TRow { seq: 0, token: *out.last().unwrap(), pos, logits: true }])[0]);
            }
            out
        })
        .collect()
}

/// Generates `n_gen` tokens for both prompts, in parallel, with the adaptive
/// walk, every target decode taking at least `pad` block decodes; checks the
/// outputs against target-only's and returns the steps' drafted tokens per
/// sequence.
fn run(drafter: &Path, pad: u32, n_gen: usize) -> Vec<Vec<usize>> {
    let target_path = smollm2();
    let mut target = Target::new(&target_path, 2, 2048, 512);
    unsafe { sys::llama_set_n_threads(target.ctx, 1, 1) };
    let prompts: Vec<Vec<i32>> = PROMPTS.iter().map(|p| target.tokenize(p, false)).collect();
    // the noise blocks of both sequences: 2 x (n_max + 1) rows
    let block =
        if pad > 0 { block_decode(&mut target, prompts[0][0], 2 * (N_MAX as usize + 1)) } else { Duration::ZERO };
    // a machine loaded by other jobs slows every decode; past 1.2 s a step the test would take too long
    let min_decode = (block * pad).min(Duration::from_millis(1200));
    eprintln!("a block decode takes {block:?}; every target decode at least {min_decode:?}");
    let reference = greedy_reference_1t(&target_path, &prompts, n_gen);
    let mut params = default_params(2);
    (params.n_threads, params.n_threads_batch) = (1, 1);
    params.walk = llama_spec_dflash2_walk::LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE as i32;
    let spec = Spec::new(&target, drafter, params);
    let mut streams = prefill(&mut target, &spec, &prompts);
    target.min_decode = Some(min_decode);
    let trace = generate_traced(Verifier::Host, &mut target, &spec, &mut streams, n_gen, N_MAX);
    for (s, want) in streams.iter().zip(&reference) {
        assert_eq!(&s.out[..n_gen], &want[..], "seq {}", s.seq);
        let info = spec.info(s.seq);
        assert_eq!(info.n_in_kv + info.n_queued, s.n_past, "seq {}: the draft KV holds the accepted prefix", s.seq);
        assert_eq!(info.n_held, 0);
    }
    trace
}

#[test]
fn where_drafting_pays_the_controller_drafts_for_every_sequence_and_keeps_on() {
    let trace = run(&drafter("smollm2-135m-dflash2.gguf"), 4, 24);
    eprintln!("drafted per step: {trace:?}");
    // first a plain step (the yardstick: a draft decode is cheap here) and
    // probes with a plain step between them, then every sequence drafts
    let late = &trace[8.min(trace.len())..];
    assert!(late.len() >= 6, "{} steps", trace.len());
    let all = late.iter().filter(|step| step.iter().all(|&n| n > 0)).count();
    assert!(all * 10 >= late.len() * 8, "every sequence drafted in {all} of the last {} steps: {trace:?}", late.len());
    // full drafts: verify rows cost next to nothing here
    let longest = trace.iter().flatten().max().copied().unwrap_or(0);
    assert!(longest >= 5, "{trace:?}");
}

#[test]
fn where_drafting_cannot_pay_the_controller_stops() {
    // the random drafter on the target as it is (no padding: a draft block
    // costs several target steps): nothing is accepted, every draft decode is
    // lost time
    let trace = run(&drafter("smollm2-135m-dflash2-random.gguf"), 0, 40);
    eprintln!("drafted per step: {trace:?}");
    assert!(trace.len() >= 38, "{} steps", trace.len());
    let drafting = trace.iter().filter(|step| step.iter().any(|&n| n > 0)).count();
    assert!(drafting >= 1, "it keeps learning: {trace:?}");
    assert!(drafting <= 4, "drafted in {drafting} of {} steps: {trace:?}", trace.len());
    // the first step is plain, a probe times a draft decode (dear here), and
    // plain steps follow until the yardstick has four
    assert!(trace[0].iter().all(|&n| n == 0), "{trace:?}");
    assert_eq!(trace[1].iter().filter(|&&n| n > 0).count(), 1, "{trace:?}");
    assert!(trace[2..5].iter().flatten().all(|&n| n == 0), "{trace:?}");
}
