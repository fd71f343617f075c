//! Rollback and state: after a partial accept the draft KV holds exactly the
//! accepted rows; seq_rm / seq_cp / seq_shift follow what the target did;
//! a state blob restored into a fresh engine gives the identical next draft.

mod common;

use common::fixtures;
use common::spec::{Spec, Stream, default_params, generate, prefill};
use common::target::{TRow, Target};
use common::{last_error, status_code};
use dflash2::ffi::*;

fn prompt(t: &Target) -> Vec<i32> {
    t.tokenize("the draft model is a fast model of the token list", true)
}

/// Drafts for sequence 0 and decodes the verify batch; returns the draft.
fn draft_and_verify(target: &mut Target, spec: &Spec, s: &Stream) -> Vec<i32> {
    let d = spec
        .draft(&[llama_spec_dflash2_draft_request {
            seq_id: s.seq,
            id_last: s.id_last,
            n_max: 3,
            ..Default::default()
        }])
        .remove(0);
    let mut rows = vec![TRow { seq: s.seq, token: s.id_last, pos: s.n_past, logits: true }];
    rows.extend(d.iter().enumerate().map(|(j, &t)| TRow {
        seq: s.seq,
        token: t,
        pos: s.n_past + 1 + j as i32,
        logits: true,
    }));
    target.decode(&rows);
    spec.process(target);
    d
}

#[test]
fn a_partial_accept_keeps_exactly_the_accepted_rows() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 1, 1024, 512);
    let spec = Spec::new(&target, &fx.drafter, default_params(1));
    let p = prompt(&target);
    let streams = prefill(&mut target, &spec, std::slice::from_ref(&p));
    let n_past = streams[0].n_past;
    let info = spec.info(0);
    assert_eq!(info.n_in_kv + info.n_queued, n_past);

    let d = draft_and_verify(&mut target, &spec, &streams[0]);
    assert_eq!(d.len(), 3, "the random drafter drafts n_max tokens");
    let info = spec.info(0);
    assert_eq!((info.n_held, info.n_outstanding, info.n_in_kv), (4, 3, n_past));
    // the noise block is gone from the draft KV
    assert_eq!(info.kv_pos_max, n_past - 1);

    // the host keeps the anchor and one drafted token: positions n_past, n_past+1
    spec.accept(0, 1);
    spec.seq_rm(0, n_past + 2, -1);
    let info = spec.info(0);
    assert_eq!((info.n_held, info.n_outstanding), (0, -1));
    assert_eq!(info.n_in_kv + info.n_queued, n_past + 2);
    assert_eq!(info.last_target_pos, n_past + 1);
    assert_eq!(spec.stats().n_rejected_rows, 2);

    // the next draft injects the two accepted rows, and only them
    spec.draft(&[llama_spec_dflash2_draft_request { seq_id: 0, id_last: 5, n_max: 3, ..Default::default() }]);
    let info = spec.info(0);
    assert_eq!((info.n_in_kv, info.n_queued), (n_past + 2, 0));
    assert_eq!((info.kv_pos_min, info.kv_pos_max), (0, n_past + 1));
}

/// Generates 12 tokens, applies `mutate` to target and engine alike, generates
/// 12 more; the same target-only run with the same mutation must agree.
fn follows_target<F>(mutate: F)
where
    F: Fn(&mut Target, Option<&Spec>, &mut Vec<Stream>),
{
    let fx = fixtures();
    let p = {
        let t = Target::new(&fx.target, 1, 64, 64);
        prompt(&t)
    };
    let n_seq = 2;

    // target only: n_max-0 loop via the same harness without drafts
    let mut reference = Target::new(&fx.target, n_seq, 2048, 512);
    let mut ref_streams = greedy_streams(&mut reference, &p, 12);
    mutate(&mut reference, None, &mut ref_streams);
    continue_greedy(&mut reference, &mut ref_streams, 24);

    let mut target = Target::new(&fx.target, n_seq, 2048, 512);
    let spec = Spec::new(&target, &fx.drafter, default_params(n_seq));
    let mut streams = prefill(&mut target, &spec, std::slice::from_ref(&p));
    generate(&mut target, &spec, &mut streams, 12, 3);
    for s in &mut streams {
        s.out.truncate(12);
    }
    mutate(&mut target, Some(&spec), &mut streams);
    generate(&mut target, &spec, &mut streams, 24, 3);
    for (s, r) in streams.iter().zip(&ref_streams) {
        assert_eq!(&s.out[..24], &r.out[..24], "seq {}", s.seq);
        let info = spec.info(s.seq);
        assert_eq!(info.n_in_kv + info.n_queued, s.n_past, "seq {}: the engine holds the target's rows", s.seq);
        assert_eq!(info.last_target_pos, s.n_past - 1);
        assert_eq!(info.kv_pos_max, info.n_in_kv - 1, "draft positions stay dense");
    }
}

