//! Every misuse of the engine API is a clear error that leaves the engine and
//! the host's target as they were.

mod common;

use std::ffi::{CStr, c_char, c_void};
use std::ptr;
use std::sync::Mutex;

use common::spec::{Spec, Stream, default_params, prefill};
use common::target::{TRow, Target};
use common::{cstr, fixtures, last_error, status_code};
use dflash2::ffi::*;

fn init(
    target: &Target,
    drafter: &std::path::Path,
    params: llama_spec_dflash2_params,
) -> (*mut llama_spec_dflash2, String) {
    let spec = unsafe { llama_spec_dflash2_init(target.ctx, cstr(drafter).as_ptr(), params) };
    (spec, last_error())
}

#[test]
fn init_refuses_bad_drafters_and_params_with_reasons() {
    let fx = fixtures();
    // 4 sequences: the n_ubatch case asks for 4 (more than the target has is its own error)
    let target = Target::new(&fx.target, 4, 2048, 512);
    let by_name =
        |name: &str| fx.broken.iter().find(|b| b.path.ends_with(format!("{name}.gguf"))).unwrap().path.clone();
    let cases: Vec<(std::path::PathBuf, llama_spec_dflash2_params, &str, &str)> = vec![
        (by_name("truncated"), default_params(1), "BAD_CHECKPOINT", "truncated"),
        (by_name("wrong-n-embd"), default_params(1), "INCOMPATIBLE", "n_embd"),
        (by_name("tap-out-of-range"), default_params(1), "INCOMPATIBLE", "layer 4"),
        (by_name("not-dflash"), default_params(1), "BAD_CHECKPOINT", "not a DFlash2 drafter"),
        ("/nonexistent/d.gguf".into(), default_params(1), "IO", "/nonexistent/d.gguf"),
        (
            fx.drafter.clone(),
            llama_spec_dflash2_params { block_size: 9, ..default_params(1) },
            "INVALID_ARGUMENT",
            "trained block size 4",
        ),
        (fx.drafter.clone(), llama_spec_dflash2_params { n_max: 0, ..default_params(1) }, "INVALID_ARGUMENT", "n_max"),
        (fx.drafter.clone(), llama_spec_dflash2_params { n_seq: 0, ..default_params(1) }, "INVALID_ARGUMENT", "n_seq"),
        (
            fx.drafter.clone(),
            llama_spec_dflash2_params { n_ubatch: 7, ..default_params(4) },
            "INVALID_ARGUMENT",
            "n_ubatch",
        ),
    ];
    for (path, params, status, needle) in cases {
        let (spec, msg) = init(&target, &path, params);
        assert!(spec.is_null(), "{} was accepted", path.display());
        assert!(msg.contains(needle), "{}: '{msg}' lacks '{needle}'", path.display());
        let rc = unsafe { llama_spec_dflash2_checkpoint_check(cstr(&path).as_ptr(), target.model.0, ptr::null_mut()) };
        if status != "INVALID_ARGUMENT" {
            assert_eq!(rc, status_code(status), "{}", path.display());
        }
    }
    let null_ctx = unsafe { llama_spec_dflash2_init(ptr::null_mut(), cstr(&fx.drafter).as_ptr(), default_params(1)) };
    assert!(null_ctx.is_null() && last_error().contains("ctx_tgt"));
    let null_path = unsafe { llama_spec_dflash2_init(target.ctx, ptr::null(), default_params(1)) };
    assert!(null_path.is_null() && last_error().contains("path_draft"));
}

static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

unsafe extern "C" fn capture_log(_level: dflash2::sys::ggml_log_level, text: *const c_char, _ud: *mut c_void) {
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned();
    LOG.lock().unwrap().push(text);
}

#[test]
fn n_max_is_clamped_to_the_block_with_a_warning_and_block_size_can_shrink() {
    let fx = fixtures();
    let target = Target::new(&fx.target, 1, 512, 512);
    llama_spec_dflash2_log_set(Some(capture_log), ptr::null_mut());
    let spec = Spec::new(&target, &fx.drafter, llama_spec_dflash2_params { n_max: 100, ..default_params(1) });
    llama_spec_dflash2_log_set(None, ptr::null_mut());
    assert_eq!(spec.n_max(), 3);
    let log = LOG.lock().unwrap().join("");
    assert!(log.contains("n_max 100") && log.contains("clamping n_max to 3"), "{log}");
    // one engine per target context at a time
    drop(spec);

    let small = Spec::new(&target, &fx.drafter, llama_spec_dflash2_params { block_size: 3, ..default_params(1) });
    assert_eq!((small.n_max(), unsafe { llama_spec_dflash2_block_size(small.0) }), (2, 3));
}

