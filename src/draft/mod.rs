//! The library's own draft forward: the drafter's weights in backend buffers
//! on the placement's devices, its draft KV cache, and its graphs built and
//! run through the ggml C API of the linked build (a `ggml_backend_sched`
//! over the drafter's devices, the target head's device and the CPU).
//!
//! What libllama computes: the target's forward (and its tap features). What
//! this module computes: everything of the drafter's, the selector's top-k
//! and edge scores included, on the target's token embeddings and head where
//! they are. libllama's `dflash` graph stays selectable
//! (`engine::drafter`).
//!
//! - `spec`: shapes and constants; which drafters this graph covers;
//! - `weights`, `names`: the weights and their roles;
//! - `kv`: the cache; `batch`: a decode's host-side inputs;
//! - `graph`, `conv`, `lattice`: the graphs (the lattice below the graph);
//!   `io`: the names of their inputs and outputs; `stage`: a scheduler and the
//!   graph it keeps between decodes of the same shape;
//! - `state`: a sequence's cells in state blobs.

mod batch;
mod conv;
mod graph;
mod io;
mod kv;
mod lattice;
mod names;
mod slices;
pub mod spec;
mod stage;
mod state;
mod weights;

use crate::checkpoint::Opened;
use crate::error::{Error, Result};
use crate::log;
use crate::sys::ggml::{Backend, GraphCtx, Sched, Tensor};
use crate::sys::{
    Device, DeviceKind, GGML_TYPE_F16, GGML_TYPE_F32, MemoryUse, TargetContext, TargetHead, ggml_backend_dev_t,
    ggml_type,
};

use batch::{InjectInputs, NoiseInputs};
pub use batch::{InjectRow, NoiseBlock};

use graph::{HeadSlice, Net, TargetHead as HeadTensors};
use kv::KvCache;
use names::ModelIds;
use slices::SliceTopK;
use spec::Spec;
use stage::Stage;
use weights::{Slot, Weights};

/// How to build an own-graph drafter.
pub struct OwnSetup<'a> {
    pub target: &'a TargetContext,
    /// Devices for the drafter's layers and KV (empty: the CPU).
    pub layers: &'a [Device],
    /// The target head's device when it is not one of `layers`.
    pub head: Option<&'a Device>,
    /// Layers to offload (None: all), as llama_model_params.n_gpu_layers.
    pub n_gpu_layers: Option<u32>,
    pub type_k: Option<u32>,
    pub type_v: Option<u32>,
    /// Cells per sequence.
    pub n_cells: u32,
    pub n_seq: usize,
    /// Rows of the largest injection decode.
    pub n_ubatch: u32,
    /// Threads of decodes of many rows (all of the drafter's).
    pub n_threads: i32,
}

/// What reading a head split by tensor moves between devices (`OwnDrafter::head_traffic`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadTraffic {
    /// Slices the target's head is read in (1: whole).
    pub slices: u64,
    /// Bytes the last noise decode moved: the hidden states to each slice's
    /// device, each slice's candidates (ids and logits) to the merge.
    pub moved: u64,
    /// What gathering every slice's logits to the merge would have moved on
    /// the same decode (the hidden states' copies included).
    pub full_gather: u64,
    /// Bytes a copy of the whole head on every slice's device would add.
    pub mirrored: u64,
}

/// Bytes of compute buffers by the stage (scheduler) that holds them: every
/// compute buffer of the own graph is one stage's. The selection stage holds
/// some only for a split head whose candidates the host merges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageBytes {
    /// Noise decodes (the head and, unless the host merges, the lattice).
    pub noise: u64,
    /// The lattice of candidates merged on the host (`select_merged`).
    pub selection: u64,
    /// Injections and the cache's own edits.
    pub injection: u64,
}

impl StageBytes {
    pub fn total(&self) -> u64 {
        self.noise + self.selection + self.injection
    }
}

/// The target's head as the graphs read it: its tensors, and who ranks each
/// slice of a split head (empty: ggml in the graph, merged there).
struct HeadRead {
    tensors: TargetHead,
    topk: Vec<SliceTopK>,
}

impl HeadRead {
    /// Whether the host merges the slices' candidates (some slice is ranked
    /// outside the graph).
    fn merged_on_host(&self) -> bool {
        self.topk.iter().any(SliceTopK::outside)
    }
}

