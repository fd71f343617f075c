//! The drafter on real devices: llama.cpp RPC servers on loopback (remote
//! devices, in every build) and the Vulkan device of a Vulkan build (Mesa's
//! llvmpipe; those tests are `#[ignore]`d here and run by scripts/devices.sh
//! against that build). The placement rule (src/engine/placement.rs): the
//! drafter goes with the target's output head; named devices keep its layers,
//! with the head's device added to its scheduler. Every placement is lossless
//! against target-only greedy decoding on the same placement, and drafts.

mod common;

use std::path::Path;

use common::devices::{Placement, RpcServer, add_rpc_server, device, serial, vulkan};
use common::spec::{Spec, default_params, generate, prefill};
use common::target::{TRow, Target};
use common::{Model, cstr, last_error, smollm2, smollm2_drafter, status_code};
use dflash2::config::Config;
use dflash2::engine::{DraftGraph, Engine, estimate_memory};
use dflash2::ffi::*;
use dflash2::sys::{self, TargetContext};

const N_GEN: usize = 24;
/// SmolLM2-135M's repeating layers; -ngl N offloads the last N of the 31 (the
/// output layer counts as one), so the head is on a device whenever N >= 1.
const SMOLLM2_LAYERS: i32 = 30;

const PROMPTS: [&str; 2] =
    ["Write a Python function that adds two numbers.", "List three colours of the rainbow, one per line."];

fn all_layers(devices: &[sys::ggml_backend_dev_t]) -> Placement<'_> {
    Placement { devices: Some(devices), n_gpu_layers: -1, split_mode: sys::LLAMA_SPLIT_MODE_LAYER }
}

fn chat_prompts(target: &Target) -> Vec<Vec<i32>> {
    PROMPTS
        .iter()
        .map(|p| target.tokenize(&format!("<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n"), false))
        .collect()
}

/// Target-only greedy continuation of each prompt on a context of `model`.
fn reference(model: &Model, prompts: &[Vec<i32>]) -> Vec<Vec<i32>> {
    prompts
        .iter()
        .map(|prompt| {
            with_second_context(model.0, |t| {
                let rows: Vec<TRow> = prompt
                    .iter()
                    .enumerate()
                    .map(|(i, &token)| TRow { seq: 0, token, pos: i as i32, logits: i + 1 == prompt.len() })
                    .collect();
                let mut out = t.decode(&rows);
                while out.len() < N_GEN {
                    let pos = (prompt.len() + out.len() - 1) as i32;
                    let next = t.decode(&[TRow { seq: 0, token: *out.last().unwrap(), pos, logits: true }]);
                    out.extend(next);
                }
                out
            })
        })
        .collect()
}

/// Runs `body` on a second one-sequence context of `model`, which stays owned
/// by its first Target: the context is freed after, the model is not.
fn with_second_context<R>(model: *mut sys::llama_model, body: impl FnOnce(&mut Target) -> R) -> R {
    let mut t = std::mem::ManuallyDrop::new(Target::with_model(Model(model), 1, 1024, 512));
    let out = body(&mut t);
    unsafe { sys::llama_free(t.ctx) };
    out
}

/// Names of the devices the drafter of an engine with `params` on `target` went on.
fn drafter_devices(target: &Target, drafter: &Path, params: llama_spec_dflash2_params) -> Vec<String> {
    let config = Config::from_c(&params, read_devices(params.devices)).unwrap();
    let engine = Engine::new(unsafe { TargetContext::from_raw(target.ctx) }.unwrap(), drafter, &config).unwrap();
    engine.draft_devices().into_iter().map(|d| d.name).collect()
}

fn read_devices(list: *mut sys::ggml_backend_dev_t) -> Option<Vec<sys::ggml_backend_dev_t>> {
    if list.is_null() {
        return None;
    }
    let mut out = Vec::new();
    unsafe {
        while !(*list.add(out.len())).is_null() {
            out.push(*list.add(out.len()));
        }
    }
    Some(out)
}

