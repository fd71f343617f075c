//! Targets split by tensor (`-sm tensor`) over two llama.cpp RPC servers on
//! loopback: the drafter reads the target's output head by its per-device
//! slices (a partial top-k on each slice's device, merged), so its lattices
//! carry the candidates and scores of the unsplit head, and generation stays
//! lossless against target-only on the same placement.

mod common;

use std::path::Path;

use common::devices::{Placement, RpcServer, add_rpc_server, device, serial};
use common::lattice::canonical;
use common::spec::{Spec, default_params, generate, prefill};
use common::target::{TRow, Target};
use common::{Model, fixtures, smollm2, smollm2_drafter};
use dflash2::config::Config;
use dflash2::draft::{InjectRow, NoiseBlock};
use dflash2::engine::{DraftGraph, Drafter, create_drafter, estimate_memory};
use dflash2::error::Status;
use dflash2::sys::{self, TargetContext};

const N_GEN: usize = 20;

fn split(devices: &[sys::ggml_backend_dev_t], mode: sys::llama_split_mode) -> Placement<'_> {
    Placement { devices: Some(devices), n_gpu_layers: -1, split_mode: mode }
}

/// A context of `n_seq` sequences (512 cells, batches of 256) on `path` loaded with `placement`.
fn placed(path: &Path, placement: &Placement, n_seq: u32) -> Target {
    Target::with_model(Model::load_placed(path, placement), n_seq, 512, 256)
}

/// Two RPC servers, registered: their devices.
fn two_nodes() -> (RpcServer, RpcServer, Vec<sys::ggml_backend_dev_t>, Vec<String>) {
    let (a, b) = (RpcServer::start(), RpcServer::start());
    let names: Vec<String> = [&a, &b].iter().flat_map(|s| add_rpc_server(s)).collect();
    let nodes = names.iter().map(|n| device(n)).collect();
    (a, b, nodes, names)
}

fn own_drafter(target: &Target, drafter: &Path, n_seq: usize) -> (Drafter, i32, usize, usize) {
    let tc = unsafe { TargetContext::from_raw(target.ctx) }.unwrap();
    let config = Config { n_seq, draft_graph: DraftGraph::Own, ..Config::default() };
    let setup = create_drafter(&tc, drafter, &config).expect("own drafter");
    assert_eq!(setup.drafter.graph(), DraftGraph::Own);
    let h = &setup.ckpt.hparams;
    (setup.drafter, setup.ckpt.mask_token as i32, h.n_embd as usize, h.selector_top_k as usize)
}

