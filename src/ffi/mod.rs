//! The exported `llama_spec_dflash2_*` functions. Each one has the same shape
//! (`boundary`): its pointers read and checked there, its body run inside
//! `catch_unwind` (no panic crosses into C), failures reported as a negative
//! status plus a message for `llama_spec_dflash2_last_error()`.
//!
//! `unsafe` is allowed here and in `sys` only; it is written in `boundary`
//! (pointer arguments, the handle) and `log` (the host's callback).
#![allow(unsafe_code)]
// The exports are `unsafe extern "C" fn`s whose contract is written for C
// readers in plain sentences in each doc comment ("`rows` must point to
// `n_rows` entries"), which cbindgen copies into dflash2.h; a Rust `# Safety`
// heading would leak into the C header.
#![allow(clippy::missing_safety_doc)]

mod boundary;
mod log;

// In the order of dflash2.h: the library, drafter files, the engine, sampled
// drafts, tree drafts, its sequences, its statistics.
mod library;

mod checkpoint;

mod engine;

mod sampling;

mod tree;
// the target's KV bookkeeping of trees, kept by the engine
mod tree_kv;

mod sequence;

mod stats;

pub use checkpoint::*;
pub use engine::*;
pub use library::*;
pub use sampling::*;
pub use sequence::*;
pub use stats::*;
pub use tree::*;
pub use tree_kv::*;

// The C-visible types and constants defined next to the code that uses them.
pub use crate::error::llama_spec_dflash2_status;
pub use crate::params::{
    LLAMA_SPEC_DFLASH2_MAX_DRAFT, LLAMA_SPEC_DFLASH2_MAX_SEQUENCES, llama_spec_dflash2_draft_graph,
    llama_spec_dflash2_first_child, llama_spec_dflash2_image_rows, llama_spec_dflash2_params, llama_spec_dflash2_walk,
};
