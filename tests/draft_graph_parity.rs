//! The library's own draft graph against libllama's `dflash` graph on the
//! same inputs: one target context decodes prompts with its tap layers
//! captured, both drafters are fed the same feature rows at the same dense
//! positions, and their noise-block lattices (top-k candidates and edge
//! scores) are compared bit for bit, before and after the cache edits a host
//! makes (more rows, a rollback, a context shift, a sequence copy).

mod common;

use std::path::Path;

use common::lattice::canonical;
use common::target::{TRow, Target};
use dflash2::config::Config;
use dflash2::draft::{InjectRow, NoiseBlock};
use dflash2::engine::{DraftGraph, Drafter, create_drafter};
use dflash2::sys::TargetContext;

/// A deterministic token stream (an LCG over the vocabulary, specials skipped).
fn tokens(seed: u64, n: usize, n_vocab: usize) -> Vec<i32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (10 + (x >> 33) as usize % (n_vocab - 10)) as i32
        })
        .collect()
}

/// Both drafters on one target, fed alike.
struct Pair {
    own: Drafter,
    lib: Drafter,
    taps: Vec<u32>,
    n_embd_tgt: usize,
    mask_token: i32,
    block: usize,
    /// Rows each sequence has injected (its next draft position).
    next_pos: Vec<i32>,
    /// The target's next position per sequence.
    target_pos: Vec<i32>,
    n_vocab: usize,
    n_embd: usize,
    top_k: u32,
}

/// Lattice floats that differ, and the largest difference.
#[derive(Debug, Default, PartialEq)]
struct Diff {
    differing: usize,
    max_abs: f32,
    total: usize,
}

impl Pair {
    fn new(target: &Target, drafter: &Path, n_seq: usize) -> Pair {
        let tc = unsafe { TargetContext::from_raw(target.ctx) }.unwrap();
        let mut config = Config { n_seq, ..Config::default() };
        config.draft_graph = DraftGraph::Own;
        let own = create_drafter(&tc, drafter, &config).expect("own drafter");
        config.draft_graph = DraftGraph::Libllama;
        let lib = create_drafter(&tc, drafter, &config).expect("libllama drafter");
        assert_eq!(own.drafter.graph(), DraftGraph::Own);
        assert_eq!(lib.drafter.graph(), DraftGraph::Libllama);
        let taps: Vec<u32> = own.ckpt.hparams.target_layers.iter().map(|&l| l as u32).collect();
        for &lid in &taps {
            tc.set_layer_capture(lid, true);
        }
        Pair {
            own: own.drafter,
            lib: lib.drafter,
            taps,
            n_embd_tgt: tc.n_embd(),
            mask_token: own.ckpt.mask_token as i32,
            block: own.limits.block_size,
            next_pos: vec![0; n_seq],
            target_pos: vec![0; n_seq],
            n_vocab: target.n_vocab,
            n_embd: own.ckpt.hparams.n_embd as usize,
            top_k: own.ckpt.hparams.selector_top_k,
        }
    }

    /// Decodes `n[s]` new tokens of every sequence s on the target in one
    /// batch and injects their features into both drafters: one injection
    /// per sequence, or all sequences' rows in one (`together`).
    ///
    /// libllama splits a batch of several sequences into ubatches of equal
    /// rows per sequence, the own graph injects it whole; ggml's CPU matmul
    /// takes another kernel for one row than for several (llamafile's sgemm
    /// needs two or more), so only batches of one sequence reach both graphs
    /// in the same shapes.
    fn feed(&mut self, target: &mut Target, n: &[usize], seed: u64, together: bool) {
        let mut rows = Vec::new();
        for (s, &k) in n.iter().enumerate() {
            for (i, t) in tokens(seed + s as u64, k, self.n_vocab).into_iter().enumerate() {
                rows.push(TRow { seq: s as i32, token: t, pos: self.target_pos[s] + i as i32, logits: false });
            }
        }
        target.decode(&rows);
        let tc = unsafe { TargetContext::from_raw(target.ctx) }.unwrap();
        let layers: Vec<&[f32]> = self.taps.iter().map(|&l| tc.layer_input(l).expect("captured")).collect();
        let features: Vec<Vec<f32>> = (0..rows.len())
            .map(|i| layers.iter().flat_map(|l| &l[i * self.n_embd_tgt..(i + 1) * self.n_embd_tgt]).copied().collect())
            .collect();
        let mut inject = Vec::new();
        for (r, f) in rows.iter().zip(&features) {
            let s = r.seq as usize;
            inject.push(InjectRow { stream: s, pos: self.next_pos[s], features: f });
            self.next_pos[s] += 1;
            self.target_pos[s] += 1;
        }
        let groups: Vec<Vec<InjectRow>> = if together {
            vec![inject]
        } else {
            (0..n.len()).map(|s| inject.iter().filter(|r| r.stream == s).copied().collect()).collect()
        };
        for rows in groups {
            self.own.inject(&rows).expect("own inject");
            self.lib.inject(&rows).expect("libllama inject");
        }
    }