/// The same tap features fed to a drafter on the unsplit target (`whole`)
/// and one on the target split by tensor (`sharded`): their lattices,
/// compared row by row as the walks read them: the same candidates, scores
/// within `ulps` units in the last place (a slice's product may take another
/// of ggml's CPU matmul kernels than the whole head's, by its shape).
/// Returns the rows compared and the largest difference in ulps.
fn lattices_agree(
    whole: &mut Target,
    sharded: &Target,
    drafter: &Path,
    ulps: u32,
    head_devices: usize,
) -> (usize, u32) {
    let n_seq = 2;
    let (mut a, mask, n_embd, k) = own_drafter(whole, drafter, n_seq);
    let (mut b, _, _, _) = own_drafter(sharded, drafter, n_seq);
    let names: Vec<String> = b.devices().into_iter().map(|d| d.name).collect();
    assert_eq!(names.len(), head_devices, "the devices the drafter reads the head on: {names:?}");
    let tc = unsafe { TargetContext::from_raw(whole.ctx) }.unwrap();
    let ckpt = dflash2::checkpoint::open(drafter).unwrap();
    let taps: Vec<u32> = ckpt.hparams.target_layers.iter().map(|&l| l as u32).collect();
    for &l in &taps {
        tc.set_layer_capture(l, true);
    }
    let n_vocab = whole.n_vocab;
    let mut next = [0i32; 2];
    let mut compared = 0;
    let mut worst = 0u32;
    for step in 0..3u64 {
        let mut rows = Vec::new();
        for (s, &at) in next.iter().enumerate() {
            for i in 0..(if step == 0 { 6 } else { 2 }) {
                let token = (10 + (step as usize * 31 + s * 7 + i * 13) % (n_vocab - 10)) as i32;
                rows.push(TRow { seq: s as i32, token, pos: at + i as i32, logits: false });
            }
        }
        whole.decode(&rows);
        let layers: Vec<&[f32]> = taps.iter().map(|&l| tc.layer_input(l).expect("captured")).collect();
        let n_tgt = tc.n_embd();
        let features: Vec<Vec<f32>> = (0..rows.len())
            .map(|i| layers.iter().flat_map(|l| &l[i * n_tgt..(i + 1) * n_tgt]).copied().collect())
            .collect();
        let inject: Vec<InjectRow> = rows
            .iter()
            .zip(&features)
            .map(|(r, f)| InjectRow { stream: r.seq as usize, pos: r.pos, features: f })
            .collect();
        a.inject(&inject).unwrap();
        b.inject(&inject).unwrap();
        for r in &rows {
            next[r.seq as usize] = next[r.seq as usize].max(r.pos + 1);
        }
        let block = ckpt.block_size as usize;
        let blocks: Vec<NoiseBlock> = (0..n_seq)
            .map(|s| NoiseBlock { stream: s, anchor: next[s], id_last: (20 + step as i32 * 3 + s as i32) })
            .collect();
        let la = a.noise(&blocks, block, mask).unwrap();
        let lb = b.noise(&blocks, block, mask).unwrap();
        assert!(la.iter().any(|&x| x != 0.0), "an all-zero lattice proves nothing");
        let (ca, cb) = (canonical(&la, n_embd, k, block), canonical(&lb, n_embd, k, block));
        assert_eq!(ca.len(), cb.len());
        for (row, (x, y)) in ca.iter().zip(&cb).enumerate() {
            let ids = |c: &Vec<(i32, i32, f32)>| c.iter().map(|e| (e.0, e.1)).collect::<Vec<_>>();
            assert_eq!(ids(x), ids(y), "step {step}, lattice row {row}: the candidates differ");
            for (p, q) in x.iter().zip(y) {
                let d = (p.2.to_bits() as i64 - q.2.to_bits() as i64).unsigned_abs() as u32;
                assert!(p.2.signum() == q.2.signum() && d <= ulps, "step {step}, row {row}: {} vs {}", p.2, q.2);
                worst = worst.max(d);
            }
            compared += 1;
        }
    }
    (compared, worst)
}

#[test]
fn a_head_split_by_vocabulary_gives_the_lattices_of_the_whole_head() {
    let _serial = serial();
    let (_a, _b, nodes, _) = two_nodes();
    let f = fixtures();
    // the fixture target has its own output.weight: -sm tensor splits its rows
    let mut whole = placed(&f.target, &split(&[], sys::LLAMA_SPLIT_MODE_LAYER), 2);
    let sharded = placed(&f.target, &split(&nodes, sys::LLAMA_SPLIT_MODE_TENSOR), 2);
    // two equal slices take the whole head's matmul kernel: bit for bit
    let (rows, worst) = lattices_agree(&mut whole, &sharded, &f.drafter, 0, 2);
    eprintln!("split head: {rows} lattice rows identical to the whole head's (largest difference {worst} ulp)");
}

