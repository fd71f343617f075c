//! The exported `llama_spec_dflash2_*` functions. Each one checks its pointers,
//! runs inside `guard` (no panic crosses into C) and reports failures as a
//! negative status plus a message for `llama_spec_dflash2_last_error()`.

mod checkpoint;
mod engine;
mod guard;
mod library;

pub use checkpoint::*;
pub use engine::*;
pub use library::*;

// The C-visible types defined next to the code that uses them.
pub use crate::engine::stats::{LLAMA_SPEC_DFLASH2_MAX_DRAFT, llama_spec_dflash2_stats};
pub use crate::error::llama_spec_dflash2_status;
pub use crate::params::{llama_spec_dflash2_image_rows, llama_spec_dflash2_params, llama_spec_dflash2_walk};
