//! The one shape of every export, and the only place that touches what a C
//! caller hands in. An export runs its body through `status`, `value`,
//! `pointer`, `boolean` or `quiet` (the boundary: the thread's last error is
//! cleared, the body runs inside `catch_unwind`, an error or a caught panic
//! becomes a status code plus a message) and reads each pointer argument
//! through the readers below (the NULL check and the dereference), the engine
//! through `engine_status` / `engine_value` (also the lock).
//!
//! Safety: the readers trust the C contract written in each export's doc in
//! dflash2.h ("`rows` must point to `n_rows` entries", "a handle from
//! llama_spec_dflash2_init", ...). They are reached only from those exports,
//! which are `unsafe extern "C" fn`s: a Rust caller takes on the same contract.

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use parking_lot::Mutex;

use super::engine::llama_spec_dflash2;
use crate::checkpoint::TargetFacts;
use crate::engine::Engine;
use crate::error::{Error, Result, Status};
use crate::sys::{self, TargetContext, ggml_backend_dev_t, llama_context, llama_model};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static LAST_STATUS: Cell<i32> = const { Cell::new(0) };
}

// The thread's last error is reached with `try_with`: a host may call dflash2
// from a thread-exit destructor (freeing an engine held in thread-local
// storage), after this slot is gone; the call must still work, not panic.

fn set_last_error(err: &Error) {
    // interior NULs would truncate the C string; replace them
    let text = CString::new(err.message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = text);
    let _ = LAST_STATUS.try_with(|s| s.set(err.status as i32));
}

/// This thread's last status: 0 when its last dflash2 call succeeded (and once
/// the thread is exiting).
pub(super) fn last_status() -> i32 {
    LAST_STATUS.try_with(Cell::get).unwrap_or(0)
}

/// Pointer to this thread's last error message; valid until the thread's next
/// dflash2 call ("" once the thread is exiting).
pub(super) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.try_with(|e| e.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

fn panic_error(payload: Box<dyn std::any::Any + Send>) -> Error {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    Error::internal(format!("internal error (caught panic): {what}"))
}

/// The boundary: runs `body`; an error or a panic is recorded as the thread's
/// last error and returned.
fn run<T>(body: impl FnOnce() -> Result<T>) -> Result<T> {
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = CString::default());
    let _ = LAST_STATUS.try_with(|s| s.set(0));
    let result = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| Err(panic_error(payload)));
    if let Err(e) = &result {
        set_last_error(e);
    }
    result
}

/// For exports that return a status: 0 or a negative status code.
pub(super) fn status(body: impl FnOnce() -> Result<()>) -> i32 {
    match run(body) {
        Ok(()) => Status::LLAMA_SPEC_DFLASH2_OK as i32,
        Err(e) => e.status as i32,
    }
}

/// For exports that return a count: the value (>= 0) or a negative status code.
pub(super) fn value(body: impl FnOnce() -> Result<i32>) -> i32 {
    run(body).unwrap_or_else(|e| e.status as i32)
}

/// For exports that return a pointer: NULL on error.
pub(super) fn pointer<T>(body: impl FnOnce() -> Result<*mut T>) -> *mut T {
    run(body).unwrap_or(std::ptr::null_mut())
}

/// For exports that answer yes or no: false on error.
pub(super) fn boolean(body: impl FnOnce() -> Result<bool>) -> bool {
    run(body).unwrap_or(false)
}

/// For exports that return nothing: an error is only recorded.
pub(super) fn quiet(body: impl FnOnce() -> Result<()>) {
    let _ = run(body);
}

fn lock<'a>(spec: *mut llama_spec_dflash2) -> Result<parking_lot::MutexGuard<'a, Engine>> {
    // SAFETY: NULL or a live handle from llama_spec_dflash2_init (the C contract).
    let spec = unsafe { spec.as_ref() }.ok_or_else(|| Error::null_argument("spec"))?;
    spec.engine.try_lock().ok_or_else(|| {
        Error::invalid_state("another thread is inside a call on this engine; use one engine per thread at a time")
    })
}

/// For exports on an engine that return a status.
pub(super) fn engine_status(spec: *mut llama_spec_dflash2, body: impl FnOnce(&mut Engine) -> Result<()>) -> i32 {
    status(|| body(&mut *lock(spec)?))
}

/// For exports on an engine that return a count or a negative status.
pub(super) fn engine_value(spec: *mut llama_spec_dflash2, body: impl FnOnce(&mut Engine) -> Result<i32>) -> i32 {
    value(|| body(&mut *lock(spec)?))
}

/// Boxes an engine into the handle C holds.
pub(super) fn new_handle(engine: Engine) -> *mut llama_spec_dflash2 {
    Box::into_raw(Box::new(llama_spec_dflash2 { engine: Mutex::new(engine) }))
}

/// Frees a handle from `new_handle` (NULL is ignored).
pub(super) fn free_handle(spec: *mut llama_spec_dflash2) {
    if !spec.is_null() {
        // SAFETY: a handle from new_handle that the caller gives up (the C contract).
        drop(unsafe { Box::from_raw(spec) });
    }
}

/// A pointer argument to read.
pub(super) fn input<'a, T>(ptr: *const T, name: &str) -> Result<&'a T> {
    // SAFETY: NULL or pointing to a T (the C contract).
    unsafe { ptr.as_ref() }.ok_or_else(|| Error::null_argument(name))
}

