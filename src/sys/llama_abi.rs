//! What a llama.cpp build says about itself, read from its loaded libraries:
//! llama_version(), ggml_version(), ggml_commit(), and the bytes its
//! llama_model_default_params() / llama_context_default_params() write, read
//! into a guarded buffer. Each llama-cpp-python release changed a struct that
//! dflash2 passes by value (llama_model_params grew from 72 to 80 bytes from
//! 0.3.35 to 0.3.36; llama_context_params kept its size from 0.3.34 to 0.3.35
//! but moved every field from n_threads on), and the libraries are all
//! libllama.so.0 / libggml*.so.0 to the loader: a libdflash2 built on one and
//! run on another would read and write its params at the wrong offsets.
//!
//! build.rs reads the prefix's libraries with this module (included there by
//! path: it uses std and libc only) and records what they say; at engine
//! creation `llama_check` reads the loaded ones and compares.

use std::ffi::{CStr, c_char, c_void};
use std::fmt::Write as _;

/// What a llama.cpp build reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlamaBuild {
    pub llama_version: String,
    pub ggml_version: String,
    /// "unknown" for a build outside a git checkout (the sdists).
    pub ggml_commit: String,
    /// What llama_model_default_params() writes; None where it could not be
    /// read through a guarded buffer (a target other than x86-64).
    pub model_defaults: Option<Written>,
    /// What llama_context_default_params() writes.
    pub context_defaults: Option<Written>,
}

impl LlamaBuild {
    /// "llama.cpp 0.5.0-dev, ggml 0.25.3 (commit unknown)".
    pub fn versions(&self) -> String {
        format!("llama.cpp {}, ggml {} (commit {})", self.llama_version, self.ggml_version, self.ggml_commit)
    }
}

/// The bytes a function wrote into a buffer it was handed, up to the last one
/// it wrote: None where it left one alone (padding between fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written(pub Vec<Option<u8>>);

impl Written {
    /// How far it wrote: the struct's size, less any tail padding it skipped.
    pub fn extent(&self) -> usize {
        self.0.len()
    }

    /// Two hex digits per byte, "--" for a byte left alone.
    pub fn to_hex(&self) -> String {
        self.0.iter().fold(String::new(), |mut s, b| {
            match b {
                Some(b) => write!(s, "{b:02x}").unwrap(),
                None => s.push_str("--"),
            }
            s
        })
    }

