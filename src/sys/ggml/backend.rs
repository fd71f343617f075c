//! ggml backends of devices, their scheduler, and tensors allocated in one
//! backend buffer (weights, KV cache).

use std::ffi::CStr;
use std::ptr::NonNull;

use super::{GraphCtx, Tensor};
use crate::error::{Error, Result};
use crate::sys::*;

type SetThreads = unsafe extern "C" fn(ggml_backend_t, i32);

/// A backend (stream, queue, thread pool) on one device.
pub struct Backend {
    ptr: NonNull<ggml_backend>,
    dev: ggml_backend_dev_t,
    set_threads: Option<SetThreads>,
}

// SAFETY: owned exclusively, used by one thread at a time behind the engine's mutex.
unsafe impl Send for Backend {}

impl Backend {
    /// A backend on `device` (a device of ggml's registry, as every `Device`).
    pub fn new(device: &Device) -> Result<Backend> {
        let dev = device.dev;
        // SAFETY: a live device; the thread setter is looked up by ggml's
        // documented name and has ggml's signature.
        unsafe {
            let ptr = NonNull::new(ggml_backend_dev_init(dev, std::ptr::null())).ok_or_else(|| {
                Error::backend(format!("ggml could not start a backend on device {}", device_name(dev)))
            })?;
            let reg = ggml_backend_dev_backend_reg(dev);
            let f = if reg.is_null() {
                std::ptr::null_mut()
            } else {
                ggml_backend_reg_get_proc_address(reg, c"ggml_backend_set_n_threads".as_ptr())
            };
            let set_threads = (!f.is_null()).then(|| std::mem::transmute::<*mut std::ffi::c_void, SetThreads>(f));
            Ok(Backend { ptr, dev, set_threads })
        }
    }

    /// A backend on ggml's CPU device.
    pub fn cpu() -> Result<Backend> {
        // SAFETY: ggml's registry returns a live device or NULL.
        let dev = unsafe { ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU) };
        if dev.is_null() {
            return Err(Error::backend("ggml has no CPU device"));
        }
        // SAFETY: a live device.
        Backend::new(&unsafe { Device::describe(dev) })
    }

    pub fn device(&self) -> ggml_backend_dev_t {
        self.dev
    }

    /// The backend's device as the placement rules see it.
    pub fn describe(&self) -> Device {
        // SAFETY: the live device of a live backend.
        unsafe { Device::describe(self.dev) }
    }

    /// Threads of a CPU-like backend (others ignore it).
    pub fn set_threads(&self, n: i32) {
        if let Some(f) = self.set_threads {
            // SAFETY: ggml's setter for this backend's registry.
            unsafe { f(self.ptr.as_ptr(), n.max(1)) }
        }
    }

    /// Whether this backend's device can run `op` where it is.
    pub fn supports(&self, op: Tensor<'_>) -> bool {
        // SAFETY: live device and tensor.
        unsafe { ggml_backend_dev_supports_op(self.dev, op.raw()) }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: owned; the scheduler that used it is dropped first (Sched owns both).
        unsafe { ggml_backend_free(self.ptr.as_ptr()) }
    }
}

/// ggml's name of a device.
pub fn device_name(dev: ggml_backend_dev_t) -> String {
    if dev.is_null() {
        return "?".into();
    }
    // SAFETY: a live device returns a static name.
    unsafe {
        let name = ggml_backend_dev_name(dev);
        if name.is_null() { "?".into() } else { CStr::from_ptr(name).to_string_lossy().into_owned() }
    }
}

/// A scheduler over backends (the CPU last): it places each op of a graph
/// on a backend that holds its weights or can run it, allocates the graph's
/// intermediate tensors and runs it.
pub struct Sched {
    sched: NonNull<ggml_backend_sched>,
    // after `sched` in drop order: the scheduler references them
    backends: Vec<Backend>,
}

// SAFETY: owned exclusively, used by one thread at a time behind the engine's mutex.
unsafe impl Send for Sched {}

