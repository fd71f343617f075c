//! The host's target context, borrowed: sizes, tap-layer capture and the rows
//! it captured in its last decode.

use std::ptr::NonNull;

use super::device::{Device, model_devices};
use super::*;

/// The target context's limits on tree verification.
#[derive(Clone, Copy, Debug)]
pub struct TreeRoom {
    /// KV cells of the whole context.
    pub n_ctx: u32,
    /// Sequence ids the context accepts (0 .. n_seq_max).
    pub n_seq_max: u32,
    /// One KV stream for every sequence (`kv_unified`, or a single sequence):
    /// rows with several sequence ids are only accepted then.
    pub unified: bool,
    /// Pure attention memory: a cell may belong to several sequences. Recurrent
    /// and hybrid targets keep one state per sequence and cannot branch.
    pub branching: bool,
}

/// A host-owned `llama_context` that outlives the engine (the host's contract).
pub struct TargetContext {
    ctx: NonNull<llama_context>,
}

// SAFETY: the engine uses the target context only inside calls the host makes,
// one at a time (the engine is behind a mutex); libllama contexts may move
// between threads.
unsafe impl Send for TargetContext {}

impl TargetContext {
    /// # Safety
    /// `ctx` must be NULL or a live context that outlives the returned value.
    pub unsafe fn from_raw(ctx: *mut llama_context) -> Option<TargetContext> {
        NonNull::new(ctx).map(|ctx| TargetContext { ctx })
    }

    pub fn as_ptr(&self) -> *mut llama_context {
        self.ctx.as_ptr()
    }

    pub fn model(&self) -> *const llama_model {
        // SAFETY: live context.
        unsafe { llama_get_model(self.ctx.as_ptr()) }
    }

    pub fn facts(&self) -> TargetFacts {
        // SAFETY: the model of a live context is live.
        unsafe { target_facts(self.model()) }
    }

    pub fn n_embd(&self) -> usize {
        // SAFETY: live model.
        unsafe { llama_model_n_embd(self.model()) }.max(0) as usize
    }

    pub fn n_ctx_seq(&self) -> u32 {
        // SAFETY: live context.
        unsafe { llama_n_ctx_seq(self.ctx.as_ptr()) }
    }

    /// Sequences the target context was created for (its n_seq_max).
    pub fn n_seq_max(&self) -> u32 {
        // SAFETY: live context.
        unsafe { llama_n_seq_max(self.ctx.as_ptr()) }
    }

    pub fn n_batch(&self) -> u32 {
        // SAFETY: live context.
        unsafe { llama_n_batch(self.ctx.as_ptr()) }
    }

    pub fn n_ubatch(&self) -> u32 {
        // SAFETY: live context.
        unsafe { llama_n_ubatch(self.ctx.as_ptr()) }
    }

