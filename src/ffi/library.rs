//! Version, parameters and errors.

use std::ffi::{c_char, c_void};

use crate::sys::llama_check::built;

use super::boundary::{self, input, last_error_ptr, last_status};
use crate::config::Config;
use crate::error::Status;
use crate::params::llama_spec_dflash2_params;

/// Version of the C API in this header. It changes whenever a function or a
/// struct of dflash2.h changes incompatibly; compare it with
/// `llama_spec_dflash2_api_version()` to detect a header/library mismatch.
/// 2: llama_spec_dflash2_stats gained n_verify_steps and tau; a skipped
/// accept() is an error; llama_spec_dflash2_verify_greedy and
/// llama_spec_dflash2_estimate_memory.
/// 3: llama_spec_dflash2_draft_request gained temperature, draft_temperature
/// and seed (sampled drafts; zero = greedy as before, but the struct is larger);
/// llama_spec_dflash2_top_k, _draft_q, _verify_sampled_step, _verify_sampled.
/// 4: llama_spec_dflash2_tree_request gained temperature, draft_temperature
/// and seed (sampled trees; zero = the greedy tree as before, but the struct is
/// larger); llama_spec_dflash2_verify_tree_sampled_step, _verify_tree_sampled.
/// 5: the drafter's default devices are the device of the target's output head
/// (were: every device of the target); params.devices entries must be ggml
/// devices (else _INVALID_ARGUMENT); LLAMA_SPEC_DFLASH2_ERR_OUT_OF_MEMORY when
/// that device reports too little free memory for the drafter;
/// llama_spec_dflash2_last_status (why init returned NULL).
/// 6: n-gram branches in greedy tree drafts: params.ngram_branches (appended;
/// default on), llama_spec_dflash2_process_tokens (the prompt's tokens),
/// process_batch reads batch.token; stats gained n_ngram_nodes,
/// n_ngram_reached, n_ngram_accepted (appended); a tree request's max_depth
/// above n_max lets n-gram branches go that deep (was: capped at n_max).
/// 7: params.first_child (appended): a sampled tree's parents may take q's
/// most probable token as their first child without a draw (default: drawn, as
/// before); n-gram branches join sampled trees too (children taken without a
/// draw), not only greedy ones; state blobs carry the sequence's text (blob
/// version 3: a restored sequence keeps its n-gram branches; older blobs are
/// refused).
/// 8: params.adapt_sampled_drafts (appended; default on): a sampled request
/// that leaves draft_temperature unset gets the engine's choice per request
/// temperature and draft shape (was: the request's temperature), and sampled
/// trees grow by calibrated acceptance (0 keeps both as before, but sampled
/// trees now weigh a sibling by the chance its elder siblings are rejected);
/// stats gained n_tuned_drafts and mean_draft_temperature_ratio (appended);
/// llama_spec_dflash2_draft_request and _tree_request gained top_k, top_p and
/// min_p (appended; zero cuts nothing): q cut like the host sampler's p.
/// 9: params.draft_graph (appended; default own): the library runs the
/// drafter's forward itself (its own weights, draft KV cache and graph on the
/// linked ggml) instead of libllama's dflash graph, and
/// llama_spec_dflash2_draft_graph() says which serves; plain DFlash drafters
/// (no selector) are served (own graph only); state blobs of the own graph hold
/// its own cache format (blob version 4: a blob saved by one graph is refused
/// by an engine on the other, and older blobs are refused).
/// 10: targets split by tensor (-sm tensor) are served: the own draft graph
/// reads the target's head by its per-device vocabulary slices (a partial
/// top-k on each device, merged); stats gained n_noise_decodes,
/// n_head_slices, head_bytes_moved, head_bytes_full_gather and
/// head_bytes_mirrored (appended).
/// 11: LLAMA_SPEC_DFLASH2_CPU_IDENTICAL_N_UBATCH: the target ubatch that keeps
/// T = 0 verification on a CPU target with an f16/f32 cache identical to
/// target-only decoding. (Defaults since, no ABI change: sampled trees of
/// more than 15 nodes draw from the whole q and take q's most probable token
/// as each parent's first child.)
/// 12: the llama.cpp the library was built against (llama_spec_dflash2_llama_built)
/// and the check of the loaded one against it (llama_spec_dflash2_llama_check,
/// also made by init: LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH).
/// 13: the target's KV bookkeeping of tree verification kept by the engine
/// (llama_spec_dflash2_tree_kv_seq_ids, _init, _rows, _commit, _unpark,
/// _parked, _room, _owner): path and park sequence ids, the prefix tagged before the verify
/// decode, the accepted path committed and the step's other cells parked after it.
/// 14: llama_spec_dflash2_tree_kv_pad: the row more that keeps a verify
/// decode's last ubatch off one row over parked cells on a CPU target (T = 0
/// identity), from the engine instead of each host.
pub const LLAMA_SPEC_DFLASH2_API_VERSION: u32 = 14;

