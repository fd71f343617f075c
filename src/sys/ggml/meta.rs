//! Model tensors of a target split by tensor (`-sm tensor`): ggml's meta
//! backend keeps each of them as one "simple" tensor per device, a slice
//! along the split axis (the output head: rows of its vocabulary) or a full
//! copy (mirrored tensors, such as the token embeddings).
//!
//! The draft graph reads those slices where they are: a partial product and a
//! partial top-k on each device (`crate::draft::shards`). ggml exports no
//! accessor to them — `ggml_backend_meta_buffer_simple_tensor` is file-local
//! in ggml-backend-meta.cpp — so the library finds that function in the
//! symbol table of the libggml-base it runs on (`elf_local`). A build with its
//! symbol table stripped (distribution packages) has no such entry: its `-sm
//! tensor` targets are refused with that reason, as before.

use std::ffi::{CStr, c_void};
use std::sync::OnceLock;

use super::Tensor;
use crate::error::{Error, Result};
use crate::sys::*;

unsafe extern "C" {
    // ggml-backend-impl.h, exported (GGML_API) with C linkage
    fn ggml_backend_buffer_is_meta(buf: ggml_backend_buffer_t) -> bool;
    fn ggml_backend_meta_n_backends(meta_backend: ggml_backend_t) -> usize;
    fn ggml_backend_meta_simple_backend(meta_backend: ggml_backend_t, index: usize) -> ggml_backend_t;
}

/// `static ggml_tensor * ggml_backend_meta_buffer_simple_tensor(const ggml_tensor *, size_t)`
type SimpleTensorFn = unsafe extern "C" fn(*const ggml_tensor, usize) -> *mut ggml_tensor;

/// The file-local symbol's mangled name (g++ / clang: `_ZL` + length + name +
/// parameter types).
const SIMPLE_TENSOR_SYMBOL: &str = "_ZL38ggml_backend_meta_buffer_simple_tensorPK11ggml_tensorm";

/// How a meta tensor lies over the devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Every device holds all of it.
    Mirrored,
    /// Device i holds a slice along `axis` (0 = ne[0]); slices in device order.
    Split { axis: usize },
}

/// One device's piece of a meta tensor.
#[derive(Clone, Copy, Debug)]
pub struct Piece<'a> {
    pub tensor: Tensor<'a>,
    pub device: ggml_backend_dev_t,
    /// Index of its first element along the split axis (0 when mirrored).
    pub first: i64,
}

/// A meta tensor's pieces, one per device of the meta device, in its order.
#[derive(Clone, Debug)]
pub struct Pieces<'a> {
    pub layout: Layout,
    pub pieces: Vec<Piece<'a>>,
}

/// Whether the tensor lives in a meta buffer (its model is split by tensor).
pub fn is_meta(t: Tensor<'_>) -> bool {
    let buffer = t.get().buffer;
    // SAFETY: the live buffer of a live tensor.
    !buffer.is_null() && unsafe { ggml_backend_buffer_is_meta(buffer) }
}

/// The devices of a meta device, in its order (a meta backend is made and
/// freed to ask: ggml exports the count only on a backend).
fn simple_devices(meta_dev: ggml_backend_dev_t) -> Result<Vec<ggml_backend_dev_t>> {
    // SAFETY: a live device; the backend is freed before returning.
    unsafe {
        let backend = ggml_backend_dev_init(meta_dev, std::ptr::null());
        if backend.is_null() {
            return Err(Error::unsupported("ggml could not start a backend of the target's meta device".to_string()));
        }
        let n = ggml_backend_meta_n_backends(backend);
        let devs = (0..n).map(|i| ggml_backend_get_device(ggml_backend_meta_simple_backend(backend, i))).collect();
        ggml_backend_free(backend);
        Ok(devs)
    }
}

/// The devices of the meta device that holds `t`, a tensor in a meta buffer.
fn devices_of(t: Tensor<'_>) -> Result<Vec<ggml_backend_dev_t>> {
    // SAFETY: a live tensor in a meta buffer; its buffer type's device is the meta device.
    simple_devices(unsafe { ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t.get().buffer)) })
}

