//! dflash2: DFlash2 speculative decoding for llama.cpp targets, behind a C ABI.
//!
//! A host that decodes its target with libllama hands this library its target
//! context and a DFlash2 drafter GGUF; the library owns the draft context, the
//! dense per-sequence draft positions and the candidate selector. It links the
//! host's own libllama dynamically. The C API is `include/dflash2.h`.
//!
//! `unsafe` lives in `sys` (bindings and the C++ shim) and `ffi` (the exports)
//! only; everything else is safe Rust, and the compiler holds it to that.
#![deny(unsafe_code)]

pub mod adaptive;
/// cbindgen:ignore
pub mod calibration;
pub mod checkpoint;
pub mod config;
/// cbindgen:ignore
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod cuda;
/// cbindgen:ignore
pub mod draft;
/// cbindgen:ignore
pub mod draft_temperature;
pub mod engine;
pub mod error;
pub mod ffi;
pub(crate) mod log;
/// cbindgen:ignore
pub mod ngram;
pub mod params;
pub mod positions;
/// cbindgen:ignore
pub mod sampling;
/// cbindgen:ignore
pub mod selector;
/// cbindgen:ignore
#[doc(hidden)]
#[allow(unsafe_code)]
pub mod sys;
/// cbindgen:ignore
pub mod topk;
/// cbindgen:ignore
pub mod tree;
/// cbindgen:ignore
pub mod truncation;

pub use config::Config;
pub use error::{Error, Result, Status};
pub use params::llama_spec_dflash2_params;