/// The drafter with its own graph.
pub struct OwnDrafter {
    // drop order: the schedulers (their buffers back graphs over the tensors
    // below) first, then the cache and weights
    /// Noise decodes.
    noise_stage: Stage,
    /// The lattice of noise decodes whose candidates the host merges (a
    /// split head with slices ranked outside the graph, `slices`).
    select_stage: Stage,
    /// Injections, and the cache's own edits (shift, copy).
    inject_stage: Stage,
    kv: KvCache,
    weights: Weights,
    ids: ModelIds,
    spec: Spec,
    head: HeadRead,
    mask_token: i32,
    flash_attn: bool,
    n_threads: i32,
    n_ubatch: u32,
    /// The devices besides the CPU the drafter runs on: its layers', and the
    /// target head's when the drafter reads it elsewhere (empty: the CPU only).
    devices: Vec<Device>,
    /// Of the last noise decode.
    traffic: HeadTraffic,
}

/// Tensors and nodes a graph of `n_blocks` noise blocks may create: a layer
/// of DFlash2 makes about 110 nodes and 10 more per attention run, the head
/// and lattice about 60; the margin is wide because ggml aborts past it.
fn graph_capacity(n_layer: usize, n_blocks: usize) -> usize {
    1024 + n_layer * (256 + 24 * n_blocks.max(1))
}

/// Which device holds layer `il` (None: the CPU) with `n_gpu_layers` of
/// `n_layer` offloaded to `devices` (libllama's rule: the last layers go,
/// split evenly in order).
fn layer_device(il: usize, n_layer: usize, n_gpu_layers: Option<u32>, devices: &[Device]) -> Option<usize> {
    if devices.is_empty() {
        return None;
    }
    let ngl = n_gpu_layers.map_or(n_layer + 1, |n| n as usize);
    let start = (n_layer + 1).saturating_sub(ngl);
    if il < start {
        return None;
    }
    let span = (n_layer - start).max(1);
    Some(((il - start) * devices.len() / span).min(devices.len() - 1))
}

impl OwnDrafter {
    pub fn new(opened: &Opened, setup: &OwnSetup) -> Result<OwnDrafter> {
        let ckpt = &opened.ckpt;
        let spec = Spec::new(ckpt, setup.target.n_embd());
        let cpu_dev = Backend::cpu()?.describe();
        let dev_of_layer = |il: usize| {
            layer_device(il, spec.n_layer, setup.n_gpu_layers, setup.layers)
                .map_or_else(|| cpu_dev.clone(), |d| setup.layers[d].clone())
        };
        let ngl_all = setup.n_gpu_layers.is_none_or(|n| n as usize > spec.n_layer);
        let output_dev = if ngl_all {
            setup.layers.last().cloned().unwrap_or_else(|| cpu_dev.clone())
        } else {
            dev_of_layer(spec.n_layer - 1)
        };
        let device_of = |slot: Slot| match slot {
            Slot::Input => cpu_dev.clone(),
            Slot::Fusion => dev_of_layer(0),
            Slot::Layer(il) => dev_of_layer(il),
            Slot::Output => output_dev.clone(),
        };
        let weights = Weights::load(&opened.file, opened.data_offset, &opened.tensors, device_of)?;
        let ids = ModelIds::resolve(&weights, spec.n_layer, ckpt.selector)?;
        let tensors = TargetHead::find(setup.target, setup.layers.first().map(|d| d.dev))?;
        let topk = if ids.output.is_none() {
            slices::choose(&tensors.output().iter().map(|p| p.0).collect::<Vec<_>>())
        } else {
            Vec::new()
        };
        let head = HeadRead { tensors, topk };
        let types: (ggml_type, ggml_type) =
            (setup.type_k.unwrap_or(GGML_TYPE_F16), setup.type_v.unwrap_or(GGML_TYPE_F16));
        let kv =
            KvCache::new(spec.n_layer, spec.n_embd_kv(), setup.n_cells as usize, setup.n_seq, types, dev_of_layer)?;

        // backends: every device that holds a weight, the cache or a target
        // tensor the graph reads; the CPU last, as the scheduler requires
        // (a head split by tensor: each slice's device)
        let mut head_devices: Vec<Device> = Vec::new();
        if ids.tok_embd.is_none() {
            head_devices.extend(head.tensors.tok_embd().device());
        }
        if ids.output.is_none() {
            head_devices.extend(head.tensors.output().iter().filter_map(|(w, _, _)| w.device()));
        }
        let mut devices: Vec<Device> = Vec::new();
        for d in setup.layers.iter().chain(setup.head).cloned().chain(head_devices) {
            if d.kind != DeviceKind::Cpu && !devices.iter().any(|x| x.dev == d.dev) {
                devices.push(d);
            }
        }
        // each scheduler has backends of its own (the same devices): they are
        // used one at a time, but a backend is not shared between owners
        let backends = || -> Result<Vec<Backend>> {
            let mut b = devices.iter().map(Backend::new).collect::<Result<Vec<_>>>()?;
            b.push(Backend::cpu()?);
            Ok(b)
        };
        let capacity = graph_capacity(spec.n_layer, setup.n_seq);
        let mut drafter = OwnDrafter {
            noise_stage: Stage::new(Sched::new(backends()?, capacity)?),
            select_stage: Stage::new(Sched::new(backends()?, capacity)?),
            inject_stage: Stage::new(Sched::new(backends()?, capacity)?),
            kv,
            weights,
            ids,
            spec,
            head,
            mask_token: ckpt.mask_token as i32,
            flash_attn: true,
            n_threads: setup.n_threads.max(1),
            n_ubatch: setup.n_ubatch,
            devices,
            traffic: HeadTraffic::default(),
        };
        drafter.flash_attn = drafter.layers_support_flash_attn()?;
        drafter.reserve(setup.n_seq, ckpt.block_size as usize)?;
        log::info(&format!(
            "draft graph: the library's own ({} layers, {}, flash attention {}, weights {:.1} MiB, KV {:.1} MiB{})",
            drafter.spec.n_layer,
            if drafter.spec.selector.is_some() { "DFlash2" } else { "plain DFlash" },
            if drafter.flash_attn { "on" } else { "off" },
            drafter.weights.bytes() as f64 / (1 << 20) as f64,
            drafter.kv.bytes_on(None) as f64 / (1 << 20) as f64,
            drafter.describe_head_slices(),
        ));
        Ok(drafter)
    }