/// The pieces of `t`, a tensor of a model split by tensor, checked: each
/// piece is allocated on its device, of `t`'s type, equal to `t` but along one
/// axis, and the slices add up to `t`.
pub fn pieces<'a>(t: Tensor<'a>) -> Result<Pieces<'a>> {
    let refuse = |why: String| {
        Error::unsupported(format!("the target's tensor {} is split by tensor (-sm tensor) and {why}", t.name()))
    };
    if !is_meta(t) {
        return Err(refuse("is not in a meta buffer".into()));
    }
    let simple_tensor = simple_tensor_fn().ok_or_else(|| {
        refuse(format!(
            "this libggml-base has no symbol table entry {SIMPLE_TENSOR_SYMBOL} (a stripped build): the library \
             cannot find the tensor's per-device slices"
        ))
    })?;
    let devices = devices_of(t)?;
    let ne = t.ne();
    let mut pieces = Vec::with_capacity(devices.len());
    let mut axis: Option<usize> = None;
    let mut first = 0i64;
    for (i, &device) in devices.iter().enumerate() {
        // SAFETY: i < the meta buffer's buffer count (one per simple device);
        // the result is a tensor of the meta buffer's own contexts, live as
        // long as the model.
        let raw = unsafe { simple_tensor(t.raw(), i) };
        if raw.is_null() {
            return Err(refuse(format!("ggml has no slice of it for device {i}")));
        }
        // SAFETY: non-NULL, owned by the meta buffer (above).
        let piece = unsafe { Tensor::from_raw(raw) };
        if piece.ty() != t.ty() || !piece.is_allocated() || piece.get().data.is_null() {
            return Err(refuse(format!("its slice on device {i} is not an allocated tensor of its type")));
        }
        // SAFETY: a live allocated tensor: its buffer type's device is live (or NULL).
        let piece_dev = unsafe { ggml_backend_buft_get_device(ggml_backend_buffer_get_type(piece.get().buffer)) };
        // a CPU device's slice may lie in a buffer of no device (host memory
        // ggml maps a file into): it is the CPU's
        let on_cpu_host = piece_dev.is_null()
            && piece.in_host_memory()
            // SAFETY: a live device of the meta device.
            && unsafe { ggml_backend_dev_type(device) } == GGML_BACKEND_DEVICE_TYPE_CPU;
        if piece_dev != device && !on_cpu_host {
            let a = if piece_dev.is_null() { "no device".to_string() } else { super::backend::device_name(piece_dev) };
            let b = super::backend::device_name(device);
            return Err(refuse(format!("its slice {i} is on {a}, not on the meta device's device {i} ({b})")));
        }
        let pne = piece.ne();
        let differing: Vec<usize> = (0..4).filter(|&d| pne[d] != ne[d]).collect();
        match differing.as_slice() {
            [] => {}
            [d] => match axis {
                None => axis = Some(*d),
                Some(a) if a == *d => {}
                Some(_) => return Err(refuse("its slices differ along two axes".into())),
            },
            _ => return Err(refuse(format!("its slice on device {i} differs from it along several axes"))),
        }
        pieces.push(Piece { tensor: piece, device, first });
        first += axis.map_or(0, |a| pne[a]);
    }
    let layout = match axis {
        None => Layout::Mirrored,
        Some(a) => {
            if first != ne[a] {
                return Err(refuse(format!("its slices add up to {first} of {} along axis {a}", ne[a])));
            }
            // a piece equal to the whole along the axis in a split tensor
            // (a one-device split) starts at 0 and is the whole
            let mut at = 0;
            for p in pieces.iter_mut() {
                p.first = at;
                at += p.tensor.ne()[a];
            }
            Layout::Split { axis: a }
        }
    };
    if pieces.is_empty() {
        return Err(refuse("its meta device has no devices".into()));
    }
    Ok(Pieces { layout, pieces })
}

