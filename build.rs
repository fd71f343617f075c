//! Finds the llama.cpp build dflash2 links against, checks it, generates its
//! Rust bindings, compiles the C++ shim over llama-ext.h and generates
//! include/dflash2.h.
//!
//! The build is the pinned one that `scripts/llama-cpp.sh build` puts in the
//! user's cache, or any install prefix named by DFLASH2_LLAMA_PREFIX. Before
//! anything is compiled, the prefix's headers must declare every llama.cpp
//! function and field dflash2 uses (else one message says what is missing, not
//! a page of compiler errors); then its libraries are loaded and asked what
//! they are (`src/sys/llama_abi.rs`): what they write as default params must
//! be the headers' structs, and what they report is recorded for the check
//! the library makes against the libllama it runs on (`src/sys/llama_check.rs`).

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code, unsafe_code)]
#[path = "src/sys/llama_abi.rs"]
mod llama_abi;

use llama_abi::{Layout, LlamaBuild};

/// Must match PIN_VERSION / RECIPE in scripts/llama-cpp.sh.
const PIN_VERSION: &str = "0.3.36";
const RECIPE: &str = "3";
/// What the pinned build's libraries report (llama_version(), ggml_version()).
const PIN_LLAMA_VERSION: &str = "0.5.0-dev";
const PIN_GGML_VERSION: &str = "0.25.3";

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

fn llama_prefix() -> (PathBuf, &'static str) {
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
    (prefix, how)
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
fn bindings(include: &Path, out: &Path) -> String {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let committed_path = crate_dir.join(PINNED_BINDINGS);
    println!("cargo:rerun-if-changed={}", committed_path.display());
    let marker = pinned_marker(include);
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
    std::fs::write(out.join("llama_bindings.rs"), &text).expect("cannot write bindings");
    text
}

/// The first line of the committed bindings when they were generated from these headers.
fn pinned_marker(include: &Path) -> String {
    format!("// dflash2 pinned bindings: headers fnv1a64 {:#018x}, target {PINNED_TARGET}\n", headers_hash(include))
}

/// Whether the headers are the ones the committed bindings were generated from.
fn headers_are_pinned(include: &Path) -> bool {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let committed = std::fs::read_to_string(crate_dir.join(PINNED_BINDINGS)).unwrap_or_default();
    committed.starts_with(&pinned_marker(include))
}

/// llama.cpp's structs that cross the boundary between dflash2 and libllama
/// (by value or read in place), with the fields dflash2 sets or reads. The
/// build checks the fields exist, records every field's offset as the C
/// compiler lays it out and stops if the bindings disagree.
const BOUNDARY_STRUCTS: &[(&str, &[&str])] = &[
    (
        "llama_model_params",
        &["devices", "n_gpu_layers", "split_mode", "load_mode", "main_gpu", "tensor_split", "use_extra_bufts"],
    ),
    (
        "llama_context_params",
        &[
            "n_ctx",
            "n_batch",
            "n_ubatch",
            "n_seq_max",
            "n_rs_seq",
            "n_threads",
            "n_threads_batch",
            "type_k",
            "type_v",
            "embeddings",
            "no_perf",
            "kv_unified",
            "ctx_other",
        ],
    ),
    ("llama_batch", &["n_tokens", "token", "embd", "pos", "n_seq_id", "seq_id"]),
    ("llama_token_data", &["id", "p"]),
    ("llama_token_data_array", &["data", "size"]),
    ("llama_perf_context_data", &["t_load_ms", "t_p_eval_ms", "t_eval_ms", "n_p_eval", "n_eval"]),
    ("ggml_init_params", &["mem_size", "mem_buffer", "no_alloc"]),
    ("ggml_tensor", &["type", "buffer", "ne", "nb", "data", "name"]),
];

/// What a build of llama.cpp dflash2 is made for has (the first line of the
/// refusal names it).
const DFLASH2_API: &str = "llama-ext.h's llama_model_dflash_selector_top_k and tap-layer capture, \
                           llama_process / llama_batch_ext, llama_context_params.ctx_other";

/// The version a prefix declares (its pkg-config file or CMake package).
fn declared_version(prefix: &Path) -> Option<String> {
    let pc = std::fs::read_to_string(prefix.join("lib/pkgconfig/llama.pc")).ok();
    if let Some(v) = pc.iter().flat_map(|t| t.lines()).find_map(|l| l.strip_prefix("Version:")) {
        return Some(format!("llama.cpp {} (lib/pkgconfig/llama.pc)", v.trim()));
    }
    let cmake = std::fs::read_to_string(prefix.join("lib/cmake/llama/llama-config-version.cmake")).ok()?;
    let v = cmake.split("PACKAGE_VERSION \"").nth(1)?.split('"').next()?;
    Some(format!("llama.cpp {v} (lib/cmake/llama)"))
}

/// The llama.cpp functions dflash2's sources call (`name(` outside comments),
/// less types (C++ casts) and functions of its own: every one a header of
/// the prefix must declare, or (declared by dflash2 itself, from llama.cpp's
/// internal headers) its libraries must export.
fn called_functions(crate_dir: &Path, pinned: &str) -> (Vec<String>, Vec<String>) {
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "cpp") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    sources(&crate_dir.join("src"), &mut files);
    sources(&crate_dir.join("csrc"), &mut files);
    files.retain(|f| !f.ends_with(PINNED_BINDINGS));
    files.sort();

    let is_type =
        |name: &str| pinned.contains(&format!("pub type {name} ")) || pinned.contains(&format!("pub struct {name} "));
    let (mut called, mut defined, mut declared) = (Vec::new(), Vec::new(), Vec::new());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        // a Rust name is llama.cpp's when the bindings or dflash2's own extern
        // blocks declare it (not another crate's ggml_*); the shim calls llama.cpp only
        let is_cpp = file.extension().is_some_and(|e| e == "cpp");
        let mut in_extern = false;
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("//") || trimmed.starts_with('*') {
                continue;
            }
            if line.contains("extern \"C\" {") {
                in_extern = true;
            } else if line == "}" {
                in_extern = false;
            }
            for (at, _) in line.match_indices(['l', 'g']) {
                let rest = &line[at..];
                if !(rest.starts_with("llama_") || rest.starts_with("ggml_") || rest.starts_with("gguf_"))
                    || ident(line[..at].chars().next_back())
                {
                    continue;
                }
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !rest[name.len()..].trim_start().starts_with('(') || name.starts_with("llama_spec_dflash2") {
                    continue;
                }
                if line[..at].trim_end().ends_with("fn") {
                    if in_extern { &mut declared } else { &mut defined }.push(name);
                } else if !is_type(&name) {
                    called.push((name, is_cpp));
                }
            }
        }
    }
    let mut called: Vec<String> = called
        .into_iter()
        .filter(|(n, is_cpp)| {
            !defined.contains(n) && (*is_cpp || declared.contains(n) || pinned.contains(&format!("pub fn {n}(")))
        })
        .map(|(n, _)| n)
        .collect();
    called.sort();
    called.dedup();
    let (internal, public) = called.into_iter().partition(|n| declared.contains(n));
    (public, internal)
}

