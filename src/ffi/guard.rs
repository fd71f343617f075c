//! The shape every export has: clear the thread's last error, run the body
//! inside `catch_unwind`, turn an error or a caught panic into a status code
//! and a message. No panic crosses into C.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{Error, Result, Status};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub fn set_last_error(err: &Error) {
    // interior NULs would truncate the C string; replace them
    let text = err.message.replace('\0', " ");
    let text = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

fn clear_last_error() {
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::default());
}

/// Pointer to this thread's last error message; valid until the thread's next
/// dflash2 call.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> Error {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_INTERNAL, format!("internal error (caught panic): {what}"))
}

/// Runs `body` and returns its result, or `on_error` with the last error set.
pub fn guard<T>(on_error: T, body: impl FnOnce() -> Result<T>) -> (T, i32) {
    clear_last_error();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => (v, Status::LLAMA_SPEC_DFLASH2_OK as i32),
        Ok(Err(e)) => {
            set_last_error(&e);
            (on_error, e.status as i32)
        }
        Err(payload) => {
            let e = panic_message(payload);
            set_last_error(&e);
            (on_error, e.status as i32)
        }
    }
}

/// `guard` for calls that return only a status.
pub fn guard_status(body: impl FnOnce() -> Result<()>) -> i32 {
    guard((), body).1
}

pub fn null_argument(name: &str) -> Error {
    Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_NULL_ARGUMENT, format!("'{name}' is NULL"))
}

/// Reads a C path argument.
///
/// # Safety
/// `ptr` must be NULL or a NUL-terminated string.
pub unsafe fn path_arg(ptr: *const c_char, name: &str) -> Result<std::path::PathBuf> {
    if ptr.is_null() {
        return Err(null_argument(name));
    }
    // SAFETY: non-null and NUL-terminated per the caller.
    let s = unsafe { CStr::from_ptr(ptr) };
    let s = s.to_str().map_err(|_| Error::invalid(format!("'{name}' is not valid UTF-8")))?;
    if s.is_empty() {
        return Err(Error::invalid(format!("'{name}' is empty")));
    }
    Ok(std::path::PathBuf::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_internal_error_with_its_message() {
        let (v, code) = guard(-1, || -> Result<i32> { panic!("boom") });
        assert_eq!((v, code), (-1, Status::LLAMA_SPEC_DFLASH2_ERR_INTERNAL as i32));
        let msg = unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap().to_string();
        assert!(msg.contains("boom"), "{msg}");
    }

    #[test]
    fn success_clears_the_previous_error() {
        guard_status(|| Err(Error::invalid("first")));
        assert_eq!(guard_status(|| Ok(())), 0);
        assert_eq!(unsafe { CStr::from_ptr(last_error_ptr()) }.to_bytes(), b"");
    }
}