/// The names of the devices that hold an empty slice of `t`, a tensor of a
/// model split by tensor: llama.cpp rounds every slice down to its
/// granularity, so a device may get none of a tensor. None when `t` is not in
/// a meta buffer or its slices cannot be reached.
pub fn empty_slices(t: Tensor<'_>) -> Option<Vec<String>> {
    if !is_meta(t) || t.ne().iter().product::<i64>() == 0 {
        return None;
    }
    let simple_tensor = simple_tensor_fn()?;
    let mut empty = Vec::new();
    for (i, &device) in devices_of(t).ok()?.iter().enumerate() {
        // SAFETY: i < the meta buffer's buffer count (one per simple device).
        let raw = unsafe { simple_tensor(t.raw(), i) };
        if raw.is_null() {
            return None;
        }
        // SAFETY: non-NULL, owned by the meta buffer.
        if unsafe { Tensor::from_raw(raw) }.ne().iter().product::<i64>() == 0 {
            empty.push(super::backend::device_name(device));
        }
    }
    Some(empty)
}

/// The exported marker of a ggml whose meta backend fills a device's partial
/// result with 0 where that device holds an empty slice (scripts/ggml-fixes.py,
/// meta-zero-fill); ggml itself scales that never-written memory by 0, which
/// keeps its NaN and Inf.
const FILLS_EMPTY_SLICES_SYMBOL: &CStr = c"ggml_backend_meta_dflash2_fills_empty_slices";

/// Set (to anything but 0) to treat the loaded ggml as one without the fix:
/// lets a test see the refusal on the pinned build.
pub const ASSUME_UNFIXED_ENV: &str = "DFLASH2_TEST_GGML_KEEPS_NAN_IN_EMPTY_SLICES";

/// Whether the loaded ggml fills empty slices' partial results with 0.
pub fn fills_empty_slices() -> bool {
    if std::env::var(ASSUME_UNFIXED_ENV).is_ok_and(|v| !v.is_empty() && v != "0") {
        return false;
    }
    // SAFETY: a lookup in the process's global scope; the symbol, when there,
    // is `int f(void)` (scripts/ggml-fixes.py).
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, FILLS_EMPTY_SLICES_SYMBOL.as_ptr());
        !f.is_null() && std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> i32>(f)() == 1
    }
}

/// `ggml_backend_meta_buffer_simple_tensor` of the loaded libggml-base, found
/// once (None: not found, or the symbol table disagrees with the loader).
fn simple_tensor_fn() -> Option<SimpleTensorFn> {
    static FOUND: OnceLock<Option<usize>> = OnceLock::new();
    let addr = *FOUND.get_or_init(|| {
        let anchor = ggml_backend_buffer_is_meta as *const c_void;
        let addr = elf_local::resolve(anchor, c"ggml_backend_buffer_is_meta", SIMPLE_TENSOR_SYMBOL);
        if addr.is_none() {
            crate::log::info("ggml's per-device tensor slices are not reachable in this build (-sm tensor refused)");
        }
        addr
    });
    // SAFETY: the address of the function of that exact mangled signature in
    // the loaded library, cross-checked against the loader (elf_local).
    addr.map(|a| unsafe { std::mem::transmute::<usize, SimpleTensorFn>(a) })
}

/// File-local functions of a loaded shared library, by its ELF symbol table.
mod elf_local {
    use super::*;

    const SHT_SYMTAB: u32 = 2;

    /// `N` bytes at `base + off`, None past the end (or on overflow).
    fn bytes_at<const N: usize>(b: &[u8], base: usize, off: usize) -> Option<[u8; N]> {
        let at = base.checked_add(off)?;
        b.get(at..at.checked_add(N)?)?.try_into().ok()
    }
    fn u16_at(b: &[u8], base: usize, off: usize) -> Option<u16> {
        bytes_at(b, base, off).map(u16::from_le_bytes)
    }
    fn u32_at(b: &[u8], base: usize, off: usize) -> Option<u32> {
        bytes_at(b, base, off).map(u32::from_le_bytes)
    }
    fn u64_at(b: &[u8], base: usize, off: usize) -> Option<u64> {
        bytes_at(b, base, off).map(u64::from_le_bytes)
    }

