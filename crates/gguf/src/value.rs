//! GGUF metadata values as read from a file: scalars decoded, arrays kept as a
//! checked span of the file so that a 50k-entry vocabulary costs nothing until used.

/// The on-disk type tag of a metadata value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    Str = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => Str,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Encoded size of one value of a fixed-size type; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            Str | Array => None,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            Str => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value. `Array` holds its element type, its length and the span of
/// its encoded elements; the reader has already checked that the span is complete.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(&'a [u8]),
    U64(u64),
    I64(i64),
    F64(f64),
    Array { elem: ValueType, len: u64, raw: &'a [u8] },
}

impl<'a> Value<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::Str(_) => ValueType::Str,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
            Value::Array { .. } => ValueType::Array,
        }
    }

    /// A short human description of the type, e.g. `u32` or `array[i32]`.
    pub fn type_name(&self) -> String {
        match self {
            Value::Array { elem, .. } => format!("array[{}]", elem.name()),
            v => v.value_type().name().to_string(),
        }
    }

    pub fn as_u32(&self) -> Option<u32> {
        match *self {
            Value::U32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::Str(s) => std::str::from_utf8(s).ok(),
            _ => None,
        }
    }

    /// Elements of an `array[i32]`.
    pub fn as_i32_array(&self) -> Option<Vec<i32>> {
        self.fixed_array(ValueType::I32, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Elements of an `array[u32]`.
    pub fn as_u32_array(&self) -> Option<Vec<u32>> {
        self.fixed_array(ValueType::U32, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Elements of an `array[bool]`.
    pub fn as_bool_array(&self) -> Option<Vec<bool>> {
        self.fixed_array(ValueType::Bool, |b| b[0] != 0)
    }

    /// Number of elements when this is an array of `elem`.
    pub fn array_len_of(&self, want: ValueType) -> Option<u64> {
        match *self {
            Value::Array { elem, len, .. } if elem == want => Some(len),
            _ => None,
        }
    }

    fn fixed_array<T>(&self, want: ValueType, decode: impl Fn(&[u8]) -> T) -> Option<Vec<T>> {
        match *self {
            Value::Array { elem, raw, .. } if elem == want => {
                let size = want.fixed_size()?;
                Some(raw.chunks_exact(size).map(decode).collect())
            }
            _ => None,
        }
    }
}

impl Value<'_> {
    /// The value's on-disk encoding (without its type tag), e.g. to copy it into
    /// another file.
    pub fn encode(&self) -> Vec<u8> {
        match *self {
            Value::U8(v) => vec![v],
            Value::I8(v) => vec![v as u8],
            Value::U16(v) => v.to_le_bytes().to_vec(),
            Value::I16(v) => v.to_le_bytes().to_vec(),
            Value::U32(v) => v.to_le_bytes().to_vec(),
            Value::I32(v) => v.to_le_bytes().to_vec(),
            Value::F32(v) => v.to_le_bytes().to_vec(),
            Value::Bool(v) => vec![v as u8],
            Value::U64(v) => v.to_le_bytes().to_vec(),
            Value::I64(v) => v.to_le_bytes().to_vec(),
            Value::F64(v) => v.to_le_bytes().to_vec(),
            Value::Str(s) => {
                let mut out = (s.len() as u64).to_le_bytes().to_vec();
                out.extend_from_slice(s);
                out
            }
            Value::Array { elem, len, raw } => {
                let mut out = (elem as u32).to_le_bytes().to_vec();
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(raw);
                out
            }
        }
    }
}