    /// ", the target's head in N vocabulary slices: RPC0 [0, 500), ..." for a
    /// head split by tensor (empty otherwise).
    fn describe_head_slices(&self) -> String {
        let parts = self.head.tensors.output();
        if self.ids.output.is_some() || parts.len() < 2 {
            return String::new();
        }
        let n_vocab = self.spec.n_vocab;
        let ends = parts.iter().skip(1).map(|p| p.2).chain([n_vocab]);
        let slices: Vec<String> = parts
            .iter()
            .zip(ends)
            .map(|((w, _, first), end)| {
                let at = w.device().map(|d| d.name);
                let at = at.unwrap_or_else(|| if w.in_host_memory() { "CPU".into() } else { "?".into() });
                format!("{at} [{first}, {end})")
            })
            .collect();
        format!(
            ", the target's head in {} vocabulary slices: {}; a partial top-{} on each",
            parts.len(),
            slices.join(", "),
            self.spec.top_k
        )
    }

    /// Whether every layer's device runs ggml's fused attention on this
    /// cache's types (libllama's auto flash attention decides the same way).
    fn layers_support_flash_attn(&self) -> Result<bool> {
        let g = GraphCtx::new(16)?;
        let s = &self.spec;
        let q = g.new_tensor(GGML_TYPE_F32, &[s.head_dim, 1, s.n_head, 1]);
        let k = g.new_tensor(self.kv.k(0).ty(), &[s.head_dim, 256, s.n_head_kv, 1]);
        let v = g.new_tensor(self.kv.v(0).ty(), &[s.head_dim, 256, s.n_head_kv, 1]);
        let mask = g.new_tensor(GGML_TYPE_F16, &[256, 1, 1, 1]);
        let fa = g.flash_attn(q, k, v, mask, s.kq_scale, None);
        let devices: Vec<ggml_backend_dev_t> =
            (0..s.n_layer).filter_map(|il| self.kv.k(il).device()).map(|d| d.dev).collect();
        Ok(self.noise_stage.sched().backends().iter().filter(|b| devices.contains(&b.device())).all(|b| b.supports(fa)))
    }

