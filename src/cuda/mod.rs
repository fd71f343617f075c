//! The selector's top-k as a CUDA kernel (`cuda/topk.cu`), compiled with
//! NVRTC and launched through cudarc (crate feature `cuda`). CUDA is loaded
//! at run time: a `cuda` build runs on a machine without a driver, where
//! `TopK::new` says so and the callers keep ggml's top-k.
//!
//! The kernel gives exactly `crate::topk::top_k` (the library's order: ties
//! by token id, NaN last), best first, on logits that stay on the device
//! (`TopK::run_device`: ggml's buffers, no copy to the host).
//!
//! The draft graph launches it on the slices of a head split by tensor that
//! lie on CUDA devices (`crate::draft::slices`: their candidates are merged on
//! the host, the path the CPU slices' own top-k takes too).
//!
//! Status: compiled to PTX in CI (NVRTC from PyPI, no GPU needed); the GPU
//! test (`tests/cuda_topk.rs`, ignored without a device) and the launch on a
//! CUDA build of ggml have not run on a GPU yet.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::error::{Error, Result};
use crate::sys::ggml::Tensor;
use crate::topk::Scored;

/// The kernel's source.
pub const SOURCE: &str = include_str!("../../cuda/topk.cu");
/// Its entry point.
pub const ENTRY: &str = "dflash2_topk_f32";
/// Largest k it takes (its per-thread lists live in registers).
pub const MAX_K: usize = 16;
/// Threads per block (one block per row).
const THREADS: u32 = 256;

/// Whether NVRTC can be loaded (a CUDA toolkit, or PyPI's
/// nvidia-cuda-nvrtc-cu12 on the library path).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether the CUDA driver can be loaded.
pub fn driver_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The kernel compiled to PTX (for `arch`, e.g. "compute_80"; None: NVRTC's
/// default).
pub fn compile_ptx(arch: Option<&'static str>) -> Result<Ptx> {
    if !nvrtc_available() {
        return Err(Error::unsupported("NVRTC (libnvrtc.so) cannot be loaded: no CUDA toolkit on the library path"));
    }
    let opts = CompileOptions { arch, ..CompileOptions::default() };
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts)
        .map_err(|e| Error::backend(format!("NVRTC did not compile cuda/topk.cu: {e:?}")))
}

/// The kernel loaded on one CUDA device.
pub struct TopK {
    stream: Arc<CudaStream>,
    func: CudaFunction,
}

fn driver(e: cudarc::driver::DriverError) -> Error {
    Error::backend(format!("CUDA: {e}"))
}

impl TopK {
    /// Loads the kernel on device `ordinal`; an error when this machine has
    /// no CUDA driver or no such device.
    pub fn new(ordinal: usize) -> Result<TopK> {
        if !driver_available() {
            return Err(Error::unsupported("no CUDA driver (libcuda.so) on this machine"));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let module = ctx.load_module(compile_ptx(None)?).map_err(driver)?;
        let func = module.load_function(ENTRY).map_err(driver)?;
        Ok(TopK { stream: ctx.default_stream(), func })
    }

    /// The top `k` of `rows` rows of `n` logits at device address `logits`,
    /// rows `row_stride` floats apart (ids from `first`), best first: `k`
    /// entries per row, id -1 where a row has fewer than `k`.
    ///
    /// # Safety
    /// `logits` must be device memory of this context holding every row, not
    /// written while the kernel runs (synchronise its producer's stream first).
    pub unsafe fn run_device(
        &self,
        logits: u64,
        rows: usize,
        n: usize,
        row_stride: usize,
        k: usize,
        first: i32,
    ) -> Result<(Vec<i32>, Vec<f32>)> {
        if k == 0 || k > MAX_K || n > i32::MAX as usize || rows > u32::MAX as usize {
            return Err(Error::invalid(format!("top-k of {k} over rows of {n} (the kernel takes k 1..={MAX_K})")));
        }
        if rows == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut ids = self.stream.alloc_zeros::<i32>(rows * k).map_err(driver)?;
        let mut vals = self.stream.alloc_zeros::<f32>(rows * k).map_err(driver)?;
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let (stride, n, k_arg) = (row_stride as i64, n as i32, k as i32);
        let mut launch = self.stream.launch_builder(&self.func);
        launch.arg(&logits).arg(&stride).arg(&n).arg(&k_arg).arg(&first).arg(&mut ids).arg(&mut vals);
        // SAFETY: the kernel's signature (cuda/topk.cu) takes exactly these
        // arguments; its outputs hold rows * k entries; the logits are the
        // caller's contract.
        unsafe { launch.launch(cfg) }.map_err(driver)?;
        let ids = self.stream.clone_dtoh(&ids).map_err(driver)?;
        let vals = self.stream.clone_dtoh(&vals).map_err(driver)?;
        Ok((ids, vals))
    }

    /// `run_device` on a computed output of a ggml graph on this device:
    /// logits [width, rows] (rows `nb[1]` apart) the scheduler computed and
    /// synchronised before its compute returned; ggml's buffer, no copy.
    pub fn run_on_output(&self, logits: Tensor<'_>, rows: usize, k: usize, first: i32) -> Result<(Vec<i32>, Vec<f32>)> {
        if logits.ty() != crate::sys::GGML_TYPE_F32 || !logits.is_allocated() || (logits.ne()[1] as usize) < rows {
            return Err(Error::internal(format!("the CUDA top-k needs {rows} rows of f32 logits")));
        }
        let stride = logits.nb()[1] / std::mem::size_of::<f32>();
        // SAFETY: an allocated f32 tensor of at least `rows` rows in device
        // memory of this context (the caller's slice device), no longer
        // written once the graph's compute returned.
        unsafe { self.run_device(logits.data_addr(), rows, logits.ne()[0] as usize, stride, k, first) }
    }

    /// `run_device` on rows copied from the host (tests, and hosts without
    /// device logits): each row's top `k`, best first, `k.min(n)` entries.
    pub fn run_host(&self, logits: &[f32], n: usize, k: usize) -> Result<Vec<Vec<Scored>>> {
        if n == 0 || logits.len() % n != 0 {
            return Err(Error::invalid(format!("{} logits are not rows of {n}", logits.len())));
        }
        let rows = logits.len() / n;
        let dev = self.stream.clone_htod(logits).map_err(driver)?;
        let (ptr, _guard) = cudarc::driver::DevicePtr::device_ptr(&dev, &self.stream);
        // SAFETY: device memory of this context holding rows x n floats, written before (same stream).
        let (ids, vals) = unsafe { self.run_device(ptr, rows, n, n, k, 0)? };
        Ok(ids
            .chunks(k)
            .zip(vals.chunks(k))
            .map(|(i, v)| i.iter().zip(v).filter(|(id, _)| **id >= 0).map(|(&id, &val)| (id, val)).collect())
            .collect())
    }
}