    /// One noise block per listed sequence: both graphs' lattices.
    fn lattices(&mut self, seqs: &[usize], width: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let ids = tokens(seed, seqs.len(), self.n_vocab);
        let blocks: Vec<NoiseBlock> = seqs
            .iter()
            .zip(ids)
            .map(|(&s, id_last)| NoiseBlock { stream: s, anchor: self.next_pos[s], id_last })
            .collect();
        let a = self.own.noise(&blocks, width, self.mask_token).expect("own noise");
        let b = self.lib.noise(&blocks, width, self.mask_token).expect("libllama noise");
        (a, b)
    }

    /// One noise block per listed sequence: both lattices, compared.
    fn compare(&mut self, seqs: &[usize], width: usize, seed: u64) -> Diff {
        let (a, b) = self.lattices(seqs, width, seed);
        assert_eq!(a.len(), b.len(), "lattice sizes");
        assert!(a.iter().any(|&x| x != 0.0), "an all-zero lattice proves nothing");
        let mut d = Diff { total: a.len(), ..Diff::default() };
        for (x, y) in a.iter().zip(&b) {
            if x.to_bits() != y.to_bits() {
                d.differing += 1;
                d.max_abs = d.max_abs.max((x - y).abs());
            }
        }
        d
    }

    fn both(&mut self, f: impl Fn(&mut Drafter)) {
        f(&mut self.own);
        f(&mut self.lib);
    }
}

fn assert_identical(d: Diff, what: &str) {
    assert_eq!((d.differing, d.max_abs), (0, 0.0), "{what}: {} of {} lattice floats differ", d.differing, d.total);
}

