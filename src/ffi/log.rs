//! The host's C log callback as the sink of `crate::log`.

use std::ffi::{CString, c_void};

use crate::log::{Level, Sink, set_sink};
use crate::sys::{GGML_LOG_LEVEL_INFO, GGML_LOG_LEVEL_WARN, ggml_log_callback, ggml_log_level};

struct Callback {
    callback: unsafe extern "C" fn(ggml_log_level, *const std::ffi::c_char, *mut c_void),
    user_data: *mut c_void,
}

// SAFETY: the host promises its callback and user data may be used from any
// thread that calls dflash2, as with llama_log_set.
unsafe impl Send for Callback {}

impl Callback {
    fn call(&self, level: Level, line: &str) {
        let level = match level {
            Level::Info => GGML_LOG_LEVEL_INFO,
            Level::Warn => GGML_LOG_LEVEL_WARN,
        };
        let text = CString::new(line.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the host registered this callback for exactly this use.
        unsafe { (self.callback)(level, text.as_ptr(), self.user_data) }
    }
}

/// Routes dflash2's messages to `callback` (None: back to stderr).
pub(super) fn set_callback(callback: ggml_log_callback, user_data: *mut c_void) {
    let sink = callback.map(|callback| {
        let c = Callback { callback, user_data };
        Box::new(move |level: Level, line: &str| c.call(level, line)) as Sink
    });
    set_sink(sink);
}