    /// What the context offers a draft tree's verify batch (`engine::tree_step`).
    pub fn tree_room(&self) -> TreeRoom {
        let ctx = self.ctx.as_ptr();
        // SAFETY: live context and its live model.
        unsafe {
            let n_ctx = llama_n_ctx(ctx);
            let n_seq_max = llama_n_seq_max(ctx);
            let model = self.model();
            TreeRoom {
                n_ctx,
                n_seq_max,
                // the per-sequence streams of a split cache each get n_ctx / n_seq_max
                unified: n_seq_max <= 1 || llama_n_ctx_seq(ctx) >= n_ctx,
                branching: !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model),
            }
        }
    }

    /// `llama_memory_seq_cp` on the context's memory.
    pub fn memory_seq_cp(&self, src: i32, dst: i32, p0: i32, p1: i32) {
        // SAFETY: live context; its memory lives as long.
        unsafe { llama_memory_seq_cp(llama_get_memory(self.ctx.as_ptr()), src, dst, p0, p1) }
    }

    /// `llama_memory_seq_rm` on the context's memory: false where it refused.
    pub fn memory_seq_rm(&self, seq: i32, p0: i32, p1: i32) -> bool {
        // SAFETY: live context; its memory lives as long.
        unsafe { llama_memory_seq_rm(llama_get_memory(self.ctx.as_ptr()), seq, p0, p1) }
    }

    /// `llama_memory_seq_add` on the context's memory.
    pub fn memory_seq_add(&self, seq: i32, p0: i32, p1: i32, delta: i32) {
        // SAFETY: live context; its memory lives as long.
        unsafe { llama_memory_seq_add(llama_get_memory(self.ctx.as_ptr()), seq, p0, p1, delta) }
    }

    /// The lowest and highest position of `seq` in the context's memory (-1: none).
    pub fn memory_seq_pos_min(&self, seq: i32) -> i32 {
        // SAFETY: live context; its memory lives as long.
        unsafe { llama_memory_seq_pos_min(llama_get_memory(self.ctx.as_ptr()), seq) }
    }

    pub fn memory_seq_pos_max(&self, seq: i32) -> i32 {
        // SAFETY: live context; its memory lives as long.
        unsafe { llama_memory_seq_pos_max(llama_get_memory(self.ctx.as_ptr()), seq) }
    }

    pub fn n_threads(&self) -> (i32, i32) {
        // SAFETY: live context.
        unsafe { (llama_n_threads(self.ctx.as_ptr()), llama_n_threads_batch(self.ctx.as_ptr())) }
    }

    /// Devices the target model uses (empty: CPU only).
    pub fn devices(&self) -> Vec<Device> {
        // SAFETY: the model of a live context is live.
        unsafe { model_devices(self.model()) }
    }

    /// The device libllama put the target's output layer (its head) on: a CPU
    /// device when the head stays in host memory, a meta device when the model
    /// is split by tensor. None when this libllama does not say.
    pub fn output_device(&self) -> Option<Device> {
        // SAFETY: live model; a non-NULL result is one of its live devices.
        unsafe {
            let dev = dflash2_shim_model_dev_output(self.model());
            (!dev.is_null()).then(|| Device::describe(dev))
        }
    }

    /// Tokens in the target's vocabulary.
    pub fn n_vocab(&self) -> usize {
        // SAFETY: the vocabulary of a live model.
        unsafe {
            let vocab = llama_model_get_vocab(self.model());
            if vocab.is_null() { 0 } else { llama_vocab_n_tokens(vocab).max(0) as usize }
        }
    }

    /// The logits of row `i` of the last decode (`n_vocab` floats); None when
    /// that row did not ask for logits or is out of range.
    pub fn logits(&self, i: i32) -> Option<&[f32]> {
        let n_vocab = self.n_vocab();
        // SAFETY: live context; libllama checks `i` (NULL for a row without
        // logits) and keeps the row until the next decode, which cannot happen
        // while the host is inside an engine call.
        unsafe {
            let p = llama_get_logits_ith(self.ctx.as_ptr(), i);
            (!p.is_null()).then(|| std::slice::from_raw_parts(p, n_vocab))
        }
    }

    /// Turns capture of the input of target layer `lid` on or off.
    pub fn set_layer_capture(&self, lid: u32, on: bool) {
        // SAFETY: live context; the caller checked lid against the target's layers.
        unsafe { dflash2_shim_set_embeddings_layer_inp(self.ctx.as_ptr(), lid, on) }
    }

    /// A marker that changes whenever the target runs a decode (waits for
    /// pending work): a decode is what makes captured rows readable. libllama
    /// clamps its eval counters to >= 1, so a first decode of one token leaves
    /// them as they were; the marker also folds in the eval times (unless the
    /// context has no_perf), the load time (set on a context's very first
    /// decode, no_perf or not) and every sequence's highest KV position.
    pub fn decode_marker(&self) -> u64 {
        // SAFETY: live context; memory queries on ids below n_seq_max.
        unsafe {
            llama_synchronize(self.ctx.as_ptr());
            let perf = llama_perf_context(self.ctx.as_ptr());
            let mem = llama_get_memory(self.ctx.as_ptr());
            let n_seq = llama_n_seq_max(self.ctx.as_ptr()).min(256) as i32;
            let positions = (0..n_seq).map(|s| llama_memory_seq_pos_max(mem, s) as i64 as u64);
            [
                perf.n_p_eval as i64 as u64,
                perf.n_eval as i64 as u64,
                perf.t_p_eval_ms.to_bits(),
                perf.t_eval_ms.to_bits(),
                perf.t_load_ms.to_bits(),
            ]
            .into_iter()
            .chain(positions)
            .fold(0xcbf2_9ce4_8422_2325u64, |h, v| (h ^ v).wrapping_mul(0x0100_0000_01b3))
        }
    }

    /// The captured inputs of layer `lid` for the rows of the last decode, one
    /// `n_embd` row per batch index, `n_batch` rows. Only valid after a decode
    /// with capture on (libllama asserts otherwise; the engine checks first).
    pub fn layer_input(&self, lid: u32) -> Option<&[f32]> {
        let len = self.n_embd() * self.n_batch() as usize;
        // SAFETY: live context; libllama sizes each capture buffer n_embd * n_batch
        // floats and keeps it until the next decode, which cannot happen while the
        // host is inside an engine call.
        unsafe {
            let p = dflash2_shim_get_embeddings_layer_inp(self.ctx.as_ptr(), lid);
            (!p.is_null()).then(|| std::slice::from_raw_parts(p, len))
        }
    }
}
