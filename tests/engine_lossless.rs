//! Greedy speculative decoding through the C API reproduces target-only greedy
//! decoding exactly.

mod common;

use common::spec::{Spec, default_params, generate, generate_verified, prefill};
use common::target::{Target, greedy_reference};
use common::{fixtures, smollm2};

const N_GEN: usize = 40;

fn fixture_prompts(t: &Target) -> Vec<Vec<i32>> {
    ["the draft model is fast", "one two three", "code: a list of the", "it is not a block but a token and"]
        .iter()
        .map(|p| t.tokenize(p, true))
        .collect()
}

#[test]
fn fixture_pair_single_sequence_is_lossless() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 1, 1024, 512);
    let prompts = fixture_prompts(&target);
    let reference = greedy_reference(&fx.target, &prompts, N_GEN);
    for (prompt, want) in prompts.iter().zip(&reference) {
        let spec = Spec::new(&target, &fx.drafter, default_params(1));
        target.seq_rm(0, -1, -1);
        let mut streams = prefill(&mut target, &spec, std::slice::from_ref(prompt));
        generate(&mut target, &spec, &mut streams, N_GEN, 3);
        assert_eq!(&streams[0].out[..N_GEN], &want[..], "prompt {prompt:?}");
        let st = spec.stats();
        assert!(st.n_drafted > 0, "the engine drafted nothing");
    }
}

#[test]
fn fixture_pair_four_interleaved_sequences_are_lossless() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 4, 2048, 512);
    let prompts = fixture_prompts(&target);
    let reference = greedy_reference(&fx.target, &prompts, N_GEN);
    for drafter in [&fx.drafter, &fx.drafter_swa, &fx.drafter_own_head] {
        target.seq_rm(-1, -1, -1);
        let spec = Spec::new(&target, drafter, default_params(4));
        let mut streams = prefill(&mut target, &spec, &prompts);
        generate(&mut target, &spec, &mut streams, N_GEN, 3);
        for (s, want) in streams.iter().zip(&reference) {
            assert_eq!(&s.out[..N_GEN], &want[..], "{} seq {}", drafter.display(), s.seq);
        }
        // the draft KV holds exactly the committed rows of every sequence
        for s in &streams {
            let info = spec.info(s.seq);
            assert_eq!(info.n_held, 0);
            // every row the target kept (positions 0..n_past), densely
            assert_eq!(info.n_in_kv + info.n_queued, s.n_past, "seq {}", s.seq);
            assert_eq!(info.last_target_pos, s.n_past - 1);
            assert_eq!((info.kv_pos_min, info.kv_pos_max), (0, info.n_in_kv - 1), "seq {}", s.seq);
        }
    }
}

#[test]
fn smollm2_with_a_generated_drafter_is_lossless_on_four_sequences() {
    let target_path = smollm2();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("smol-lossless-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let drafter = dir.join("drafter.gguf");
    dflash2_fixtures::drafter_for_target(&target_path, &drafter, &Default::default()).unwrap();
    let mut target = Target::new(&target_path, 4, 2048, 512);
    let prompts: Vec<Vec<i32>> = [
        "Write a Python function that reverses a string.",
        "What is 17 times 23?",
        "List three colors.",
        "Explain in one sentence why the sky is blue.",
    ]
    .iter()
    .map(|p| target.tokenize(p, false))
    .collect();
    let reference = greedy_reference(&target_path, &prompts, 24);
    let spec = Spec::new(&target, &drafter, default_params(4));
    assert_eq!(spec.n_max(), 7);
    let mut streams = prefill(&mut target, &spec, &prompts);
    generate(&mut target, &spec, &mut streams, 24, 7);
    for (s, want) in streams.iter().zip(&reference) {
        assert_eq!(&s.out[..24], &want[..], "seq {}", s.seq);
    }
}

#[test]
fn the_adaptive_walk_is_lossless_on_four_sequences() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 4, 2048, 512);
    let prompts = fixture_prompts(&target);
    let reference = greedy_reference(&fx.target, &prompts, N_GEN);
    let mut params = default_params(4);
    params.walk = dflash2::ffi::llama_spec_dflash2_walk::LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE as i32;
    let spec = Spec::new(&target, &fx.drafter, params);
    let mut streams = prefill(&mut target, &spec, &prompts);
    generate(&mut target, &spec, &mut streams, N_GEN, 3);
    for (s, want) in streams.iter().zip(&reference) {
        assert_eq!(&s.out[..N_GEN], &want[..], "seq {}", s.seq);
        let info = spec.info(s.seq);
        assert_eq!(info.n_in_kv + info.n_queued, s.n_past, "seq {}", s.seq);
    }
    // it drafts at first (full length until its models are warm)
    assert!(spec.stats().n_drafted > 0);
}

#[test]
fn a_loop_verified_by_the_library_is_lossless_and_counts_verify_steps() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 4, 2048, 512);
    let prompts = fixture_prompts(&target);
    let reference = greedy_reference(&fx.target, &prompts, N_GEN);
    let spec = Spec::new(&target, &fx.drafter, default_params(4));
    let mut streams = prefill(&mut target, &spec, &prompts);
    generate_verified(&mut target, &spec, &mut streams, N_GEN, 3);
    for (s, want) in streams.iter().zip(&reference) {
        assert_eq!(&s.out[..N_GEN], &want[..], "seq {}", s.seq);
        let info = spec.info(s.seq);
        assert_eq!((info.n_held, info.n_outstanding), (0, -1));
        assert_eq!(info.n_in_kv + info.n_queued, s.n_past, "seq {}", s.seq);
    }
    let st = spec.stats();
    // the random drafter drafts every step: one verify step per accept
    assert_eq!(st.n_verify_steps, st.n_accept_calls);
    assert_eq!(st.n_verify_steps, st.n_drafts);
    let tau = (st.n_accepted + st.n_verify_steps) as f64 / st.n_verify_steps as f64;
    assert!((st.tau - tau).abs() < 1e-12, "{} vs {tau}", st.tau);
    assert!(st.tau >= 1.0);
}
