//! A target's prompt decode must not change when the engine attaches to it,
//! on every placement, and must not read memory nothing wrote (issue 43).
//!
//! Under `-sm tensor` llama.cpp may give a device an empty slice of a weight
//! (SmolLM2's attention over two devices: all of it to one, alternating by
//! layer); ggml's meta backend then zeroes that device's never-computed partial
//! by scaling it by 0, which keeps NaN. llama-server answered "......" with the
//! drafter attached (its taps moved that partial onto NaN bytes) and after
//! other clients of the same RPC servers. Each test here fills the RPC
//! servers' reusable memory with NaN bytes first (`poison`), so that a decode
//! that reads memory it never wrote shows it.

mod common;

use common::devices::{Placement, RpcServer, add_rpc_server, device, poison, serial};
use common::reference::logits;
use common::spec::{Spec, default_params};
use common::target::{TRow, Target};
use common::{Model, smollm2, smollm2_drafter};
use dflash2::config::Config;
use dflash2::engine::create_drafter;
use dflash2::error::Status;
use dflash2::sys::{self, TargetContext};

const PROMPT: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\
                      <|im_end|>\n<|im_start|>user\nName four planets of the solar system and one fact about \
                      each.<|im_end|>\n<|im_start|>assistant\n";

fn two_nodes() -> (RpcServer, RpcServer, Vec<sys::ggml_backend_dev_t>) {
    let (a, b) = (RpcServer::start(), RpcServer::start());
    let names: Vec<String> = [&a, &b].iter().flat_map(|s| add_rpc_server(s)).collect();
    let nodes = names.iter().map(|n| device(n)).collect();
    (a, b, nodes)
}

/// Every row's logits of the prompt decoded from an empty cache.
fn prompt_logits(target: &mut Target, tokens: &[i32]) -> Vec<Vec<f32>> {
    unsafe { sys::llama_memory_clear(sys::llama_get_memory(target.ctx), true) };
    let rows: Vec<TRow> =
        tokens.iter().enumerate().map(|(i, &t)| TRow { token: t, pos: i as i32, seq: 0, logits: true }).collect();
    target.decode(&rows);
    (0..tokens.len()).map(|i| logits(target, i).to_vec()).collect()
}

/// The prompt's logits on SmolLM2 placed as `placement` (RPC nodes poisoned
/// before the context is made), without the engine and then with it
/// attached: bit-equal and finite. Returns the greedy first token.
fn same_logits_with_the_engine(placement: &Placement, nodes: &[sys::ggml_backend_dev_t], what: &str) -> i32 {
    let path = smollm2();
    let drafter = smollm2_drafter(&path);
    let model = Model::load_placed(&path, placement);
    poison(nodes, 64);
    let mut target = Target::with_model(model, 1, 512, 256);
    let tokens = target.tokenize(PROMPT, false);
    let alone = prompt_logits(&mut target, &tokens);
    let spec = Spec::new(&target, &drafter, default_params(1));
    poison(nodes, 64);
    let attached = prompt_logits(&mut target, &tokens);
    spec.process(&target);
    let mut differ = 0;
    for (i, (a, b)) in alone.iter().zip(&attached).enumerate() {
        assert!(a.iter().all(|x| x.is_finite()), "{what}: row {i}'s logits without the engine are not all finite");
        assert!(b.iter().all(|x| x.is_finite()), "{what}: row {i}'s logits with the engine are not all finite");
        differ += a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    }
    assert_eq!(differ, 0, "{what}: {differ} logits of the prompt differ with the engine attached");
    let last = alone.last().unwrap();
    let first = common::target::argmax(last);
    eprintln!(
        "{what}: {} rows x {} logits bit-equal with and without the engine; first token {first}",
        tokens.len(),
        last.len()
    );
    first
}

#[test]
fn a_prompt_decodes_to_the_same_logits_with_the_engine_attached_on_every_placement() {
    let _serial = serial();
    let (_a, _b, nodes) = two_nodes();
    let cpu = Placement { devices: Some(&[]), n_gpu_layers: -1, split_mode: sys::LLAMA_SPLIT_MODE_LAYER };
    let on_cpu = same_logits_with_the_engine(&cpu, &[], "CPU");
    let layer = Placement { devices: Some(&nodes), n_gpu_layers: -1, split_mode: sys::LLAMA_SPLIT_MODE_LAYER };
    let by_layer = same_logits_with_the_engine(&layer, &nodes, "RPC0,RPC1 -sm layer");
    assert_eq!(by_layer, on_cpu, "the RPC nodes compute with the CPU's kernels");
    let one = Placement { devices: Some(&nodes[..1]), n_gpu_layers: -1, split_mode: sys::LLAMA_SPLIT_MODE_LAYER };
    assert_eq!(same_logits_with_the_engine(&one, &nodes[..1], "RPC0"), on_cpu);
    let tensor = Placement { devices: Some(&nodes), n_gpu_layers: -1, split_mode: sys::LLAMA_SPLIT_MODE_TENSOR };
    let by_tensor = same_logits_with_the_engine(&tensor, &nodes, "RPC0,RPC1 -sm tensor");
    let mut with_cpu = nodes.clone();
    with_cpu.push(device("CPU"));
    let three = Placement { devices: Some(&with_cpu), n_gpu_layers: -1, split_mode: sys::LLAMA_SPLIT_MODE_TENSOR };
    let by_three = same_logits_with_the_engine(&three, &nodes, "RPC0,RPC1,CPU -sm tensor");
    // '.' is what NaN logits decode to: the answer issue 43 saw
    let dot = cpu_target().tokenize(".", false)[0];
    assert!(by_tensor != dot && by_three != dot, "first tokens {by_tensor} / {by_three}: '.'");
}

