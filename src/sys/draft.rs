//! The draft model, its context and its batches, owned by the engine.

use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;

use super::device::{Device, model_devices};
use super::*;
use crate::error::{Error, Result};

/// How to load the drafter.
pub struct ModelLoad<'a> {
    /// Devices to place the drafter's layers on; empty = CPU only.
    pub devices: &'a [ggml_backend_dev_t],
    /// A device for the drafter's scheduler that gets no layers (the target's
    /// head the drafter reads, when it is elsewhere).
    pub head_device: Option<ggml_backend_dev_t>,
    pub n_gpu_layers: i32,
    pub use_extra_bufts: bool,
}

/// A loaded drafter model.
pub struct DraftModel {
    model: NonNull<llama_model>,
}

// SAFETY: owned exclusively by one engine, used behind its mutex.
unsafe impl Send for DraftModel {}

impl DraftModel {
    pub fn load(path: &Path, load: &ModelLoad) -> Result<DraftModel> {
        // llama_model_params goes by value below: only the build's layout
        super::llama_check::check()?;
        let cpath = CString::new(path.to_string_lossy().as_bytes())
            .map_err(|_| Error::invalid("draft path contains a NUL byte"))?;
        let mut devices: Vec<ggml_backend_dev_t> = load.devices.to_vec();
        devices.extend(load.head_device);
        devices.push(std::ptr::null_mut());
        // the layers' devices share the layers evenly, the head's device gets none
        // SAFETY: plain query.
        let mut split = vec![0.0f32; unsafe { llama_max_devices() }.max(devices.len())];
        split[..load.devices.len()].fill(1.0);
        // SAFETY: default params are plain data; `devices` is NULL-terminated and
        // `split` holds llama_max_devices() values; both outlive the load call.
        let model = unsafe {
            let mut mp = llama_model_default_params();
            mp.devices = devices.as_mut_ptr();
            mp.n_gpu_layers = if load.devices.is_empty() { 0 } else { load.n_gpu_layers };
            mp.split_mode = if devices.len() > 2 { LLAMA_SPLIT_MODE_LAYER } else { LLAMA_SPLIT_MODE_NONE };
            if load.head_device.is_some() {
                mp.tensor_split = split.as_ptr();
            }
            mp.main_gpu = 0;
            mp.use_extra_bufts = load.use_extra_bufts;
            // read, not mapped: a drafter file truncated or rewritten on disk
            // while the engine runs would otherwise SIGBUS the host at the next
            // draft decode (tests/server/load_faults.py); drafters are small
            mp.load_mode = LLAMA_LOAD_MODE_NONE;
            llama_model_load_from_file(cpath.as_ptr(), mp)
        };
        NonNull::new(model)
            .map(|model| DraftModel { model })
            .ok_or_else(|| Error::backend(format!("libllama could not load the drafter '{}'", path.display())))
    }

    pub fn as_ptr(&self) -> *mut llama_model {
        self.model.as_ptr()
    }

    pub fn selector_top_k(&self) -> i32 {
        // SAFETY: live model.
        unsafe { dflash2_shim_model_dflash_selector_top_k(self.model.as_ptr()) }
    }

    pub fn n_embd(&self) -> usize {
        // SAFETY: live model.
        unsafe { llama_model_n_embd(self.model.as_ptr()) }.max(0) as usize
    }

    /// The devices libllama placed the drafter on (empty: the CPU only).
    pub fn devices(&self) -> Vec<Device> {
        // SAFETY: live model.
        unsafe { model_devices(self.model.as_ptr()) }
    }

    /// Bytes of the model's tensors (llama_model_size).
    pub fn size(&self) -> u64 {
        // SAFETY: live model.
        unsafe { llama_model_size(self.model.as_ptr()) }
    }
}

/// What a context holds over all its buffer types, as libllama reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// The model's weights.
    pub weights: usize,
    /// The context's memory: its KV cache.
    pub kv: usize,
    /// Compute buffers of the scheduler.
    pub compute: usize,
}

impl Drop for DraftModel {
    fn drop(&mut self) {
        // SAFETY: owned; every context on it was dropped first (field order in Engine).
        unsafe { llama_model_free(self.model.as_ptr()) }
    }
}

/// How to create the draft context.
pub struct ContextSetup {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub n_seq: u32,
    pub kv_unified: bool,
    pub type_k: Option<i32>,
    pub type_v: Option<i32>,
    pub n_threads: i32,
    pub n_threads_batch: i32,
    /// The target context: shared embeddings / head and the source of features.
    pub ctx_other: *mut llama_context,
}

