//! Raw FFI: bindgen's bindings of llama.h (and the ggml parts it needs), the
//! extern "C" shim over the C++-only llama-ext.h, and the few unsafe helpers
//! the safe modules build on. `unsafe` lives here and in `ffi` only.

#[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, unsafe_op_in_unsafe_fn, clippy::all)]
mod bindings {
    include!(concat!(env!("OUT_DIR"), "/llama_bindings.rs"));
}

mod device;
mod draft;
pub mod ggml;
mod head;
pub mod llama_abi;
pub mod llama_check;
mod model;
pub mod split;
mod target;

pub use bindings::*;
pub use device::{Device, DeviceKind, registered_devices};
pub use draft::{Batch, ContextSetup, DraftContext, DraftModel, MemoryUse, ModelLoad};
pub use head::TargetHead;
pub use model::{TargetFacts, target_facts};
pub use target::{TargetContext, TreeRoom};

// The shim in csrc/llama_ext_shim.cpp; each wrapper catches C++ exceptions.
unsafe extern "C" {
    pub fn dflash2_shim_set_embeddings_nextn(ctx: *mut llama_context, value: bool, masked: bool);
    pub fn dflash2_shim_get_embeddings_nextn(ctx: *mut llama_context) -> *mut f32;
    pub fn dflash2_shim_set_embeddings_layer_inp(ctx: *mut llama_context, lid: u32, value: bool);
    pub fn dflash2_shim_get_embeddings_layer_inp(ctx: *mut llama_context, lid: u32) -> *mut f32;
    pub fn dflash2_shim_model_dflash_selector_top_k(model: *const llama_model) -> i32;
    pub fn dflash2_shim_model_n_devices(model: *const llama_model) -> i32;
    pub fn dflash2_shim_model_get_device(model: *const llama_model, i: i32) -> ggml_backend_dev_t;
    pub fn dflash2_shim_model_dev_output(model: *const llama_model) -> ggml_backend_dev_t;
    pub fn dflash2_shim_model_tensors(
        model: *const llama_model,
        name: *const std::ffi::c_char,
        out: *mut *mut ggml_tensor,
        n_out: i32,
    ) -> i32;
    pub fn dflash2_shim_model_tensor_at(
        model: *const llama_model,
        i: i32,
        name: *mut *const std::ffi::c_char,
    ) -> *mut ggml_tensor;
    pub fn dflash2_shim_memory_breakdown(
        ctx: *const llama_context,
        dev: ggml_backend_dev_t,
        model: *mut usize,
        context: *mut usize,
        compute: *mut usize,
    ) -> bool;
}

/// Maps a file read-only.
pub fn map_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and its users only read through bounds-checked
    // slices; a file truncated by another process while mapped is outside what a
    // reader can defend against.
    unsafe { memmap2::Mmap::map(file) }
}