    pub fn from_hex(hex: &str) -> Option<Written> {
        let pairs = hex.as_bytes().chunks(2);
        pairs
            .map(|p| match std::str::from_utf8(p).ok()? {
                "--" => Some(None),
                p if p.len() == 2 => u8::from_str_radix(p, 16).ok().map(Some),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(Written)
    }
}

/// The functions of a loaded llama.cpp this module calls.
pub struct Entry {
    pub llama_version: unsafe extern "C" fn() -> *const c_char,
    pub ggml_version: unsafe extern "C" fn() -> *const c_char,
    pub ggml_commit: unsafe extern "C" fn() -> *const c_char,
    /// llama_model_default_params and llama_context_default_params, as
    /// addresses: they are called through a guarded buffer, not their C type.
    pub model_defaults: *const c_void,
    pub context_defaults: *const c_void,
}

/// Reads what the build behind `entry` says about itself.
///
/// # Safety
/// `entry` holds the functions of one loaded llama.cpp (any version).
pub unsafe fn read(entry: &Entry) -> LlamaBuild {
    // SAFETY: functions without arguments returning static strings (or NULL).
    let text = |f: unsafe extern "C" fn() -> *const c_char| unsafe {
        let s = f();
        if s.is_null() { "(null)".to_string() } else { CStr::from_ptr(s).to_string_lossy().into_owned() }
    };
    LlamaBuild {
        llama_version: text(entry.llama_version),
        ggml_version: text(entry.ggml_version),
        ggml_commit: text(entry.ggml_commit),
        // SAFETY: both return a struct by value and take no arguments.
        model_defaults: unsafe { guarded_call(entry.model_defaults) },
        context_defaults: unsafe { guarded_call(entry.context_defaults) },
    }
}

/// Room for the struct a params function writes: llama.cpp's are a few
/// hundred bytes at most.
const GUARD: usize = 4096;

/// Calls `f`, a function without arguments that returns a struct of more than
/// 16 bytes, with a 4 KiB buffer to write it to, twice (under two fill
/// patterns), and returns the bytes it wrote. However large the struct of the
/// library's version, it lands in this buffer, not past a caller's slot.
///
/// # Safety
/// `f` takes no arguments and returns a struct larger than 16 bytes (and
/// smaller than 4 KiB) by value.
#[cfg(target_arch = "x86_64")]
unsafe fn guarded_call(f: *const c_void) -> Option<Written> {
    if f.is_null() {
        return None;
    }
    // On x86-64 (System V and Windows alike) a function returning a struct of
    // more than 16 bytes takes the address to write it to as a hidden first
    // argument and returns that address: the same call as this type.
    // SAFETY: f has that calling convention (the contract above).
    let call = unsafe { std::mem::transmute::<*const c_void, unsafe extern "C" fn(*mut u8) -> *mut u8>(f) };
    let mut passes = [[0xa5u8; GUARD], [0x5au8; GUARD]];
    for pass in passes.iter_mut() {
        let buf = pass.as_mut_ptr();
        // SAFETY: buf is writable for GUARD bytes, more than f writes.
        if unsafe { call(buf) } != buf {
            // not a function that returns its struct through the hidden pointer
            return None;
        }
    }
    // a byte f wrote holds its value under both patterns; one it left alone holds each pattern
    let written = |i: usize| passes[0][i] != 0xa5 || passes[1][i] != 0x5a;
    let extent = (0..GUARD).rev().find(|&i| written(i)).map_or(0, |i| i + 1);
    Some(Written((0..extent).map(|i| written(i).then_some(passes[0][i])).collect()))
}

/// Other targets pass the hidden pointer elsewhere (aarch64: x8), out of reach
/// of a plain call: the versions alone are compared there.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn guarded_call(_f: *const c_void) -> Option<Written> {
    None
}

/// The file of the loaded object that holds `addr` (a function's address; an
/// address, never dereferenced).
pub fn object_path(addr: usize) -> Option<String> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only looks the address up in the loader's tables and fills info.
    let found = unsafe { libc::dladdr(addr as *const c_void, info.as_mut_ptr()) } != 0;
    // SAFETY: filled (or left zeroed) by dladdr.
    let info = unsafe { info.assume_init() };
    if !found || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated path owned by the loader.
    Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
}

/// A struct's layout as a C compiler lays it out: its size and alignment, each
/// field's offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub name: String,
    pub size: usize,
    pub align: usize,
    pub fields: Vec<(String, usize)>,
}

impl Layout {
    /// The fields that hold any of the bytes start..end.
    pub fn fields_at(&self, start: usize, end: usize) -> Vec<&str> {
        let mut out = Vec::new();
        for (i, (name, offset)) in self.fields.iter().enumerate() {
            let next = self.fields.get(i + 1).map_or(self.size, |f| f.1);
            if *offset < end && next > start {
                out.push(name.as_str());
            }
        }
        out
    }

    /// Whether `w`, written by a params function, is a struct of this layout:
    /// it ends past the last alignment unit (the tail padding may be left alone).
    pub fn fits(&self, w: &Written) -> bool {
        w.extent() <= self.size && w.extent() + self.align > self.size
    }
}