/// Greedy speculative decoding of the prompts, all sequences at once, is
/// identical to target-only on the same placement; returns (drafted, accepted).
fn lossless_on(model: Model, drafter: &Path, params: llama_spec_dflash2_params) -> (u64, u64) {
    let n_seq = PROMPTS.len() as u32;
    let mut target = Target::with_model(model, n_seq, 2048, 512);
    let prompts = chat_prompts(&target);
    let want = reference(&target.model, &prompts);
    let mut params = params;
    params.n_seq = n_seq;
    let spec = Spec::new(&target, drafter, params);
    let mut streams = prefill(&mut target, &spec, &prompts);
    generate(&mut target, &spec, &mut streams, N_GEN, 7);
    for (s, want) in streams.iter().zip(&want) {
        assert_eq!(&s.out[..N_GEN], &want[..], "seq {}", s.seq);
    }
    let st = spec.stats();
    assert!(st.n_drafted > 0, "nothing drafted");
    (st.n_drafted, st.n_accepted)
}

fn trained_drafter_accepts(drafter: &Path, accepted: u64) {
    if drafter.ends_with("smollm2-135m-dflash2.gguf") {
        assert!(accepted > 0, "the trained drafter had no draft accepted");
    }
}

#[test]
fn a_target_on_an_rpc_node_gets_its_drafter_there_and_stays_lossless() {
    let _serial = serial();
    let server = RpcServer::start();
    let names = add_rpc_server(&server);
    assert_eq!(names.len(), 1, "{names:?}");
    let rpc = [device(&names[0])];
    let path = smollm2();
    let drafter = smollm2_drafter(&path);

    let target = Target::with_model(Model::load_placed(&path, &all_layers(&rpc)), 1, 1024, 512);
    assert_eq!(drafter_devices(&target, &drafter, default_params(1)), vec![names[0].clone()]);
    drop(target);

    let (drafted, accepted) = lossless_on(Model::load_placed(&path, &all_layers(&rpc)), &drafter, default_params(1));
    eprintln!("target and drafter on {}: {accepted}/{drafted} accepted", names[0]);
    trained_drafter_accepts(&drafter, accepted);
}

#[test]
fn the_cpu_named_for_the_drafter_keeps_its_layers_and_reads_the_head_on_the_node() {
    let _serial = serial();
    let server = RpcServer::start();
    let names = add_rpc_server(&server);
    let rpc = [device(&names[0])];
    let path = smollm2();
    let drafter = smollm2_drafter(&path);

    // named: the CPU only (an empty list); the head is on the node
    let mut none: [sys::ggml_backend_dev_t; 1] = [std::ptr::null_mut()];
    let mut params = default_params(1);
    params.devices = none.as_mut_ptr();
    let target = Target::with_model(Model::load_placed(&path, &all_layers(&rpc)), 1, 1024, 512);
    let config = Config::from_c(&params, Some(vec![])).unwrap();
    let engine = Engine::new(unsafe { TargetContext::from_raw(target.ctx) }.unwrap(), &drafter, &config).unwrap();
    // the node is in the drafter's scheduler for the head, but holds no weights or KV of it
    assert_eq!(engine.draft_devices().iter().map(|d| d.name.clone()).collect::<Vec<_>>(), vec![names[0].clone()]);
    let node = &engine.draft_devices()[0];
    let on_node = engine.memory_use_on(Some(node)).unwrap();
    assert_eq!((on_node.weights, on_node.kv), (0, 0), "{on_node:?}");
    assert_eq!(engine.memory_use().unwrap().weights as u64, engine.weight_bytes());
    drop(engine);
    drop(target);

    let (drafted, accepted) = lossless_on(Model::load_placed(&path, &all_layers(&rpc)), &drafter, params);
    eprintln!("target on {}, drafter on the CPU: {accepted}/{drafted} accepted", names[0]);
    trained_drafter_accepts(&drafter, accepted);
}

#[test]
fn a_target_on_the_cpu_with_its_drafter_on_a_node_is_lossless() {
    let _serial = serial();
    let server = RpcServer::start();
    let names = add_rpc_server(&server);
    let mut list = [device(&names[0]), std::ptr::null_mut()];
    let path = smollm2();
    let drafter = smollm2_drafter(&path);
    let mut params = default_params(1);
    params.devices = list.as_mut_ptr();
    let cpu_only = Placement { devices: Some(&[]), n_gpu_layers: 0, split_mode: sys::LLAMA_SPLIT_MODE_NONE };

    let target = Target::with_model(Model::load_placed(&path, &cpu_only), 1, 1024, 512);
    assert_eq!(drafter_devices(&target, &drafter, params), vec![names[0].clone()]);
    // by default it stays with the head, in host memory
    assert!(drafter_devices(&target, &drafter, default_params(1)).is_empty());
    drop(target);

    let (drafted, accepted) = lossless_on(Model::load_placed(&path, &cpu_only), &drafter, params);
    trained_drafter_accepts(&drafter, accepted);
    assert!(drafted > 0);
}

