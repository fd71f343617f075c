//! Typed reads of GGUF metadata with errors that name the key and both types.
//! libllama is strict about metadata types, so these are too.

use dflash2_gguf::{Gguf, Value, ValueType};

use crate::error::{Error, Result};

pub struct Keys<'g, 'a> {
    gguf: &'g Gguf<'a>,
}

fn wrong_type(key: &str, want: &str, found: &Value) -> Error {
    Error::bad_checkpoint(format!("metadata '{key}' must be {want}, the file has {}", found.type_name()))
}

impl<'g, 'a> Keys<'g, 'a> {
    pub fn new(gguf: &'g Gguf<'a>) -> Self {
        Keys { gguf }
    }

    pub fn has(&self, key: &str) -> bool {
        self.gguf.get(key).is_some()
    }

    fn required<T>(&self, key: &str, v: Option<T>) -> Result<T> {
        v.ok_or_else(|| Error::bad_checkpoint(format!("required metadata '{key}' is missing")))
    }

    pub fn u32_opt(&self, key: &str) -> Result<Option<u32>> {
        match self.gguf.get(key) {
            None => Ok(None),
            Some(v) => v.as_u32().map(Some).ok_or_else(|| wrong_type(key, "u32", v)),
        }
    }

    pub fn u32(&self, key: &str) -> Result<u32> {
        self.required(key, self.u32_opt(key)?)
    }

    pub fn f32_opt(&self, key: &str) -> Result<Option<f32>> {
        match self.gguf.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f32() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                Some(x) => Err(Error::bad_checkpoint(format!("metadata '{key}' is {x}"))),
                None => Err(wrong_type(key, "f32", v)),
            },
        }
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        self.required(key, self.f32_opt(key)?)
    }

    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.gguf.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong_type(key, "bool", v)),
        }
    }

    pub fn str_opt(&self, key: &str) -> Result<Option<&'a str>> {
        match self.gguf.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| wrong_type(key, "a UTF-8 string", v)),
        }
    }

    pub fn i32_array(&self, key: &str) -> Result<Vec<i32>> {
        match self.gguf.get(key) {
            None => Err(Error::bad_checkpoint(format!("required metadata '{key}' is missing"))),
            Some(v) => v.as_i32_array().ok_or_else(|| wrong_type(key, "array[i32]", v)),
        }
    }

    pub fn i32_array_opt(&self, key: &str) -> Result<Option<Vec<i32>>> {
        if self.has(key) { self.i32_array(key).map(Some) } else { Ok(None) }
    }

    pub fn bool_array(&self, key: &str) -> Result<Vec<bool>> {
        match self.gguf.get(key) {
            None => Err(Error::bad_checkpoint(format!("required metadata '{key}' is missing"))),
            Some(v) => v.as_bool_array().ok_or_else(|| wrong_type(key, "array[bool]", v)),
        }
    }

    pub fn str_array_len(&self, key: &str) -> Result<u64> {
        match self.gguf.get(key) {
            None => Err(Error::bad_checkpoint(format!("required metadata '{key}' is missing"))),
            Some(v) => v.array_len_of(ValueType::Str).ok_or_else(|| wrong_type(key, "array[string]", v)),
        }
    }

    /// A per-layer hyperparameter stored either as one u32 or as one entry per
    /// layer (libllama's get_key_or_arr). Returns the value of every layer.
    pub fn u32_per_layer_opt(&self, key: &str, n_layer: u32) -> Result<Option<Vec<u32>>> {
        let Some(v) = self.gguf.get(key) else { return Ok(None) };
        if let Some(x) = v.as_u32() {
            return Ok(Some(vec![x; n_layer as usize]));
        }
        let arr = v
            .as_u32_array()
            .or_else(|| v.as_i32_array().map(|a| a.into_iter().map(|x| x as u32).collect()))
            .ok_or_else(|| wrong_type(key, "u32 or array[u32]", v))?;
        if arr.len() != n_layer as usize {
            return Err(Error::bad_checkpoint(format!(
                "metadata '{key}' has {} entries for {n_layer} layers",
                arr.len()
            )));
        }
        Ok(Some(arr))
    }
}