#[test]
fn call_order_and_argument_errors_leave_the_engine_unchanged() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 2, 1024, 512);
    let spec = Spec::new(&target, &fx.drafter, default_params(2));
    let row = |seq, i_batch, pos| llama_spec_dflash2_row { i_batch, seq_id: seq, pos, embd: false };

    // nothing decoded yet: reading captured rows would abort libllama
    let rc = unsafe { llama_spec_dflash2_process(spec.0, [row(0, 0, 0)].as_ptr(), 1) };
    assert_eq!(rc, status_code("INVALID_STATE"), "{}", last_error());

    let p = target.tokenize("one two three", true);
    let streams = prefill(&mut target, &spec, std::slice::from_ref(&p));
    let before = spec.info(0);
    let target_pos_max =
        unsafe { dflash2::sys::llama_memory_seq_pos_max(dflash2::sys::llama_get_memory(target.ctx), 0) };

    let process = |rows: &[llama_spec_dflash2_row]| unsafe {
        llama_spec_dflash2_process(spec.0, rows.as_ptr(), rows.len() as i32)
    };
    assert_eq!(process(&[row(0, 0, 0), row(7, 1, 1)]), status_code("UNKNOWN_SEQUENCE"));
    assert!(last_error().contains("sequence 7"));
    assert_eq!(process(&[row(0, 100_000, 0)]), status_code("INVALID_ARGUMENT"));
    assert_eq!(process(&[row(0, 0, -3)]), status_code("INVALID_ARGUMENT"));
    assert_eq!(unsafe { llama_spec_dflash2_process(spec.0, ptr::null(), 2) }, status_code("NULL_ARGUMENT"));
    // process_tokens: NULL tokens means none known; NULL rows with rows to read is refused
    let one = [row(0, 0, 0)];
    assert_eq!(
        unsafe { llama_spec_dflash2_process_tokens(spec.0, ptr::null(), [1].as_ptr(), 1) },
        status_code("NULL_ARGUMENT")
    );
    assert_eq!(
        unsafe { llama_spec_dflash2_process_tokens(spec.0, one.as_ptr(), ptr::null(), -1) },
        status_code("INVALID_ARGUMENT")
    );

    let req =
        |seq, id_last, n_max| llama_spec_dflash2_draft_request { seq_id: seq, id_last, n_max, ..Default::default() };
    let draft = |reqs: &[llama_spec_dflash2_draft_request], cap: usize| {
        let mut tokens = vec![0i32; cap];
        let mut n = vec![0i32; reqs.len()];
        unsafe {
            llama_spec_dflash2_draft(
                spec.0,
                reqs.as_ptr(),
                reqs.len() as i32,
                tokens.as_mut_ptr(),
                cap as i32,
                n.as_mut_ptr(),
            )
        }
    };
    let id = streams[0].id_last;
    assert_eq!(draft(&[req(0, id, 0)], 8), status_code("INVALID_ARGUMENT"));
    assert!(last_error().contains("n_max 0"));
    assert_eq!(draft(&[req(0, id, 3), req(0, id, 3)], 8), status_code("INVALID_ARGUMENT"));
    assert_eq!(draft(&[req(0, 1_000_000, 3)], 8), status_code("INVALID_ARGUMENT"));
    assert_eq!(draft(&[req(5, id, 3)], 8), status_code("UNKNOWN_SEQUENCE"));
    assert_eq!(draft(&[req(0, id, 3), req(1, id, 3)], 5), status_code("BUFFER_TOO_SMALL"));

    let accept = |seq, n| unsafe { llama_spec_dflash2_accept(spec.0, seq, n) };
    assert_eq!(accept(0, 0), status_code("INVALID_STATE"));
    assert!(last_error().contains("no draft"));

    // nothing above changed the engine or the target
    assert_eq!(spec.info(0), before);
    assert_eq!(spec.stats().n_draft_calls, 0);
    let after = unsafe { dflash2::sys::llama_memory_seq_pos_max(dflash2::sys::llama_get_memory(target.ctx), 0) };
    assert_eq!(after, target_pos_max);

    // a real draft, then accept errors
    assert_eq!(draft(&[req(0, id, 3)], 3), 0, "{}", last_error());
    assert_eq!(accept(0, 4), status_code("INVALID_ARGUMENT"));
    assert_eq!(accept(0, 1), status_code("INVALID_STATE"), "the verify rows were never passed to process()");
    assert!(last_error().contains("verify rows"));
    assert_eq!(spec.info(0).n_outstanding, 3);

    let rm = unsafe { llama_spec_dflash2_seq_rm(spec.0, 0, 5, 2) };
    assert_eq!(rm, status_code("INVALID_ARGUMENT"));
    assert_eq!(unsafe { llama_spec_dflash2_seq_cp(spec.0, 0, 9, -1, -1) }, status_code("UNKNOWN_SEQUENCE"));
}