#[test]
fn a_mirrored_head_under_sm_tensor_gives_the_lattices_of_the_unsplit_target() {
    let _serial = serial();
    let (_a, _b, nodes, _) = two_nodes();
    // SmolLM2's head is its token embeddings (tied): -sm tensor mirrors it, so
    // the drafter reads it whole on one device, as on an unsplit target
    let path = smollm2();
    let mut whole = placed(&path, &split(&[], sys::LLAMA_SPLIT_MODE_LAYER), 2);
    let sharded = placed(&path, &split(&nodes, sys::LLAMA_SPLIT_MODE_TENSOR), 2);
    let (rows, worst) = lattices_agree(&mut whole, &sharded, &smollm2_drafter(&path), 0, 1);
    eprintln!("SmolLM2 -sm tensor: {rows} lattice rows identical to the unsplit target's ({worst} ulp)");
}

/// The inputs of the drafter's tap layers for one prompt on a SmolLM2 target
/// loaded with `placement`: one vector per tap, rows x n_embd.
fn tap_features(placement: &Placement, taps: &[u32], prompt: &str) -> (Vec<Vec<f32>>, usize) {
    let path = smollm2();
    let mut t = placed(&path, placement, 1);
    let toks = t.tokenize(&format!("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"), false);
    let tc = unsafe { TargetContext::from_raw(t.ctx) }.unwrap();
    for &l in taps {
        tc.set_layer_capture(l, true);
    }
    let rows: Vec<TRow> =
        toks.iter().enumerate().map(|(i, &token)| TRow { seq: 0, token, pos: i as i32, logits: false }).collect();
    t.decode(&rows);
    let n = tc.n_embd() * rows.len();
    (taps.iter().map(|&l| tc.layer_input(l).expect("captured")[..n].to_vec()).collect(), tc.n_embd())
}

/// What the drafter is fed on a target split by tensor: llama.cpp computes the
/// target's layers with per-device partial products summed across devices, in
/// another order than one device sums them. Under -sm layer the tap features
/// are the CPU's bit for bit; under -sm tensor they drift (rounding to f16 in
/// attention and to q8_1 before each Q4_1 matmul amplifies the reordering),
/// while staying the same vectors (cosine near 1). The drift is the target's
/// arithmetic, not the drafter's; it is why the trained drafter (fitted on
/// this target's CPU features) has a lower tau under -sm tensor than under
/// -sm layer (docs/tensor-parallel.md).
#[test]
fn tap_features_under_sm_tensor_drift_only_by_the_targets_arithmetic() {
    let _serial = serial();
    let (_a, _b, nodes, _) = two_nodes();
    let ckpt = dflash2::checkpoint::open(&smollm2_drafter(&smollm2())).unwrap();
    let taps: Vec<u32> = ckpt.hparams.target_layers.iter().map(|&l| l as u32).collect();
    let prompt = "Write a haiku about rain.";
    let (cpu, n) = tap_features(&split(&[], sys::LLAMA_SPLIT_MODE_LAYER), &taps, prompt);
    let (layer, _) = tap_features(&split(&nodes, sys::LLAMA_SPLIT_MODE_LAYER), &taps, prompt);
    let (tensor, _) = tap_features(&split(&nodes, sys::LLAMA_SPLIT_MODE_TENSOR), &taps, prompt);
    assert!(cpu.iter().zip(&layer).all(|(a, b)| a == b), "-sm layer's tap features differ from the CPU's");
    for (t, (a, b)) in taps.iter().zip(cpu.iter().zip(&tensor)) {
        let (mut worst_cos, mut worst_rel) = (1f64, 0f64);
        for (x, y) in a.chunks(n).zip(b.chunks(n)) {
            let dot: f64 = x.iter().zip(y).map(|(p, q)| *p as f64 * *q as f64).sum();
            let norm = |v: &[f32]| v.iter().map(|p| (*p as f64).powi(2)).sum::<f64>().sqrt();
            let diff: f64 = x.iter().zip(y).map(|(p, q)| (*p as f64 - *q as f64).powi(2)).sum::<f64>().sqrt();
            worst_cos = worst_cos.min(dot / (norm(x) * norm(y)));
            worst_rel = worst_rel.max(diff / norm(x));
        }
        eprintln!(
            "tap layer {t:2}: -sm tensor vs CPU: smallest cosine {worst_cos:.6}, largest |diff|/|x| {worst_rel:.2e}"
        );
        assert!(worst_cos > 0.99, "tap layer {t}: -sm tensor's features are not the target's (cosine {worst_cos})");
    }
}