/// The body of `struct name { ... }` in the headers' text.
fn struct_body<'a>(headers: &'a str, name: &str) -> Option<&'a str> {
    let start = headers.find(&format!("struct {name} {{"))?;
    let body = &headers[start..];
    Some(&body[..body.find("};")?])
}

fn ident(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What follows each occurrence of `word` in `text` as a whole identifier.
fn after_word<'a>(text: &'a str, word: &'a str) -> impl Iterator<Item = &'a str> {
    text.match_indices(word)
        .filter(|(at, _)| !ident(text[..*at].chars().next_back()) && !ident(text[at + word.len()..].chars().next()))
        .map(|(at, _)| &text[at + word.len()..])
}

/// Stops the build, before anything is compiled, with what the prefix lacks.
fn refuse_without_dflash2(prefix: &Path, how: &str, missing: &[String], needs: &Needs) -> ! {
    let shown: Vec<&str> = missing.iter().take(12).map(String::as_str).collect();
    let more =
        if missing.len() > shown.len() { format!(" and {} more", missing.len() - shown.len()) } else { String::new() };
    panic!(
        "\n\ndflash2 needs a llama.cpp with DFlash2 ({DFLASH2_API}; it is built and tested on the llama.cpp of \
         llama-cpp-python {PIN_VERSION}: llama.cpp {PIN_LLAMA_VERSION}, ggml {PIN_GGML_VERSION}); this prefix ({}, \
         {how}) has {}: of the {} functions and {} struct fields dflash2 uses, it lacks {}: {}{more}.\n\
         Build the pinned llama.cpp with `scripts/llama-cpp.sh build` (and unset DFLASH2_LLAMA_PREFIX), or point \
         DFLASH2_LLAMA_PREFIX at an install of that llama.cpp (CPU, CUDA, Vulkan or Metal: docs/building.md).\n",
        prefix.display(),
        declared_version(prefix).unwrap_or_else(|| "a llama.cpp of unknown version".into()),
        needs.n_functions,
        needs.n_fields,
        missing.len(),
        shown.join(", ")
    );
}

/// What dflash2 needs of a llama.cpp beyond what its headers declare.
struct Needs {
    /// Functions dflash2 declares itself (from llama.cpp's internal headers):
    /// the libraries must export them.
    internal: Vec<String>,
    n_functions: usize,
    n_fields: usize,
}

/// Checks, before anything is compiled, that the prefix's headers declare the
/// functions and fields dflash2 uses.
fn check_requirements(prefix: &Path, how: &str, crate_dir: &Path) -> Needs {
    let mut names: Vec<PathBuf> =
        std::fs::read_dir(prefix.join("include")).into_iter().flatten().flatten().map(|e| e.path()).collect();
    names.retain(|p| p.extension().is_some_and(|e| e == "h"));
    names.sort();
    let headers: String = names.iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect();
    let pinned = std::fs::read_to_string(crate_dir.join(PINNED_BINDINGS)).unwrap_or_default();

    let (public, internal) = called_functions(crate_dir, &pinned);
    let declared = |name: &str| after_word(&headers, name).any(|rest| rest.trim_start().starts_with('('));
    let mut missing: Vec<String> = public.iter().filter(|n| !declared(n)).cloned().collect();
    let n_fields: usize = BOUNDARY_STRUCTS.iter().map(|(_, f)| f.len()).sum();
    for (name, fields) in BOUNDARY_STRUCTS {
        let body = struct_body(&headers, name).unwrap_or_default();
        missing.extend(fields.iter().filter(|f| after_word(body, f).next().is_none()).map(|f| format!("{name}.{f}")));
    }
    let needs = Needs { n_functions: public.len() + internal.len(), n_fields, internal };
    if !missing.is_empty() {
        refuse_without_dflash2(prefix, how, &missing, &needs);
    }
    needs
}

/// The C compiler's layout of the boundary structs in the prefix's headers,
/// each with every field the bindings give it. None when the build cannot run
/// what it compiles (a cross build).
fn probe_layouts(include: &Path, bindings: &str, out: &Path) -> Option<Vec<Layout>> {
    if env::var("HOST").ok() != env::var("TARGET").ok() {
        println!("cargo:warning=dflash2: cross build: the llama.cpp layouts and libraries are not probed");
        return None;
    }
    // bindgen's field names, C's: a Rust keyword gets a trailing underscore
    let c_name = |f: &str| match f.strip_suffix('_') {
        Some(k) if ["type", "ref", "fn", "in", "match", "mod", "use", "loop", "move", "impl"].contains(&k) => {
            k.to_string()
        }
        _ => f.to_string(),
    };
    let mut code = String::from("#include \"llama.h\"\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n");
    let mut fields_of = Vec::new();
    for (name, _) in BOUNDARY_STRUCTS {
        let start = bindings.find(&format!("pub struct {name} {{")).unwrap_or_else(|| {
            panic!("dflash2: the bindings have no struct {name}, which dflash2 passes to llama.cpp")
        });
        let body = &bindings[start..];
        let body = &body[..body.find("\n}").unwrap_or(body.len())];
        let fields: Vec<String> =
            body.lines().filter_map(|l| l.strip_prefix("    pub ")?.split(':').next().map(str::to_string)).collect();
        writeln!(code, "    printf(\"size {name} %zu %zu\\n\", sizeof(struct {name}), _Alignof(struct {name}));")
            .unwrap();
        for f in &fields {
            writeln!(code, "    printf(\"field {name} {f} %zu\\n\", offsetof(struct {name}, {}));", c_name(f)).unwrap();
        }
        fields_of.push((name.to_string(), fields));
    }
    code.push_str("    return 0;\n}\n");
    let source = out.join("llama_layout_probe.c");
    let exe = out.join("llama_layout_probe");
    std::fs::write(&source, code).expect("cannot write the layout probe");
    let compiler = cc::Build::new().get_compiler();
    let built = compiler
        .to_command()
        .arg("-std=c11")
        .arg(format!("-I{}", include.display()))
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cannot run the C compiler");
    if !built.status.success() {
        panic!(
            "\n\ndflash2: the C compiler cannot lay out llama.cpp's structs from {}:\n{}",
            include.display(),
            String::from_utf8_lossy(&built.stderr)
        );
    }
    let ran = Command::new(&exe).output().expect("cannot run the layout probe");
    let text = String::from_utf8_lossy(&ran.stdout);
    let mut layouts: Vec<Layout> = fields_of
        .iter()
        .map(|(name, _)| Layout { name: name.clone(), size: 0, align: 0, fields: Vec::new() })
        .collect();
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        let layout = layouts.iter_mut().find(|l| words.get(1) == Some(&l.name.as_str()));
        match (words.as_slice(), layout) {
            (["size", _, size, align], Some(l)) => (l.size, l.align) = (size.parse().unwrap(), align.parse().unwrap()),
            (["field", _, field, offset], Some(l)) => l.fields.push((field.to_string(), offset.parse().unwrap())),
            _ => panic!("dflash2: the layout probe wrote '{line}'"),
        }
    }
    Some(layouts)
}

