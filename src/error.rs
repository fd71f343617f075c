//! Status codes of the C API and the error type behind them.

use std::ffi::CStr;
use std::fmt;

/// Result of every fallible `llama_spec_dflash2_*` call: 0 on success, negative
/// on error. The message of the last error on the calling thread is returned by
/// `llama_spec_dflash2_last_error()`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum llama_spec_dflash2_status {
    LLAMA_SPEC_DFLASH2_OK = 0,
    /// A required pointer argument was NULL.
    LLAMA_SPEC_DFLASH2_ERR_NULL_ARGUMENT = -1,
    /// An argument is out of range or inconsistent (bad params, n_max <= 0, ...).
    LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT = -2,
    /// An output buffer is smaller than the result; the call changed nothing.
    LLAMA_SPEC_DFLASH2_ERR_BUFFER_TOO_SMALL = -3,
    /// The call is not valid now (wrong call order, e.g. accept without a draft).
    LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE = -4,
    /// The sequence id is outside 0..n_seq.
    LLAMA_SPEC_DFLASH2_ERR_UNKNOWN_SEQUENCE = -5,
    /// A file could not be opened or read.
    LLAMA_SPEC_DFLASH2_ERR_IO = -6,
    /// The file is not a valid DFlash2 checkpoint (corrupt, truncated, wrong keys or tensors).
    LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT = -7,
    /// The drafter does not fit the target (n_embd, vocab, tap layers, devices).
    LLAMA_SPEC_DFLASH2_ERR_INCOMPATIBLE = -8,
    /// The target or configuration needs something libllama cannot do.
    LLAMA_SPEC_DFLASH2_ERR_UNSUPPORTED = -9,
    /// A libllama call failed (model load, context creation, decode).
    LLAMA_SPEC_DFLASH2_ERR_BACKEND = -10,
    /// The device the drafter goes on reports less free memory than the drafter
    /// needs (the message gives both); nothing was allocated.
    LLAMA_SPEC_DFLASH2_ERR_OUT_OF_MEMORY = -11,
    /// The libllama / ggml this process loaded are not the llama.cpp build
    /// dflash2 was built against (another version, or params structs of
    /// another layout); the message names both builds and the loaded files.
    LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH = -12,
    /// A bug in dflash2: a panic was caught at the C boundary.
    LLAMA_SPEC_DFLASH2_ERR_INTERNAL = -99,
}

pub use llama_spec_dflash2_status as Status;

impl Status {
    /// A short name, as C sees it (static storage).
    pub fn c_name(self) -> &'static CStr {
        use Status::*;
        match self {
            LLAMA_SPEC_DFLASH2_OK => c"ok",
            LLAMA_SPEC_DFLASH2_ERR_NULL_ARGUMENT => c"null argument",
            LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT => c"invalid argument",
            LLAMA_SPEC_DFLASH2_ERR_BUFFER_TOO_SMALL => c"buffer too small",
            LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE => c"invalid state",
            LLAMA_SPEC_DFLASH2_ERR_UNKNOWN_SEQUENCE => c"unknown sequence",
            LLAMA_SPEC_DFLASH2_ERR_IO => c"i/o error",
            LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT => c"bad checkpoint",
            LLAMA_SPEC_DFLASH2_ERR_INCOMPATIBLE => c"incompatible drafter",
            LLAMA_SPEC_DFLASH2_ERR_UNSUPPORTED => c"unsupported",
            LLAMA_SPEC_DFLASH2_ERR_BACKEND => c"backend error",
            LLAMA_SPEC_DFLASH2_ERR_OUT_OF_MEMORY => c"out of device memory",
            LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH => c"llama.cpp mismatch",
            LLAMA_SPEC_DFLASH2_ERR_INTERNAL => c"internal error",
        }
    }

    pub fn name(self) -> &'static str {
        self.c_name().to_str().expect("names are ASCII")
    }

    pub fn from_code(code: i32) -> Option<Status> {
        use Status::*;
        [
            LLAMA_SPEC_DFLASH2_OK,
            LLAMA_SPEC_DFLASH2_ERR_NULL_ARGUMENT,
            LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT,
            LLAMA_SPEC_DFLASH2_ERR_BUFFER_TOO_SMALL,
            LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE,
            LLAMA_SPEC_DFLASH2_ERR_UNKNOWN_SEQUENCE,
            LLAMA_SPEC_DFLASH2_ERR_IO,
            LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT,
            LLAMA_SPEC_DFLASH2_ERR_INCOMPATIBLE,
            LLAMA_SPEC_DFLASH2_ERR_UNSUPPORTED,
            LLAMA_SPEC_DFLASH2_ERR_BACKEND,
            LLAMA_SPEC_DFLASH2_ERR_OUT_OF_MEMORY,
            LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH,
            LLAMA_SPEC_DFLASH2_ERR_INTERNAL,
        ]
        .into_iter()
        .find(|s| *s as i32 == code)
    }
}

/// An error with the status it maps to at the C boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT, message)
    }

    pub fn bad_checkpoint(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT, message)
    }

    pub fn incompatible(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_INCOMPATIBLE, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_UNSUPPORTED, message)
    }

    pub fn io(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_IO, message)
    }

    pub fn backend(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_BACKEND, message)
    }

    pub fn out_of_memory(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_OUT_OF_MEMORY, message)
    }

    pub fn llama_mismatch(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH, message)
    }

    pub fn invalid_state(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE, message)
    }

    pub fn buffer_too_small(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_BUFFER_TOO_SMALL, message)
    }

    /// A required pointer argument `name` was NULL.
    pub fn null_argument(name: &str) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_NULL_ARGUMENT, format!("'{name}' is NULL"))
    }

    /// Sequence `seq` is not one of the engine's `n_seq` sequences.
    pub fn unknown_sequence(seq: i32, n_seq: usize) -> Error {
        Error::new(
            Status::LLAMA_SPEC_DFLASH2_ERR_UNKNOWN_SEQUENCE,
            format!("sequence {seq} is outside 0..{n_seq} (params.n_seq)"),
        )
    }

    /// A panic caught at the C boundary.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_INTERNAL, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
