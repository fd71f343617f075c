//! What the build says about a llama.cpp prefix it cannot use: this crate's
//! own build script (the binary cargo built from build.rs) run on fake
//! prefixes made in a temporary folder from the pinned one's headers, in
//! seconds, without building a llama.cpp.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The prefix this crate was built against (build.rs exports it).
fn pinned_prefix() -> PathBuf {
    PathBuf::from(env!("DFLASH2_LLAMA_PREFIX"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dflash2-llama-prefix-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("out")).unwrap();
    dir
}

/// A prefix with the pinned headers, `edit` applied to each (name, text).
fn fake_prefix(dir: &Path, edit: impl Fn(&str, String) -> String) -> PathBuf {
    let prefix = dir.join("prefix");
    std::fs::create_dir_all(prefix.join("include")).unwrap();
    std::fs::create_dir_all(prefix.join("lib/pkgconfig")).unwrap();
    for entry in std::fs::read_dir(pinned_prefix().join("include")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "h") {
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(prefix.join("include").join(&name), edit(&name, text)).unwrap();
        }
    }
    prefix
}

/// Runs the build script as cargo would for a build against `prefix`.
fn build_against(prefix: &Path, out: &Path) -> Output {
    let target = "x86_64-unknown-linux-gnu";
    Command::new(env!("DFLASH2_BUILD_SCRIPT"))
        .env("CARGO_MANIFEST_DIR", env!("CARGO_MANIFEST_DIR"))
        .env("OUT_DIR", out)
        .env("TARGET", target)
        .env("HOST", target)
        .env("OPT_LEVEL", "0")
        .env("DEBUG", "false")
        .env("PROFILE", "release")
        .env("DFLASH2_LLAMA_PREFIX", prefix)
        .env("RUST_BACKTRACE", "0")
        .env_remove("DFLASH2_WRITE_HEADER")
        .env_remove("DFLASH2_WRITE_BINDINGS")
        .env_remove("DFLASH2_CHECK_BINDINGS")
        .output()
        .expect("the build script runs")
}

/// The build failed, and its message says each of `expected`; returns it.
fn assert_refused(out: &Output, expected: &[String]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the build went on:\n{stderr}");
    for e in expected {
        assert!(stderr.contains(e), "missing '{e}' in:\n{stderr}");
    }
    stderr
}

/// Compiles `code` into PREFIX/lib/NAME (soname NAME.0), linked to `libs` there.
fn stub_library(prefix: &Path, name: &str, code: &str, libs: &[&str]) {
    let lib = prefix.join("lib");
    let source = lib.join(format!("{name}.c"));
    std::fs::write(&source, code).unwrap();
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(lib.join(format!("{name}.so")))
        .arg(format!("-Wl,-soname,{name}.so.0"))
        .arg(&source)
        .arg(format!("-L{}", lib.display()))
        .arg("-Wl,--no-as-needed")
        .args(libs.iter().map(|l| format!("-l{l}")))
        .status()
        .expect("cc runs");
    assert!(status.success(), "cannot compile the stub {name}");
    std::fs::copy(lib.join(format!("{name}.so")), lib.join(format!("{name}.so.0"))).unwrap();
}

#[test]
fn a_prefix_without_dflash2_stops_the_build_before_compiling_with_what_it_lacks() {
    let dir = temp_dir("no-dflash2");
    // the pin's headers less its DFlash2 parts, as an older llama.cpp has them
    let prefix = fake_prefix(&dir, |name, text| match name {
        "llama-ext.h" => {
            text.lines().filter(|l| !l.contains("llama_model_dflash_selector_top_k")).collect::<Vec<_>>().join("\n")
        }
        "llama.h" => text.lines().filter(|l| !l.contains(" ctx_other;")).collect::<Vec<_>>().join("\n"),
        _ => text,
    });
    std::fs::write(prefix.join("lib/pkgconfig/llama.pc"), "Name: llama\nVersion: 0.1.0\n").unwrap();
    for lib in ["libllama.so", "libggml.so", "libggml-base.so"] {
        std::fs::write(prefix.join("lib").join(lib), "").unwrap();
    }

    let expected = [
        "dflash2 needs a llama.cpp with DFlash2 (llama-ext.h's llama_model_dflash_selector_top_k".to_string(),
        format!(
            "this prefix ({}, DFLASH2_LLAMA_PREFIX) has llama.cpp 0.1.0 (lib/pkgconfig/llama.pc)",
            prefix.display()
        ),
        "struct fields dflash2 uses, it lacks 2: llama_model_dflash_selector_top_k, llama_context_params.ctx_other."
            .to_string(),
        "scripts/llama-cpp.sh build".to_string(),
    ];
    let stderr = assert_refused(&build_against(&prefix, &dir.join("out")), &expected);
    assert!(!stderr.contains("error["), "compiler errors:\n{stderr}");
    assert!(!dir.join("out/llama_bindings.rs").exists(), "bindings were generated before the check");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn libraries_of_another_build_than_the_headers_stop_the_build() {
    let dir = temp_dir("other-libs");
    // the pinned headers over libraries whose llama_model_params has 72 bytes
    // (llama-cpp-python 0.3.35's, before lazy_mode)
    let prefix = fake_prefix(&dir, |_, text| text);
    stub_library(
        &prefix,
        "libggml-base",
        "#include <stddef.h>\n\
         const char * ggml_version(void) { return \"0.20.0\"; }\n\
         const char * ggml_commit(void) { return \"unknown\"; }\n\
         int ggml_backend_buffer_is_meta(void * b) { (void) b; return 0; }\n\
         size_t ggml_backend_meta_n_backends(void * b) { (void) b; return 0; }\n\
         void * ggml_backend_meta_simple_backend(void * b, size_t i) { (void) b; (void) i; return NULL; }\n",
        &[],
    );
    stub_library(&prefix, "libggml", "int ggml_stub;\n", &["ggml-base"]);
    stub_library(
        &prefix,
        "libllama",
        "#include <string.h>\n\
         struct params72 { unsigned char bytes[72]; };\n\
         struct params160 { unsigned char bytes[160]; };\n\
         const char * llama_version(void) { return \"0.1.0\"; }\n\
         struct params72 llama_model_default_params(void) { struct params72 p; memset(&p, 1, sizeof(p)); return p; }\n\
         struct params160 llama_context_default_params(void) { struct params160 p; memset(&p, 2, sizeof(p)); return p; }\n",
        &["ggml", "ggml-base"],
    );

    let expected = [
        format!(
            "dflash2: the libraries in {0}/lib are not the build of the headers in {0}/include (DFLASH2_LLAMA_PREFIX)",
            prefix.display()
        ),
        "lib/libllama.so reports llama.cpp 0.1.0, ggml 0.20.0 (commit unknown)".to_string(),
        "llama_model_default_params() writes 72 bytes where include/llama.h's struct llama_model_params has 80"
            .to_string(),
        "the headers are llama-cpp-python 0.3.36's (llama.cpp 0.5.0-dev, ggml 0.25.3)".to_string(),
    ];
    let stderr = assert_refused(&build_against(&prefix, &dir.join("out")), &expected);
    assert!(!stderr.contains("llama_context_default_params() writes"), "its 160 bytes are the headers':\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