    /// Values (st_value) of `names` in the symbol table of the ELF64 file.
    fn symbol_values(elf: &[u8], names: &[&[u8]]) -> Option<Vec<Option<u64>>> {
        if elf.get(..6)? != b"\x7fELF\x02\x01" {
            return None; // not a little-endian ELF64
        }
        let shoff = u64_at(elf, 0, 0x28)? as usize;
        let shentsize = u16_at(elf, 0, 0x3a)? as usize;
        let shnum = u16_at(elf, 0, 0x3c)? as usize;
        let section = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
        let mut found = vec![None; names.len()];
        for i in 0..shnum {
            let sh = section(i)?;
            if u32_at(elf, sh, 4)? != SHT_SYMTAB {
                continue;
            }
            let (off, size, link, entsize) = (
                u64_at(elf, sh, 0x18)? as usize,
                u64_at(elf, sh, 0x20)? as usize,
                u32_at(elf, sh, 0x28)? as usize,
                u64_at(elf, sh, 0x38)? as usize,
            );
            let str_sh = section(link)?;
            let (str_off, str_size) = (u64_at(elf, str_sh, 0x18)? as usize, u64_at(elf, str_sh, 0x20)? as usize);
            let strtab = elf.get(str_off..str_off.checked_add(str_size)?)?;
            if entsize < 24 {
                return None;
            }
            for s in 0..size / entsize {
                let sym = off.checked_add(s * entsize)?;
                let name_at = u32_at(elf, sym, 0)? as usize;
                let name = strtab.get(name_at..)?;
                let name = &name[..name.iter().position(|&c| c == 0)?];
                if let Some(k) = names.iter().position(|n| *n == name) {
                    found[k] = Some(u64_at(elf, sym, 8)?);
                }
            }
        }
        Some(found)
    }

    /// The address of `local` in the shared library that holds `anchor`, an
    /// exported function named `anchor_name`; checked by finding the anchor's
    /// own table entry at the loader's address.
    pub fn resolve(anchor: *const c_void, anchor_name: &CStr, local: &str) -> Option<usize> {
        // SAFETY: dladdr reads the loader's tables; info is plain data.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        if unsafe { libc::dladdr(anchor, &mut info) } == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dladdr returned a NUL-terminated path.
        let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?.to_owned();
        let file = std::fs::File::open(&path).ok()?;
        // SAFETY: read-only map of a library file, read while mapped only here.
        let elf = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let values = symbol_values(&elf, &[anchor_name.to_bytes(), local.as_bytes()])?;
        let base = info.dli_fbase as usize;
        let (anchor_value, local_value) = (values[0]?, values[1]?);
        if base.checked_add(anchor_value as usize)? != anchor as usize || local_value == 0 {
            return None; // another file than the loaded one, or a different layout
        }
        base.checked_add(local_value as usize)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_function_of_the_loaded_libggml_base_is_found_at_its_address() {
            // an exported function resolved through the table must be the one the loader bound
            let anchor = ggml_backend_buffer_is_meta as *const c_void;
            let addr = resolve(anchor, c"ggml_backend_buffer_is_meta", "ggml_backend_meta_n_backends");
            assert_eq!(addr, Some(ggml_backend_meta_n_backends as *const c_void as usize));
        }

        #[test]
        fn the_file_local_accessor_is_found_in_the_pinned_build() {
            let anchor = ggml_backend_buffer_is_meta as *const c_void;
            assert!(resolve(anchor, c"ggml_backend_buffer_is_meta", SIMPLE_TENSOR_SYMBOL).is_some());
        }

        #[test]
        fn a_missing_name_or_a_bad_file_finds_nothing() {
            let anchor = ggml_backend_buffer_is_meta as *const c_void;
            assert_eq!(resolve(anchor, c"ggml_backend_buffer_is_meta", "_ZL_no_such_function"), None);
            assert_eq!(resolve(anchor, c"no_such_anchor", SIMPLE_TENSOR_SYMBOL), None);
            assert_eq!(symbol_values(b"not an elf file", &[b"x"]), None);
            let mut cut = b"\x7fELF\x02\x01".to_vec();
            cut.resize(64, 0xff);
            assert_eq!(symbol_values(&cut, &[b"x"]), None);
        }
    }
}