/// The draft context.
pub struct DraftContext {
    ctx: NonNull<llama_context>,
    n_embd: usize,
}

// SAFETY: owned exclusively by one engine, used behind its mutex.
unsafe impl Send for DraftContext {}

impl DraftContext {
    pub fn new(model: &DraftModel, setup: &ContextSetup) -> Result<DraftContext> {
        // llama_context_params goes by value below: only the build's layout
        super::llama_check::check()?;
        // SAFETY: default params are plain data; model and ctx_other are live.
        let ctx = unsafe {
            let mut cp = llama_context_default_params();
            cp.n_ctx = setup.n_ctx;
            cp.n_batch = setup.n_batch;
            cp.n_ubatch = setup.n_ubatch;
            cp.n_seq_max = setup.n_seq;
            cp.kv_unified = setup.kv_unified;
            cp.n_threads = setup.n_threads;
            cp.n_threads_batch = setup.n_threads_batch;
            cp.embeddings = false;
            cp.no_perf = true;
            cp.n_rs_seq = 0;
            cp.ctx_other = setup.ctx_other;
            if let Some(t) = setup.type_k {
                cp.type_k = t as ggml_type;
            }
            if let Some(t) = setup.type_v {
                cp.type_v = t as ggml_type;
            }
            llama_init_from_model(model.as_ptr(), cp)
        };
        let ctx = NonNull::new(ctx).ok_or_else(|| Error::backend("libllama could not create the draft context"))?;
        Ok(DraftContext { ctx, n_embd: model.n_embd() })
    }

    pub fn as_ptr(&self) -> *mut llama_context {
        self.ctx.as_ptr()
    }

    /// Lattice output on (unmasked: one row per batch token) and the attention kind.
    pub fn configure(&self, causal: bool) {
        // SAFETY: live context.
        unsafe {
            dflash2_shim_set_embeddings_nextn(self.ctx.as_ptr(), true, false);
            llama_set_causal_attn(self.ctx.as_ptr(), causal);
        }
    }

    pub fn n_ubatch(&self) -> u32 {
        // SAFETY: live context.
        unsafe { llama_n_ubatch(self.ctx.as_ptr()) }
    }

    pub fn n_ctx_seq(&self) -> u32 {
        // SAFETY: live context.
        unsafe { llama_n_ctx_seq(self.ctx.as_ptr()) }
    }

    /// Decodes a batch; libllama's return code on failure.
    pub fn decode(&self, batch: &Batch) -> std::result::Result<(), i32> {
        // SAFETY: live context; the batch was made for this context.
        let rc = unsafe { llama_process(self.ctx.as_ptr(), LLAMA_PROCESS_TYPE_DECODE, batch.ptr.as_ptr()) };
        if rc == 0 { Ok(()) } else { Err(rc) }
    }

    /// The lattice rows of the last decode: `n_rows` rows of `n_embd` floats, in
    /// batch order.
    pub fn lattice(&self, n_rows: usize) -> Option<&[f32]> {
        // SAFETY: live context; with unmasked nextn output libllama keeps one row
        // per token of the last batch (at most n_batch), until the next decode.
        unsafe {
            let p = dflash2_shim_get_embeddings_nextn(self.ctx.as_ptr());
            (!p.is_null() && n_rows <= llama_n_batch(self.ctx.as_ptr()) as usize)
                .then(|| std::slice::from_raw_parts(p, n_rows * self.n_embd))
        }
    }

    /// What the context holds on `device` (None: on every device).
    pub fn memory_use(&self, device: Option<&Device>) -> Option<MemoryUse> {
        let mut m = MemoryUse::default();
        let dev = device.map_or(std::ptr::null_mut(), |d| d.dev);
        // SAFETY: live context; NULL or a live device; the out pointers are valid for the call.
        let ok =
            unsafe { dflash2_shim_memory_breakdown(self.ctx.as_ptr(), dev, &mut m.weights, &mut m.kv, &mut m.compute) };
        ok.then_some(m)
    }

    fn memory(&self) -> llama_memory_t {
        // SAFETY: live context.
        unsafe { llama_get_memory(self.ctx.as_ptr()) }
    }

    pub fn can_shift(&self) -> bool {
        // SAFETY: live memory.
        unsafe { llama_memory_can_shift(self.memory()) }
    }

    pub fn seq_rm(&self, seq: i32, p0: i32, p1: i32) -> bool {
        // SAFETY: live memory; seq < n_seq_max checked by the engine.
        unsafe { llama_memory_seq_rm(self.memory(), seq, p0, p1) }
    }

