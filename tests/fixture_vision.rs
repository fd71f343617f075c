//! The multimodal fixture pair: `vision-mmproj.gguf` (a qwen3vl_merger
//! projector) with `vision-target.gguf` (qwen35). The pinned build of libllama
//! has no mtmd; when libmtmd is built (`scripts/server.sh build` puts it in
//! target/server/lib), a small C program built against it and the pinned
//! libllama (tests/fixture_vision_probe.c) loads the projector with the text
//! model, tokenizes a prompt holding `vision-image.png`, encodes the image
//! (twice: same embeddings), evaluates the chunks with mtmd's helper and
//! decodes greedily. They fail without libmtmd (built by `scripts/server.sh
//! build`, which scripts/test.sh runs first).
//!
//! Environment: DFLASH2_MTMD_LIB_DIR (folder of libmtmd.so, default
//! target/server/lib), DFLASH2_LLAMA_SRC (llama.cpp source tree for mtmd.h,
//! default `scripts/llama-cpp.sh src`), DFLASH2_LLAMA_PREFIX (llama.h, libllama).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{Model, fixtures};
use dflash2::sys;
use dflash2_fixtures::vision::{MIN_IMAGE_TOKENS, ProjectorSpec, SAMPLE_SIZE};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn llama_cpp(what: &str) -> PathBuf {
    let out = Command::new("bash").arg(format!("{ROOT}/scripts/llama-cpp.sh")).arg(what).output().unwrap();
    assert!(out.status.success(), "scripts/llama-cpp.sh {what}");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The probe program, built once; `None` (with the reason) when there is no libmtmd.
fn probe() -> Result<&'static Path, String> {
    static PROBE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let lib_dir = std::env::var_os("DFLASH2_MTMD_LIB_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(ROOT).join("target/server/lib"));
            if !lib_dir.join("libmtmd.so").exists() {
                return Err(format!(
                    "no libmtmd.so in {} (run scripts/server.sh build, or set DFLASH2_MTMD_LIB_DIR)",
                    lib_dir.display()
                ));
            }
            let src = std::env::var_os("DFLASH2_LLAMA_SRC").map(PathBuf::from).unwrap_or_else(|| llama_cpp("src"));
            let prefix =
                std::env::var_os("DFLASH2_LLAMA_PREFIX").map(PathBuf::from).unwrap_or_else(|| llama_cpp("prefix"));
            let exe =
                Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fixture_vision_probe-{}", std::process::id()));
            let rpath = format!("-Wl,-rpath,{}:{}", lib_dir.display(), prefix.join("lib").display());
            let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                .args(["-O1", "-std=c11", "-Wall", "-Werror"])
                .arg(format!("{ROOT}/tests/fixture_vision_probe.c"))
                .arg(format!("-I{}", prefix.join("include").display()))
                .arg(format!("-I{}", src.join("tools/mtmd").display()))
                .arg(format!("-L{}", lib_dir.display()))
                .arg(format!("-L{}", prefix.join("lib").display()))
                .args(["-lmtmd", "-lllama", "-lggml", "-lggml-base", "-lm", &rpath, "-o"])
                .arg(&exe)
                .output()
                .expect("run the C compiler");
            assert!(out.status.success(), "building the probe failed:\n{}", String::from_utf8_lossy(&out.stderr));
            Ok(exe)
        })
        .as_deref()
        .map_err(Clone::clone)
}

/// Runs the probe on a target; returns its key=value output.
fn run_probe(target: &Path) -> BTreeMap<String, String> {
    let exe = match probe() {
        Ok(exe) => exe,
        Err(why) => panic!("{why} (build libmtmd with `scripts/server.sh build`)"),
    };
    let fx = fixtures();
    let out = Command::new(exe).arg(target).arg(&fx.vision_mmproj).arg(&fx.vision_image).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "probe on {} failed:\n{stdout}\n{stderr}", target.display());
    let errors: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(errors.is_empty(), "the probe logged errors:\n{stderr}");
    let mut kv = BTreeMap::new();
    for line in stdout.lines() {
        // chunk lines repeat their keys: each is kept whole under its index
        if let Some(rest) = line.strip_prefix("chunk=") {
            let (idx, fields) = rest.split_once(' ').unwrap();
            kv.insert(format!("chunk{idx}"), fields.to_string());
            continue;
        }
        for field in line.split_whitespace() {
            if let Some((k, v)) = field.split_once('=') {
                kv.insert(k.to_string(), v.to_string());
            }
        }
    }
    eprintln!("probe on {}:\n{stdout}", target.display());
    kv
}