impl Sched {
    /// A scheduler for graphs of up to `graph_size` nodes. The last backend
    /// must be the CPU's.
    pub fn new(backends: Vec<Backend>, graph_size: usize) -> Result<Sched> {
        let mut raw: Vec<ggml_backend_t> = backends.iter().map(|b| b.ptr.as_ptr()).collect();
        // SAFETY: live backends; NULL buffer types: each backend's default;
        // not parallel (no pipeline copies); ops offloaded where weights are.
        let sched = unsafe {
            ggml_backend_sched_new(raw.as_mut_ptr(), std::ptr::null_mut(), raw.len() as i32, graph_size, false, true)
        };
        let sched = NonNull::new(sched).ok_or_else(|| Error::backend("ggml could not create a scheduler"))?;
        Ok(Sched { sched, backends })
    }

    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// Allocates the compute buffers `graph` needs (the largest graph the
    /// scheduler will run), once.
    pub fn reserve(&mut self, graph: &GraphCtx) -> Result<()> {
        // SAFETY: live scheduler and graph.
        if unsafe { ggml_backend_sched_reserve(self.sched.as_ptr(), graph.raw_graph()) } {
            Ok(())
        } else {
            Err(Error::out_of_memory("ggml could not allocate the draft graph's compute buffers"))
        }
    }

    /// Places and allocates `graph` (after the previous one is done).
    pub fn alloc(&mut self, graph: &GraphCtx) -> Result<()> {
        // SAFETY: live scheduler and graph; reset forgets the previous graph.
        unsafe {
            ggml_backend_sched_reset(self.sched.as_ptr());
            if ggml_backend_sched_alloc_graph(self.sched.as_ptr(), graph.raw_graph()) {
                Ok(())
            } else {
                Err(Error::out_of_memory("ggml could not allocate the draft graph"))
            }
        }
    }

    /// Runs an allocated graph to completion.
    pub fn compute(&mut self, graph: &GraphCtx) -> Result<()> {
        // SAFETY: live scheduler; the graph was allocated by `alloc`.
        let status = unsafe { ggml_backend_sched_graph_compute(self.sched.as_ptr(), graph.raw_graph()) };
        if status == GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(Error::backend(format!("ggml failed to compute the draft graph (status {status})")))
        }
    }

    /// Bytes of the compute buffer on each backend, in backend order.
    pub fn buffer_sizes(&self) -> Vec<usize> {
        self.backends
            .iter()
            // SAFETY: live scheduler and one of its backends.
            .map(|b| unsafe { ggml_backend_sched_get_buffer_size(self.sched.as_ptr(), b.ptr.as_ptr()) })
            .collect()
    }

    /// Graph splits of the last allocated graph (1: all on one backend).
    pub fn n_splits(&self) -> i32 {
        // SAFETY: live scheduler.
        unsafe { ggml_backend_sched_get_n_splits(self.sched.as_ptr()) }
    }

    /// The device the last allocated graph runs `node` on.
    pub fn device_of(&self, node: Tensor<'_>) -> Option<ggml_backend_dev_t> {
        // SAFETY: live scheduler; a node of the allocated graph.
        let b = unsafe { ggml_backend_sched_get_tensor_backend(self.sched.as_ptr(), node.raw()) };
        // SAFETY: a backend of this scheduler.
        (!b.is_null()).then(|| unsafe { ggml_backend_get_device(b) })
    }
}

impl Drop for Sched {
    fn drop(&mut self) {
        // SAFETY: owned; the backends are freed after it (field order).
        unsafe { ggml_backend_sched_free(self.sched.as_ptr()) }
    }
}

/// Tensors allocated together in one buffer of one device's buffer type.
pub struct TensorStore {
    ctx: NonNull<ggml_context>,
    buffer: Option<NonNull<ggml_backend_buffer>>,
    capacity: usize,
    tensors: Vec<NonNull<ggml_tensor>>,
}

// SAFETY: owned exclusively, used by one thread at a time behind the engine's mutex.
unsafe impl Send for TensorStore {}

impl TensorStore {
    /// A store for up to `capacity` tensors (metadata now, memory at `allocate`).
    pub fn new(capacity: usize) -> Result<TensorStore> {
        // SAFETY: plain size query, then ggml_init with its own small pool.
        let ctx = unsafe {
            ggml_init(ggml_init_params {
                mem_size: ggml_tensor_overhead() * capacity.max(1),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            })
        };
        let ctx = NonNull::new(ctx).ok_or_else(|| Error::out_of_memory("ggml could not create a tensor context"))?;
        Ok(TensorStore { ctx, buffer: None, capacity: capacity.max(1), tensors: Vec::new() })
    }