/// SmolLM2 on the CPU alone (not on the RPC devices earlier tests registered, whose servers are gone).
fn cpu_target() -> Target {
    let cpu = Placement { devices: Some(&[]), n_gpu_layers: -1, split_mode: sys::LLAMA_SPLIT_MODE_LAYER };
    Target::with_model(Model::load_placed(&smollm2(), &cpu), 1, 64, 64)
}

fn smollm2_split_by_tensor(nodes: &[sys::ggml_backend_dev_t]) -> Target {
    let tensor = Placement { devices: Some(nodes), n_gpu_layers: -1, split_mode: sys::LLAMA_SPLIT_MODE_TENSOR };
    Target::with_model(Model::load_placed(&smollm2(), &tensor), 1, 512, 256)
}

#[test]
fn smollm2_split_by_tensor_leaves_a_device_without_attention_and_this_ggml_fills_it() {
    let _serial = serial();
    let (_a, _b, nodes) = two_nodes();
    let target = smollm2_split_by_tensor(&nodes);
    let tc = unsafe { TargetContext::from_raw(target.ctx) }.unwrap();
    let empty = sys::split::empty_slices(&tc);
    // 576 attention columns in units of 384 (two KV groups of Q4_1 heads): one device gets none,
    // alternating by layer; the FFN (1536 in units of 32) splits evenly
    let names: Vec<&str> = empty.iter().map(|e| e.tensor.as_str()).collect();
    assert!(names.contains(&"blk.0.attn_q.weight") && names.contains(&"blk.1.attn_output.weight"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("ffn")), "{names:?}");
    let devices: std::collections::BTreeSet<&String> = empty.iter().flat_map(|e| &e.devices).collect();
    assert_eq!(devices.len(), 2, "both devices lose some layer's attention: {devices:?}");
    assert!(sys::ggml::meta::fills_empty_slices(), "the pinned build carries scripts/ggml-fixes.py meta-zero-fill");
    let config = Config { n_seq: 1, ..Config::default() };
    assert!(create_drafter(&tc, &smollm2_drafter(&smollm2()), &config).is_ok());
    // a target on one device has no slices at all
    let whole = cpu_target();
    let tc = unsafe { TargetContext::from_raw(whole.ctx) }.unwrap();
    assert!(sys::split::empty_slices(&tc).is_empty());
}

#[test]
fn on_a_ggml_that_keeps_nan_in_empty_slices_such_a_target_is_refused_at_init() {
    let _serial = serial();
    let (_a, _b, nodes) = two_nodes();
    let target = smollm2_split_by_tensor(&nodes);
    let drafter = smollm2_drafter(&smollm2());
    // SAFETY of the environment: every test that creates engines on split targets holds serial()
    unsafe { std::env::set_var(sys::ggml::meta::ASSUME_UNFIXED_ENV, "1") };
    let tc = unsafe { TargetContext::from_raw(target.ctx) }.unwrap();
    let err = create_drafter(&tc, &drafter, &Config { n_seq: 1, ..Config::default() }).err();
    // the C API: NULL, the status and the message
    let spec = unsafe {
        dflash2::ffi::llama_spec_dflash2_init(target.ctx, common::cstr(&drafter).as_ptr(), default_params(1))
    };
    let c_message = common::last_error();
    unsafe { std::env::remove_var(sys::ggml::meta::ASSUME_UNFIXED_ENV) };
    let err = err.expect("refused");
    assert_eq!(err.status, Status::LLAMA_SPEC_DFLASH2_ERR_UNSUPPORTED);
    for part in ["-sm tensor", "blk.0.attn_q.weight", "leftover memory", "meta-zero-fill"] {
        assert!(err.message.contains(part), "{part:?} not in: {}", err.message);
    }
    assert!(spec.is_null());
    assert!(c_message.contains("leftover memory"), "{c_message}");
    eprintln!("refused: {}", err.message);
}