/// How the defaults `loaded` wrote differ from `built`'s, in words (None when
/// they do not): a size, or the fields whose bytes differ.
pub fn defaults_difference(function: &str, layout: &Layout, built: &Written, loaded: &Written) -> Option<String> {
    if built == loaded {
        return None;
    }
    if built.extent() != loaded.extent() {
        return Some(format!(
            "{function}() writes {} bytes where the build's wrote {} (struct {} of {} bytes)",
            loaded.extent(),
            built.extent(),
            layout.name,
            layout.size
        ));
    }
    let differ: Vec<usize> = (0..built.extent()).filter(|&i| built.0[i] != loaded.0[i]).collect();
    let (first, last) = (differ[0], differ[differ.len() - 1]);
    Some(format!(
        "{function}() writes other bytes than the build's at offsets {first}..{} (where the build's struct {} has {})",
        last + 1,
        layout.name,
        layout.fields_at(first, last + 1).join(", ")
    ))
}

/// The ways `loaded` differs from `built`, one phrase each (empty: the same
/// build). Defaults are compared where both were read.
pub fn differences(built: &LlamaBuild, loaded: &LlamaBuild, model: &Layout, context: &Layout) -> Vec<String> {
    let mut out = Vec::new();
    if built.llama_version != loaded.llama_version {
        out.push(format!("llama_version() is \"{}\", the build's \"{}\"", loaded.llama_version, built.llama_version));
    }
    if built.ggml_version != loaded.ggml_version {
        out.push(format!("ggml_version() is \"{}\", the build's \"{}\"", loaded.ggml_version, built.ggml_version));
    }
    if built.ggml_commit != loaded.ggml_commit {
        out.push(format!("ggml_commit() is \"{}\", the build's \"{}\"", loaded.ggml_commit, built.ggml_commit));
    }
    let pairs = [
        ("llama_model_default_params", model, &built.model_defaults, &loaded.model_defaults),
        ("llama_context_default_params", context, &built.context_defaults, &loaded.context_defaults),
    ];
    for (function, layout, built, loaded) in pairs {
        if let (Some(b), Some(l)) = (built, loaded) {
            out.extend(defaults_difference(function, layout, b, l));
        }
    }
    out
}

/// A prefix's llama.cpp libraries, loaded into this process.
#[allow(dead_code)]
pub struct Prefix {
    handle: *mut c_void,
    pub entry: Entry,
}

#[allow(dead_code)]
impl Prefix {
    /// Whether libllama or a library it needs exports `name`.
    pub fn exports(&self, name: &str) -> bool {
        let Ok(name) = std::ffi::CString::new(name) else { return false };
        // SAFETY: a live handle and a NUL-terminated name.
        !unsafe { libc::dlsym(self.handle, name.as_ptr()) }.is_null()
    }
}

