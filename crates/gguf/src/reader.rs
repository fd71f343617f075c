//! Parsing a GGUF file from bytes. Every count is checked against the bytes that
//! remain before anything is allocated, every offset against the file's length.

use std::collections::HashSet;
use std::fmt;

use crate::ggml_type::{GgmlType, ggml_type_from_id};
use crate::value::{Value, ValueType};
use crate::{DEFAULT_ALIGNMENT, MAX_DIMS};

const MAGIC: &[u8; 4] = b"GGUF";

/// ggml's limit on tensor names (including the terminating NUL).
const MAX_TENSOR_NAME: usize = 64;

/// Arrays of arrays are legal GGUF; more than this much nesting is not a real file.
const MAX_ARRAY_DEPTH: u32 = 3;

/// Why a file could not be read as GGUF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufError {
    /// Byte offset where reading failed.
    pub offset: u64,
    pub message: String,
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.offset)
    }
}

impl std::error::Error for GgufError {}

/// One tensor's descriptor; `offset` is relative to the start of the data section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub offset: u64,
    pub nbytes: u64,
}

/// A parsed GGUF header: metadata and tensor descriptors, with the data section
/// known to hold every tensor in full.
#[derive(Debug)]
pub struct Gguf<'a> {
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    pub file_len: u64,
    kvs: Vec<(&'a str, Value<'a>)>,
    tensors: Vec<TensorInfo>,
}

impl<'a> Gguf<'a> {
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.kvs.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    pub fn kvs(&self) -> &[(&'a str, Value<'a>)] {
        &self.kvs
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    pub fn architecture(&self) -> Option<&'a str> {
        self.get("general.architecture").and_then(|v| v.as_str())
    }
}