fn layout<'a>(layouts: &'a [Layout], name: &str) -> &'a Layout {
    layouts.iter().find(|l| l.name == name).expect("a boundary struct")
}

/// Loads the prefix's libraries and reads what they are; stops the build when
/// they lack what dflash2 declares itself, write default params that are not
/// the headers' structs, or (under the pinned headers) are another build.
fn probe_libraries(prefix: &Path, how: &str, layouts: &[Layout], needs: &Needs) -> LlamaBuild {
    let lib = prefix.join("lib");
    // SAFETY: the prefix's own libraries, loaded into this build script only.
    let loaded = unsafe { llama_abi::open_prefix(&lib) }.unwrap_or_else(|why| {
        panic!("\n\ndflash2: cannot load the llama.cpp libraries of {} ({how}): {why}\n", prefix.display())
    });
    let missing: Vec<String> = needs.internal.iter().filter(|n| !loaded.exports(n)).cloned().collect();
    if !missing.is_empty() {
        refuse_without_dflash2(prefix, how, &missing, needs);
    }
    // SAFETY: the functions of the llama.cpp just loaded.
    let build = unsafe { llama_abi::read(&loaded.entry) };
    let mut wrong = Vec::new();
    let defaults = [
        ("llama_model_default_params", "llama_model_params", &build.model_defaults),
        ("llama_context_default_params", "llama_context_params", &build.context_defaults),
    ];
    for (function, name, written) in defaults {
        let l = layout(layouts, name);
        if let Some(w) = written.as_ref().filter(|w| !l.fits(w)) {
            wrong.push(format!(
                "{function}() writes {} bytes where include/llama.h's struct {name} has {}",
                w.extent(),
                l.size
            ));
        }
    }
    let pinned = headers_are_pinned(&prefix.join("include"));
    if pinned && (build.llama_version != PIN_LLAMA_VERSION || build.ggml_version != PIN_GGML_VERSION) {
        wrong.push(format!(
            "the headers are llama-cpp-python {PIN_VERSION}'s (llama.cpp {PIN_LLAMA_VERSION}, ggml {PIN_GGML_VERSION})"
        ));
    }
    if !wrong.is_empty() {
        panic!(
            "\n\ndflash2: the libraries in {}/lib are not the build of the headers in {}/include ({how}): \
             lib/libllama.so reports {}, and {}. Install the headers and the libraries of one llama.cpp build \
             into the prefix (docs/building.md).\n",
            prefix.display(),
            prefix.display(),
            build.versions(),
            wrong.join("; ")
        );
    }
    build
}

