//! The drafter's forward as ggml graphs, op for op as libllama's `dflash`
//! graph computes it (src/models/dflash.cpp of the pinned llama.cpp), so the
//! same backend gives the same bits:
//!
//! - injection: the tap features fused (`fc`, RMS norm), each layer's K and V
//!   of them written into the draft KV at the rows' dense positions;
//! - noise blocks: `[id_last, mask, ...]` per sequence through the decoder
//!   layers (DFlash2's grouped dynamic depthwise convolutions around attention
//!   and FFN), attention over the sequence's cells and its own block, the
//!   head, then the lattice (`lattice.rs`);
//! - the cache's own edits: a rope shift of moved cells, a stream copy.

use super::batch::{NoiseInputs, Run};
use super::conv::conv;
use super::io;
use super::kv::KvCache;
use super::lattice::{self, SelectorWeights};
use super::names::{LayerIds, ModelIds};
use super::spec::Spec;
use super::weights::{WeightId, Weights};
use crate::checkpoint::Activation;
use crate::sys::ggml::{GraphCtx, Tensor, row_size};
use crate::sys::{GGML_ROPE_TYPE_NEOX, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, GGML_TYPE_I64};

/// A part of the target's output head: all of it, or (a head split by
/// tensor, `-sm tensor`) its vocabulary rows from `first` on, on one device,
/// with the head's scale on that device.
#[derive(Clone, Copy)]
pub struct HeadSlice<'a> {
    pub weight: Tensor<'a>,
    pub scale: Option<Tensor<'a>>,
    pub first: i64,
    /// Its top-k is taken outside the graph, on its logits where they are
    /// (`crate::draft::slices`): the graph leaves them as an output.
    pub outside: bool,
}

/// The target's tensors the drafter reads in place (never copied).
pub struct TargetHead<'a> {
    pub tok_embd: Tensor<'a>,
    /// One slice (the whole head), or its vocabulary slices in order.
    pub output: Vec<HeadSlice<'a>>,
}

/// Everything a graph is built from.
pub struct Net<'a> {
    pub g: &'a GraphCtx,
    pub w: &'a Weights,
    pub ids: &'a ModelIds,
    pub spec: &'a Spec,
    pub kv: &'a KvCache,
    pub head: TargetHead<'a>,
    /// Fused attention (else matmul + softmax).
    pub flash_attn: bool,
}

/// The inputs the layers of a noise graph read.
struct Inputs<'a> {
    positions: Tensor<'a>,
    cells: Tensor<'a>,
    /// Per run, full-attention and windowed masks.
    masks: Vec<Tensor<'a>>,
    masks_swa: Vec<Tensor<'a>>,
}

