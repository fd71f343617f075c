//! A ggml context without data and its compute graph: the ops of the draft
//! forward, one method each, in ggml's own terms (shapes in `ne` order).

use std::ptr::NonNull;

use super::{Tensor, ggml_tensor};
use crate::error::{Error, Result};
use crate::sys::*;

/// Rope parameters shared by every rope of one model (ggml_rope_ext's floats).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub n_dims: i32,
    pub mode: i32,
    pub n_ctx_orig: i32,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// M-RoPE sections (`mode` GGML_ROPE_TYPE_MROPE): rotary pairs per position
    /// component.
    pub sections: [i32; 4],
}

/// A context holding tensor metadata only (ggml allocates the data through a
/// scheduler), and one graph in it.
pub struct GraphCtx {
    ctx: NonNull<ggml_context>,
    graph: NonNull<ggml_cgraph>,
    capacity: usize,
}

// SAFETY: owned exclusively, used by one thread at a time behind the engine's mutex.
unsafe impl Send for GraphCtx {}

impl GraphCtx {
    /// A context for at most `capacity` tensors and graph nodes.
    pub fn new(capacity: usize) -> Result<GraphCtx> {
        // SAFETY: plain size queries, then ggml_init with its own pool (no_alloc:
        // tensor data is never placed in it).
        unsafe {
            let mem_size = ggml_tensor_overhead() * capacity + ggml_graph_overhead_custom(capacity, false);
            let ctx = ggml_init(ggml_init_params { mem_size, mem_buffer: std::ptr::null_mut(), no_alloc: true });
            let ctx = NonNull::new(ctx).ok_or_else(|| Error::out_of_memory("ggml could not create a graph context"))?;
            let graph = ggml_new_graph_custom(ctx.as_ptr(), capacity, false);
            let Some(graph) = NonNull::new(graph) else {
                ggml_free(ctx.as_ptr());
                return Err(Error::out_of_memory("ggml could not create a graph"));
            };
            Ok(GraphCtx { ctx, graph, capacity })
        }
    }

    pub(super) fn raw_ctx(&self) -> *mut ggml_context {
        self.ctx.as_ptr()
    }

    pub(super) fn raw_graph(&self) -> *mut ggml_cgraph {
        self.graph.as_ptr()
    }

    /// Tensors the context can still hold: the caller sizes contexts so that
    /// this never reaches 0 (ggml aborts past it).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Nodes of the graph so far.
    pub fn n_nodes(&self) -> usize {
        // SAFETY: the live graph.
        unsafe { ggml_graph_n_nodes(self.graph.as_ptr()) as usize }
    }

