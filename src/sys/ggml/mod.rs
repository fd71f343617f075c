//! Safe handles over the ggml C API of the linked build, for the draft graph
//! the library builds and runs itself (`crate::draft`).
//!
//! - `Tensor<'a>`: a tensor of a ggml context that lives at least for `'a`;
//!   reading and writing its data checks that it is allocated and in bounds.
//! - `GraphCtx`: a context without data (`no_alloc`) and its graph: every op
//!   the drafter's forward uses, as a method.
//! - `TensorStore`: tensors allocated in one backend buffer (weights, KV).
//! - `Backend`, `Sched`: ggml backends of devices and their scheduler.
//!
//! ggml aborts the process on shapes its ops do not accept; the graph code
//! builds its shapes from a checkpoint validated tensor by tensor, and the
//! contexts are sized for every node it can create.

mod backend;
mod graph;
pub mod meta;

use std::marker::PhantomData;
use std::ptr::NonNull;

use super::*;
use crate::error::{Error, Result};

pub use backend::{Backend, Sched, TensorStore};
pub use graph::{GraphCtx, Rope};

/// A tensor of a ggml context that outlives `'a`.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    ptr: NonNull<ggml_tensor>,
    _context: PhantomData<&'a ggml_context>,
}

/// Element types whose bytes ggml reads and writes as they are.
pub trait Plain: Copy {
    const GGML_TYPES: &'static [ggml_type];
}

impl Plain for f32 {
    const GGML_TYPES: &'static [ggml_type] = &[GGML_TYPE_F32];
}
impl Plain for i32 {
    const GGML_TYPES: &'static [ggml_type] = &[GGML_TYPE_I32];
}
impl Plain for i64 {
    const GGML_TYPES: &'static [ggml_type] = &[GGML_TYPE_I64];
}
/// f16 / bf16 bits.
impl Plain for u16 {
    const GGML_TYPES: &'static [ggml_type] = &[GGML_TYPE_F16, GGML_TYPE_BF16];
}
/// Raw bytes of any type.
impl Plain for u8 {
    const GGML_TYPES: &'static [ggml_type] = &[];
}

impl<'a> Tensor<'a> {
    /// # Safety
    /// `ptr` must be a tensor of a context that outlives `'a`.
    pub(crate) unsafe fn from_raw(ptr: *mut ggml_tensor) -> Tensor<'a> {
        Tensor { ptr: NonNull::new(ptr).expect("ggml returned a NULL tensor"), _context: PhantomData }
    }

    /// The address of the tensor's data in its buffer's memory space (a
    /// device pointer on a device buffer), for kernels launched on it.
    #[cfg(feature = "cuda")]
    pub(crate) fn data_addr(&self) -> u64 {
        self.get().data as u64
    }

    /// The raw tensor (for handles that outlive this borrow's scope).
    pub(crate) fn as_ptr(&self) -> *mut ggml_tensor {
        self.ptr.as_ptr()
    }

    fn raw(&self) -> *mut ggml_tensor {
        self.ptr.as_ptr()
    }

    fn get(&self) -> &ggml_tensor {
        // SAFETY: a live tensor for 'a (the type's contract).
        unsafe { self.ptr.as_ref() }
    }

    /// The tensor's name (for messages).
    pub fn name(&self) -> String {
        let name = &self.get().name;
        let bytes: Vec<u8> = name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn ne(&self) -> [i64; 4] {
        self.get().ne
    }

    pub fn nb(&self) -> [usize; 4] {
        self.get().nb
    }

    pub fn ty(&self) -> ggml_type {
        self.get().type_
    }

    pub fn nbytes(&self) -> usize {
        // SAFETY: a live tensor.
        unsafe { ggml_nbytes(self.raw()) }
    }

    pub fn n_elements(&self) -> i64 {
        self.ne().iter().product()
    }

    pub fn is_contiguous(&self) -> bool {
        // SAFETY: a live tensor.
        unsafe { ggml_is_contiguous(self.raw()) }
    }

    /// Whether the tensor has memory (a buffer) to read and write.
    pub fn is_allocated(&self) -> bool {
        !self.get().buffer.is_null()
    }

    /// The device of the buffer that holds the tensor (None: not allocated).
    pub fn device(&self) -> Option<Device> {
        let buffer = self.get().buffer;
        if buffer.is_null() {
            return None;
        }
        // SAFETY: the live buffer of a live tensor; its type's device is live.
        unsafe {
            let dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buffer));
            (!dev.is_null()).then(|| Device::describe(dev))
        }
    }

    /// Whether the tensor's buffer is host memory.
    pub fn in_host_memory(&self) -> bool {
        let buffer = self.get().buffer;
        // SAFETY: the live buffer of a live tensor.
        !buffer.is_null() && unsafe { ggml_backend_buffer_is_host(buffer) }
    }

    fn check_io<T: Plain>(&self, offset: usize, n: usize, what: &str) -> Result<()> {
        if !T::GGML_TYPES.is_empty() && !T::GGML_TYPES.contains(&self.ty()) {
            return Err(Error::internal(format!("{what}: tensor of ggml type {} read as another type", self.ty())));
        }
        let bytes = n * std::mem::size_of::<T>();
        if !self.is_allocated() {
            return Err(Error::internal(format!("{what}: the tensor has no buffer")));
        }
        if offset.checked_add(bytes).is_none_or(|end| end > self.nbytes()) {
            return Err(Error::internal(format!(
                "{what}: {bytes} bytes at {offset} of a tensor of {} bytes",
                self.nbytes()
            )));
        }
        Ok(())
    }

    /// Writes `data` at byte `offset` of the tensor's memory.
    pub fn write<T: Plain>(&self, offset: usize, data: &[T]) -> Result<()> {
        self.check_io::<T>(offset, data.len(), "write")?;
        // SAFETY: allocated, in bounds (checked); data is readable for its length.
        unsafe {
            ggml_backend_tensor_set(self.raw(), data.as_ptr().cast(), offset, std::mem::size_of_val(data));
        }
        Ok(())
    }

    /// Reads `out.len()` elements from byte `offset` of the tensor's memory.
    pub fn read<T: Plain>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        self.check_io::<T>(offset, out.len(), "read")?;
        // SAFETY: allocated, in bounds (checked); out is writable for its length.
        unsafe {
            ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), offset, std::mem::size_of_val(out));
        }
        Ok(())
    }
}

/// Bytes of `n` elements of `ty` in one row (ggml_row_size).
pub fn row_size(ty: ggml_type, n: i64) -> usize {
    // SAFETY: plain arithmetic on the type's traits.
    unsafe { ggml_row_size(ty, n) }
}

/// Elements per quantization block of `ty`.
pub fn block_size(ty: ggml_type) -> i64 {
    // SAFETY: plain query.
    unsafe { ggml_blck_size(ty) }
}

/// Whether `ty` is one of this ggml's types.
pub fn is_known_type(ty: u32) -> bool {
    ty < GGML_TYPE_COUNT
}

/// ggml's name of a type.
pub fn type_name(ty: ggml_type) -> String {
    if !is_known_type(ty) {
        return format!("type {ty}");
    }
    // SAFETY: a valid type returns a static name.
    unsafe {
        let name = ggml_type_name(ty);
        if name.is_null() {
            format!("type {ty}")
        } else {
            std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}

/// Whether ggml stores `ty` in blocks (a quantized type).
pub fn is_quantized(ty: ggml_type) -> bool {
    // SAFETY: plain query.
    is_known_type(ty) && unsafe { ggml_is_quantized(ty) }
}