fn n_embd_inp(path: &Path) -> u32 {
    let m = Model::load(path);
    unsafe { sys::llama_model_n_embd_inp(m.0) as u32 }
}

#[test]
fn mmproj_is_a_qwen3vl_projector_as_wide_as_the_targets() {
    let fx = fixtures();
    let bytes = std::fs::read(&fx.vision_mmproj).unwrap();
    let g = dflash2_gguf::read(&bytes).unwrap();
    let s = |k: &str| g.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let u = |k: &str| g.get(k).and_then(|v| v.as_u32()).unwrap();
    assert_eq!(s("general.architecture"), "clip");
    assert_eq!(s("clip.projector_type"), "qwen3vl_merger");
    assert_eq!(g.get("clip.has_vision_encoder").and_then(|v| v.as_bool()), Some(true));
    let spec = ProjectorSpec::default();
    assert_eq!(u("clip.vision.projection_dim"), spec.projection_dim);
    assert_eq!(g.tensor("mm.2.bias").unwrap().dims, vec![spec.projection_dim as u64]);
    for target in [&fx.vision_target, &fx.target_mrope, &fx.qwen35_target] {
        assert_eq!(n_embd_inp(target), spec.projection_dim, "{}", target.display());
    }
    // the sample picture: mtmd scales it up to the fewest tokens a Qwen-VL image gets
    assert_eq!(spec.n_tokens(SAMPLE_SIZE.0 * 2, SAMPLE_SIZE.1 * 2), MIN_IMAGE_TOKENS);
    assert_eq!(&std::fs::read(&fx.vision_image).unwrap()[1..4], b"PNG");
}

fn assert_image_prompt_runs(target: &Path) {
    let a = run_probe(target);
    assert_eq!(a["ok"], "1");
    assert_eq!((a["vision"].as_str(), a["mrope"].as_str()), ("1", "1"), "vision with M-RoPE positions");
    assert_eq!(a["image"], format!("{}x{}", SAMPLE_SIZE.0, SAMPLE_SIZE.1));
    assert_eq!(a["chunks"], "3", "text, image, text");
    assert_eq!(a["image_tokens"], MIN_IMAGE_TOKENS.to_string());
    // the image chunk: 8 embeddings on a 4 x 2 grid advance M-RoPE positions by max(4, 2)
    assert_eq!(a["chunk1"], format!("type=1 n_tokens={MIN_IMAGE_TOKENS} n_pos=4"));
    // 8 tokens on a 4 x 2 grid (mtmd's x, y): the last at (t 0, y 1, x 3)
    assert_eq!(a["last_pos"], "0,1,3");
    assert_eq!(a["embd_n"], (MIN_IMAGE_TOKENS * 64).to_string());
    assert_eq!((a["embd_finite"].as_str(), a["embd_same"].as_str()), ("1", "1"));
    assert!(a["embd_max_abs"].parse::<f64>().unwrap() > 0.0);
    // M-RoPE: the image advances positions by less than its token count
    let n_tokens: i64 = a["tokens"].parse().unwrap();
    let n_pos: i64 = a["n_pos"].parse().unwrap();
    assert!(n_pos < n_tokens, "{n_pos} positions for {n_tokens} tokens");
    assert_eq!(a["n_past"], a["n_pos"]);
    assert_eq!(a["generated"].split(',').count(), 8);
    // a second run gives the same embeddings and the same continuation
    let b = run_probe(target);
    assert_eq!((&a["embd_sum"], &a["generated"]), (&b["embd_sum"], &b["generated"]));
}

#[test]
fn mtmd_encodes_an_image_prompt_for_the_qwen35_pair() {
    assert_image_prompt_runs(&fixtures().vision_target);
}

#[test]
fn the_projector_also_pairs_with_the_attention_only_m_rope_target() {
    assert_image_prompt_runs(&fixtures().target_mrope);
}
