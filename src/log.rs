//! Where dflash2's messages go: a sink the host set (through
//! llama_spec_dflash2_log_set, which wraps its C callback in `ffi::log`), else stderr.

use parking_lot::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

/// Receives each message as one line, newline included.
pub type Sink = Box<dyn Fn(Level, &str) + Send>;

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

/// Routes messages to `sink` (None restores stderr).
pub fn set_sink(sink: Option<Sink>) {
    *SINK.lock() = sink;
}

fn emit(level: Level, message: &str) {
    let line = format!("dflash2: {message}\n");
    match SINK.lock().as_ref() {
        Some(sink) => sink(level, &line),
        None => eprint!("{line}"),
    }
}

pub fn warn(message: &str) {
    emit(Level::Warn, message);
}

pub fn info(message: &str) {
    emit(Level::Info, message);
}
