//! Sizes of the ggml tensor types a GGUF file may store.
//!
//! The table mirrors ggml's type traits of the pinned llama.cpp; a test in the
//! dflash2 crate compares it with libggml's `ggml_blck_size` / `ggml_type_size`.

/// Storage layout of one ggml type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    /// Elements per block; a row's length must be a multiple of it.
    pub block_size: u64,
    /// Bytes per block.
    pub type_size: u64,
}

impl GgmlType {
    /// Bytes of a tensor with these dimensions, or `None` when the row length is
    /// not a whole number of blocks or the size overflows.
    pub fn nbytes(&self, dims: &[u64]) -> Option<u64> {
        let (&ne0, rest) = dims.split_first()?;
        if ne0 % self.block_size != 0 {
            return None;
        }
        let mut bytes = (ne0 / self.block_size).checked_mul(self.type_size)?;
        for &ne in rest {
            bytes = bytes.checked_mul(ne)?;
        }
        Some(bytes)
    }
}

macro_rules! ggml_types {
    ($($id:literal $name:literal $blck:literal $size:literal),* $(,)?) => {
        const TYPES: &[GgmlType] = &[
            $(GgmlType { id: $id, name: $name, block_size: $blck, type_size: $size },)*
        ];
    };
}

ggml_types! {
    0 "f32" 1 4,
    1 "f16" 1 2,
    2 "q4_0" 32 18,
    3 "q4_1" 32 20,
    6 "q5_0" 32 22,
    7 "q5_1" 32 24,
    8 "q8_0" 32 34,
    9 "q8_1" 32 36,
    10 "q2_K" 256 84,
    11 "q3_K" 256 110,
    12 "q4_K" 256 144,
    13 "q5_K" 256 176,
    14 "q6_K" 256 210,
    15 "q8_K" 256 292,
    16 "iq2_xxs" 256 66,
    17 "iq2_xs" 256 74,
    18 "iq3_xxs" 256 98,
    19 "iq1_s" 256 50,
    20 "iq4_nl" 32 18,
    21 "iq3_s" 256 110,
    22 "iq2_s" 256 82,
    23 "iq4_xs" 256 136,
    24 "i8" 1 1,
    25 "i16" 1 2,
    26 "i32" 1 4,
    27 "i64" 1 8,
    28 "f64" 1 8,
    29 "iq1_m" 256 56,
    30 "bf16" 1 2,
    34 "tq1_0" 256 54,
    35 "tq2_0" 256 66,
    39 "mxfp4" 32 17,
    40 "nvfp4" 64 36,
    41 "q1_0" 128 18,
    42 "q2_0" 64 18,
}

/// The type with this ggml id, if the pinned ggml knows it.
pub fn ggml_type_from_id(id: u32) -> Option<GgmlType> {
    TYPES.iter().copied().find(|t| t.id == id)
}

/// Every type in the table (for cross-checks against libggml).
pub fn all_ggml_types() -> &'static [GgmlType] {
    TYPES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbytes_counts_blocks_of_quantized_rows() {
        let q4_1 = ggml_type_from_id(3).unwrap();
        assert_eq!(q4_1.nbytes(&[64, 3]), Some(2 * 20 * 3));
    }

    #[test]
    fn nbytes_rejects_partial_blocks_and_overflow() {
        let q8_0 = ggml_type_from_id(8).unwrap();
        assert_eq!(q8_0.nbytes(&[33]), None);
        let f32t = ggml_type_from_id(0).unwrap();
        assert_eq!(f32t.nbytes(&[u64::MAX, 2]), None);
    }

    #[test]
    fn removed_types_are_unknown() {
        assert!(ggml_type_from_id(4).is_none());
        assert!(ggml_type_from_id(31).is_none());
    }
}