/// The C API version the loaded library implements (LLAMA_SPEC_DFLASH2_API_VERSION
/// of the header it was built with).
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_api_version() -> u32 {
    LLAMA_SPEC_DFLASH2_API_VERSION
}

/// The library version, e.g. "0.1.0". Static storage; never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The llama.cpp build the library was built against, as its libraries
/// reported it to the build (static strings, never NULL).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llama_spec_dflash2_llama_build {
    /// llama_version() of that libllama, e.g. "0.5.0-dev".
    pub llama_version: *const c_char,
    /// ggml_version() of its ggml, e.g. "0.25.3".
    pub ggml_version: *const c_char,
    /// ggml_commit(): "unknown" for a llama.cpp built outside a git checkout
    /// (the llama-cpp-python sdists).
    pub ggml_commit: *const c_char,
    /// Where the build came from: "dflash2's pinned build: llama-cpp-python==0.3.36
    /// recipe=3 ..." (scripts/llama-cpp.sh), else "a llama.cpp install prefix".
    pub origin: *const c_char,
    /// Its install prefix on the machine that built the library.
    pub prefix: *const c_char,
    /// All of the above in one line, for a log.
    pub summary: *const c_char,
}

/// The llama.cpp build the library was built against, for a host to print
/// (llama-server logs it and shows it in /props).
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_llama_built() -> llama_spec_dflash2_llama_build {
    llama_spec_dflash2_llama_build {
        llama_version: built::LLAMA_VERSION.as_ptr(),
        ggml_version: built::GGML_VERSION.as_ptr(),
        ggml_commit: built::GGML_COMMIT.as_ptr(),
        origin: built::ORIGIN.as_ptr(),
        prefix: built::PREFIX.as_ptr(),
        summary: built::SUMMARY.as_ptr(),
    }
}

/// Checks that the libllama and ggml this process loaded are the llama.cpp
/// build the library was built against: the same llama_version(),
/// ggml_version() and ggml_commit(), and (on x86-64) the same bytes written by
/// llama_model_default_params() and llama_context_default_params(), which are
/// called with a guarded buffer, so a build whose params structs are larger
/// cannot write past it. llama_spec_dflash2_init makes the same check before
/// it passes any llama.cpp struct; the answer is computed once per process.
/// Returns 0, or LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH with both builds and the
/// loaded files named in llama_spec_dflash2_last_error().
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_llama_check() -> i32 {
    boundary::status(crate::sys::llama_check::check)
}

/// Default engine parameters; change fields, then pass the struct by value.
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_default_params() -> llama_spec_dflash2_params {
    llama_spec_dflash2_params::default()
}

/// Checks the fields of `*params` that do not depend on a drafter.
/// Returns 0, or a negative status with the reason (naming the field) in
/// llama_spec_dflash2_last_error().
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_params_check(params: *const llama_spec_dflash2_params) -> i32 {
    boundary::status(|| Config::from_c(input(params, "params")?, None).map(|_| ()))
}

/// Message of the last error on the calling thread ("" when the thread's last
/// dflash2 call succeeded). Owned by the library, valid until the thread's next
/// dflash2 call; never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_last_error() -> *const c_char {
    last_error_ptr()
}

/// Status of the last dflash2 call on the calling thread: 0 when it succeeded,
/// else the negative status it failed with (what a call that returns a pointer,
/// like llama_spec_dflash2_init, cannot return itself).
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_last_status() -> i32 {
    last_status()
}

/// A short name for a status code ("ok", "bad checkpoint", ...; "unknown status"
/// for codes this library does not return). Static storage; never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_status_name(status: i32) -> *const c_char {
    match Status::from_code(status) {
        Some(s) => s.c_name().as_ptr(),
        None => c"unknown status".as_ptr(),
    }
}

/// Routes dflash2's log messages (warnings such as an n_max clamp, engine
/// creation) to `log_callback`, like llama_log_set; NULL restores stderr. The
/// callback and `user_data` must stay usable from any thread that calls dflash2.
#[unsafe(no_mangle)]
pub extern "C" fn llama_spec_dflash2_log_set(log_callback: crate::sys::ggml_log_callback, user_data: *mut c_void) {
    boundary::quiet(|| {
        super::log::set_callback(log_callback, user_data);
        Ok(())
    });
}
