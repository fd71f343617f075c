//! dflash2 from several threads: engines on separate target contexts run
//! concurrently and stay lossless; one engine entered from two threads at once
//! refuses the second caller with LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE (the
//! handle's lock is a try-lock: nothing blocks, nothing is half-done) and stays
//! lossless for the caller that holds it.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::spec::{Spec, default_params, generate, prefill};
use common::target::{TRow, Target, greedy_reference};
use common::{fixtures, last_error, status_code};
use dflash2::ffi::*;

const N_GEN: usize = 32;
const CONTENDED: &str = "another thread is inside a call on this engine";

fn prompts(t: &Target) -> Vec<Vec<i32>> {
    ["the draft model is fast", "one two three", "code: a list of the", "it is not a block but a token and"]
        .iter()
        .map(|p| t.tokenize(p, true))
        .collect()
}

#[test]
fn two_engines_on_two_contexts_run_from_two_threads_at_once_and_stay_lossless() {
    let fx = fixtures();
    let probe = Target::new(&fx.target, 1, 512, 512);
    let prompts = prompts(&probe);
    drop(probe);
    let reference = greedy_reference(&fx.target, &prompts, N_GEN);
    // both threads load, prefill and generate at the same time, several rounds
    // each, with engines created and freed while the other thread decodes
    let start = Barrier::new(2);
    std::thread::scope(|scope| {
        let runs: Vec<_> = [&fx.drafter, &fx.drafter_swa]
            .into_iter()
            .map(|drafter| {
                let (start, prompts, reference) = (&start, &prompts, &reference);
                scope.spawn(move || {
                    let mut target = Target::new(&fx.target, 4, 2048, 512);
                    start.wait();
                    for round in 0..3 {
                        target.seq_rm(-1, -1, -1);
                        let spec = Spec::new(&target, drafter, default_params(4));
                        let mut streams = prefill(&mut target, &spec, prompts);
                        generate(&mut target, &spec, &mut streams, N_GEN, 3);
                        for (s, want) in streams.iter().zip(reference) {
                            assert_eq!(&s.out[..N_GEN], &want[..], "{} round {round} seq {}", drafter.display(), s.seq);
                        }
                        assert!(spec.stats().n_drafted > 0);
                    }
                })
            })
            .collect();
        for r in runs {
            r.join().expect("a generating thread failed");
        }
    });
}

/// A raw engine handle shared with a second thread on purpose.
#[derive(Clone, Copy)]
struct Shared(*mut llama_spec_dflash2);
// SAFETY: the library's handle lock arbitrates the calls; this test checks it.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// Retries a call the other thread's presence refused; returns its status and
/// how many times it was refused. A refusal must carry the contention message.
fn retrying(refusals: &mut u64, mut call: impl FnMut() -> i32) -> i32 {
    loop {
        let rc = call();
        if rc != status_code("INVALID_STATE") || !last_error().contains(CONTENDED) {
            return rc;
        }
        *refusals += 1;
        std::thread::yield_now();
    }
}