    /// Declares a tensor (allocated by `allocate`); returns its index.
    pub fn add(&mut self, name: &str, ty: ggml_type, ne: &[i64]) -> Result<usize> {
        if self.buffer.is_some() || self.tensors.len() >= self.capacity || ne.is_empty() || ne.len() > 4 {
            return Err(Error::internal(format!("tensor store cannot take '{name}'")));
        }
        if !super::is_known_type(ty) || ne.iter().any(|&n| n <= 0) || ne[0] % super::block_size(ty) != 0 {
            return Err(Error::invalid(format!("tensor '{name}': ggml type {ty} with shape {ne:?}")));
        }
        let mut full = [1i64; 4];
        full[..ne.len()].copy_from_slice(ne);
        // SAFETY: live context with room (counted); the shape is valid for the type.
        let t = unsafe { ggml_new_tensor(self.ctx.as_ptr(), ty, ne.len() as i32, full.as_ptr()) };
        let t = NonNull::new(t).ok_or_else(|| Error::out_of_memory(format!("tensor '{name}'")))?;
        let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(63).collect();
        bytes.push(0);
        // SAFETY: live tensor, NUL-terminated name.
        unsafe { ggml_set_name(t.as_ptr(), bytes.as_ptr().cast()) };
        self.tensors.push(t);
        Ok(self.tensors.len() - 1)
    }

    /// The tensor `add` returned `i` for.
    pub fn get(&self, i: usize) -> Tensor<'_> {
        // SAFETY: a tensor of this store's context, live as long as the store.
        unsafe { Tensor::from_raw(self.tensors[i].as_ptr()) }
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Bytes `allocate` would take on `device`'s buffer type.
    pub fn size_on(&self, device: &Device) -> usize {
        // SAFETY: live context and device (a Device is one of ggml's registry).
        unsafe {
            ggml_backend_alloc_ctx_tensors_from_buft_size(self.ctx.as_ptr(), ggml_backend_dev_buffer_type(device.dev))
        }
    }

    /// Allocates every declared tensor in one buffer of `device`'s buffer type.
    pub fn allocate(&mut self, device: &Device, weights: bool) -> Result<()> {
        let dev = device.dev;
        if self.buffer.is_some() || self.tensors.is_empty() {
            return Ok(());
        }
        // SAFETY: live context and device; the buffer owns the memory of the
        // context's tensors until freed in Drop.
        unsafe {
            let buft = ggml_backend_dev_buffer_type(dev);
            let buffer = ggml_backend_alloc_ctx_tensors_from_buft(self.ctx.as_ptr(), buft);
            let buffer = NonNull::new(buffer).ok_or_else(|| {
                Error::out_of_memory(format!(
                    "could not allocate {} bytes on {} for the drafter",
                    self.size_on(device),
                    device.name
                ))
            })?;
            if weights {
                ggml_backend_buffer_set_usage(buffer.as_ptr(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            }
            self.buffer = Some(buffer);
        }
        Ok(())
    }

    /// Bytes of the allocated buffer (0 before `allocate`).
    pub fn allocated_bytes(&self) -> usize {
        // SAFETY: the live buffer.
        self.buffer.map_or(0, |b| unsafe { ggml_backend_buffer_get_size(b.as_ptr()) })
    }

    /// Sets every byte of the buffer to `value`.
    pub fn clear(&self, value: u8) {
        if let Some(b) = self.buffer {
            // SAFETY: the live buffer.
            unsafe { ggml_backend_buffer_clear(b.as_ptr(), value) }
        }
    }
}

impl Drop for TensorStore {
    fn drop(&mut self) {
        // SAFETY: owned buffer and context; graphs that used the tensors are gone
        // (the drafter drops its scheduler and graphs first).
        unsafe {
            if let Some(b) = self.buffer {
                ggml_backend_buffer_free(b.as_ptr());
            }
            ggml_free(self.ctx.as_ptr());
        }
    }
}
