//! Writing GGUF files (version 3). Used to build test fixtures and generated
//! drafters; it writes what the reader and libllama accept.

use std::io::{self, Write};

use crate::DEFAULT_ALIGNMENT;
use crate::ggml_type::ggml_type_from_id;
use crate::value::ValueType;

/// The bytes of one tensor, already in its ggml type's layout.
pub struct TensorData {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub bytes: Vec<u8>,
}

/// A GGUF file being assembled in memory.
#[derive(Default)]
pub struct GgufWriter {
    kvs: Vec<(String, ValueType, Vec<u8>)>,
    tensors: Vec<TensorData>,
}

fn encode_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata entry whose value is already encoded (e.g. copied from
    /// another file). A key written twice keeps the last value.
    pub fn kv_raw(&mut self, key: &str, vt: ValueType, encoded: Vec<u8>) -> &mut Self {
        self.kvs.retain(|(k, _, _)| k != key);
        self.kvs.push((key.to_string(), vt, encoded));
        self
    }

    pub fn remove_kv(&mut self, key: &str) -> &mut Self {
        self.kvs.retain(|(k, _, _)| k != key);
        self
    }

    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.kv_raw(key, ValueType::U32, v.to_le_bytes().to_vec())
    }

    pub fn kv_i32(&mut self, key: &str, v: i32) -> &mut Self {
        self.kv_raw(key, ValueType::I32, v.to_le_bytes().to_vec())
    }

    pub fn kv_f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.kv_raw(key, ValueType::F32, v.to_le_bytes().to_vec())
    }

    pub fn kv_bool(&mut self, key: &str, v: bool) -> &mut Self {
        self.kv_raw(key, ValueType::Bool, vec![v as u8])
    }

    pub fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
        let mut enc = Vec::new();
        encode_str(&mut enc, v.as_bytes());
        self.kv_raw(key, ValueType::Str, enc)
    }

    fn kv_array(&mut self, key: &str, elem: ValueType, len: usize, body: Vec<u8>) -> &mut Self {
        let mut enc = Vec::with_capacity(12 + body.len());
        enc.extend_from_slice(&(elem as u32).to_le_bytes());
        enc.extend_from_slice(&(len as u64).to_le_bytes());
        enc.extend_from_slice(&body);
        self.kv_raw(key, ValueType::Array, enc)
    }

    pub fn kv_i32_array(&mut self, key: &str, v: &[i32]) -> &mut Self {
        let body = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.kv_array(key, ValueType::I32, v.len(), body)
    }

    pub fn kv_f32_array(&mut self, key: &str, v: &[f32]) -> &mut Self {
        let body = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.kv_array(key, ValueType::F32, v.len(), body)
    }

    pub fn kv_bool_array(&mut self, key: &str, v: &[bool]) -> &mut Self {
        let body = v.iter().map(|&b| b as u8).collect();
        self.kv_array(key, ValueType::Bool, v.len(), body)
    }

    pub fn kv_str_array<S: AsRef<str>>(&mut self, key: &str, v: &[S]) -> &mut Self {
        let mut body = Vec::new();
        for s in v {
            encode_str(&mut body, s.as_ref().as_bytes());
        }
        self.kv_array(key, ValueType::Str, v.len(), body)
    }

    /// Adds a tensor; its bytes must match the type and dimensions.
    pub fn tensor(&mut self, t: TensorData) -> io::Result<&mut Self> {
        let ty = ggml_type_from_id(t.ggml_type)
            .ok_or_else(|| io::Error::other(format!("unknown ggml type {}", t.ggml_type)))?;
        if ty.nbytes(&t.dims) != Some(t.bytes.len() as u64) {
            return Err(io::Error::other(format!(
                "tensor '{}': {} bytes do not fit {:?} of {}",
                t.name,
                t.bytes.len(),
                t.dims,
                ty.name
            )));
        }
        self.tensors.retain(|x| x.name != t.name);
        self.tensors.push(t);
        Ok(self)
    }

    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|x| x.name != name);
        self
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.iter().any(|t| t.name == name)
    }

    /// Serializes the file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = DEFAULT_ALIGNMENT as usize;
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (key, vt, enc) in &self.kvs {
            encode_str(&mut out, key.as_bytes());
            out.extend_from_slice(&(*vt as u32).to_le_bytes());
            out.extend_from_slice(enc);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            encode_str(&mut out, t.name.as_bytes());
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += t.bytes.len().div_ceil(align) * align;
        }
        out.resize(out.len().div_ceil(align) * align, 0);
        for t in &self.tensors {
            out.extend_from_slice(&t.bytes);
            out.resize(out.len().div_ceil(align) * align, 0);
        }
        out
    }

    pub fn write_to(&self, mut w: impl Write) -> io::Result<()> {
        w.write_all(&self.to_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Value, read};

    #[test]
    fn written_files_read_back() {
        let mut w = GgufWriter::new();
        w.kv_str("general.architecture", "llama")
            .kv_u32("llama.block_count", 2)
            .kv_i32_array("taps", &[1, -2, 3])
            .kv_str_array("toks", &["a", "bc"]);
        w.tensor(TensorData { name: "w".into(), dims: vec![2, 3], ggml_type: 0, bytes: vec![0u8; 24] }).unwrap();
        let bytes = w.to_bytes();
        let g = read(&bytes).unwrap();
        assert_eq!(g.architecture(), Some("llama"));
        assert_eq!(g.get("llama.block_count"), Some(&Value::U32(2)));
        assert_eq!(g.get("taps").unwrap().as_i32_array(), Some(vec![1, -2, 3]));
        assert_eq!(g.get("toks").unwrap().array_len_of(crate::ValueType::Str), Some(2));
        assert_eq!(g.tensor("w").unwrap().nbytes, 24);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let mut w = GgufWriter::new();
        w.kv_str("general.architecture", "x").kv_str_array("toks", &["a", "b", "c"]);
        w.tensor(TensorData { name: "t".into(), dims: vec![8], ggml_type: 0, bytes: vec![1u8; 32] }).unwrap();
        let bytes = w.to_bytes();
        assert!(read(&bytes).is_ok());
        for cut in 0..bytes.len() {
            assert!(read(&bytes[..cut]).is_err(), "cut at {cut} was accepted");
        }
    }

    #[test]
    fn absurd_counts_are_rejected_before_allocation() {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes()); // tensors
        bytes.extend_from_slice(&u64::MAX.to_le_bytes()); // kvs
        let err = read(&bytes).unwrap_err();
        assert!(err.message.contains("more than"), "{err}");
    }

    #[test]
    fn absurd_array_length_is_rejected() {
        let mut w = GgufWriter::new();
        let mut enc = (ValueType::U32 as u32).to_le_bytes().to_vec();
        enc.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
        w.kv_raw("big", ValueType::Array, enc);
        let err = read(&w.to_bytes()).unwrap_err();
        assert!(err.message.contains("truncated"), "{err}");
    }
}