/// Greedy speculative decoding on `model` is identical to target-only on
/// the same model; returns (drafted, accepted).
fn lossless(model: Model, drafter: &Path, prompts: &[&str]) -> (u64, u64) {
    let n_seq = prompts.len() as u32;
    let mut target = Target::with_model(model, n_seq, 1024, 512);
    let toks: Vec<Vec<i32>> = prompts
        .iter()
        .map(|p| target.tokenize(&format!("<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n"), false))
        .collect();
    // target-only first, on the same context
    let mut want = Vec::new();
    for (s, prompt) in toks.iter().enumerate() {
        let rows: Vec<TRow> = prompt
            .iter()
            .enumerate()
            .map(|(i, &token)| TRow { seq: s as i32, token, pos: i as i32, logits: i + 1 == prompt.len() })
            .collect();
        let mut out = target.decode(&rows);
        while out.len() < N_GEN {
            let pos = (prompt.len() + out.len() - 1) as i32;
            out.extend(target.decode(&[TRow { seq: s as i32, token: *out.last().unwrap(), pos, logits: true }]));
        }
        want.push(out);
        target.seq_rm(s as i32, -1, -1);
    }
    let mut params = default_params(n_seq);
    params.n_seq = n_seq;
    let spec = Spec::new(&target, drafter, params);
    let mut streams = prefill(&mut target, &spec, &toks);
    generate(&mut target, &spec, &mut streams, N_GEN, 7);
    for (s, want) in streams.iter().zip(&want) {
        assert_eq!(&s.out[..N_GEN], &want[..N_GEN], "seq {}", s.seq);
    }
    let st = spec.stats();
    assert!(st.n_drafted > 0, "nothing drafted");
    (st.n_drafted, st.n_accepted)
}

#[test]
fn generation_on_targets_split_by_tensor_is_lossless() {
    let _serial = serial();
    let (_a, _b, nodes, names) = two_nodes();
    let f = fixtures();
    let prompts = ["Write a haiku about rain.", "Count from one to five."];
    let tensor = split(&nodes, sys::LLAMA_SPLIT_MODE_TENSOR);
    // a head split by vocabulary rows
    let (drafted, _) = lossless(Model::load_placed(&f.target, &tensor), &f.drafter, &prompts);
    eprintln!("fixture target -sm tensor over {names:?}: {drafted} drafted");
    // SmolLM2's head is its token embeddings (tied): every device holds it whole
    let path = smollm2();
    let drafter = smollm2_drafter(&path);
    let (drafted, accepted) = lossless(Model::load_placed(&path, &tensor), &drafter, &prompts);
    let layer = split(&nodes, sys::LLAMA_SPLIT_MODE_LAYER);
    let (drafted_l, accepted_l) = lossless(Model::load_placed(&path, &layer), &drafter, &prompts);
    eprintln!("SmolLM2 -sm tensor: {accepted}/{drafted} accepted; -sm layer: {accepted_l}/{drafted_l}");
    if drafter.ends_with("smollm2-135m-dflash2.gguf") {
        assert!(accepted > 0, "the trained drafter had no draft accepted under -sm tensor");
    }
}

/// The error of creating a drafter with `config` on the fixture target split
/// by tensor over two nodes: `_UNSUPPORTED`, naming `-sm tensor` and `why`.
fn refused_on_a_split_head(config: Config, why: &str) {
    let _serial = serial();
    let (_a, _b, nodes, _) = two_nodes();
    let f = fixtures();
    let target = placed(&f.target, &split(&nodes, sys::LLAMA_SPLIT_MODE_TENSOR), 1);
    let tc = unsafe { TargetContext::from_raw(target.ctx) }.unwrap();
    let err = create_drafter(&tc, &f.drafter, &config).err().expect("refused");
    assert_eq!(err.status, Status::LLAMA_SPEC_DFLASH2_ERR_UNSUPPORTED);
    assert!(err.message.contains("-sm tensor") && err.message.contains(why), "{}", err.message);
}