    /// Allocates the compute buffers of the largest graphs once: a noise
    /// decode of every sequence over full caches, an injection of n_ubatch rows.
    fn reserve(&mut self, n_seq: usize, block: usize) -> Result<()> {
        let blocks: Vec<NoiseBlock> = (0..n_seq)
            .map(|s| NoiseBlock { stream: s, anchor: (self.kv.n_cells - block) as i32, id_last: 0 })
            .collect();
        let inputs = NoiseInputs::new(&blocks, block, self.mask_token, &self.spec, &self.kv)?;
        let OwnDrafter { noise_stage, inject_stage, kv, weights, ids, spec, head, flash_attn, .. } = self;
        let g = GraphCtx::new(graph_capacity(spec.n_layer, n_seq))?;
        net(&g, weights, ids, spec, kv, head, *flash_attn).noise(&inputs);
        noise_stage.sched_mut().reserve(&g)?;
        let g = GraphCtx::new(graph_capacity(spec.n_layer, 1))?;
        net(&g, weights, ids, spec, kv, head, *flash_attn).inject(self.n_ubatch.max(1) as i64);
        inject_stage.sched_mut().reserve(&g)?;
        if head.merged_on_host() {
            let n = (n_seq * block) as i64;
            let g = GraphCtx::new(graph_capacity(spec.n_layer, 1))?;
            net(&g, weights, ids, spec, kv, head, *flash_attn).select_lattice(n, block as i64);
            self.select_stage.sched_mut().reserve(&g)?;
        }
        Ok(())
    }

    /// Injects rows of tap features into the cache at their positions.
    pub fn inject(&mut self, rows: &[InjectRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let inputs = InjectInputs::new(rows, &self.spec, &self.kv)?;
        let OwnDrafter { inject_stage, kv, weights, ids, spec, head, flash_attn, n_threads, .. } = self;
        let g = inject_stage.graph(vec![rows.len() as i64], graph_capacity(spec.n_layer, 1), |g| {
            net(g, weights, ids, spec, kv, head, *flash_attn).inject(rows.len() as i64);
        })?;
        input(g, io::FEATURES)?.write(0, &inputs.features)?;
        input(g, io::POSITIONS)?.write(0, &inputs.positions)?;
        input(g, io::CELLS)?.write(0, &inputs.cells)?;
        inject_stage.compute(*n_threads)?;
        for r in rows {
            kv.mark_used(r.stream, r.pos as usize, r.pos as usize + 1);
        }
        Ok(())
    }

    /// Decodes noise blocks of `width` rows (blocks sorted by stream decode
    /// with the fewest attention ops) and returns their lattice rows, block
    /// by block: `width` rows of n_embd floats each. The blocks never stay in
    /// the cache.
    pub fn noise(&mut self, blocks: &[NoiseBlock], width: usize) -> Result<Vec<f32>> {
        if blocks.is_empty() {
            return Ok(Vec::new());
        }
        if width < 2 || width as i64 > self.spec.block_size {
            return Err(Error::internal(format!(
                "noise blocks of {width} rows (trained block {})",
                self.spec.block_size
            )));
        }
        let inputs = NoiseInputs::new(blocks, width, self.mask_token, &self.spec, &self.kv)?;
        // the graph depends on the blocks' streams, their width and the cells
        // attention reads; everything else is an input
        let mut key: Vec<i64> = blocks.iter().map(|b| b.stream as i64).collect();
        key.extend([width as i64, inputs.n_kv as i64]);
        let OwnDrafter { noise_stage, kv, weights, ids, spec, head, flash_attn, n_threads, .. } = self;
        let g = noise_stage.graph(key, graph_capacity(spec.n_layer, blocks.len()), |g| {
            net(g, weights, ids, spec, kv, head, *flash_attn).noise(&inputs);
        })?;
        input(g, io::TOKENS)?.write(0, &inputs.tokens)?;
        input(g, io::POSITIONS)?.write(0, &inputs.positions)?;
        input(g, io::CELLS)?.write(0, &inputs.cells)?;
        for (swa, masks) in [(false, &inputs.masks), (true, &inputs.masks_swa)] {
            for (run, m) in masks.iter().enumerate() {
                write_mask(input(g, &io::mask(run, swa))?, m, *flash_attn)?;
            }
        }
        noise_stage.compute(*n_threads)?;
        // what a decode moves depends on its graph's shape and placement only
        if self.noise_stage.take_rebuilt() {
            self.traffic = self.count_head_traffic()?;
        }
        let lattice = if self.head.merged_on_host() {
            self.select_merged(&inputs.tokens, width)?
        } else {
            input(self.noise_stage.graph_kept()?, io::LATTICE)?
        };
        let mut out = vec![0.0f32; lattice.n_elements() as usize];
        lattice.read(0, &mut out)?;
        debug_assert_eq!(lattice.ty(), GGML_TYPE_F32);
        Ok(out)
    }

    /// The lattice of the computed noise graph of a split head whose slices'
    /// candidates the host merges: merged (`slices::merge`), then scored by
    /// the selection graph. Returns its output.
    fn select_merged(&mut self, tokens: &[i32], width: usize) -> Result<Tensor<'_>> {
        let n = tokens.len();
        let k = self.spec.top_k as usize;
        let firsts: Vec<i64> = self.head.tensors.output().iter().map(|p| p.2).collect();
        let g = self.noise_stage.graph_kept()?;
        let (ids_m, logits_m) = slices::merge(g, &self.head.topk, &firsts, k, n)?;
        let mut hidden = vec![0f32; self.spec.n_embd as usize * n];
        input(g, io::HEAD_IN)?.read(0, &mut hidden)?;
        let OwnDrafter { select_stage, kv, weights, ids, spec, head, flash_attn, n_threads, .. } = self;
        let g = select_stage.graph(vec![n as i64, width as i64], graph_capacity(spec.n_layer, 1), |g| {
            net(g, weights, ids, spec, kv, head, *flash_attn).select_lattice(n as i64, width as i64);
        })?;
        input(g, io::SEL_IDS)?.write(0, &ids_m)?;
        input(g, io::SEL_LOGITS)?.write(0, &logits_m)?;
        // plain DFlash reads neither the hidden states (the selector's gate)
        // nor the tokens (its anchors): not in its graph, not allocated
        let (hidden_in, tokens_in) = (input(g, io::HEAD_IN)?, input(g, io::TOKENS)?);
        if hidden_in.is_allocated() {
            hidden_in.write(0, &hidden)?;
        }
        if tokens_in.is_allocated() {
            tokens_in.write(0, tokens)?;
        }
        select_stage.compute(*n_threads)?;
        input(self.select_stage.graph_kept()?, io::LATTICE)
    }