#[test]
fn a_target_split_over_two_nodes_puts_the_drafter_with_the_last_layers() {
    let _serial = serial();
    let (a, b) = (RpcServer::start(), RpcServer::start());
    let names: Vec<String> = [&a, &b].iter().flat_map(|s| add_rpc_server(s)).collect();
    let nodes: Vec<_> = names.iter().map(|n| device(n)).collect();
    let path = smollm2();
    let drafter = smollm2_drafter(&path);

    let target = Target::with_model(Model::load_placed(&path, &all_layers(&nodes)), 1, 1024, 512);
    assert_eq!(drafter_devices(&target, &drafter, default_params(1)), vec![names[1].clone()]);
    drop(target);

    // a partial offload: the first layers on the CPU, the rest and the head on the nodes
    let partial = Placement { devices: Some(&nodes), n_gpu_layers: 20, split_mode: sys::LLAMA_SPLIT_MODE_LAYER };
    let (drafted, accepted) = lossless_on(Model::load_placed(&path, &partial), &drafter, default_params(1));
    eprintln!("target on CPU + {names:?} (-ngl 20): {accepted}/{drafted} accepted");
    trained_drafter_accepts(&drafter, accepted);
}

#[test]
fn device_params_that_cannot_be_met_are_refused_with_a_reason() {
    let _serial = serial();
    let server = RpcServer::start();
    let names = add_rpc_server(&server);
    let rpc = [device(&names[0])];
    let path = smollm2();
    let drafter = smollm2_drafter(&path);
    let target = Target::with_model(Model::load_placed(&path, &all_layers(&rpc)), 1, 1024, 512);
    // init returns NULL; the status and the reason are the thread's last
    let refused = |params: llama_spec_dflash2_params| -> (i32, String) {
        let spec = unsafe { llama_spec_dflash2_init(target.ctx, cstr(&drafter).as_ptr(), params) };
        assert!(spec.is_null(), "init succeeded");
        (llama_spec_dflash2_last_status(), last_error())
    };

    // a pointer that is not a ggml device
    let mut bogus = [0x10 as sys::ggml_backend_dev_t, std::ptr::null_mut()];
    let mut params = default_params(1);
    params.devices = bogus.as_mut_ptr();
    let (status, err) = refused(params);
    assert_eq!(status, status_code("INVALID_ARGUMENT"));
    assert!(err.contains("params.devices[0]") && err.contains(&names[0]), "{err}");

    // n_gpu_layers below -1 (-1 is "all")
    let mut params = default_params(1);
    params.n_gpu_layers = -5;
    let (status, err) = refused(params);
    assert_eq!(status, status_code("INVALID_ARGUMENT"));
    assert!(err.contains("n_gpu_layers"), "{err}");

    // more than the node has free: compute buffers for a huge ubatch (the own
    // graph's injections hold ~14 KB a row: 2^24 rows are ~230 GB)
    let mut params = default_params(1);
    params.n_ubatch = 1 << 24;
    let (status, err) = refused(params);
    assert_eq!(status, status_code("OUT_OF_MEMORY"));
    assert!(err.contains("MiB free of") && err.contains(&names[0]), "{err}");
}