/// A pointer argument to write.
pub(super) fn output<'a, T>(ptr: *mut T, name: &str) -> Result<&'a mut T> {
    // SAFETY: NULL or pointing to a writable T (the C contract).
    unsafe { ptr.as_mut() }.ok_or_else(|| Error::null_argument(name))
}

/// An optional pointer argument to write (NULL: nothing to write).
pub(super) fn optional_output<'a, T>(ptr: *mut T) -> Option<&'a mut T> {
    // SAFETY: NULL or pointing to a writable T (the C contract).
    unsafe { ptr.as_mut() }
}

/// `n` entries to read at `ptr` (NULL allowed when `n` is 0).
pub(super) fn slice<'a, T>(ptr: *const T, n: usize, name: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::null_argument(name));
    }
    // SAFETY: non-NULL and readable for n entries (the C contract).
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

/// `n` entries to write at `ptr` (NULL allowed when `n` is 0).
pub(super) fn slice_mut<'a, T>(ptr: *mut T, n: usize, name: &str) -> Result<&'a mut [T]> {
    if n == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(Error::null_argument(name));
    }
    // SAFETY: non-NULL and writable for n entries (the C contract).
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, n) })
}

/// A C count: negative is an error.
pub(super) fn count(n: i32, name: &str) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::invalid(format!("'{name}' count {n} is negative")))
}

/// A NUL-terminated path argument.
pub(super) fn path(ptr: *const c_char, name: &str) -> Result<PathBuf> {
    if ptr.is_null() {
        return Err(Error::null_argument(name));
    }
    // SAFETY: non-NULL and NUL-terminated (the C contract).
    let s = unsafe { CStr::from_ptr(ptr) };
    let s = s.to_str().map_err(|_| Error::invalid(format!("'{name}' is not valid UTF-8")))?;
    if s.is_empty() {
        return Err(Error::invalid(format!("'{name}' is empty")));
    }
    Ok(PathBuf::from(s))
}

/// A NULL-terminated device list (NULL: none named).
pub(super) fn devices(list: *mut ggml_backend_dev_t) -> Result<Option<Vec<ggml_backend_dev_t>>> {
    if list.is_null() {
        return Ok(None);
    }
    const MAX: usize = 256;
    let mut out = Vec::new();
    for i in 0..MAX {
        // SAFETY: a NULL-terminated array (the C contract), read up to its terminator.
        let d = unsafe { *list.add(i) };
        if d.is_null() {
            return Ok(Some(out));
        }
        out.push(d);
    }
    Err(Error::invalid(format!("params.devices has no NULL terminator within {MAX} entries")))
}

/// The host's target context, which outlives the engine (the C contract).
pub(super) fn target_context(ctx: *mut llama_context) -> Result<TargetContext> {
    // SAFETY: NULL or a live context that outlives the engine (the C contract).
    unsafe { TargetContext::from_raw(ctx) }.ok_or_else(|| Error::null_argument("ctx_tgt"))
}

/// What the checks need of a target model (`name` for the NULL error).
pub(super) fn target_model(model: *const llama_model, name: &str) -> Result<TargetFacts> {
    if model.is_null() {
        return Err(Error::null_argument(name));
    }
    // SAFETY: a live model (the C contract).
    Ok(unsafe { sys::target_facts(model) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: the thread's own message, read before the next call.
        unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap().to_string()
    }

    #[test]
    fn a_panic_becomes_an_internal_error_with_its_message() {
        let code = value(|| -> Result<i32> { panic!("boom") });
        assert_eq!(code, Status::LLAMA_SPEC_DFLASH2_ERR_INTERNAL as i32);
        assert!(last_error().contains("boom"));
        assert!(pointer(|| -> Result<*mut u8> { panic!("boom") }).is_null());
    }

    #[test]
    fn success_clears_the_previous_error() {
        status(|| Err(Error::invalid("first")));
        assert_eq!(status(|| Ok(())), 0);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn null_arguments_are_named() {
        assert_eq!(status(|| input::<i32>(std::ptr::null(), "info").map(|_| ())), -1);
        assert!(last_error().contains("'info'"));
        assert_eq!(slice::<i32>(std::ptr::null(), 0, "rows").unwrap().len(), 0);
        assert!(slice::<i32>(std::ptr::null(), 2, "rows").is_err());
    }

    #[test]
    fn calls_from_a_thread_exit_destructor_still_answer() {
        // a host's engine held in thread-local storage is freed when its thread
        // exits, possibly after the last-error slot was destroyed
        struct FreedAtExit;
        impl Drop for FreedAtExit {
            fn drop(&mut self) {
                assert_eq!(status(|| Err(Error::invalid("late"))), -2);
                assert_eq!(status(|| Ok(())), 0);
                // SAFETY: a NUL-terminated string, static or the thread's own.
                assert!(unsafe { CStr::from_ptr(last_error_ptr()) }.to_bytes().len() < 8);
            }
        }
        thread_local! {
            static HELD: RefCell<Option<FreedAtExit>> = const { RefCell::new(None) };
        }
        let t = std::thread::spawn(|| {
            // registered first, so destroyed after LAST_ERROR
            HELD.with(|h| *h.borrow_mut() = Some(FreedAtExit));
            status(|| Err(Error::invalid("early")));
        });
        assert!(t.join().is_ok(), "a dflash2 call from a thread-exit destructor panicked");
    }
}