    fn t<'a>(&'a self, ptr: *mut ggml_tensor) -> Tensor<'a> {
        // SAFETY: ggml returned a tensor of this context (or of a longer-lived
        // one it was built from), live for as long as self is borrowed.
        unsafe { Tensor::from_raw(ptr) }
    }

    /// A new tensor with data of its own (graph inputs and fills).
    pub fn new_tensor(&self, ty: ggml_type, ne: &[i64]) -> Tensor<'_> {
        // SAFETY: live context; 1..=4 dimensions.
        let p = unsafe {
            match *ne {
                [a] => ggml_new_tensor_1d(self.raw_ctx(), ty, a),
                [a, b] => ggml_new_tensor_2d(self.raw_ctx(), ty, a, b),
                [a, b, c] => ggml_new_tensor_3d(self.raw_ctx(), ty, a, b, c),
                [a, b, c, d] => ggml_new_tensor_4d(self.raw_ctx(), ty, a, b, c, d),
                _ => panic!("tensors have 1 to 4 dimensions"),
            }
        };
        self.t(p)
    }

    /// A graph input: data written after allocation.
    pub fn input(&self, ty: ggml_type, ne: &[i64], name: &str) -> Tensor<'_> {
        let t = self.new_tensor(ty, ne);
        // SAFETY: live tensor of this context.
        unsafe { ggml_set_input(t.raw()) };
        self.name(t, name);
        t
    }

    /// Marks a tensor as an output: its data stays readable after compute.
    pub fn output(&self, t: Tensor<'_>) {
        // SAFETY: live tensor.
        unsafe { ggml_set_output(t.raw()) };
    }

    pub fn name(&self, t: Tensor<'_>, name: &str) {
        let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(63).collect();
        bytes.push(0);
        // SAFETY: live tensor; a NUL-terminated name ggml copies (64 bytes at most).
        unsafe { ggml_set_name(t.raw(), bytes.as_ptr().cast()) };
    }

    /// The graph's tensor named `name` (an input, an output), if any.
    pub fn tensor(&self, name: &str) -> Option<Tensor<'_>> {
        let cname = std::ffi::CString::new(name).ok()?;
        // SAFETY: live graph; a NUL-terminated name.
        let p = unsafe { ggml_graph_get_tensor(self.graph.as_ptr(), cname.as_ptr()) };
        (!p.is_null()).then(|| self.t(p))
    }

    /// Adds `t` and everything it depends on to the graph.
    pub fn expand(&self, t: Tensor<'_>) {
        // SAFETY: live graph and tensor.
        unsafe { ggml_build_forward_expand(self.graph.as_ptr(), t.raw()) }
    }

    pub fn mul_mat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensors; shapes are the caller's (validated checkpoint).
        self.t(unsafe { ggml_mul_mat(self.raw_ctx(), a.raw(), b.raw()) })
    }

    pub fn mul<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_mul(self.raw_ctx(), a.raw(), b.raw()) })
    }

    pub fn add<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_add(self.raw_ctx(), a.raw(), b.raw()) })
    }

    pub fn scale<'a>(&'a self, a: Tensor<'a>, s: f32) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_scale(self.raw_ctx(), a.raw(), s) })
    }

    /// `a * s + b`, elementwise.
    pub fn scale_bias<'a>(&'a self, a: Tensor<'a>, s: f32, b: f32) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_scale_bias(self.raw_ctx(), a.raw(), s, b) })
    }

    pub fn tanh<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_tanh(self.raw_ctx(), a.raw()) })
    }

    pub fn rms_norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_rms_norm(self.raw_ctx(), a.raw(), eps) })
    }

    /// gate activation (SiLU) times up, in one op (ggml_swiglu_split).
    pub fn swiglu_split<'a>(&'a self, gate: Tensor<'a>, up: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_swiglu_split(self.raw_ctx(), gate.raw(), up.raw()) })
    }

    /// GELU(gate) times up, in one op (ggml_geglu_split).
    pub fn geglu_split<'a>(&'a self, gate: Tensor<'a>, up: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_geglu_split(self.raw_ctx(), gate.raw(), up.raw()) })
    }

    /// Rope of `a` ([head_dim, n_head, n_tokens]) at `pos` (I32; four per
    /// token, component-major, for M-RoPE).
    pub fn rope<'a>(
        &'a self,
        a: Tensor<'a>,
        pos: Tensor<'a>,
        freq_factors: Option<Tensor<'a>>,
        r: &Rope,
    ) -> Tensor<'a> {
        let c = freq_factors.map_or(std::ptr::null_mut(), |t| t.raw());
        // SAFETY: as mul_mat; `sections` outlives the call (ggml copies it).
        self.t(unsafe {
            if r.mode == GGML_ROPE_TYPE_MROPE as i32 {
                let mut sections = r.sections;
                ggml_rope_multi(
                    self.raw_ctx(),
                    a.raw(),
                    pos.raw(),
                    c,
                    r.n_dims,
                    sections.as_mut_ptr(),
                    r.mode,
                    r.n_ctx_orig,
                    r.freq_base,
                    r.freq_scale,
                    r.ext_factor,
                    r.attn_factor,
                    r.beta_fast,
                    r.beta_slow,
                )
            } else {
                ggml_rope_ext(
                    self.raw_ctx(),
                    a.raw(),
                    pos.raw(),
                    c,
                    r.n_dims,
                    r.mode,
                    r.n_ctx_orig,
                    r.freq_base,
                    r.freq_scale,
                    r.ext_factor,
                    r.attn_factor,
                    r.beta_fast,
                    r.beta_slow,
                )
            }
        })
    }

    pub fn reshape<'a>(&'a self, a: Tensor<'a>, ne: &[i64]) -> Tensor<'a> {
        // SAFETY: as mul_mat; ggml checks the element count.
        self.t(unsafe {
            match *ne {
                [x] => ggml_reshape_1d(self.raw_ctx(), a.raw(), x),
                [x, y] => ggml_reshape_2d(self.raw_ctx(), a.raw(), x, y),
                [x, y, z] => ggml_reshape_3d(self.raw_ctx(), a.raw(), x, y, z),
                [x, y, z, w] => ggml_reshape_4d(self.raw_ctx(), a.raw(), x, y, z, w),
                _ => panic!("tensors have 1 to 4 dimensions"),
            }
        })
    }

    /// A view of `a`: `ne` elements per dimension, row strides `nb` (one
    /// fewer than `ne`), starting at byte `offset`.
    pub fn view<'a>(&'a self, a: Tensor<'a>, ne: &[i64], nb: &[usize], offset: usize) -> Tensor<'a> {
        // SAFETY: as mul_mat; ggml checks the view stays inside `a`.
        self.t(unsafe {
            match (ne, nb) {
                ([x], []) => ggml_view_1d(self.raw_ctx(), a.raw(), *x, offset),
                ([x, y], [b1]) => ggml_view_2d(self.raw_ctx(), a.raw(), *x, *y, *b1, offset),
                ([x, y, z], [b1, b2]) => ggml_view_3d(self.raw_ctx(), a.raw(), *x, *y, *z, *b1, *b2, offset),
                ([x, y, z, w], [b1, b2, b3]) => {
                    ggml_view_4d(self.raw_ctx(), a.raw(), *x, *y, *z, *w, *b1, *b2, *b3, offset)
                }
                _ => panic!("a view has 1 to 4 dimensions and one stride fewer"),
            }
        })
    }

    pub fn cont<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_cont(self.raw_ctx(), a.raw()) })
    }

    pub fn cont_shape<'a>(&'a self, a: Tensor<'a>, ne: &[i64]) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe {
            match *ne {
                [x] => ggml_cont_1d(self.raw_ctx(), a.raw(), x),
                [x, y] => ggml_cont_2d(self.raw_ctx(), a.raw(), x, y),
                [x, y, z] => ggml_cont_3d(self.raw_ctx(), a.raw(), x, y, z),
                [x, y, z, w] => ggml_cont_4d(self.raw_ctx(), a.raw(), x, y, z, w),
                _ => panic!("tensors have 1 to 4 dimensions"),
            }
        })
    }

    pub fn permute<'a>(&'a self, a: Tensor<'a>, axes: [i32; 4]) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_permute(self.raw_ctx(), a.raw(), axes[0], axes[1], axes[2], axes[3]) })
    }

    pub fn transpose<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_transpose(self.raw_ctx(), a.raw()) })
    }

    /// `a` repeated to the shape of `b`.
    pub fn repeat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_repeat(self.raw_ctx(), a.raw(), b.raw()) })
    }

    pub fn repeat_4d<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4]) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_repeat_4d(self.raw_ctx(), a.raw(), ne[0], ne[1], ne[2], ne[3]) })
    }

    /// Zeros appended at the end of each dimension.
    pub fn pad<'a>(&'a self, a: Tensor<'a>, p: [i32; 4]) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_pad(self.raw_ctx(), a.raw(), p[0], p[1], p[2], p[3]) })
    }

    /// Zeros before (`left`) and after (`right`) each dimension.
    pub fn pad_ext<'a>(&'a self, a: Tensor<'a>, left: [i32; 4], right: [i32; 4]) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe {
            ggml_pad_ext(
                self.raw_ctx(),
                a.raw(),
                left[0],
                right[0],
                left[1],
                right[1],
                left[2],
                right[2],
                left[3],
                right[3],
            )
        })
    }

    pub fn concat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, dim: i32) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_concat(self.raw_ctx(), a.raw(), b.raw(), dim) })
    }

    pub fn cast<'a>(&'a self, a: Tensor<'a>, ty: ggml_type) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_cast(self.raw_ctx(), a.raw(), ty) })
    }

    /// Rows of `a` at the I32 indices `rows`.
    pub fn get_rows<'a>(&'a self, a: Tensor<'a>, rows: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_get_rows(self.raw_ctx(), a.raw(), rows.raw()) })
    }

    /// `dst` with rows of `src` written at the I64 indices `rows` (dst's view).
    pub fn set_rows<'a>(&'a self, dst: Tensor<'a>, src: Tensor<'a>, rows: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_set_rows(self.raw_ctx(), dst.raw(), src.raw(), rows.raw()) })
    }

    /// Indices of the `k` largest values of each row (in no particular order).
    pub fn top_k<'a>(&'a self, a: Tensor<'a>, k: i32) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_top_k(self.raw_ctx(), a.raw(), k) })
    }

    /// `a` filled with `c`.
    pub fn fill<'a>(&'a self, a: Tensor<'a>, c: f32) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_fill(self.raw_ctx(), a.raw(), c) })
    }

    /// `src` copied into `dst` (converting the type).
    pub fn cpy<'a>(&'a self, src: Tensor<'a>, dst: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        self.t(unsafe { ggml_cpy(self.raw_ctx(), src.raw(), dst.raw()) })
    }

    /// Fused attention with F32 accumulation; `sinks` per head when given.
    pub fn flash_attn<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        mask: Tensor<'a>,
        scale: f32,
        sinks: Option<Tensor<'a>>,
    ) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        let out = self
            .t(unsafe { ggml_flash_attn_ext(self.raw_ctx(), q.raw(), k.raw(), v.raw(), mask.raw(), scale, 0.0, 0.0) });
        // SAFETY: live tensors of this graph.
        unsafe {
            ggml_flash_attn_ext_add_sinks(out.raw(), sinks.map_or(std::ptr::null_mut(), |s| s.raw()));
            ggml_prec_set_acc(out.raw(), GGML_PREC_F32);
        }
        out
    }

    /// softmax(a * scale + mask), with per-head sinks when given.
    pub fn soft_max<'a>(
        &'a self,
        a: Tensor<'a>,
        mask: Tensor<'a>,
        scale: f32,
        sinks: Option<Tensor<'a>>,
    ) -> Tensor<'a> {
        // SAFETY: as mul_mat.
        let out = self.t(unsafe { ggml_soft_max_ext(self.raw_ctx(), a.raw(), mask.raw(), scale, 0.0) });
        // SAFETY: live tensors of this graph.
        unsafe { ggml_soft_max_add_sinks(out.raw(), sinks.map_or(std::ptr::null_mut(), |s| s.raw())) };
        out
    }

    /// Asks for F32 accumulation of a matmul.
    pub fn prec_f32(&self, t: Tensor<'_>) {
        // SAFETY: live tensor.
        unsafe { ggml_prec_set_acc(t.raw(), GGML_PREC_F32) };
    }
}

impl Drop for GraphCtx {
    fn drop(&mut self) {
        // SAFETY: owned; the graph lives in this context.
        unsafe { ggml_free(self.ctx.as_ptr()) }
    }
}