#[test]
fn a_null_engine_is_an_error_everywhere() {
    let null = ptr::null_mut();
    let code = status_code("NULL_ARGUMENT");
    let mut size = 0usize;
    let mut stats = std::mem::MaybeUninit::uninit();
    let mut info = std::mem::MaybeUninit::uninit();
    unsafe {
        assert_eq!(llama_spec_dflash2_process(null, ptr::null(), 0), code);
        assert_eq!(llama_spec_dflash2_process_tokens(null, ptr::null(), ptr::null(), 0), code);
        assert_eq!(llama_spec_dflash2_draft(null, ptr::null(), 0, ptr::null_mut(), 0, ptr::null_mut()), code);
        assert_eq!(llama_spec_dflash2_accept(null, 0, 0), code);
        assert_eq!(llama_spec_dflash2_seq_rm(null, 0, -1, -1), code);
        assert_eq!(llama_spec_dflash2_seq_cp(null, 0, 1, -1, -1), code);
        assert_eq!(llama_spec_dflash2_seq_shift(null, 0, 0, -1, 1), code);
        assert_eq!(llama_spec_dflash2_seq_clear(null, 0), code);
        assert_eq!(llama_spec_dflash2_state_size(null, 0, &mut size), code);
        assert_eq!(llama_spec_dflash2_state_set(null, 0, [0u8].as_ptr(), 1), code);
        assert_eq!(llama_spec_dflash2_n_max(null), code);
        assert_eq!(llama_spec_dflash2_block_size(null), code);
        assert_eq!(llama_spec_dflash2_get_stats(null, stats.as_mut_ptr()), code);
        assert_eq!(llama_spec_dflash2_reset_stats(null), code);
        assert_eq!(llama_spec_dflash2_seq_info(null, 0, info.as_mut_ptr()), code);
        llama_spec_dflash2_free(null);
    }
}

#[test]
fn a_target_that_cannot_capture_layer_inputs_is_refused_before_anything_changes() {
    let fx = fixtures();
    let target = Target::new(&fx.target_without_capture, 1, 512, 512);
    let (spec, msg) = init(&target, &fx.drafter, default_params(1));
    assert!(spec.is_null());
    assert!(msg.contains("'granite'") && msg.contains("layer inputs"), "{msg}");
    let rc =
        unsafe { llama_spec_dflash2_checkpoint_check(cstr(&fx.drafter).as_ptr(), target.model.0, ptr::null_mut()) };
    assert_eq!(rc, status_code("UNSUPPORTED"));
    // the target still decodes: no capture was switched on
    let mut t = target;
    let p = t.tokenize("one two", true);
    let rows: Vec<_> = p
        .iter()
        .enumerate()
        .map(|(i, &tok)| common::target::TRow { seq: 0, token: tok, pos: i as i32, logits: i + 1 == p.len() })
        .collect();
    assert_eq!(t.decode(&rows).len(), 1);
}