/// Weights and draft KV on the drafter's device exactly as estimated, its
/// compute buffers there within 1.2x from above. The scheduler also keeps a
/// small compute buffer in host memory (the graph's inputs on their way to the
/// device), which the estimate of device memory does not cover: under 5% of it.
fn memory_matches_the_estimate_on(target: &Target, drafter: &Path, device_name: &str) {
    let params = default_params(1);
    let n_ctx_seq = unsafe { sys::llama_n_ctx_seq(target.ctx) };
    let config = Config::from_c(&params, None).unwrap();
    let facts = unsafe { sys::target_facts(target.model.0) };
    let estimate = estimate_memory(Some(&facts), drafter, &config, n_ctx_seq).unwrap();
    let engine = Engine::new(unsafe { TargetContext::from_raw(target.ctx) }.unwrap(), drafter, &config).unwrap();
    let dev = engine.draft_devices().into_iter().find(|d| d.name == device_name).expect("the drafter's device");
    let on_dev = engine.memory_use_on(Some(&dev)).unwrap();
    let all = engine.memory_use().unwrap();
    eprintln!("{device_name}: estimate {estimate:?}, on the device {on_dev:?}, everywhere {all:?}");
    assert_eq!(on_dev.weights as u64, estimate.weights, "weights on {device_name}");
    assert_eq!(on_dev.kv as u64, estimate.kv, "draft KV on {device_name}");
    let compute = on_dev.compute as f64;
    assert!(compute <= estimate.compute as f64, "compute {compute} above the estimate {}", estimate.compute);
    assert!(estimate.compute as f64 <= 1.2 * compute, "compute estimate {} > 1.2 x {compute}", estimate.compute);
    // the host keeps the graph's inputs on their way to the device: for the
    // own graph mostly the tap features of an injection (n_ubatch rows)
    let host = (all.compute - on_dev.compute) as f64;
    let inputs = if engine.draft_graph() == DraftGraph::Own { features_bytes(&facts, drafter, &config) } else { 0.0 };
    assert!(host < 0.05 * estimate.compute as f64 + inputs, "host-side compute {host} of {}", estimate.compute);
}

/// Bytes of the tap features of the largest injection (n_ubatch rows).
fn features_bytes(facts: &dflash2::checkpoint::TargetFacts, drafter: &Path, config: &Config) -> f64 {
    let ckpt = dflash2::checkpoint::open(drafter).unwrap();
    let n_ubatch = config.n_ubatch.unwrap_or(512).max(512) as f64;
    n_ubatch * (ckpt.hparams.target_layers.len() as f64) * facts.n_embd as f64 * 4.0
}

#[test]
fn memory_on_an_rpc_node_matches_the_estimate() {
    let _serial = serial();
    let server = RpcServer::start();
    let names = add_rpc_server(&server);
    let rpc = [device(&names[0])];
    let path = smollm2();
    let target = Target::with_model(Model::load_placed(&path, &all_layers(&rpc)), 1, 1024, 512);
    memory_matches_the_estimate_on(&target, &smollm2_drafter(&path), &names[0]);
}

#[test]
#[ignore = "needs the Vulkan build of llama.cpp (scripts/devices.sh)"]
fn vulkan_target_and_drafter_on_the_device_are_lossless_and_sized_as_estimated() {
    let _serial = serial();
    let vk = [vulkan()];
    let path = smollm2();
    let drafter = smollm2_drafter(&path);
    let target = Target::with_model(Model::load_placed(&path, &all_layers(&vk)), 1, 1024, 512);
    assert_eq!(drafter_devices(&target, &drafter, default_params(1)), vec!["Vulkan0".to_string()]);
    memory_matches_the_estimate_on(&target, &drafter, "Vulkan0");
    drop(target);
    let (drafted, accepted) = lossless_on(Model::load_placed(&path, &all_layers(&vk)), &drafter, default_params(1));
    eprintln!("target and drafter on Vulkan0: {accepted}/{drafted} accepted");
    trained_drafter_accepts(&drafter, accepted);
}

#[test]
#[ignore = "needs the Vulkan build of llama.cpp (scripts/devices.sh)"]
fn vulkan_target_with_the_drafter_on_the_cpu_and_the_reverse_are_lossless() {
    let _serial = serial();
    let vk = [vulkan()];
    let path = smollm2();
    let drafter = smollm2_drafter(&path);
    let mut none: [sys::ggml_backend_dev_t; 1] = [std::ptr::null_mut()];
    let mut on_cpu = default_params(1);
    on_cpu.devices = none.as_mut_ptr();
    let (_, accepted) = lossless_on(Model::load_placed(&path, &all_layers(&vk)), &drafter, on_cpu);
    trained_drafter_accepts(&drafter, accepted);

    let mut list = [vk[0], std::ptr::null_mut()];
    let mut on_vk = default_params(1);
    on_vk.devices = list.as_mut_ptr();
    let cpu_only = Placement { devices: Some(&[]), n_gpu_layers: 0, split_mode: sys::LLAMA_SPLIT_MODE_NONE };
    let (_, accepted) = lossless_on(Model::load_placed(&path, &cpu_only), &drafter, on_vk);
    trained_drafter_accepts(&drafter, accepted);
}