#[test]
fn libllamas_graph_on_a_split_head_is_refused_with_the_reason() {
    refused_on_a_split_head(Config { n_seq: 1, draft_graph: DraftGraph::Libllama, ..Config::default() }, "own");
}

#[test]
fn a_split_over_two_nodes_and_the_cpu_reads_three_slices_and_stays_lossless() {
    let _serial = serial();
    let (_a, _b, mut nodes, _) = two_nodes();
    nodes.push(device("CPU"));
    let f = fixtures();
    let tensor = split(&nodes, sys::LLAMA_SPLIT_MODE_TENSOR);
    {
        let target = placed(&f.target, &tensor, 1);
        let tc = unsafe { TargetContext::from_raw(target.ctx) }.unwrap();
        let devices = dflash2::sys::TargetHead::split_devices(&tc).expect("slices found").expect("split");
        let names: Vec<String> = devices.into_iter().map(|d| d.name).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert_eq!(names[2], "CPU", "{names:?}");
    }
    let mut whole = placed(&f.target, &split(&[], sys::LLAMA_SPLIT_MODE_LAYER), 2);
    let sharded = placed(&f.target, &tensor, 2);
    // the CPU slice is read in host memory: the drafter's devices are the two nodes
    let (rows, worst) = lattices_agree(&mut whole, &sharded, &f.drafter, 8, 2);
    drop((whole, sharded));
    let (drafted, _) = lossless(Model::load_placed(&f.target, &tensor), &f.drafter, &["one two", "three four"]);
    eprintln!(
        "RPC0 + RPC1 + CPU: {rows} lattice rows with the whole head's candidates, scores within {worst} ulp; \
         lossless, {drafted} drafted"
    );
}

/// Loads `path` split by tensor over `devices` in the shares `split` (as `-ts`).
fn load_with_shares(path: &Path, devices: &[sys::ggml_backend_dev_t], split: &[f32]) -> Model {
    common::init_backend();
    let mut list = devices.to_vec();
    list.push(std::ptr::null_mut());
    let mut shares = split.to_vec();
    shares.resize(128, 0.0);
    let mut mp = unsafe { sys::llama_model_default_params() };
    mp.use_extra_bufts = false;
    mp.devices = list.as_mut_ptr();
    mp.n_gpu_layers = -1;
    mp.split_mode = sys::LLAMA_SPLIT_MODE_TENSOR;
    mp.tensor_split = shares.as_ptr();
    let m = unsafe { sys::llama_model_load_from_file(common::cstr(path).as_ptr(), mp) };
    assert!(!m.is_null(), "libllama could not load {}", path.display());
    Model(m)
}

#[test]
fn a_slice_with_fewer_rows_than_candidates_gives_all_of_them() {
    let _serial = serial();
    let (_a, _b, nodes, _) = two_nodes();
    let f = fixtures();
    let sharded = Target::with_model(load_with_shares(&f.target, &nodes, &[0.005, 0.995]), 2, 512, 256);
    let tc = unsafe { TargetContext::from_raw(sharded.ctx) }.unwrap();
    let (drafter, _, _, k) = own_drafter(&sharded, &f.drafter, 1);
    drop(drafter);
    let head = dflash2::sys::TargetHead::find(&tc, None).unwrap();
    let rows: Vec<i64> = head.output().iter().map(|(w, _, _)| w.ne()[1]).collect();
    assert!(rows.len() == 2 && rows[0] < k as i64, "slices of {rows:?} rows, k {k}: the first must be shorter than k");
    let mut whole = placed(&f.target, &split(&[], sys::LLAMA_SPLIT_MODE_LAYER), 2);
    let (n, worst) = lattices_agree(&mut whole, &sharded, &f.drafter, 8, 2);
    drop((whole, sharded));
    let (drafted, _) = lossless(load_with_shares(&f.target, &nodes, &[0.005, 0.995]), &f.drafter, &["one two"]);
    eprintln!(
        "slices of {rows:?} rows (k {k}): {n} lattice rows agree within {worst} ulp; lossless, {drafted} drafted"
    );
}

