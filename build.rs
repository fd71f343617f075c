//! Finds the llama.cpp build dflash2 links against, generates its Rust bindings,
//! compiles the C++ shim over llama-ext.h and generates include/dflash2.h.
//!
//! The build is the pinned one that `scripts/llama-cpp.sh build` puts in the
//! user's cache, or any install prefix named by DFLASH2_LLAMA_PREFIX.

use std::env;
use std::path::{Path, PathBuf};

/// Must match PIN_VERSION / RECIPE in scripts/llama-cpp.sh.
const PIN_VERSION: &str = "0.3.36";
const RECIPE: &str = "3";

fn default_prefix() -> Option<PathBuf> {
    let cache = match env::var_os("DFLASH2_CACHE") {
        Some(c) => PathBuf::from(c),
        None => match env::var_os("XDG_CACHE_HOME") {
            Some(x) => PathBuf::from(x).join("dflash2"),
            None => PathBuf::from(env::var_os("HOME")?).join(".cache").join("dflash2"),
        },
    };
    Some(cache.join(format!("llama.cpp-{PIN_VERSION}")).join(format!("prefix-r{RECIPE}")))
}

fn llama_prefix() -> PathBuf {
    let (prefix, how) = match env::var_os("DFLASH2_LLAMA_PREFIX") {
        Some(p) => (PathBuf::from(p), "DFLASH2_LLAMA_PREFIX"),
        None => (default_prefix().unwrap_or_default(), "the pinned build cache"),
    };
    let needs = [
        "include/llama.h",
        "include/llama-ext.h",
        "include/ggml-alloc.h",
        "lib/libllama.so",
        "lib/libggml.so",
        "lib/libggml-base.so",
    ];
    let missing: Vec<_> = needs.iter().filter(|n| !prefix.join(n).exists()).collect();
    if !missing.is_empty() {
        panic!(
            "\n\ndflash2: no usable llama.cpp build at {} ({how}); missing {:?}.\n\
             Build the pinned one with:\n\n    scripts/llama-cpp.sh build\n\n\
             or point DFLASH2_LLAMA_PREFIX at your own llama.cpp install prefix \
             (include/llama.h, include/llama-ext.h from its src/, lib/libllama.so).\n",
            prefix.display(),
            missing
        );
    }
    prefix
}

/// The bindings of the pinned llama.cpp, committed so that a fresh machine needs
/// no libclang: used when the prefix's headers hash to the value they were
/// generated from (and the target is the one they were generated for).
const PINNED_BINDINGS: &str = "src/sys/pinned_bindings.rs";
const PINNED_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The headers bindgen reads: llama.h, which includes ggml.h, ggml-cpu.h,
/// ggml-backend.h and ggml-alloc.h (the draft graph the library builds
/// itself, `crate::draft`, uses all of them).
const BOUND_HEADERS: [&str; 1] = ["llama.h"];

