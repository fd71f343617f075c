//! GGUF files, read and written without trusting the file.
//!
//! The reader works over a byte slice (usually a memory map) and checks every
//! count, length and offset against the bytes that remain before it allocates or
//! indexes anything, so a truncated or hostile header yields an error, never an
//! allocation sized by an unchecked field. The writer exists for test fixtures.

mod ggml_type;
mod reader;
mod value;
mod writer;

pub use ggml_type::{GgmlType, all_ggml_types, ggml_type_from_id};
pub use reader::{Gguf, GgufError, TensorInfo, read};
pub use value::{Value, ValueType};
pub use writer::{GgufWriter, TensorData};

/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Most dimensions a ggml tensor has.
pub const MAX_DIMS: usize = 4;
