//! Real ggml devices for the placement tests: llama.cpp RPC servers on
//! loopback (the pinned build's `ggml-rpc-server`, a remote device each) and the
//! Vulkan device of a Vulkan build (Mesa's llvmpipe, `GGML_VK_VISIBLE_DEVICES=0`).
#![allow(dead_code)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dflash2::sys;

use super::{Model, cstr, init_backend};

unsafe extern "C" {
    fn ggml_backend_reg_by_name(name: *const c_char) -> *mut c_void;
    fn ggml_backend_reg_get_proc_address(reg: *mut c_void, name: *const c_char) -> *mut c_void;
    fn ggml_backend_register(reg: *mut c_void);
    fn ggml_backend_reg_dev_count(reg: *mut c_void) -> usize;
    fn ggml_backend_reg_dev_get(reg: *mut c_void, index: usize) -> sys::ggml_backend_dev_t;
}

/// Held by every test that registers or places on devices: ggml's device
/// registry is a plain vector (registering while another thread walks it is a
/// data race), and a test must never place a model on another test's node,
/// whose server dies with that test.
pub fn serial() -> MutexGuard<'static, ()> {
    static DEVICES: Mutex<()> = Mutex::new(());
    // a failed test poisons the lock; the registry it guards is still whole
    DEVICES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The RPC server of the llama.cpp build the tests link.
pub fn rpc_server_binary() -> PathBuf {
    Path::new(env!("DFLASH2_LLAMA_PREFIX")).join("bin/ggml-rpc-server")
}

/// A `ggml-rpc-server` on 127.0.0.1, killed when dropped.
pub struct RpcServer {
    pub endpoint: String,
    child: Child,
}

impl RpcServer {
    /// Starts a server on a free port, serving its CPU (one thread), and waits
    /// until it accepts connections. The CPU device is named: the Vulkan build's
    /// server would otherwise serve llvmpipe, and then dies of heap corruption
    /// ("corrupted double-linked list") on its first graph (pinned build).
    pub fn start() -> RpcServer {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let binary = rpc_server_binary();
        assert!(binary.exists(), "{} is missing: build the pinned llama.cpp (GGML_RPC)", binary.display());
        let child = Command::new(&binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1", "-d", "CPU"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ggml-rpc-server");
        let endpoint = format!("127.0.0.1:{port}");
        let start = Instant::now();
        // a probe connection is served and closed by the server like any client
        while TcpStream::connect(&endpoint).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "ggml-rpc-server on {endpoint} did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        RpcServer { endpoint, child }
    }

    /// Kills the server now (a node lost mid-generation).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Registers the server's devices with ggml (as llama.cpp's `--rpc` does) and
/// returns their names (RPC0, RPC1, ... in the order servers are added), read
/// from the server's own registry entry.
pub fn add_rpc_server(server: &RpcServer) -> Vec<String> {
    init_backend();
    unsafe {
        let reg = ggml_backend_reg_by_name(c"RPC".as_ptr());
        assert!(!reg.is_null(), "this llama.cpp build has no RPC backend");
        let add = ggml_backend_reg_get_proc_address(reg, c"ggml_backend_rpc_add_server".as_ptr());
        assert!(!add.is_null());
        let add: unsafe extern "C" fn(*const c_char) -> *mut c_void = std::mem::transmute(add);
        let endpoint = CString::new(server.endpoint.as_str()).unwrap();
        let server_reg = add(endpoint.as_ptr());
        assert!(!server_reg.is_null(), "ggml_backend_rpc_add_server({})", server.endpoint);
        ggml_backend_register(server_reg);
        (0..ggml_backend_reg_dev_count(server_reg))
            .map(|i| {
                let name = sys::ggml_backend_dev_name(ggml_backend_reg_dev_get(server_reg, i));
                CStr::from_ptr(name).to_string_lossy().into_owned()
            })
            .collect()
    }
}

/// Names of every registered device.
pub fn device_names() -> Vec<String> {
    init_backend();
    unsafe {
        (0..sys::ggml_backend_dev_count())
            .map(|i| CStr::from_ptr(sys::ggml_backend_dev_name(sys::ggml_backend_dev_get(i))).to_string_lossy().into())
            .collect()
    }
}

/// The registered device named `name`.
pub fn device(name: &str) -> sys::ggml_backend_dev_t {
    init_backend();
    let c = CString::new(name).unwrap();
    let dev = unsafe { sys::ggml_backend_dev_by_name(c.as_ptr()) };
    assert!(!dev.is_null(), "no device {name} (devices: {:?})", device_names());
    dev
}

/// The Vulkan device of a Vulkan build, or a panic saying how to get one: the
/// Vulkan tests are `#[ignore]`d and run by scripts/devices.sh on that build.
pub fn vulkan() -> sys::ggml_backend_dev_t {
    let names = device_names();
    assert!(
        names.iter().any(|n| n == "Vulkan0"),
        "no Vulkan0 device (devices: {names:?}): run with the Vulkan build of llama.cpp and \
         GGML_VK_VISIBLE_DEVICES=0 (scripts/devices.sh)"
    );
    device("Vulkan0")
}

/// Where a target model goes.
pub struct Placement<'a> {
    /// None: libllama's default; Some(&[]): the CPU only.
    pub devices: Option<&'a [sys::ggml_backend_dev_t]>,
    /// -1: every layer and the output layer.
    pub n_gpu_layers: i32,
    pub split_mode: sys::llama_split_mode,
}

impl Model {
    /// Loads a model placed as `placement` says (repacking off, as `load`).
    pub fn load_placed(path: &Path, placement: &Placement) -> Model {
        init_backend();
        let mut list: Vec<sys::ggml_backend_dev_t> = placement.devices.unwrap_or_default().to_vec();
        list.push(std::ptr::null_mut());
        let mut mp = unsafe { sys::llama_model_default_params() };
        mp.use_extra_bufts = false;
        if placement.devices.is_some() {
            mp.devices = list.as_mut_ptr();
        }
        mp.n_gpu_layers = placement.n_gpu_layers;
        mp.split_mode = placement.split_mode;
        let m = unsafe { sys::llama_model_load_from_file(cstr(path).as_ptr(), mp) };
        assert!(!m.is_null(), "libllama could not load {}", path.display());
        Model(m)
    }
}

/// Fills memory of each device's server with NaN bytes and frees it, twice:
/// the server's allocator hands such reused memory to its next buffers (a
/// server that served another client before, or the same client's freed
/// buffers), so a computation that reads memory nothing wrote sees NaN there.
/// The first round's blocks are fresh (zeroed) pages given back on free; the
/// second round's come from the heap, which keeps them.
pub fn poison(devices: &[sys::ggml_backend_dev_t], mib: usize) {
    const CHUNK: usize = 8 << 20;
    for _ in 0..2 {
        for &dev in devices {
            unsafe {
                let buft = sys::ggml_backend_dev_buffer_type(dev);
                // a large block first: its free raises the allocator's threshold for fresh pages
                let big = sys::ggml_backend_buft_alloc_buffer(buft, 32 << 20);
                assert!(!big.is_null(), "poison: allocation on the device failed");
                sys::ggml_backend_buffer_free(big);
                let bufs: Vec<_> = (0..(mib << 20) / CHUNK)
                    .map(|_| {
                        let b = sys::ggml_backend_buft_alloc_buffer(buft, CHUNK);
                        assert!(!b.is_null(), "poison: allocation on the device failed");
                        sys::ggml_backend_buffer_clear(b, 0xff);
                        b
                    })
                    .collect();
                for b in bufs {
                    sys::ggml_backend_buffer_free(b);
                }
            }
        }
    }
}
