//! Where dflash2's warnings go: a host-set callback (like llama_log_set), else stderr.

use std::ffi::{CString, c_void};

use parking_lot::Mutex;

use crate::sys::{GGML_LOG_LEVEL_INFO, GGML_LOG_LEVEL_WARN, ggml_log_callback, ggml_log_level};

struct Sink {
    callback: ggml_log_callback,
    user_data: *mut c_void,
}

// SAFETY: the host promises its callback and user data may be used from any
// thread that calls dflash2, as with llama_log_set.
unsafe impl Send for Sink {}

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

/// Routes messages to `callback` (None restores stderr).
pub fn set_callback(callback: ggml_log_callback, user_data: *mut c_void) {
    *SINK.lock() = callback.map(|cb| Sink { callback: Some(cb), user_data });
}

fn emit(level: ggml_log_level, message: &str) {
    let line = format!("dflash2: {message}\n");
    let sink = SINK.lock();
    match sink.as_ref().and_then(|s| s.callback.map(|cb| (cb, s.user_data))) {
        Some((cb, user_data)) => {
            let text = CString::new(line.replace('\0', " ")).unwrap_or_default();
            // SAFETY: the host registered this callback for exactly this use.
            unsafe { cb(level, text.as_ptr(), user_data) }
        }
        None => eprint!("{line}"),
    }
}

pub fn warn(message: &str) {
    emit(GGML_LOG_LEVEL_WARN, message);
}

pub fn info(message: &str) {
    emit(GGML_LOG_LEVEL_INFO, message);
}