fn greedy_streams(t: &mut Target, p: &[i32], n: usize) -> Vec<Stream> {
    let rows: Vec<TRow> = p
        .iter()
        .enumerate()
        .map(|(i, &tok)| TRow { seq: 0, token: tok, pos: i as i32, logits: i + 1 == p.len() })
        .collect();
    let first = t.decode(&rows)[0];
    let mut streams = vec![Stream { seq: 0, n_past: p.len() as i32, id_last: first, out: vec![first] }];
    continue_greedy(t, &mut streams, n);
    streams
}

fn continue_greedy(t: &mut Target, streams: &mut [Stream], n: usize) {
    for s in streams.iter_mut() {
        while s.out.len() < n {
            let next = t.decode(&[TRow { seq: s.seq, token: s.id_last, pos: s.n_past, logits: true }])[0];
            s.n_past += 1;
            s.id_last = next;
            s.out.push(next);
        }
    }
}

/// Applies a memory operation to the target and, when present, the engine.
fn both(t: &mut Target, spec: Option<&Spec>, op: impl Fn(TargetMemory), ours: impl Fn(&Spec)) {
    op(TargetMemory(t.ctx));
    if let Some(s) = spec {
        ours(s);
    }
}

#[derive(Clone, Copy)]
struct TargetMemory(*mut dflash2::sys::llama_context);

impl TargetMemory {
    fn mem(self) -> dflash2::sys::llama_memory_t {
        unsafe { dflash2::sys::llama_get_memory(self.0) }
    }
}

#[test]
fn a_context_shift_is_followed() {
    // llama-server's context shift: drop [keep, keep + n_discard), move the rest down
    follows_target(|t, spec, streams| {
        let (keep, discard) = (4, 6);
        both(
            t,
            spec,
            |m| unsafe {
                assert!(dflash2::sys::llama_memory_seq_rm(m.mem(), 0, keep, keep + discard));
                dflash2::sys::llama_memory_seq_add(m.mem(), 0, keep + discard, -1, -discard);
            },
            |s| unsafe {
                assert_eq!(llama_spec_dflash2_seq_rm(s.0, 0, keep, keep + discard), 0, "{}", last_error());
                assert_eq!(llama_spec_dflash2_seq_shift(s.0, 0, keep + discard, -1, -discard), 0, "{}", last_error());
            },
        );
        streams[0].n_past -= discard;
    });
}

#[test]
fn a_sequence_copy_is_followed() {
    // n_cmpl > 1: sequence 1 continues from a copy of sequence 0
    follows_target(|t, spec, streams| {
        both(
            t,
            spec,
            |m| unsafe {
                dflash2::sys::llama_memory_seq_rm(m.mem(), 1, -1, -1);
                dflash2::sys::llama_memory_seq_cp(m.mem(), 0, 1, -1, -1);
            },
            |s| unsafe {
                assert_eq!(llama_spec_dflash2_seq_cp(s.0, 0, 1, -1, -1), 0, "{}", last_error());
            },
        );
        let copy =
            Stream { seq: 1, n_past: streams[0].n_past, id_last: streams[0].id_last, out: streams[0].out.clone() };
        streams.push(copy);
    });
}