/// The fixed sequence of inputs and edits every pair goes through.
fn run_script(target_path: &Path, drafter: &Path, n_seq: usize) {
    let mut target = Target::new(target_path, n_seq as u32, 1024, 256);
    let mut pair = Pair::new(&target, drafter, n_seq);
    let all: Vec<usize> = (0..n_seq).collect();
    let block = pair.block;

    // prompts of different lengths, then the first blocks
    let lens: Vec<usize> = (0..n_seq).map(|s| 11 + 7 * s).collect();
    pair.feed(&mut target, &lens, 1, false);
    assert_identical(pair.compare(&all, block, 100), "after the prompts");
    assert_identical(pair.compare(&all[..1], block, 101), "one sequence");
    assert_identical(pair.compare(&all, 2, 102), "blocks of 2 rows");

    // a few accepted rows per step
    for step in 0..3 {
        let n: Vec<usize> = (0..n_seq).map(|s| 1 + (s + step) % 3).collect();
        pair.feed(&mut target, &n, 10 + step as u64, false);
        assert_identical(pair.compare(&all, block, 200 + step as u64), "after decode steps");
    }

    // a rollback of the last two rows of the last sequence (the target goes
    // on from where it is: the drafters' positions are their own)
    let s = n_seq - 1;
    let p = pair.next_pos[s] - 2;
    pair.both(|d| assert!(d.seq_rm(s as i32, p, -1)));
    pair.next_pos[s] = p;
    assert_identical(pair.compare(&all, block, 300), "after a rollback");

    // a copy of sequence 0 over the last one
    if n_seq > 1 {
        pair.both(|d| {
            d.seq_rm((n_seq - 1) as i32, -1, -1);
            d.seq_cp_all(0, (n_seq - 1) as i32).unwrap();
        });
        pair.next_pos[n_seq - 1] = pair.next_pos[0];
        assert_identical(pair.compare(&all, block, 500), "after a sequence copy");
    }

    // the rows of every sequence in one injection (what the engine does): the
    // own graph takes them in one matmul, libllama in ubatches per sequence
    // count, so where a ubatch has a single row its kernel differs
    if n_seq > 1 {
        let n: Vec<usize> = (0..n_seq).map(|s| 1 + s % 3).collect();
        pair.feed(&mut target, &n, 600, true);
        let (a, b) = pair.lattices(&all, block, 601);
        let g = agreement(&a, &b, pair.n_embd, pair.top_k as usize, block);
        assert_close(&format!("rows of {n_seq} sequences in one injection"), &g);
    }

    // a context shift of the first sequence: rows 3..7 dropped, the rest moved
    // down, K re-roped by the same delta on both sides. libllama leaves the
    // moved rows in their cells and puts the next block in the freed ones:
    // attention then sums the same terms in another order than the own
    // cache (cell = position), so the lattices agree closely, not bitwise.
    // (libllama's sliding-window cache cannot shift at all: it aborts in
    // set_input_k_shift, so an engine on it keeps gaps instead.)
    if pair.lib.can_shift() {
        pair.both(|d| {
            assert!(d.seq_rm(0, 3, 7));
            d.seq_add(0, 7, -1, -4).unwrap();
        });
        pair.next_pos[0] -= 4;
        let (a, b) = pair.lattices(&all, block, 400);
        let g = agreement(&a, &b, pair.n_embd, pair.top_k as usize, block);
        assert_close("after a shift", &g);
    }
}

/// How closely two lattices agree where they can be compared: the rows
/// whose candidate sets (and predecessors') are equal, the largest score
/// difference on them, and the largest score there (the scale summation-order
/// error grows with: a generated drafter's scores run to 18, the fixtures' to 4).
struct Agreement {
    same: usize,
    rows: usize,
    max_abs: f32,
    scale: f32,
}

fn agreement(a: &[f32], b: &[f32], n_embd: usize, k: usize, width: usize) -> Agreement {
    let (ca, cb) = (canonical(a, n_embd, k, width), canonical(b, n_embd, k, width));
    let mut g = Agreement { same: 0, rows: ca.len(), max_abs: 0.0, scale: 0.0 };
    for (x, y) in ca.iter().zip(&cb) {
        if x.iter().map(|c| (c.0, c.1)).eq(y.iter().map(|c| (c.0, c.1))) {
            g.same += 1;
            for (p, q) in x.iter().zip(y) {
                g.max_abs = g.max_abs.max((p.2 - q.2).abs());
                g.scale = g.scale.max(p.2.abs());
            }
        }
    }
    g
}

/// Lattices that agree closely, not bitwise: their scores within
/// `CLOSE` of the largest score on the rows compared.
const CLOSE: f32 = 0.015;

fn assert_close(what: &str, g: &Agreement) {
    let &Agreement { same, rows, max_abs, scale } = g;
    eprintln!(
        "{what}: candidate sets equal on {same} of {rows} rows; largest score difference on equal sets {max_abs} (largest score {scale})"
    );
    assert!(scale > 0.0, "{what}: no row's candidate sets agree, nothing was compared");
    assert!(
        max_abs <= CLOSE * scale,
        "{what}: scores differ by {max_abs}, more than {CLOSE} of the largest score {scale}"
    );
}

#[test]
fn fixture_drafter_lattices_are_bit_identical() {
    let f = common::fixtures();
    run_script(&f.target, &f.drafter, 1);
    run_script(&f.target, &f.drafter, 3);
}

#[test]
fn sliding_window_drafter_lattices_are_bit_identical() {
    let f = common::fixtures();
    run_script(&f.target, &f.drafter_swa, 2);
}

#[test]
fn own_head_drafter_lattices_are_bit_identical() {
    let f = common::fixtures();
    run_script(&f.target, &f.drafter_own_head, 2);
}