/// Drafts up to 3 tokens for stream `s`, decodes its verify batch (logits on
/// the rows `logits` says) and feeds it to the engine: the draft then awaits
/// accept(). Returns the draft.
fn draft_and_verify(target: &mut Target, spec: &Spec, s: &Stream, logits: impl Fn(usize) -> bool) -> Vec<i32> {
    let d = spec
        .draft(&[llama_spec_dflash2_draft_request {
            seq_id: s.seq,
            id_last: s.id_last,
            n_max: 3,
            ..Default::default()
        }])
        .remove(0);
    let mut rows = vec![TRow { seq: s.seq, token: s.id_last, pos: s.n_past, logits: logits(0) }];
    rows.extend(d.iter().enumerate().map(|(j, &t)| TRow {
        seq: s.seq,
        token: t,
        pos: s.n_past + 1 + j as i32,
        logits: logits(j + 1),
    }));
    target.decode(&rows);
    spec.process(target);
    d
}

fn raw_draft(spec: &Spec, s: &Stream) -> i32 {
    let req = llama_spec_dflash2_draft_request { seq_id: s.seq, id_last: s.id_last, n_max: 3, ..Default::default() };
    let (mut tokens, mut n) = ([0i32; 3], [0i32; 1]);
    unsafe { llama_spec_dflash2_draft(spec.0, &req, 1, tokens.as_mut_ptr(), 3, n.as_mut_ptr()) }
}

/// What must not change when a call is refused.
fn snapshot(spec: &Spec) -> (llama_spec_dflash2_seq_info, u64, u64, u64) {
    let st = spec.stats();
    (spec.info(0), st.n_draft_calls, st.n_accept_calls, st.n_injected)
}

#[test]
fn a_skipped_accept_is_an_error_that_changes_nothing() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 1, 1024, 512);
    let spec = Spec::new(&target, &fx.drafter, default_params(1));
    let p = target.tokenize("one two three four", true);
    let streams = prefill(&mut target, &spec, std::slice::from_ref(&p));
    let s = &streams[0];
    let d = draft_and_verify(&mut target, &spec, s, |_| true);
    assert_eq!(d.len(), 3, "the random drafter drafts n_max tokens");
    let before = snapshot(&spec);
    assert_eq!((before.0.n_held, before.0.n_outstanding), (4, 3));

    // the next draft without accept()
    assert_eq!(raw_draft(&spec, s), status_code("INVALID_STATE"));
    assert!(last_error().contains("never accepted") && last_error().contains("accept"), "{}", last_error());
    assert_eq!(snapshot(&spec), before);

    // more rows of the sequence after its whole verify batch
    target.decode(&[TRow { seq: 0, token: d[2], pos: s.n_past + 4, logits: false }]);
    let row = llama_spec_dflash2_row { i_batch: 0, seq_id: 0, pos: s.n_past + 4, embd: false };
    assert_eq!(unsafe { llama_spec_dflash2_process(spec.0, &row, 1) }, status_code("INVALID_STATE"));
    assert!(last_error().contains("accept"), "{}", last_error());
    assert_eq!(snapshot(&spec), before);

    // accept() settles it: the anchor and one token are kept
    spec.accept(0, 1);
    let info = spec.info(0);
    assert_eq!((info.n_held, info.n_outstanding, info.last_target_pos), (0, -1, s.n_past + 1));

    // a row going back without seq_rm
    let before = snapshot(&spec);
    let back = llama_spec_dflash2_row { i_batch: 0, seq_id: 0, pos: s.n_past, embd: false };
    assert_eq!(unsafe { llama_spec_dflash2_process(spec.0, &back, 1) }, status_code("INVALID_STATE"));
    assert!(last_error().contains("seq_rm"), "{}", last_error());
    assert_eq!(snapshot(&spec), before);
    // mirrored rollback first: the same row is taken
    spec.seq_rm(0, s.n_past, -1);
    assert_eq!(unsafe { llama_spec_dflash2_process(spec.0, &back, 1) }, 0, "{}", last_error());
    assert_eq!(spec.info(0).last_target_pos, s.n_past);
}

