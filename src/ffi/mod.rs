//! The exported `llama_spec_dflash2_*` functions. Each one checks its pointers,
//! runs inside `guard` (no panic crosses into C) and reports failures as a
//! negative status plus a message for `llama_spec_dflash2_last_error()`.

mod checkpoint;
mod guard;
mod library;

pub use checkpoint::*;
pub use library::*;