    /// What the last noise decode moved between devices to read the target's
    /// head (nothing when it is whole or the drafter has its own).
    pub fn head_traffic(&self) -> HeadTraffic {
        self.traffic
    }

    /// Counts, on the kept noise graph, the bytes that crossed devices to
    /// read a split head: by the devices the scheduler gave its nodes.
    fn count_head_traffic(&self) -> Result<HeadTraffic> {
        let parts = self.head.tensors.output();
        let mut t = HeadTraffic { slices: parts.len() as u64, ..HeadTraffic::default() };
        if self.ids.output.is_some() || parts.len() < 2 {
            t.slices = if self.ids.output.is_some() { 0 } else { 1 };
            return Ok(t);
        }
        let g = self.noise_stage.graph_kept()?;
        let sched = self.noise_stage.sched();
        let cpu = sched.backends().last().map(|b| b.device());
        let hidden = input(g, io::HEAD_IN)?;
        let on_host = self.head.merged_on_host();
        // where the candidates meet: the host (CPU) for a host merge
        let merge = if on_host { cpu } else { sched.device_of(input(g, io::HEAD_MERGE)?) };
        let hidden_dev = sched.device_of(hidden);
        let hidden_bytes = hidden.nbytes() as u64;
        if on_host && hidden_dev != cpu {
            // to the host and into the selection graph
            t.moved += 2 * hidden_bytes;
        }
        let k_bytes = 2 * 4 * self.spec.top_k as u64 * hidden.ne()[1] as u64;
        let mut head_bytes = 0u64;
        for (j, (weight, _, _)) in parts.iter().enumerate() {
            let logits = input(g, &io::head_logits(j))?;
            let at = sched.device_of(logits);
            let copy_in = if at != hidden_dev { hidden_bytes } else { 0 };
            t.moved += copy_in;
            t.full_gather += copy_in;
            if at != merge {
                t.full_gather += logits.nbytes() as u64;
                let part = if on_host { g.tensor(&io::head_part_ids(j)) } else { g.tensor(&io::head_part(j)) };
                t.moved += match (part, self.head.topk.get(j)) {
                    // ids and logits: 2 x 4 bytes per candidate
                    (Some(part), _) => 2 * part.nbytes() as u64,
                    (None, Some(kind)) if kind.outside() => k_bytes,
                    _ => 0,
                };
            }
            head_bytes += weight.nbytes() as u64;
        }
        // each device holding it all: S copies of the head instead of one
        t.mirrored = head_bytes * (parts.len() as u64 - 1);
        Ok(t)
    }