#[test]
#[ignore = "needs the Vulkan build of llama.cpp (scripts/devices.sh)"]
fn vulkan_plus_an_rpc_node_plus_the_cpu_layer_split_is_lossless() {
    let _serial = serial();
    let server = RpcServer::start();
    let names = add_rpc_server(&server);
    let devices = [vulkan(), device(&names[0])];
    let path = smollm2();
    let drafter = smollm2_drafter(&path);
    let split = Placement {
        devices: Some(&devices),
        n_gpu_layers: SMOLLM2_LAYERS - 6,
        split_mode: sys::LLAMA_SPLIT_MODE_LAYER,
    };
    let target = Target::with_model(Model::load_placed(&path, &split), 1, 1024, 512);
    // the head goes with the last layers: on the last device of the split
    assert_eq!(drafter_devices(&target, &drafter, default_params(1)), vec![names[0].clone()]);
    drop(target);
    let (_, accepted) = lossless_on(Model::load_placed(&path, &split), &drafter, default_params(1));
    trained_drafter_accepts(&drafter, accepted);
}

/// Why a layer split over Vulkan, an RPC node and the CPU can make any
/// speculative decoder differ from one-token-at-a-time decoding: the target
/// itself is not batch-invariant there. Each greedy token of a one-row decode
/// is decoded again inside 8-row verify batches; where the batch's argmax
/// differs, it must be a near-tie (the two tokens' logits within 0.5 in the
/// batch's own row), not a placement that breaks the target. Prints what it saw.
#[test]
#[ignore = "needs the Vulkan build of llama.cpp (scripts/devices.sh)"]
fn vulkan_plus_an_rpc_node_plus_the_cpu_target_differs_by_batch_shape_only_on_near_ties() {
    let _serial = serial();
    let server = RpcServer::start();
    let names = add_rpc_server(&server);
    let devices = [vulkan(), device(&names[0])];
    let path = smollm2();
    let split = Placement { devices: Some(&devices), n_gpu_layers: 20, split_mode: sys::LLAMA_SPLIT_MODE_LAYER };
    let mut single = Target::with_model(Model::load_placed(&path, &split), 1, 1024, 512);
    let prompts = chat_prompts(&single);
    let differing = with_second_context(single.model.0, |batched| {
        let mut differing = Vec::new();
        for prompt in prompts {
            single.seq_rm(0, -1, -1);
            batched.seq_rm(0, -1, -1);
            let rows: Vec<TRow> = prompt
                .iter()
                .enumerate()
                .map(|(i, &token)| TRow { seq: 0, token, pos: i as i32, logits: i + 1 == prompt.len() })
                .collect();
            let mut out = single.decode(&rows);
            batched.decode(&rows);
            while out.len() < 32 {
                let pos = (prompt.len() + out.len() - 1) as i32;
                out.extend(single.decode(&[TRow { seq: 0, token: *out.last().unwrap(), pos, logits: true }]));
            }
            for k in (0..out.len()).step_by(8) {
                // [the token before, the next 7 greedy ones] at their positions: a verify batch
                let first = (prompt.len() + k - 1) as i32;
                let before = if k == 0 { *prompt.last().unwrap() } else { out[k - 1] };
                let tokens: Vec<i32> = std::iter::once(before).chain(out[k..k + 7].iter().copied()).collect();
                batched.seq_rm(0, first, -1);
                let rows: Vec<TRow> = tokens
                    .iter()
                    .enumerate()
                    .map(|(j, &token)| TRow { seq: 0, token, pos: first + j as i32, logits: true })
                    .collect();
                for (j, got) in batched.decode(&rows).into_iter().enumerate() {
                    if got != out[k + j] {
                        let logits = unsafe {
                            std::slice::from_raw_parts(
                                sys::llama_get_logits_ith(batched.ctx, j as i32),
                                batched.n_vocab,
                            )
                        };
                        differing.push((k + j, got, out[k + j], logits[got as usize] - logits[out[k + j] as usize]));
                    }
                }
            }
        }
        differing
    });
    eprintln!(
        "tokens whose argmax in an 8-row batch differs from a one-row decode (index, batch, single, gap): {differing:?}"
    );
    assert!(differing.iter().all(|d| d.3 < 0.5), "{differing:?}");
}