#[test]
fn what_only_libllamas_graph_serves_is_refused_on_a_split_head_instead_of_falling_back() {
    // a quantized draft KV cache: the own graph does not cover it (libllama's would, unsplit)
    refused_on_a_split_head(Config { n_seq: 1, type_k: Some(sys::GGML_TYPE_Q8_0), ..Config::default() }, "quantized");
}

/// A head split by tensor with a slice in host memory is merged on the host,
/// and the drafter reserves a selection stage to score the merged candidates
/// (`-sm tensor` over two nodes and the CPU). Its compute buffers are part of
/// what the drafter reports (the stages' buffers add up to its compute, on
/// every device and in all) and of the estimate, which covers each stage on
/// the drafter's device from above (the host's input copies aside, as
/// `tests/engine_devices.rs` has them).
#[test]
fn the_selection_stage_of_a_head_merged_on_the_host_is_counted_in_memory_use_and_the_estimate() {
    let _serial = serial();
    let (_a, _b, mut nodes, _) = two_nodes();
    nodes.push(device("CPU"));
    let f = fixtures();
    for n_seq in [1, 4] {
        let target = placed(&f.target, &split(&nodes, sys::LLAMA_SPLIT_MODE_TENSOR), n_seq as u32);
        let tc = unsafe { TargetContext::from_raw(target.ctx) }.unwrap();
        let config = Config { n_seq, draft_graph: DraftGraph::Own, ..Config::default() };
        let setup = create_drafter(&tc, &f.drafter, &config).expect("own drafter");
        let Drafter::Own(own) = &setup.drafter else { panic!("not the own graph") };
        let stages = own.compute_by_stage(None);
        assert!(stages.selection > 0, "n_seq {n_seq}: no selection stage reserved for a host merge: {stages:?}");
        let used = setup.drafter.memory_use(None).expect("memory use");
        assert_eq!(used.compute as u64, stages.total(), "n_seq {n_seq}: {stages:?}");
        let estimate = estimate_memory(Some(&tc.facts()), &f.drafter, &config, tc.n_ctx_seq()).expect("estimate");
        let estimated = estimate.stages.expect("the own graph's stages");
        assert_eq!(estimate.compute, estimated.total(), "n_seq {n_seq}: {estimate:?}");
        // the drafter's layers are on the first node; the second holds a slice
        // of the head (its logits and top-k in the noise graph)
        let layers = &setup.drafter.devices()[0];
        for d in setup.drafter.devices() {
            let on = setup.drafter.memory_use(Some(&d)).expect("memory use on a device");
            let by_stage = own.compute_by_stage(Some(d.dev));
            eprintln!("n_seq {n_seq}, {}: {by_stage:?}, estimate {estimated:?}", d.name);
            assert_eq!(on.compute as u64, by_stage.total(), "n_seq {n_seq}, {}", d.name);
        }
        let on_layers = own.compute_by_stage(Some(layers.dev));
        assert!(on_layers.selection > 0, "n_seq {n_seq}: the selection stage is not on {}", layers.name);
        for (what, est, got) in [
            ("noise", estimated.noise, on_layers.noise),
            ("selection", estimated.selection, on_layers.selection),
            ("injection", estimated.injection, on_layers.injection),
        ] {
            assert!(est >= got, "n_seq {n_seq}: {what} estimated {est} below the {got} reserved on {}", layers.name);
        }
    }
}