    /// Forgets positions [p0, p1) of a stream (llama's bounds).
    pub fn seq_rm(&mut self, stream: usize, p0: i32, p1: i32) -> bool {
        if stream >= self.kv.n_stream {
            return false;
        }
        self.kv.remove(stream, p0, p1);
        true
    }

    /// Moves the rows at positions [p0, p1) of a stream by `delta`: K is
    /// re-roped by `delta` (libllama's K shift), rows move to their new cells.
    pub fn seq_add(&mut self, stream: usize, p0: i32, p1: i32, delta: i32) -> Result<()> {
        let end = self.kv.end(stream);
        let c0 = p0.max(0) as usize;
        let c1 = if p1 < 0 { end } else { (p1 as usize).min(end) };
        if delta == 0 || c0 >= c1 {
            return Ok(());
        }
        let (d0, d1) = (c0 as i64 + delta as i64, c1 as i64 + delta as i64);
        if d0 < 0 || d1 > self.kv.n_cells as i64 {
            return Err(Error::backend(format!("shifting draft cells [{c0}, {c1}) by {delta} leaves the draft KV")));
        }
        let (d0, d1) = (d0 as usize, d1 as usize);
        if (d0..d1).any(|c| !(c0..c1).contains(&c) && self.kv.is_used(stream, c)) {
            return Err(Error::internal(format!("shifting draft cells [{c0}, {c1}) by {delta} overwrites rows")));
        }
        let used: Vec<bool> = (c0..c1).map(|c| self.kv.is_used(stream, c)).collect();
        let n = c1 - c0;
        let OwnDrafter { inject_stage, kv, weights, ids, spec, head, flash_attn, n_threads, .. } = self;
        // a one-off graph: keyed apart from every injection shape
        let g = inject_stage.graph(
            vec![-1, stream as i64, c0 as i64, n as i64, delta as i64],
            graph_capacity(spec.n_layer, 1),
            |g| {
                net(g, weights, ids, spec, kv, head, *flash_attn).shift(stream, c0, n, delta);
            },
        )?;
        input(g, io::SHIFT)?.write(0, &vec![delta; n])?;
        inject_stage.compute(*n_threads)?;
        kv.remove(stream, c0 as i32, c1 as i32);
        for (i, &u) in used.iter().enumerate() {
            if u {
                kv.mark_used(stream, d0 + i, d0 + i + 1);
            }
        }
        Ok(())
    }

    /// Makes stream `dst` a copy of stream `src`.
    pub fn seq_cp_all(&mut self, src: usize, dst: usize) -> Result<()> {
        if src == dst || src >= self.kv.n_stream || dst >= self.kv.n_stream {
            return Ok(());
        }
        let n = self.kv.end(src);
        if n > 0 {
            let OwnDrafter { inject_stage, kv, weights, ids, spec, head, flash_attn, n_threads, .. } = self;
            inject_stage.graph(vec![-2, src as i64, dst as i64, n as i64], graph_capacity(spec.n_layer, 1), |g| {
                net(g, weights, ids, spec, kv, head, *flash_attn).copy_stream(src, dst, n);
            })?;
            inject_stage.compute(*n_threads)?;
        }
        let cells = self.kv.used_cells(src);
        self.kv.set_used(dst, &cells);
        Ok(())
    }

    pub fn clear(&mut self) {
        self.kv.clear();
    }

    pub fn pos_min(&self, stream: usize) -> i32 {
        if stream < self.kv.n_stream { self.kv.pos_min(stream) } else { -1 }
    }

    pub fn pos_max(&self, stream: usize) -> i32 {
        if stream < self.kv.n_stream { self.kv.pos_max(stream) } else { -1 }
    }

    pub fn n_cells(&self) -> u32 {
        self.kv.n_cells as u32
    }

    pub fn n_ubatch(&self) -> u32 {
        self.n_ubatch
    }

    pub fn n_embd(&self) -> usize {
        self.spec.n_embd as usize
    }