/// Parses the header of a GGUF file held in `bytes` and checks that the data of
/// every tensor lies inside it.
pub fn read(bytes: &[u8]) -> Result<Gguf<'_>, GgufError> {
    let mut cur = Cursor { bytes, pos: 0 };

    let magic = cur.take(4, "magic")?;
    if magic != MAGIC {
        return Err(cur.error_at(0, "not a GGUF file (bad magic)".into()));
    }
    let version = cur.u32("version")?;
    if version != 2 && version != 3 {
        return Err(cur.error_at(4, format!("unsupported GGUF version {version} (2 and 3 are read)")));
    }
    let n_tensors = cur.u64("tensor count")?;
    let n_kv = cur.u64("metadata count")?;

    // A metadata entry takes at least a key length, a type and one byte of value;
    // a tensor descriptor at least a name length, n_dims, one dim, type and offset.
    cur.check_count(n_kv, 8 + 4 + 1, "metadata entries")?;
    let mut kvs = Vec::with_capacity(n_kv as usize);
    let mut seen_keys = HashSet::new();
    for _ in 0..n_kv {
        let key_at = cur.pos;
        let key = cur.string("metadata key")?;
        let key = std::str::from_utf8(key).map_err(|_| cur.error_at(key_at, "metadata key is not UTF-8".into()))?;
        if !seen_keys.insert(key) {
            return Err(cur.error_at(key_at, format!("duplicate metadata key '{key}'")));
        }
        let type_id = cur.u32("metadata type")?;
        let vt = ValueType::from_id(type_id)
            .ok_or_else(|| cur.error(format!("metadata '{key}' has unknown type {type_id}")))?;
        let value = cur.value(vt, 0)?;
        kvs.push((key, value));
    }

    let alignment = match kvs.iter().find(|(k, _)| *k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            return Err(cur.error(format!("general.alignment must be a power-of-two u32, found {v:?}")));
        }
    };

    cur.check_count(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor descriptors")?;
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut seen_names = HashSet::new();
    for _ in 0..n_tensors {
        let info_at = cur.pos;
        let name = cur.string("tensor name")?;
        let name = std::str::from_utf8(name)
            .map_err(|_| cur.error_at(info_at, "tensor name is not UTF-8".into()))?
            .to_string();
        if name.len() >= MAX_TENSOR_NAME {
            return Err(cur.error_at(info_at, format!("tensor name '{name}' is longer than ggml allows")));
        }
        if !seen_names.insert(name.clone()) {
            return Err(cur.error_at(info_at, format!("duplicate tensor '{name}'")));
        }
        let n_dims = cur.u32("tensor n_dims")?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(cur.error(format!("tensor '{name}' has {n_dims} dimensions (1..=4 allowed)")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let ne = cur.u64("tensor dimension")?;
            if ne == 0 || ne > i64::MAX as u64 {
                return Err(cur.error(format!("tensor '{name}' has dimension {ne}")));
            }
            dims.push(ne);
        }
        let type_id = cur.u32("tensor type")?;
        let ggml_type = ggml_type_from_id(type_id)
            .ok_or_else(|| cur.error(format!("tensor '{name}' has unknown ggml type {type_id}")))?;
        let nbytes = ggml_type.nbytes(&dims).ok_or_else(|| {
            cur.error(format!("tensor '{name}' of type {} has impossible shape {dims:?}", ggml_type.name))
        })?;
        let offset = cur.u64("tensor offset")?;
        if offset % alignment != 0 {
            return Err(cur.error(format!("tensor '{name}' data offset {offset} is not aligned to {alignment}")));
        }
        tensors.push(TensorInfo { name, dims, ggml_type, offset, nbytes });
    }

    let file_len = bytes.len() as u64;
    let data_offset = cur.pos as u64;
    let data_offset = data_offset.div_ceil(alignment) * alignment;
    for t in &tensors {
        let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.nbytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(GgufError {
                    offset: file_len,
                    message: format!(
                        "file is truncated: tensor '{}' needs bytes {}..{} but the file has {}",
                        t.name,
                        data_offset.saturating_add(t.offset),
                        data_offset.saturating_add(t.offset).saturating_add(t.nbytes),
                        file_len
                    ),
                });
            }
        }
    }

    Ok(Gguf { version, alignment, data_offset, file_len, kvs, tensors })
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn error(&self, message: String) -> GgufError {
        self.error_at(self.pos, message)
    }

    fn error_at(&self, pos: usize, message: String) -> GgufError {
        GgufError { offset: pos as u64, message }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.error(format!("file is truncated: {what} needs {n} bytes, {} remain", self.remaining())));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Rejects a count whose entries could not fit in the remaining bytes, so it
    /// can size an allocation safely.
    fn check_count(&self, count: u64, min_entry: u64, what: &str) -> Result<(), GgufError> {
        if count > self.remaining() as u64 / min_entry {
            return Err(self.error(format!(
                "header claims {count} {what}, more than the {} remaining bytes can hold",
                self.remaining()
            )));
        }
        Ok(())
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    fn string(&mut self, what: &str) -> Result<&'a [u8], GgufError> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(
                self.error(format!("file is truncated: {what} claims {len} bytes, {} remain", self.remaining()))
            );
        }
        self.take(len as usize, what)
    }

    fn value(&mut self, vt: ValueType, depth: u32) -> Result<Value<'a>, GgufError> {
        let fixed = |c: &mut Self, n: usize| c.take(n, "metadata value");
        Ok(match vt {
            ValueType::U8 => Value::U8(fixed(self, 1)?[0]),
            ValueType::I8 => Value::I8(fixed(self, 1)?[0] as i8),
            ValueType::Bool => {
                let b = fixed(self, 1)?[0];
                if b > 1 {
                    return Err(self.error(format!("bool value {b} is neither 0 nor 1")));
                }
                Value::Bool(b == 1)
            }
            ValueType::U16 => {
                let b = fixed(self, 2)?;
                Value::U16(u16::from_le_bytes([b[0], b[1]]))
            }
            ValueType::I16 => {
                let b = fixed(self, 2)?;
                Value::I16(i16::from_le_bytes([b[0], b[1]]))
            }
            ValueType::U32 => Value::U32(self.u32("metadata value")?),
            ValueType::I32 => Value::I32(self.u32("metadata value")? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32("metadata value")?)),
            ValueType::U64 => Value::U64(self.u64("metadata value")?),
            ValueType::I64 => Value::I64(self.u64("metadata value")? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64("metadata value")?)),
            ValueType::Str => Value::Str(self.string("metadata string")?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.error("metadata arrays nested too deeply".into()));
                }
                let type_id = self.u32("array element type")?;
                let elem = ValueType::from_id(type_id)
                    .ok_or_else(|| self.error(format!("array has unknown element type {type_id}")))?;
                let len = self.u64("array length")?;
                let start = self.pos;
                match elem.fixed_size() {
                    Some(size) => {
                        let n = len.checked_mul(size as u64).filter(|&n| n <= self.remaining() as u64).ok_or_else(
                            || {
                                self.error(format!(
                                    "file is truncated: array of {len} {} needs more than the {} remaining bytes",
                                    elem.name(),
                                    self.remaining()
                                ))
                            },
                        )?;
                        self.take(n as usize, "array elements")?;
                    }
                    None => {
                        // strings: at least their 8-byte length; nested arrays: type + length
                        let min = if elem == ValueType::Str { 8 } else { 12 };
                        self.check_count(len, min, "array elements")?;
                        for _ in 0..len {
                            self.value(elem, depth + 1)?;
                        }
                    }
                }
                Value::Array { elem, len, raw: &self.bytes[start..self.pos] }
            }
        })
    }
}