fn blob(spec: &Spec, seq: i32) -> Vec<u8> {
    let mut size = 0usize;
    assert_eq!(unsafe { llama_spec_dflash2_state_size(spec.0, seq, &mut size) }, 0, "{}", last_error());
    let mut buf = vec![0u8; size];
    let mut written = 0usize;
    let rc = unsafe { llama_spec_dflash2_state_get(spec.0, seq, buf.as_mut_ptr(), buf.len(), &mut written) };
    assert_eq!(rc, 0, "{}", last_error());
    buf.truncate(written);
    buf
}

#[test]
fn a_restored_state_gives_the_identical_next_draft() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 1, 1024, 512);
    let spec = Spec::new(&target, &fx.drafter, default_params(1));
    let p = prompt(&target);
    let mut streams = prefill(&mut target, &spec, std::slice::from_ref(&p));
    let small = blob(&spec, 0).len();
    generate(&mut target, &spec, &mut streams, 20, 3);
    let saved = blob(&spec, 0);
    assert!(saved.len() > small, "the blob grows with the sequence: {} -> {}", small, saved.len());
    let id_last = streams[0].id_last;
    let next = spec.draft(&[llama_spec_dflash2_draft_request { seq_id: 0, id_last, n_max: 3, ..Default::default() }]);

    // a fresh engine on a fresh target context, larger, with nothing decoded
    let target2 = Target::new(&fx.target, 1, 4096, 512);
    let spec2 = Spec::new(&target2, &fx.drafter, default_params(1));
    let rc = unsafe { llama_spec_dflash2_state_set(spec2.0, 0, saved.as_ptr(), saved.len()) };
    assert_eq!(rc, 0, "{}", last_error());
    assert_eq!(spec2.info(0).n_in_kv + spec2.info(0).n_queued, streams[0].n_past);
    assert_eq!(blob(&spec2, 0).len(), saved.len(), "the blob size does not follow the context size");
    let next2 = spec2.draft(&[llama_spec_dflash2_draft_request { seq_id: 0, id_last, n_max: 3, ..Default::default() }]);
    assert_eq!(next, next2);
}

#[test]
fn bad_state_blobs_are_refused_and_change_nothing() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 1, 1024, 512);
    let spec = Spec::new(&target, &fx.drafter, default_params(1));
    let p = prompt(&target);
    let streams = prefill(&mut target, &spec, std::slice::from_ref(&p));
    let good = blob(&spec, 0);
    let before = spec.info(0);

    let set = |b: &[u8]| unsafe { llama_spec_dflash2_state_set(spec.0, 0, b.as_ptr(), b.len()) };
    assert_eq!(set(&good[..good.len() / 2]), status_code("INVALID_ARGUMENT"));
    let mut flipped = good.clone();
    flipped[0] ^= 0xff;
    assert_eq!(set(&flipped), status_code("INVALID_ARGUMENT"));
    assert!(last_error().contains("magic"));
    assert_eq!(spec.info(0), before);

    // a blob from another drafter
    let other_target = Target::new(&fx.target, 1, 1024, 512);
    let other = Spec::new(&other_target, &fx.drafter_swa, default_params(1));
    let other_blob = blob(&other, 0);
    assert_eq!(set(&other_blob), status_code("INCOMPATIBLE"));
    assert_eq!(spec.info(0), before);

    // too small a buffer
    let mut small = vec![0u8; 8];
    let mut written = 0usize;
    let rc = unsafe { llama_spec_dflash2_state_get(spec.0, 0, small.as_mut_ptr(), small.len(), &mut written) };
    assert_eq!(rc, status_code("BUFFER_TOO_SMALL"));

    // verify rows awaiting accept cannot be saved
    draft_and_verify(&mut target, &spec, &streams[0]);
    let mut size = 0usize;
    assert_eq!(unsafe { llama_spec_dflash2_state_size(spec.0, 0, &mut size) }, status_code("INVALID_STATE"));
    assert!(last_error().contains("accept"));
    drop(other);
}