    /// Bytes a stream's state takes (`state::encode`).
    pub fn state_size(&self, stream: usize) -> usize {
        state::size(&self.kv, stream)
    }

    /// Writes a stream's cells into `dst`; bytes written (0 on failure).
    pub fn state_get(&self, stream: usize, dst: &mut [u8]) -> usize {
        state::encode(&self.kv, stream, dst).unwrap_or(0)
    }

    /// Loads a stream's cells from `src` (replacing them); bytes read (0 when
    /// the bytes are not a state of this cache: nothing changes then).
    pub fn state_set(&mut self, stream: usize, src: &[u8]) -> usize {
        state::decode(&mut self.kv, stream, src).unwrap_or(0)
    }

    /// Bytes of each stage's compute buffers on `dev` (None: everywhere):
    /// what `memory_use` sums as compute.
    pub fn compute_by_stage(&self, dev: Option<ggml_backend_dev_t>) -> StageBytes {
        let on_dev = |stage: &Stage| {
            let sched = stage.sched();
            sched
                .backends()
                .iter()
                .zip(sched.buffer_sizes())
                .filter(|(b, _)| dev.is_none_or(|d| d == b.device()))
                .map(|(_, n)| n as u64)
                .sum()
        };
        StageBytes {
            noise: on_dev(&self.noise_stage),
            selection: on_dev(&self.select_stage),
            injection: on_dev(&self.inject_stage),
        }
    }

    /// What the drafter holds on `dev` (None: everywhere).
    pub fn memory_use(&self, dev: Option<ggml_backend_dev_t>) -> MemoryUse {
        let compute = self.compute_by_stage(dev).total() as usize;
        let weights = dev.map_or(self.weights.bytes(), |d| self.weights.bytes_on(d));
        MemoryUse { weights, kv: self.kv.bytes_on(dev), compute }
    }

    pub fn devices(&self) -> Vec<Device> {
        self.devices.clone()
    }

    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes() as u64
    }

    /// Whether attention is ggml's fused kernel.
    pub fn flash_attn(&self) -> bool {
        self.flash_attn
    }
}

fn net<'a>(
    g: &'a GraphCtx,
    weights: &'a Weights,
    ids: &'a ModelIds,
    spec: &'a Spec,
    kv: &'a KvCache,
    head: &'a HeadRead,
    flash_attn: bool,
) -> Net<'a> {
    Net {
        g,
        w: weights,
        ids,
        spec,
        kv,
        head: HeadTensors {
            tok_embd: head.tensors.tok_embd(),
            output: head
                .tensors
                .output()
                .into_iter()
                .enumerate()
                .map(|(j, (weight, scale, first))| HeadSlice {
                    weight,
                    scale,
                    first,
                    outside: head.topk.get(j).is_some_and(SliceTopK::outside),
                })
                .collect(),
        },
        flash_attn,
    }
}

/// A graph's input or output by name.
fn input<'g>(g: &'g GraphCtx, name: &str) -> Result<Tensor<'g>> {
    g.tensor(name).ok_or_else(|| Error::internal(format!("the draft graph has no tensor '{name}'")))
}

/// Writes a mask of 0 / -inf, as f16 for fused attention.
fn write_mask(t: Tensor<'_>, mask: &[f32], f16: bool) -> Result<()> {
    if f16 {
        let bits: Vec<u16> = mask.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
        t.write(0, &bits)
    } else {
        t.write(0, mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs(n: usize) -> Vec<Device> {
        (0..n)
            .map(|i| Device {
                dev: (i + 1) as ggml_backend_dev_t,
                name: format!("D{i}"),
                kind: DeviceKind::Accelerator,
            })
            .collect()
    }

    #[test]
    fn layers_split_over_devices_like_libllama() {
        let two = devs(2);
        let all: Vec<_> = (0..4).map(|il| layer_device(il, 4, None, &two)).collect();
        assert_eq!(all, vec![Some(0), Some(0), Some(1), Some(1)]);
        // 2 of 4 offloaded: the last two layers
        let part: Vec<_> = (0..4).map(|il| layer_device(il, 4, Some(2), &two[..1])).collect();
        assert_eq!(part, vec![None, None, None, Some(0)]);
        assert_eq!(layer_device(0, 4, None, &[]), None);
        assert_eq!(layer_device(3, 4, Some(0), &two), None);
    }
}