#[test]
fn mrope_drafter_on_the_hybrid_target_lattices_are_bit_identical() {
    let f = common::fixtures();
    run_script(&f.qwen35_target, &f.qwen35_drafter, 2);
}

#[test]
fn smollm2_trained_drafter_lattices_are_bit_identical() {
    let target = common::smollm2();
    let drafter = common::smollm2_drafter(&target);
    run_script(&target, &drafter, 1);
    run_script(&target, &drafter, 4);
}

#[test]
fn drafter_with_every_optional_part_lattices_are_bit_identical() {
    // GELU, shared K/V, post norms, output scales, rope factors, sinks, the
    // embedding / attention / value / logit scales, a softcap, q8_0 matrices
    let f = common::fixtures();
    run_script(&f.target, &f.variants.extras, 1);
    run_script(&f.target, &f.variants.extras, 2);
}

#[test]
fn reduced_vocabulary_causal_drafter_lattices_are_bit_identical() {
    // a d2t head of 200 rows scattered into the vocabulary, causal attention,
    // q4_0 matrices
    let f = common::fixtures();
    run_script(&f.target, &f.variants.d2t, 2);
}

/// A plain DFlash drafter has no selector: libllama's graph gives its logits
/// (no lattice), the own graph ranks them. Its lattice rows must hold, per
/// position, the top-k of libllama's logits with those logits as scores.
#[test]
fn plain_dflash_lattices_rank_libllamas_logits() {
    use dflash2::sys;
    let f = common::fixtures();
    let path = &f.variants.plain;
    let mut target = Target::new(&f.target, 1, 512, 256);
    let tc = unsafe { TargetContext::from_raw(target.ctx) }.unwrap();
    let own = create_drafter(&tc, path, &Config::default()).expect("own drafter");
    assert!(!own.ckpt.selector);
    let libllama_graph = Config { draft_graph: DraftGraph::Libllama, ..Config::default() };
    let refused = create_drafter(&tc, path, &libllama_graph).err().expect("libllama's graph has no lattice for it");
    assert!(refused.message.contains("own draft graph only"), "{}", refused.message);
    let (k, n_embd, block) =
        (own.ckpt.hparams.selector_top_k as usize, own.ckpt.hparams.n_embd as usize, own.limits.block_size);
    let taps: Vec<u32> = own.ckpt.hparams.target_layers.iter().map(|&l| l as u32).collect();
    let mut own = own.drafter;

    // libllama's dflash model and context for the same file, logits on
    let model = common::Model::load(path);
    let ctx = unsafe {
        let mut cp = sys::llama_context_default_params();
        cp.n_ctx = 512;
        cp.n_batch = 256;
        cp.n_ubatch = 256;
        cp.n_threads = 2;
        cp.n_threads_batch = 2;
        cp.ctx_other = target.ctx;
        sys::llama_init_from_model(model.0, cp)
    };
    assert!(!ctx.is_null());
    // a dflash context attends non-causally unless the drafter says causal
    unsafe { sys::llama_set_causal_attn(ctx, false) };

    for &lid in &taps {
        tc.set_layer_capture(lid, true);
    }
    let prompt = tokens(7, 23, target.n_vocab);
    let rows: Vec<TRow> =
        prompt.iter().enumerate().map(|(i, &t)| TRow { seq: 0, token: t, pos: i as i32, logits: false }).collect();
    target.decode(&rows);
    let n_embd_tgt = tc.n_embd();
    let layers: Vec<&[f32]> = taps.iter().map(|&l| tc.layer_input(l).unwrap()).collect();
    let features: Vec<Vec<f32>> = (0..rows.len())
        .map(|i| layers.iter().flat_map(|l| &l[i * n_embd_tgt..(i + 1) * n_embd_tgt]).copied().collect())
        .collect();
    let inject: Vec<InjectRow> =
        features.iter().enumerate().map(|(i, f)| InjectRow { stream: 0, pos: i as i32, features: f }).collect();
    own.inject(&inject).unwrap();
    let mask = own_mask_token(path);
    let anchor = rows.len() as i32;
    let lattice = own.noise(&[NoiseBlock { stream: 0, anchor, id_last: prompt[3] }], block, mask).unwrap();

    let n_vocab = target.n_vocab;
    let logits: Vec<Vec<f32>> = unsafe {
        let b = sys::llama_batch_ext_init(ctx);
        for (i, f) in features.iter().enumerate() {
            let e = sys::llama_embd { data: f.as_ptr(), n_rows: 1, n_embd: f.len() };
            let idx = sys::llama_batch_ext_add_embd(b, 0, e);
            assert!(idx >= 0 && sys::llama_batch_ext_set_pos(b, idx, [i as i32; 4].as_ptr()));
        }
        assert_eq!(sys::llama_process(ctx, sys::LLAMA_PROCESS_TYPE_DECODE, b), 0);
        sys::llama_batch_ext_clear(b);
        for p in 0..block {
            let t = if p == 0 { prompt[3] } else { mask };
            let idx = sys::llama_batch_ext_add_token(b, 0, t);
            assert!(idx >= 0 && sys::llama_batch_ext_set_pos(b, idx, [anchor + p as i32; 4].as_ptr()));
            assert!(sys::llama_batch_ext_set_output_logits(b, idx, true));
        }
        assert_eq!(sys::llama_process(ctx, sys::LLAMA_PROCESS_TYPE_DECODE, b), 0);
        sys::llama_batch_ext_free(b);
        (0..block)
            .map(|p| std::slice::from_raw_parts(sys::llama_get_logits_ith(ctx, p as i32), n_vocab).to_vec())
            .collect()
    };
    unsafe { sys::llama_free(ctx) };

    for p in 1..block {
        let row = &lattice[p * n_embd..(p + 1) * n_embd];
        let mut ids: Vec<usize> = row[..k].iter().map(|&x| x as usize).collect();
        let mut by_logit: Vec<usize> = (0..n_vocab).collect();
        by_logit.sort_by(|&a, &b| logits[p][b].total_cmp(&logits[p][a]));
        let mut top: Vec<usize> = by_logit[..k].to_vec();
        ids.sort();
        top.sort();
        assert_eq!(ids, top, "position {p}: the own graph's candidates are libllama's top-{k}");
        for (j, &id) in row[..k].iter().enumerate() {
            for i in 0..k {
                let score = row[k + i * k + j];
                assert_eq!(score.to_bits(), logits[p][id as usize].to_bits(), "position {p}, candidate {j}: its logit");
            }
        }
    }
}