    pub fn seq_add(&self, seq: i32, p0: i32, p1: i32, delta: i32) {
        // SAFETY: as seq_rm.
        unsafe { llama_memory_seq_add(self.memory(), seq, p0, p1, delta) }
    }

    /// Copies the whole of `src` into `dst` (the only copy libllama supports
    /// between the streams of a non-unified cache).
    pub fn seq_cp_all(&self, src: i32, dst: i32) {
        // SAFETY: as seq_rm.
        unsafe { llama_memory_seq_cp(self.memory(), src, dst, -1, -1) }
    }

    /// Drops every cell of every sequence.
    pub fn clear(&self) {
        // SAFETY: live memory.
        unsafe { llama_memory_clear(self.memory(), true) }
    }

    pub fn seq_pos_max(&self, seq: i32) -> i32 {
        // SAFETY: as seq_rm.
        unsafe { llama_memory_seq_pos_max(self.memory(), seq) }
    }

    pub fn seq_pos_min(&self, seq: i32) -> i32 {
        // SAFETY: as seq_rm.
        unsafe { llama_memory_seq_pos_min(self.memory(), seq) }
    }

    pub fn state_seq_size(&self, seq: i32) -> usize {
        // SAFETY: live context.
        unsafe { llama_state_seq_get_size_ext(self.ctx.as_ptr(), seq, 0) }
    }

    /// Writes the sequence's KV state into `dst`; bytes written (0 on failure).
    pub fn state_seq_get(&self, seq: i32, dst: &mut [u8]) -> usize {
        // SAFETY: live context; dst is writable for its length.
        unsafe { llama_state_seq_get_data_ext(self.ctx.as_ptr(), dst.as_mut_ptr(), dst.len(), seq, 0) }
    }

    /// Loads a sequence's KV state; bytes read (0 on failure).
    pub fn state_seq_set(&self, seq: i32, src: &[u8]) -> usize {
        // SAFETY: live context; src is readable for its length.
        unsafe { llama_state_seq_set_data_ext(self.ctx.as_ptr(), src.as_ptr(), src.len(), seq, 0) }
    }
}

impl Drop for DraftContext {
    fn drop(&mut self) {
        // SAFETY: owned.
        unsafe { llama_free(self.ctx.as_ptr()) }
    }
}

/// A `llama_batch_ext` for the draft context.
pub struct Batch {
    ptr: NonNull<llama_batch_ext>,
}

// SAFETY: owned exclusively by one engine, used behind its mutex.
unsafe impl Send for Batch {}

impl Batch {
    pub fn new(ctx: &DraftContext) -> Result<Batch> {
        // SAFETY: live context.
        let ptr = unsafe { llama_batch_ext_init(ctx.as_ptr()) };
        NonNull::new(ptr).map(|ptr| Batch { ptr }).ok_or_else(|| Error::backend("cannot create a draft batch"))
    }

    pub fn clear(&mut self) {
        // SAFETY: live batch.
        unsafe { llama_batch_ext_clear(self.ptr.as_ptr()) }
    }

    fn set_pos(&mut self, idx: i32, pos: i32) -> Result<()> {
        // an M-RoPE draft reads 4 positions for embedding rows, the others one
        let p = [pos, pos, pos, 0];
        // SAFETY: live batch, idx returned by an add, p outlives the call.
        if unsafe { llama_batch_ext_set_pos(self.ptr.as_ptr(), idx, p.as_ptr()) } {
            Ok(())
        } else {
            Err(Error::backend(format!("cannot set position of batch row {idx}")))
        }
    }

    fn added(&mut self, idx: i32, what: &str) -> Result<i32> {
        if idx < 0 {
            return Err(Error::backend(format!("cannot add {what} to the draft batch (code {idx})")));
        }
        Ok(idx)
    }

    pub fn add_token(&mut self, seq: i32, token: i32, pos: i32) -> Result<()> {
        // SAFETY: live batch.
        let idx = unsafe { llama_batch_ext_add_token(self.ptr.as_ptr(), seq, token) };
        let idx = self.added(idx, "a token")?;
        self.set_pos(idx, pos)
    }

    /// Adds a feature row; libllama copies the data.
    pub fn add_embd(&mut self, seq: i32, features: &[f32], pos: i32) -> Result<()> {
        let embd = llama_embd { data: features.as_ptr(), n_rows: 1, n_embd: features.len() };
        // SAFETY: live batch; the data is copied before the call returns.
        let idx = unsafe { llama_batch_ext_add_embd(self.ptr.as_ptr(), seq, embd) };
        let idx = self.added(idx, "a feature row")?;
        self.set_pos(idx, pos)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: owned.
        unsafe { llama_batch_ext_free(self.ptr.as_ptr()) }
    }
}