/// What the pinned build script wrote about the prefix, when it built it.
fn origin(prefix: &Path) -> String {
    let built = std::fs::read_to_string(prefix.join(".dflash2-built")).unwrap_or_default();
    let built = built.split(" built_in_s=").next().unwrap_or_default().trim();
    if built.is_empty() { "a llama.cpp install prefix".into() } else { format!("dflash2's pinned build: {built}") }
}

/// OUT/llama_build.rs: what the prefix's libraries reported and the layouts of
/// the boundary structs, for `src/sys/llama_check.rs`; OUT/llama_layout.rs:
/// the bindings' layouts asserted against the C compiler's at compile time.
fn write_build_facts(out: &Path, prefix: &Path, build: Option<&LlamaBuild>, layouts: &[Layout]) {
    let hex = |w: &Option<llama_abi::Written>| w.as_ref().map(|w| w.to_hex()).unwrap_or_default();
    let (llama, ggml, commit) = build.map_or(("unknown", "unknown", "unknown"), |b| {
        (b.llama_version.as_str(), b.ggml_version.as_str(), b.ggml_commit.as_str())
    });
    let origin = origin(prefix);
    let prefix = prefix.display().to_string();
    let summary = format!("llama.cpp {llama}, ggml {ggml} (commit {commit}); {origin}; {prefix}");
    let mut facts = String::from("// generated by build.rs: the llama.cpp build dflash2 was built against\n");
    writeln!(facts, "pub const PROBED: bool = {};", build.is_some()).unwrap();
    for (name, value) in [
        ("LLAMA_VERSION", llama),
        ("GGML_VERSION", ggml),
        ("GGML_COMMIT", commit),
        ("ORIGIN", origin.as_str()),
        ("PREFIX", prefix.as_str()),
        ("SUMMARY", summary.as_str()),
    ] {
        writeln!(facts, "pub const {name}: &std::ffi::CStr = c{value:?};").unwrap();
    }
    writeln!(
        facts,
        "pub const MODEL_DEFAULTS: &str = {:?};",
        build.map(|b| hex(&b.model_defaults)).unwrap_or_default()
    )
    .unwrap();
    writeln!(
        facts,
        "pub const CONTEXT_DEFAULTS: &str = {:?};",
        build.map(|b| hex(&b.context_defaults)).unwrap_or_default()
    )
    .unwrap();
    facts.push_str("/// (struct, size, alignment, [(field, offset)]) as the C compiler lays it out\n");
    facts.push_str("pub type StructLayout = (&'static str, usize, usize, &'static [(&'static str, usize)]);\n");
    facts.push_str("pub const LAYOUTS: &[StructLayout] = &[\n");
    let mut asserts = String::from("// generated by build.rs: the bindings' layouts are the C compiler's\n");
    for l in layouts {
        writeln!(facts, "    ({:?}, {}, {}, &{:?}),", l.name, l.size, l.align, l.fields).unwrap();
        let stale = "regenerate the bindings against this prefix's headers (DFLASH2_WRITE_BINDINGS=1 cargo build, \
                     docs/building.md)";
        writeln!(
            asserts,
            "const _: () = assert!(std::mem::size_of::<{0}>() == {1}, \"dflash2: the Rust bindings disagree with the C \
             compiler on the size of struct {0} ({1} bytes in the headers): {stale}\");",
            l.name, l.size
        )
        .unwrap();
        for (field, offset) in &l.fields {
            writeln!(
                asserts,
                "const _: () = assert!(std::mem::offset_of!({0}, {1}) == {2}, \"dflash2: the Rust bindings disagree \
                 with the C compiler on {0}.{1} (offset {2} in the headers): {stale}\");",
                l.name, field, offset
            )
            .unwrap();
        }
    }
    facts.push_str("];\n");
    std::fs::write(out.join("llama_build.rs"), facts).expect("cannot write llama_build.rs");
    std::fs::write(out.join("llama_layout.rs"), asserts).expect("cannot write llama_layout.rs");
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

    // the tests run this script on fake prefixes (tests/llama_prefix.rs)
    if let Ok(exe) = env::current_exe() {
        println!("cargo:rustc-env=DFLASH2_BUILD_SCRIPT={}", exe.display());
    }

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let (prefix, how) = llama_prefix();
    let include = prefix.join("include");
    let lib = prefix.join("lib");
    println!("cargo:rerun-if-changed={}", include.join("llama.h").display());
    println!("cargo:rerun-if-changed={}", include.join("llama-ext.h").display());
    println!("cargo:rerun-if-changed={}", lib.join("libllama.so").display());
    println!("cargo:rerun-if-changed={}", lib.join("libggml-base.so").display());

    let needs = check_requirements(&prefix, how, &crate_dir);
    let bound = bindings(&include, &out);
    let layouts = probe_layouts(&include, &bound, &out);
    let build = layouts.as_ref().map(|l| probe_libraries(&prefix, how, l, &needs));
    write_build_facts(&out, &prefix, build.as_ref(), layouts.as_deref().unwrap_or_default());
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