impl<'a> Net<'a> {
    fn t(&self, id: WeightId) -> Tensor<'a> {
        self.w.get(id)
    }

    /// DFlash2's selector weights (None: plain DFlash).
    fn selector_weights(&self) -> Option<SelectorWeights<'a>> {
        self.ids.selector.as_ref().map(|sel| SelectorWeights {
            gate: self.t(sel.hidden),
            successor: self.t(sel.successor),
            predecessor: self.t(sel.predecessor),
        })
    }

    fn opt(&self, id: Option<WeightId>) -> Option<Tensor<'a>> {
        id.map(|id| self.w.get(id))
    }

    /// RMS norm, then the weight (libllama's build_norm, LLM_NORM_RMS).
    fn norm(&self, x: Tensor<'a>, weight: WeightId) -> Tensor<'a> {
        let n = self.g.rms_norm(x, self.spec.rms_eps);
        self.g.mul(n, self.t(weight))
    }

    /// A weight times `x`, then its scale when it has one.
    fn mm(&self, w: Tensor<'a>, x: Tensor<'a>, scale: Option<Tensor<'a>>) -> Tensor<'a> {
        let y = self.g.mul_mat(w, x);
        scale.map_or(y, |s| self.g.mul(y, s))
    }

    fn rope(&self, x: Tensor<'a>, pos: Tensor<'a>) -> Tensor<'a> {
        self.g.rope(x, pos, self.opt(self.ids.rope_freqs), &self.spec.rope)
    }

    /// The rope of a K shift: M-RoPE drafts rotate every pair by the one
    /// position they carry (their sections are degenerate), in NEOX order,
    /// as libllama's K shift does.
    fn rope_shift(&self, x: Tensor<'a>, delta: Tensor<'a>) -> Tensor<'a> {
        let mut rope = self.spec.rope;
        rope.mode = GGML_ROPE_TYPE_NEOX as i32;
        self.g.rope(x, delta, self.opt(self.ids.rope_freqs), &rope)
    }

    /// The cache of a layer as [n_embd_kv, cells of every stream]: rows are
    /// written at global cell indices.
    fn cache_rows(&self, cache: Tensor<'a>) -> Tensor<'a> {
        self.g.reshape(cache, &[self.kv.n_embd_kv, (self.kv.n_cells * self.kv.n_stream) as i64])
    }

    /// K (normed, roped) and V of `x` for layer `l`, [head_dim, n_head_kv, n].
    fn kv_of(&self, l: &LayerIds, x: Tensor<'a>, pos: Tensor<'a>) -> (Tensor<'a>, Tensor<'a>) {
        let s = self.spec;
        let n = x.ne()[1];
        let k = self.g.mul_mat(self.t(l.wk), x);
        let v = match l.wv {
            Some(wv) => self.g.mul_mat(self.t(wv), x),
            None => k,
        };
        let k = self.g.reshape(k, &[s.head_dim, s.n_head_kv, n]);
        let mut v = self.g.reshape(v, &[s.head_dim, s.n_head_kv, n]);
        let k = self.norm(k, l.k_norm);
        if l.wv.is_none() {
            v = self.g.rms_norm(v, s.rms_eps);
        }
        (self.rope(k, pos), v)
    }

    /// Writes K and V rows into layer `il`'s cache at `cells` and adds the
    /// writes to the graph (before anything that reads the cache).
    fn store(&self, il: usize, k: Tensor<'a>, v: Tensor<'a>, cells: Tensor<'a>) {
        let n = k.ne()[2];
        let width = self.kv.n_embd_kv;
        let k2 = self.g.view(k, &[width, n], &[k.nb()[2]], 0);
        let v2 = self.g.view(v, &[width, n], &[v.nb()[2]], 0);
        self.g.expand(self.g.set_rows(self.cache_rows(self.kv.k(il)), k2, cells));
        self.g.expand(self.g.set_rows(self.cache_rows(self.kv.v(il)), v2, cells));
    }

    /// The injection graph of `n` rows (inputs named by `io`).
    pub fn inject(&self, n: i64) {
        let g = self.g;
        let s = self.spec;
        let features = g.input(GGML_TYPE_F32, &[s.n_feat, n], io::FEATURES);
        let positions = g.input(GGML_TYPE_I32, &[n * s.n_pos_per_row() as i64], io::POSITIONS);
        let cells = g.input(GGML_TYPE_I64, &[n], io::CELLS);
        let fused = self.mm(self.t(self.ids.fc), features, self.opt(self.ids.fc_scale));
        let fused = self.norm(fused, self.ids.enc_norm);
        for (il, l) in self.ids.layers.iter().enumerate() {
            let (k, v) = self.kv_of(l, fused, positions);
            self.store(il, k, v, cells);
        }
    }

    /// Mask inputs per run, F16 for fused attention (ggml requires it).
    fn mask_inputs(&self, runs: &[Run], n_kv: usize, width: usize, swa: bool) -> Vec<Tensor<'a>> {
        let ty = if self.flash_attn { GGML_TYPE_F16 } else { GGML_TYPE_F32 };
        runs.iter()
            .enumerate()
            .map(|(i, r)| self.g.input(ty, &[n_kv as i64, width as i64, 1, r.n_blocks as i64], &io::mask(i, swa)))
            .collect()
    }

    /// Attention of the batch's queries over layer `il`'s cache, run by run
    /// (each run's streams are one strided view), [n_embd_q, n_tokens].
    fn attention(&self, il: usize, q: Tensor<'a>, masks: &[Tensor<'a>], runs: &[Run], n_kv: usize) -> Tensor<'a> {
        let g = self.g;
        let s = self.spec;
        let width = q.ne()[2] / runs.iter().map(|r| r.n_blocks as i64).sum::<i64>();
        let sinks = self.opt(self.ids.layers[il].sinks);
        let mut out: Option<Tensor<'a>> = None;
        for (run, &mask) in runs.iter().zip(masks) {
            let nb = run.n_blocks as i64;
            let qn = q.nb();
            let q_run = g.view(
                q,
                &[s.head_dim, s.n_head, width, nb],
                &[qn[1], qn[2], qn[2] * width as usize],
                qn[2] * width as usize * run.first_block,
            );
            let q_run = g.permute(q_run, [0, 2, 1, 3]);
            let view = |cache: Tensor<'a>| {
                let ty = cache.ty();
                let stream = row_size(ty, self.kv.n_embd_kv * self.kv.n_cells as i64);
                let v = g.view(
                    cache,
                    &[s.head_dim, s.n_head_kv, n_kv as i64, nb],
                    &[row_size(ty, s.head_dim), row_size(ty, self.kv.n_embd_kv), stream],
                    stream * run.first_stream,
                );
                g.permute(v, [0, 2, 1, 3])
            };
            let (mut k, mut v) = (view(self.kv.k(il)), view(self.kv.v(il)));
            let cur = if self.flash_attn {
                if k.ty() == GGML_TYPE_F32 {
                    k = g.cast(k, GGML_TYPE_F16);
                }
                if v.ty() == GGML_TYPE_F32 {
                    v = g.cast(v, GGML_TYPE_F16);
                }
                let a = g.flash_attn(q_run, k, v, mask, s.kq_scale, sinks);
                let ne = a.ne();
                g.reshape(a, &[ne[0] * ne[1], ne[2] * ne[3]])
            } else {
                let kq = g.mul_mat(k, q_run);
                g.prec_f32(kq);
                let kq = g.soft_max(kq, mask, s.kq_scale, sinks);
                let v_t = g.cont(g.transpose(v));
                let kqv = g.mul_mat(v_t, kq);
                let cur = g.permute(kqv, [0, 2, 1, 3]);
                let ne = cur.ne();
                g.cont_shape(cur, &[ne[0] * ne[1], ne[2] * ne[3]])
            };
            out = Some(match out {
                None => cur,
                Some(prev) => g.concat(prev, cur, 1),
            });
        }
        out.expect("a noise batch has at least one run")
    }

    /// The FFN of layer `l` (parallel gate and up; SiLU or GELU gate).
    fn ffn(&self, l: &LayerIds, x: Tensor<'a>) -> Tensor<'a> {
        let up = self.g.mul_mat(self.t(l.ffn_up), x);
        let gate = self.g.mul_mat(self.t(l.ffn_gate), x);
        let act = match self.spec.activation {
            Activation::Silu => self.g.swiglu_split(gate, up),
            Activation::Gelu => self.g.geglu_split(gate, up),
        };
        self.g.mul_mat(self.t(l.ffn_down), act)
    }

    /// One decoder layer over the noise rows.
    fn layer(&self, il: usize, x: Tensor<'a>, inp: &Inputs<'a>, batch: &NoiseInputs) -> Tensor<'a> {
        let g = self.g;
        let s = self.spec;
        let l = &self.ids.layers[il];
        let n = x.ne()[1];
        let n_blocks = (n as usize / batch.width) as i64;

        let mut normed = self.norm(x, l.attn_norm);
        let attn_dynamic = l.conv.map(|c| {
            let dynamic = g.mul_mat(self.t(c.attn_proj), normed);
            normed = conv(g, s, normed, dynamic, self.t(c.attn_base), 0, n_blocks);
            dynamic
        });
        let q = g.mul_mat(self.t(l.wq), normed);
        let q = g.reshape(q, &[s.head_dim, s.n_head, n]);
        let q = self.rope(self.norm(q, l.q_norm), inp.positions);
        let (k, v) = self.kv_of(l, normed, inp.positions);
        g.expand(q);
        g.expand(v);
        g.expand(k);
        self.store(il, k, v, inp.cells);
        let masks = if s.is_swa(il) { &inp.masks_swa } else { &inp.masks };
        let attn = self.attention(il, q, masks, &batch.runs, batch.n_kv);
        let mut cur = g.mul_mat(self.t(l.wo), attn);
        if s.value_scale != 0.0 {
            cur = g.scale(cur, s.value_scale);
        }
        if let (Some(c), Some(d)) = (l.conv, attn_dynamic) {
            cur = conv(g, s, cur, d, self.t(c.attn_base), 1, n_blocks);
        }
        if let Some(w) = l.attn_post_norm {
            cur = self.norm(cur, w);
        }
        let ffn_in = g.add(cur, x);

        let mut cur = self.norm(ffn_in, l.ffn_norm);
        let ffn_dynamic = l.conv.map(|c| {
            let dynamic = g.mul_mat(self.t(c.ffn_proj), cur);
            cur = conv(g, s, cur, dynamic, self.t(c.ffn_base), 0, n_blocks);
            dynamic
        });
        let mut cur = self.ffn(l, cur);
        if let (Some(c), Some(d)) = (l.conv, ffn_dynamic) {
            cur = conv(g, s, cur, d, self.t(c.ffn_base), 1, n_blocks);
        }
        if let Some(w) = l.ffn_post_norm {
            cur = self.norm(cur, w);
        }
        let mut cur = g.add(cur, ffn_in);
        if let Some(w) = l.out_scale {
            cur = g.mul(cur, self.t(w));
        }
        cur
    }

    /// The noise-block graph (inputs named by `io`); its output `io::LATTICE`
    /// is [n_embd, rows per block x blocks].
    pub fn noise(&self, batch: &NoiseInputs) {
        let g = self.g;
        let s = self.spec;
        let n = batch.tokens.len() as i64;
        let tokens = g.input(GGML_TYPE_I32, &[n], io::TOKENS);
        let positions = g.input(GGML_TYPE_I32, &[n * s.n_pos_per_row() as i64], io::POSITIONS);
        let cells = g.input(GGML_TYPE_I64, &[n], io::CELLS);
        let mask_inputs = |m: &Vec<Vec<f32>>, swa| {
            if m.is_empty() { Vec::new() } else { self.mask_inputs(&batch.runs, batch.n_kv, batch.width, swa) }
        };
        let masks = mask_inputs(&batch.masks, false);
        let masks_swa = mask_inputs(&batch.masks_swa, true);
        let inp = Inputs { positions, cells, masks, masks_swa };

        let tok_embd = self.opt(self.ids.tok_embd).unwrap_or(self.head.tok_embd);
        let mut x = g.get_rows(tok_embd, tokens);
        if s.embedding_scale != 0.0 {
            x = g.scale(x, s.embedding_scale);
        }
        for il in 0..s.n_layer {
            x = self.layer(il, x, &inp, batch);
        }
        let hidden = self.norm(x, self.ids.output_norm);
        g.name(hidden, io::HEAD_IN);
        // the head for every row, the anchor's too (its lattice row is zeros):
        // ggml's CPU matmul tiles batches of 4 rows, so a block of 8 costs
        // less through the vocabulary-wide head than its 7 drafted rows alone
        let k = s.top_k;
        let head = |slice: &HeadSlice<'a>| self.output_transforms(self.mm(slice.weight, hidden, slice.scale));
        let picked = match (self.ids.output, self.head.output.as_slice()) {
            (Some(own), _) => lattice::select(g, self.output_transforms(g.mul_mat(self.t(own), hidden)), k),
            (None, [whole]) => lattice::select(g, head(whole), k),
            (None, slices) if slices.iter().any(|sl| sl.outside) => {
                // the merge is the host's: this graph ends at each slice's
                // logits (outside) or top-k, and the hidden states the
                // selection graph (`select_lattice`) reads
                for (j, sl) in slices.iter().enumerate() {
                    let logits = head(sl);
                    g.name(logits, &io::head_logits(j));
                    let k_slice = k.min(logits.ne()[0]);
                    if sl.outside {
                        g.output(logits);
                        g.expand(logits);
                    } else if k_slice > 0 {
                        let part = lattice::select(g, logits, k_slice);
                        for (t, name) in [(part.ids, io::head_part_ids(j)), (part.logits, io::head_part_logits(j))] {
                            g.name(t, &name);
                            g.output(t);
                            g.expand(t);
                        }
                    }
                }
                g.output(hidden);
                g.expand(hidden);
                return;
            }
            (None, slices) => {
                let logits: Vec<_> = slices.iter().map(|sl| (head(sl), sl.first)).collect();
                lattice::select_sharded(g, &logits, k)
            }
        };
        let lattice = lattice::build(g, s, self.selector_weights(), picked, hidden, tokens, batch.width as i64);
        g.name(lattice, io::LATTICE);
        g.output(lattice);
        g.expand(lattice);
    }

    /// The selection graph of a noise decode whose candidates were merged on
    /// the host: inputs `io::SEL_IDS` / `io::SEL_LOGITS` [k, n], the hidden
    /// states `io::HEAD_IN` [n_embd, n] and the tokens [n]; output the lattice.
    pub fn select_lattice(&self, n: i64, width: i64) {
        let g = self.g;
        let s = self.spec;
        let picked = lattice::Candidates {
            ids: g.input(GGML_TYPE_I32, &[s.top_k, n], io::SEL_IDS),
            logits: g.input(GGML_TYPE_F32, &[s.top_k, n], io::SEL_LOGITS),
        };
        let hidden = g.input(GGML_TYPE_F32, &[s.n_embd, n], io::HEAD_IN);
        let tokens = g.input(GGML_TYPE_I32, &[n], io::TOKENS);
        let lattice = lattice::build(g, s, self.selector_weights(), picked, hidden, tokens, width);
        g.name(lattice, io::LATTICE);
        g.output(lattice);
        g.expand(lattice);
    }

    /// DFlash2's logit scale and softcap, then the `d2t` scatter of a reduced
    /// head's rows into the full vocabulary (-inf elsewhere).
    fn output_transforms(&self, logits: Tensor<'a>) -> Tensor<'a> {
        let g = self.g;
        let s = self.spec;
        let mut cur = logits;
        if s.logit_scale != 0.0 {
            cur = g.scale(cur, s.logit_scale);
        }
        if s.final_logit_softcap > 0.0 {
            cur = g.scale(cur, 1.0 / s.final_logit_softcap);
            cur = g.tanh(cur);
            cur = g.scale(cur, s.final_logit_softcap);
        }
        if let Some(d2t) = self.ids.d2t {
            let n_out = cur.ne()[1];
            let full = g.fill(g.new_tensor(GGML_TYPE_F32, &[1, s.n_vocab, n_out]), f32::NEG_INFINITY);
            let rows = g.reshape(cur, &[1, s.n_vocab_draft, n_out]);
            let index = g.reshape(self.t(d2t), &[s.n_vocab_draft, 1, 1]);
            cur = g.reshape(g.set_rows(full, rows, index), &[s.n_vocab, n_out]);
        }
        cur
    }

    /// Moves cells [c0, c0 + n) of a stream by `delta` positions (to cells
    /// c0 + delta ..), re-roping K by `delta`: libllama's K shift, with the
    /// rows moved so that cell = position holds. Its input `io::SHIFT`: n
    /// entries of delta.
    pub fn shift(&self, stream: usize, c0: usize, n: usize, delta: i32) {
        let g = self.g;
        let s = self.spec;
        let positions = g.input(GGML_TYPE_I32, &[n as i64], io::SHIFT);
        let dst0 = (c0 as i64 + delta as i64) as usize;
        for il in 0..s.n_layer {
            for (cache, is_k) in [(self.kv.k(il), true), (self.kv.v(il), false)] {
                let ty = cache.ty();
                let row = row_size(ty, self.kv.n_embd_kv);
                let at = |cell: usize| self.kv.offset(row, stream, cell);
                let src = g.view(cache, &[s.head_dim, s.n_head_kv, n as i64], &[row_size(ty, s.head_dim), row], at(c0));
                let dst =
                    g.view(cache, &[s.head_dim, s.n_head_kv, n as i64], &[row_size(ty, s.head_dim), row], at(dst0));
                // a fresh tensor between source and destination: the ranges may overlap
                let moved = if is_k { self.rope_shift(src, positions) } else { g.cont(src) };
                g.expand(g.cpy(moved, dst));
            }
        }
    }

    /// Copies cells [0, n) of stream `src` over stream `dst`.
    pub fn copy_stream(&self, src: usize, dst: usize, n: usize) {
        let g = self.g;
        for il in 0..self.spec.n_layer {
            for cache in [self.kv.k(il), self.kv.v(il)] {
                let row = row_size(cache.ty(), self.kv.n_embd_kv);
                let from = g.view(cache, &[self.kv.n_embd_kv, n as i64], &[row], self.kv.offset(row, src, 0));
                let to = g.view(cache, &[self.kv.n_embd_kv, n as i64], &[row], self.kv.offset(row, dst, 0));
                g.expand(g.cpy(from, to));
            }
        }
    }
}
