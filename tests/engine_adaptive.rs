//! The adaptive walk's controller on the real SmolLM2 pair: where drafting
//! pays it drafts for every sequence and keeps drafting; where it cannot pay it
//! stops; outputs equal target-only's either way.
//!
//! "Pays" needs a target whose decode hardly depends on its rows (a big target
//! on a GPU). The target here is SmolLM2-135M on the CPU with every decode
//! padded to a fixed time (`Target::min_decode`): verify rows become nearly
//! free against the draft decode, as with a big memory-bound target. The
//! padding is a multiple of a one-row decode measured at the start, so that
//! a loaded machine (slower draft decodes) keeps the same proportions.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::smollm2;
use common::spec::{Spec, Verifier, default_params, generate_traced, prefill};
use common::target::{TRow, Target, greedy_reference};
use dflash2::ffi::llama_spec_dflash2_walk;

const PROMPTS: [&str; 2] =
    ["Write a Python function that reverses a string.", "Explain in two sentences why the sky is blue."];

fn drafter(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/models").join(name);
    assert!(p.exists(), "{} is missing: this test needs the shared SmolLM2 drafters", p.display());
    p
}

/// The time of a one-row decode on the target: the fastest of a few, after
/// a few more that warm the context up (then all removed again).
fn one_row_decode(target: &mut Target, token: i32) -> Duration {
    let fastest = (0..8)
        .map(|i| {
            let t = Instant::now();
            target.decode(&[TRow { seq: 0, token, pos: i, logits: true }]);
            t.elapsed()
        })
        .skip(3)
        .min()
        .unwrap();
    target.seq_rm(0, -1, -1);
    fastest
}

/// Generates `n_gen` tokens for both prompts, in parallel, with the adaptive
/// walk, every target decode taking at least `pad` one-row decodes; checks the
/// outputs against target-only's and returns the steps' drafted tokens per
/// sequence.
fn run(drafter: &Path, pad: u32, n_gen: usize) -> Vec<Vec<usize>> {
    let target_path = smollm2();
    let mut target = Target::new(&target_path, 2, 2048, 512);
    let prompts: Vec<Vec<i32>> = PROMPTS.iter().map(|p| target.tokenize(p, false)).collect();
    // a machine loaded by other jobs slows every decode; past 1.5 s a step the test would take too long
    let min_decode = (one_row_decode(&mut target, prompts[0][0]) * pad).min(Duration::from_millis(1500));
    eprintln!("every target decode takes at least {min_decode:?}");
    let reference = greedy_reference(&target_path, &prompts, n_gen);
    let mut params = default_params(2);
    params.walk = llama_spec_dflash2_walk::LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE as i32;
    let spec = Spec::new(&target, drafter, params);
    let mut streams = prefill(&mut target, &spec, &prompts);
    target.min_decode = Some(min_decode);
    let trace = generate_traced(Verifier::Host, &mut target, &spec, &mut streams, n_gen, 7);
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
    let trace = run(&drafter("smollm2-135m-dflash2.gguf"), 30, 32);
    eprintln!("drafted per step: {trace:?}");
    // first a few plain steps (the yardstick) and a probe or two, then every sequence drafts
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
    // the random drafter: nothing is accepted, every draft decode is lost time
    let trace = run(&drafter("smollm2-135m-dflash2-random.gguf"), 12, 40);
    eprintln!("drafted per step: {trace:?}");
    assert!(trace.len() >= 38, "{} steps", trace.len());
    let drafting = trace.iter().filter(|step| step.iter().any(|&n| n > 0)).count();
    assert!(drafting >= 1, "it keeps learning: {trace:?}");
    assert!(drafting <= 4, "drafted in {drafting} of {} steps: {trace:?}", trace.len());
    // the first steps are plain
    assert!(trace[..4].iter().flatten().all(|&n| n == 0), "{trace:?}");
}