/// Loads the llama.cpp libraries of `lib` (a prefix's lib/) into this process
/// and finds their functions. For build.rs, which reads the prefix it builds
/// against; the library itself reads the libllama it is linked to.
///
/// # Safety
/// Runs the libraries' initializers in this process.
#[allow(dead_code)]
pub unsafe fn open_prefix(lib: &std::path::Path) -> Result<Prefix, String> {
    let mut handle = std::ptr::null_mut();
    // dependencies first: their sonames then resolve to these files, not to
    // whatever libggml the loader would find on its own
    for name in ["libggml-base.so", "libggml.so", "libllama.so"] {
        let path = lib.join(name);
        let cpath = std::ffi::CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated path; the library's initializers run (the contract).
        handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated message.
            let why = unsafe { libc::dlerror() };
            let why =
                if why.is_null() { String::new() } else { unsafe { CStr::from_ptr(why) }.to_string_lossy().into() };
            return Err(format!("cannot load {}: {why}", path.display()));
        }
    }
    // SAFETY: libllama's handle; a lookup covers it and the libraries it needs.
    let symbol = |name: &CStr| unsafe { libc::dlsym(handle, name.as_ptr()) }.cast_const();
    let function = |name: &CStr| {
        let f = symbol(name);
        if f.is_null() {
            return Err(format!("{}/libllama.so exports no {}", lib.display(), name.to_string_lossy()));
        }
        // SAFETY: llama.h / ggml.h declare these as `const char * f(void)`.
        Ok(unsafe { std::mem::transmute::<*const c_void, unsafe extern "C" fn() -> *const c_char>(f) })
    };
    let entry = Entry {
        llama_version: function(c"llama_version")?,
        ggml_version: function(c"ggml_version")?,
        ggml_commit: function(c"ggml_commit")?,
        model_defaults: symbol(c"llama_model_default_params"),
        context_defaults: symbol(c"llama_context_default_params"),
    };
    Ok(Prefix { handle, entry })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            name: "params".into(),
            size: 16,
            align: 8,
            fields: vec![("a".into(), 0), ("b".into(), 4), ("c".into(), 8), ("flag".into(), 12)],
        }
    }

    fn written(bytes: &[Option<u8>]) -> Written {
        Written(bytes.to_vec())
    }

    #[test]
    fn written_bytes_round_trip_through_hex_with_gaps() {
        let w = written(&[Some(0), Some(0xff), None, Some(0x12)]);
        assert_eq!(w.to_hex(), "00ff--12");
        assert_eq!(Written::from_hex("00ff--12"), Some(w));
        assert_eq!(Written::from_hex("0g"), None);
        assert_eq!(Written::from_hex("012"), None);
    }

    #[test]
    fn a_struct_fits_its_layout_up_to_tail_padding() {
        let l = layout();
        assert!(l.fits(&Written(vec![Some(1); 16])));
        assert!(l.fits(&Written(vec![Some(1); 13])));
        assert!(!l.fits(&Written(vec![Some(1); 8])), "a struct 8 bytes smaller");
        assert!(!l.fits(&Written(vec![Some(1); 24])), "a struct 8 bytes larger");
    }

    #[test]
    fn fields_are_named_by_the_bytes_they_hold() {
        let l = layout();
        assert_eq!(l.fields_at(4, 8), ["b"]);
        assert_eq!(l.fields_at(6, 13), ["b", "c", "flag"]);
        assert_eq!(l.fields_at(15, 16), ["flag"]);
    }

    #[test]
    fn a_larger_struct_is_named_by_its_size() {
        let built = written(&[Some(1); 16]);
        let loaded = written(&[Some(1); 24]);
        let d = defaults_difference("f", &layout(), &built, &loaded).unwrap();
        assert_eq!(d, "f() writes 24 bytes where the build's wrote 16 (struct params of 16 bytes)");
    }

    #[test]
    fn moved_fields_at_the_same_size_are_named() {
        let built = written(&[Some(0), Some(0), Some(0), Some(0), Some(4), Some(0), Some(0), Some(0)]);
        let mut moved = built.clone();
        moved.0[4] = Some(0);
        moved.0[5] = Some(4);
        let d = defaults_difference("f", &layout(), &built, &moved).unwrap();
        assert_eq!(
            d,
            "f() writes other bytes than the build's at offsets 4..6 (where the build's struct params has b)"
        );
        assert_eq!(defaults_difference("f", &layout(), &built, &built), None);
    }

    #[test]
    fn versions_and_defaults_are_compared_where_both_were_read() {
        let build = LlamaBuild {
            llama_version: "0.5.0-dev".into(),
            ggml_version: "0.25.3".into(),
            ggml_commit: "unknown".into(),
            model_defaults: Some(written(&[Some(1); 16])),
            context_defaults: None,
        };
        assert!(differences(&build, &build, &layout(), &layout()).is_empty());
        let other = LlamaBuild {
            llama_version: "9.9.9".into(),
            model_defaults: Some(written(&[Some(1); 8])),
            context_defaults: Some(written(&[Some(1); 8])),
            ..build.clone()
        };
        let d = differences(&build, &other, &layout(), &layout());
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[0], "llama_version() is \"9.9.9\", the build's \"0.5.0-dev\"");
        assert!(d[1].starts_with("llama_model_default_params() writes 8 bytes"), "{}", d[1]);
    }
}