fn own_mask_token(path: &Path) -> i32 {
    dflash2::checkpoint::open(path).unwrap().mask_token as i32
}

/// What serves an engine, as the C API reports it: the own graph by default,
/// libllama's when asked, and libllama's where the own graph falls back (a
/// quantized draft KV: libllama rotates quantized K/V, the own cache stores
/// f32, f16 or bf16).
#[test]
fn the_c_api_reports_the_graph_that_serves() {
    use dflash2::ffi::*;
    // SmolLM2's drafter: its 64-wide heads fit q8_0's blocks of 32
    let path = common::smollm2();
    let drafter = common::smollm2_drafter(&path);
    let target = Target::new(&path, 1, 512, 256);
    let graph_of = |params: llama_spec_dflash2_params| unsafe {
        let spec = llama_spec_dflash2_init(target.ctx, common::cstr(&drafter).as_ptr(), params);
        assert!(!spec.is_null(), "{}", common::last_error());
        let graph = llama_spec_dflash2_draft_graph(spec);
        llama_spec_dflash2_free(spec);
        graph
    };
    let own = llama_spec_dflash2_draft_graph::LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_OWN as i32;
    let lib = llama_spec_dflash2_draft_graph::LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_LIBLLAMA as i32;
    let mut params = llama_spec_dflash2_default_params();
    assert_eq!(graph_of(params), own);
    params.draft_graph = lib;
    assert_eq!(graph_of(params), lib);
    params.draft_graph = own;
    params.type_k = 8; // q8_0
    params.type_v = 8;
    assert_eq!(graph_of(params), lib, "a quantized draft KV falls back to libllama's graph");
    let rc = unsafe { llama_spec_dflash2_draft_graph(std::ptr::null_mut()) };
    assert_eq!(rc, common::status_code("NULL_ARGUMENT"));
}