#[test]
fn one_engine_called_from_two_threads_refuses_the_second_caller_and_stays_lossless() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 1, 1024, 512);
    let prompt = prompts(&target)[0].clone();
    let want = greedy_reference(&fx.target, std::slice::from_ref(&prompt), N_GEN)[0].clone();
    let spec = Spec::new(&target, &fx.drafter, default_params(1));
    let handle = Shared(spec.0);
    let done = Arc::new(AtomicBool::new(false));

    // the intruder: queries the engine as fast as it can while the owner generates
    let intruder = {
        let done = done.clone();
        std::thread::spawn(move || {
            let h = handle;
            let (mut ok, mut refused) = (0u64, 0u64);
            while !done.load(Ordering::Acquire) {
                let mut info = std::mem::MaybeUninit::<llama_spec_dflash2_seq_info>::zeroed();
                let mut stats = std::mem::MaybeUninit::<llama_spec_dflash2_stats>::zeroed();
                let (info, stats) = (info.as_mut_ptr(), stats.as_mut_ptr());
                let calls: [&dyn Fn() -> i32; 2] =
                    [&|| unsafe { llama_spec_dflash2_seq_info(h.0, 0, info) }, &|| unsafe {
                        llama_spec_dflash2_get_stats(h.0, stats)
                    }];
                for call in calls {
                    // the status and this thread's message of the same call
                    let rc = call();
                    if rc == 0 {
                        ok += 1;
                    } else {
                        assert_eq!(rc, status_code("INVALID_STATE"), "{}", last_error());
                        assert!(last_error().contains(CONTENDED), "{}", last_error());
                        refused += 1;
                    }
                }
            }
            (ok, refused)
        })
    };

    // the owner: a greedy loop through the raw API, retrying refused calls
    let mut owner_refusals = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut out = Vec::new();
    for round in 0.. {
        target.seq_rm(0, -1, -1);
        assert_eq!(retrying(&mut owner_refusals, || unsafe { llama_spec_dflash2_seq_clear(handle.0, 0) }), 0);
        let rows: Vec<TRow> = prompt
            .iter()
            .enumerate()
            .map(|(i, &token)| TRow { seq: 0, token, pos: i as i32, logits: i + 1 == prompt.len() })
            .collect();
        let mut id_last = target.decode(&rows)[0];
        process(&target, handle, &mut owner_refusals);
        let mut n_past = prompt.len() as i32;
        out = vec![id_last];
        while out.len() < N_GEN {
            let req = llama_spec_dflash2_draft_request { seq_id: 0, id_last, n_max: 3, ..Default::default() };
            let mut draft = [0i32; 3];
            let mut n = 0i32;
            let rc = retrying(&mut owner_refusals, || unsafe {
                llama_spec_dflash2_draft(handle.0, &req, 1, draft.as_mut_ptr(), 3, &mut n)
            });
            assert_eq!(rc, 0, "draft: {}", last_error());
            let mut rows = vec![TRow { seq: 0, token: id_last, pos: n_past, logits: true }];
            for (j, &t) in draft[..n as usize].iter().enumerate() {
                rows.push(TRow { seq: 0, token: t, pos: n_past + 1 + j as i32, logits: true });
            }
            let verdicts = target.decode(&rows);
            process(&target, handle, &mut owner_refusals);
            let n_acc = draft[..n as usize].iter().zip(&verdicts).take_while(|(d, v)| d == v).count();
            let rc = retrying(&mut owner_refusals, || unsafe { llama_spec_dflash2_accept(handle.0, 0, n_acc as i32) });
            assert_eq!(rc, 0, "accept: {}", last_error());
            out.extend_from_slice(&verdicts[..=n_acc]);
            n_past += n_acc as i32 + 1;
            target.seq_rm(0, n_past, -1);
            let rc = retrying(&mut owner_refusals, || unsafe { llama_spec_dflash2_seq_rm(handle.0, 0, n_past, -1) });
            assert_eq!(rc, 0, "seq_rm: {}", last_error());
            id_last = verdicts[n_acc];
        }
        assert_eq!(&out[..N_GEN], &want[..], "round {round}");
        // enough rounds for the two threads to have met, within a bound
        if (round >= 2 && owner_refusals > 0) || Instant::now() > deadline {
            break;
        }
    }
    done.store(true, Ordering::Release);
    let (ok, refused) = intruder.join().expect("the intruder thread failed");
    eprintln!("owner refused {owner_refusals} times; intruder: {ok} calls served, {refused} refused");
    assert!(ok > 0, "the intruder was never served");
    assert!(refused + owner_refusals > 0, "the two threads never met inside the engine");
    assert_eq!(&out[..N_GEN], &want[..]);
    // once alone again, the engine answers every call
    assert_eq!(spec.info(0).n_held, 0);
}

fn process(target: &Target, h: Shared, refusals: &mut u64) {
    let rows: Vec<llama_spec_dflash2_row> = target
        .last_rows
        .iter()
        .enumerate()
        .map(|(i, r)| llama_spec_dflash2_row { i_batch: i as i32, seq_id: r.seq, pos: r.pos, embd: r.embd })
        .collect();
    let rc = retrying(refusals, || unsafe { llama_spec_dflash2_process(h.0, rows.as_ptr(), rows.len() as i32) });
    assert_eq!(rc, 0, "process: {}", last_error());
}
