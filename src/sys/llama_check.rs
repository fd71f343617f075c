//! Whether the llama.cpp this process runs is the one dflash2 was built
//! against: build.rs recorded what the prefix's libraries reported (their
//! versions, the bytes of their default params, the C layouts of the structs
//! crossing the boundary); here the loaded libllama and ggml are asked the
//! same, once, before the first engine is created. A different build is
//! refused with both builds and the loaded files named: dflash2 passes
//! llama.cpp's params by value and would read and write them at the wrong
//! offsets (`llama_abi` says how each release moved them).

use std::ffi::{CStr, c_void};
use std::sync::OnceLock;

use super::llama_abi::{self, Entry, Layout, LlamaBuild, Written};
use super::*;
use crate::error::{Error, Result};

/// What build.rs recorded (OUT_DIR/llama_build.rs).
pub mod built {
    include!(concat!(env!("OUT_DIR"), "/llama_build.rs"));
}

// The bindings' layouts of the boundary structs against the C compiler's: a
// disagreement stops the compilation with its message.
include!(concat!(env!("OUT_DIR"), "/llama_layout.rs"));

/// What the llama.cpp dflash2 was built against reported to build.rs.
fn built_build() -> LlamaBuild {
    let text = |s: &CStr| s.to_string_lossy().into_owned();
    LlamaBuild {
        llama_version: text(built::LLAMA_VERSION),
        ggml_version: text(built::GGML_VERSION),
        ggml_commit: text(built::GGML_COMMIT),
        model_defaults: Written::from_hex(built::MODEL_DEFAULTS).filter(|w| w.extent() > 0),
        context_defaults: Written::from_hex(built::CONTEXT_DEFAULTS).filter(|w| w.extent() > 0),
    }
}

/// A boundary struct's layout in the headers dflash2 was built with.
fn built_layout(name: &str) -> Layout {
    let (name, size, align, fields) = built::LAYOUTS.iter().find(|l| l.0 == name).copied().unwrap_or((name, 0, 1, &[]));
    Layout { name: name.into(), size, align, fields: fields.iter().map(|(f, o)| (f.to_string(), *o)).collect() }
}

/// The functions this library's calls are bound to (whatever the loader
/// resolved them to: an LD_PRELOAD, another libllama.so.0 on the path).
fn linked_entry() -> Entry {
    Entry {
        llama_version,
        ggml_version,
        ggml_commit,
        model_defaults: llama_model_default_params as *const c_void,
        context_defaults: llama_context_default_params as *const c_void,
    }
}

/// The loaded files that answered, grouped: "/p/libllama.so.0 (llama_version,
/// llama_model_default_params); /p/libggml-base.so.0 (ggml_version)".
fn loaded_files(entry: &Entry) -> String {
    let answered = [
        ("llama_version", entry.llama_version as *const c_void),
        ("llama_model_default_params", entry.model_defaults),
        ("llama_context_default_params", entry.context_defaults),
        ("ggml_version", entry.ggml_version as *const c_void),
    ];
    let mut files: Vec<(String, Vec<&str>)> = Vec::new();
    for (function, addr) in answered {
        let path = llama_abi::object_path(addr as usize).unwrap_or_else(|| "an unknown file".into());
        match files.iter_mut().find(|(p, _)| *p == path) {
            Some((_, functions)) => functions.push(function),
            None => files.push((path, vec![function])),
        }
    }
    files.iter().map(|(p, f)| format!("{p} ({})", f.join(", "))).collect::<Vec<_>>().join("; ")
}

fn compare() -> Result<()> {
    if !built::PROBED {
        return Ok(());
    }
    let entry = linked_entry();
    // SAFETY: the functions of the loaded llama.cpp, whatever its version.
    let loaded = unsafe { llama_abi::read(&entry) };
    let built_build = built_build();
    let model = built_layout("llama_model_params");
    let context = built_layout("llama_context_params");
    let differences = llama_abi::differences(&built_build, &loaded, &model, &context);
    if differences.is_empty() {
        crate::log::info(&format!("running on {}, the llama.cpp it was built against", loaded.versions()));
        return Ok(());
    }
    Err(Error::llama_mismatch(format!(
        "dflash2 was built against {} ({}; {}) but runs on {} from {}: {}. dflash2 passes llama.cpp's params structs \
         by value, and their fields move between llama.cpp versions: on another build it would read and write them \
         at the wrong offsets. Rebuild dflash2 against the llama.cpp this program loads (DFLASH2_LLAMA_PREFIX, \
         docs/building.md), or run it with the libraries of {}/lib",
        built_build.versions(),
        built::ORIGIN.to_string_lossy(),
        built::PREFIX.to_string_lossy(),
        loaded.versions(),
        loaded_files(&entry),
        differences.join("; "),
        built::PREFIX.to_string_lossy(),
    )))
}

/// Ok when the loaded llama.cpp is the build dflash2 was built against, else
/// LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH with both named. Checked once per process.
pub fn check() -> Result<()> {
    static RESULT: OnceLock<Result<()>> = OnceLock::new();
    RESULT.get_or_init(compare).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_recorded_the_layouts_of_the_params_structs() {
        let model = built_layout("llama_model_params");
        assert_eq!(model.size, std::mem::size_of::<llama_model_params>());
        assert_eq!(
            model.fields.iter().find(|f| f.0 == "main_gpu").map(|f| f.1),
            Some(std::mem::offset_of!(llama_model_params, main_gpu))
        );
        let context = built_layout("llama_context_params");
        assert_eq!(context.size, std::mem::size_of::<llama_context_params>());
    }

    #[test]
    fn the_linked_libllama_is_the_build_dflash2_was_built_against() {
        assert_eq!(check(), Ok(()));
        let loaded = unsafe { llama_abi::read(&linked_entry()) };
        assert_eq!(loaded, built_build());
        #[cfg(target_arch = "x86_64")]
        assert!(built_layout("llama_model_params").fits(loaded.model_defaults.as_ref().unwrap()));
    }

    #[test]
    fn the_loaded_files_are_named() {
        let files = loaded_files(&linked_entry());
        assert!(files.contains("libllama.so"), "{files}");
        assert!(files.contains("libggml-base.so"), "{files}");
    }
}