#[test]
fn zero_length_drafts_take_an_accept_of_0_or_none() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 1, 1024, 512);
    // no lattice softmax reaches 1: every walk stops before its first token
    let spec = Spec::new(&target, &fx.drafter, llama_spec_dflash2_params { p_min: 1.0, ..default_params(1) });
    let p = target.tokenize("one two three four", true);
    let mut streams = prefill(&mut target, &spec, std::slice::from_ref(&p));
    for step in 0..4 {
        let s = &mut streams[0];
        let d = draft_and_verify(&mut target, &spec, s, |_| true);
        assert!(d.is_empty());
        let info = spec.info(0);
        assert_eq!((info.n_outstanding, info.n_held, info.last_target_pos), (0, 0, s.n_past), "committed, not held");
        if step % 2 == 0 {
            spec.accept(0, 0);
            assert_eq!(spec.info(0).n_outstanding, -1);
        }
        s.n_past += 1;
    }
    let st = spec.stats();
    assert_eq!((st.n_draft_calls, st.n_accept_calls, st.n_verify_steps, st.n_drafted), (4, 2, 0, 0));
    assert_eq!(st.tau, 0.0);
}

#[test]
fn greedy_verification_refuses_what_it_cannot_verify_and_changes_nothing() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 2, 1024, 512);
    let spec = Spec::new(&target, &fx.drafter, default_params(2));
    let p = target.tokenize("one two three four", true);
    let streams = prefill(&mut target, &spec, std::slice::from_ref(&p));
    let verify = |seq: i32, rows: &[i32], cap: usize| {
        let mut out = vec![0i32; cap];
        let mut n = -1;
        let rc = unsafe {
            llama_spec_dflash2_verify_greedy(
                spec.0,
                seq,
                rows.as_ptr(),
                rows.len() as i32,
                out.as_mut_ptr(),
                cap as i32,
                &mut n,
            )
        };
        assert_eq!(n, -1, "nothing is written on failure");
        rc
    };
    assert_eq!(verify(0, &[0], 4), status_code("INVALID_STATE"), "no draft yet");

    // the draft is decoded, but only its anchor row asked for logits
    let d = draft_and_verify(&mut target, &spec, &streams[0], |j| j == 0);
    assert_eq!(d.len(), 3);
    let before = snapshot(&spec);
    assert_eq!(verify(0, &[0, 1, 2], 4), status_code("INVALID_ARGUMENT"));
    assert!(last_error().contains("3 rows for a draft of 3 tokens"), "{}", last_error());
    assert_eq!(verify(0, &[0, 1, 2, 3], 3), status_code("BUFFER_TOO_SMALL"));
    assert_eq!(verify(0, &[0, 1, 2, 100_000], 4), status_code("INVALID_ARGUMENT"));
    assert_eq!(verify(0, &[0, 1, 2, 3], 4), status_code("INVALID_ARGUMENT"));
    assert!(last_error().contains("no logits"), "{}", last_error());
    assert_eq!(verify(1, &[0], 4), status_code("INVALID_STATE"), "sequence 1 has no draft");
    let rc = unsafe {
        llama_spec_dflash2_verify_greedy(
            spec.0,
            0,
            [0, 1, 2, 3].as_ptr(),
            4,
            [0i32; 4].as_mut_ptr(),
            4,
            ptr::null_mut(),
        )
    };
    assert_eq!(rc, status_code("NULL_ARGUMENT"));
    assert_eq!(snapshot(&spec), before);
}

#[test]
fn a_rollback_from_the_anchor_on_drops_the_draft() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 1, 1024, 512);
    let spec = Spec::new(&target, &fx.drafter, default_params(1));
    let p = target.tokenize("one two three four", true);
    let streams = prefill(&mut target, &spec, std::slice::from_ref(&p));
    let s = &streams[0];
    // a rollback that keeps the anchor row keeps the draft
    draft_and_verify(&mut target, &spec, s, |_| true);
    spec.seq_rm(0, s.n_past + 2, -1);
    assert_eq!((spec.info(0).n_outstanding, spec.info(0).n_held), (3, 2));
    // one from the anchor on drops it: the next draft needs no accept()
    target.seq_rm(0, s.n_past, -1);
    spec.seq_rm(0, s.n_past, -1);
    let info = spec.info(0);
    assert_eq!((info.n_outstanding, info.n_held, info.last_target_pos), (-1, 0, s.n_past - 1));
    assert_eq!(raw_draft(&spec, s), 0, "{}", last_error());
}