/// FNV-1a 64 of the bound headers and every header they include from the
/// prefix, in include order: identifies the headers bindgen reads.
fn headers_hash(include: &Path) -> u64 {
    fn visit(include: &Path, name: &str, seen: &mut Vec<String>, hash: &mut u64) {
        if seen.iter().any(|s| s == name) {
            return;
        }
        seen.push(name.to_string());
        let Ok(text) = std::fs::read(include.join(name)) else { return };
        for &b in name.as_bytes().iter().chain(&text) {
            *hash = (*hash ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        for line in String::from_utf8_lossy(&text).lines() {
            let line = line.trim_start();
            if let Some(rest) = line.strip_prefix("#include \"") {
                if let Some(end) = rest.find('"') {
                    visit(include, &rest[..end], seen, hash);
                }
            }
        }
    }
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut seen = Vec::new();
    for header in BOUND_HEADERS {
        visit(include, header, &mut seen, &mut hash);
    }
    hash
}

fn generate_bindings(include: &Path) -> String {
    let header = include.join("llama.h");
    let run = || {
        let mut builder = bindgen::Builder::default();
        for h in BOUND_HEADERS {
            builder = builder.header(include.join(h).to_string_lossy());
        }
        builder
            .clang_arg(format!("-I{}", include.display()))
            .allowlist_function("llama_.*")
            .allowlist_type("llama_.*")
            .allowlist_var("LLAMA_.*")
            .allowlist_function("ggml_.*")
            .allowlist_type("ggml_.*")
            .allowlist_var("GGML_.*")
            .prepend_enum_name(false)
            .derive_default(true)
            .layout_tests(false)
            .generate()
            .map(|b| b.to_string())
    };
    // bindgen panics when it cannot load libclang; say what to do instead
    match std::panic::catch_unwind(run) {
        Ok(Ok(text)) => text,
        Ok(Err(e)) => panic!("bindgen failed on {}: {e}", header.display()),
        Err(_) => panic!(
            "\n\ndflash2: generating Rust bindings for the llama.cpp headers in {} needs libclang \
             (the committed bindings only match the pinned llama.cpp build).\n\
             Install it, e.g. `apt-get install libclang-dev`, or set LIBCLANG_PATH to its folder.\n",
            include.display()
        ),
    }
}

/// Writes OUT/llama_bindings.rs: the committed bindings when the headers are the
/// pinned ones, else bindgen's. DFLASH2_CHECK_BINDINGS=1 regenerates the pinned
/// ones and fails on drift; DFLASH2_WRITE_BINDINGS=1 rewrites the committed file.
fn bindings(include: &Path, out: &Path) {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let committed_path = crate_dir.join(PINNED_BINDINGS);
    println!("cargo:rerun-if-changed={}", committed_path.display());
    let marker = format!(
        "// dflash2 pinned bindings: headers fnv1a64 {:#018x}, target {PINNED_TARGET}\n",
        headers_hash(include)
    );
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    let is_pinned = env::var("TARGET").is_ok_and(|t| t == PINNED_TARGET) && committed.starts_with(&marker);

    let text = if env::var_os("DFLASH2_WRITE_BINDINGS").is_some() {
        let text =
            format!("{marker}// regenerate: DFLASH2_WRITE_BINDINGS=1 cargo build\n{}", generate_bindings(include));
        std::fs::write(&committed_path, &text).expect("cannot write the committed bindings");
        text
    } else if is_pinned {
        if env::var_os("DFLASH2_CHECK_BINDINGS").is_some() {
            let fresh = generate_bindings(include);
            let body = committed.splitn(3, '\n').nth(2).unwrap_or_default();
            assert!(
                body == fresh,
                "{PINNED_BINDINGS} is stale: regenerate it with `DFLASH2_WRITE_BINDINGS=1 cargo build` and commit it"
            );
        }
        committed
    } else {
        generate_bindings(include)
    };
    std::fs::write(out.join("llama_bindings.rs"), text).expect("cannot write bindings");
}

fn shim(include: &Path) {
    println!("cargo:rerun-if-changed=csrc/llama_ext_shim.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(include)
        .file("csrc/llama_ext_shim.cpp")
        .warnings(true)
        .compile("dflash2_llama_ext_shim");
}

fn header(out: &Path) {
    let crate_dir = env::var("CARGO_MANIFEST_DIR").unwrap();
    let config =
        cbindgen::Config::from_file(Path::new(&crate_dir).join("cbindgen.toml")).expect("cannot read cbindgen.toml");
    let generated = out.join("dflash2.h");
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen failed")
        .write_to_file(&generated);
    // The committed header is written only on request; a test compares the two.
    if env::var_os("DFLASH2_WRITE_HEADER").is_some() {
        std::fs::copy(&generated, Path::new(&crate_dir).join("include/dflash2.h"))
            .expect("cannot write include/dflash2.h");
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=DFLASH2_LLAMA_PREFIX");
    println!("cargo:rerun-if-env-changed=DFLASH2_CACHE");
    println!("cargo:rerun-if-env-changed=XDG_CACHE_HOME");
    println!("cargo:rerun-if-env-changed=DFLASH2_WRITE_HEADER");
    println!("cargo:rerun-if-env-changed=DFLASH2_WRITE_BINDINGS");
    println!("cargo:rerun-if-env-changed=DFLASH2_CHECK_BINDINGS");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=src");

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let prefix = llama_prefix();
    let include = prefix.join("include");
    let lib = prefix.join("lib");
    println!("cargo:rerun-if-changed={}", include.join("llama.h").display());
    println!("cargo:rerun-if-changed={}", lib.join("libllama.so").display());

    bindings(&include, &out);
    shim(&include);

    // Dynamic, so the host and dflash2 share one libllama; the rpath lets tests,
    // benches and C programs find it without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=llama");
    println!("cargo:rustc-link-lib=dylib=ggml");
    println!("cargo:rustc-link-lib=dylib=ggml-base");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libdflash2.so");
    println!("cargo:rustc-env=DFLASH2_LLAMA_PREFIX={}", prefix.display());
    // exported to dependents (links = "llama") so they can find the same build
    println!("cargo:prefix={}", prefix.display());

    header(&out);
}
