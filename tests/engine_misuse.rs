//! Every misuse of the engine API is a clear error that leaves the engine and
//! the host's target as they were.

mod common;

use std::ffi::{CStr, c_char, c_void};
use std::ptr;
use std::sync::Mutex;

use common::spec::{Spec, default_params, prefill};
use common::target::Target;
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
    let target = Target::new(&fx.target, 1, 512, 512);
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

    let req = |seq, id_last, n_max| llama_spec_dflash2_draft_request { seq_id: seq, id_last, n_max };
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
