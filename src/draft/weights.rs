//! The drafter's weights in backend buffers on the placement's devices.
//!
//! The file's header comes from a memory map (`checkpoint::open_file`, which
//! validates it); the tensor data is then *read* from the same open file
//! into each tensor's buffer, and the map is dropped before the engine runs.
//! A drafter truncated or rewritten on disk afterwards cannot reach the
//! engine; one truncated during the load gives a short read (an error), never
//! the SIGBUS a read through a map of a shrinking file raises.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use dflash2_gguf::TensorInfo;

use crate::error::{Error, Result};
use crate::sys::ggml::{Tensor, TensorStore};
use crate::sys::{Device, GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I64, ggml_backend_dev_t};

/// A weight: which store, which tensor in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightId {
    store: usize,
    index: usize,
}

/// Where a tensor of the drafter belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Token embeddings: host memory, as libllama keeps its input layer.
    Input,
    /// The fusion of tap features (`fc`, its norm): with the first layer.
    Fusion,
    Layer(usize),
    /// Final norm, own head, `d2t`, selector: where the output goes.
    Output,
}

/// The slot of a tensor by its GGUF name.
pub fn slot_of(name: &str) -> Slot {
    if name == "token_embd.weight" {
        return Slot::Input;
    }
    if name.starts_with("fc.") || name == "enc.output_norm.weight" || name == "rope_freqs.weight" {
        return Slot::Fusion;
    }
    if let Some(rest) = name.strip_prefix("blk.") {
        if let Some(il) = rest.split('.').next().and_then(|n| n.parse::<usize>().ok()) {
            return Slot::Layer(il);
        }
    }
    Slot::Output
}

/// 1-d tensors the graph multiplies or adds elementwise: ggml needs them in
/// f32 there (converters write them so).
fn must_be_f32(name: &str) -> bool {
    name.ends_with("_norm.weight")
        || name.ends_with("conv_base")
        || name.ends_with(".scale")
        || name.ends_with("layer_output_scale.weight")
        || name.ends_with("attn_sinks.weight")
        || name == "rope_freqs.weight"
}

/// Types ggml multiplies by and gathers rows of: floats and the quantized
/// block types (not the integer types or f64, where ggml's ops abort).
fn is_matrix_type(ty: u32) -> bool {
    matches!(ty, GGML_TYPE_F32 | GGML_TYPE_F16 | GGML_TYPE_BF16) || crate::sys::ggml::is_quantized(ty)
}

/// Weights on their devices.
pub struct Weights {
    stores: Vec<(Device, TensorStore)>,
    ids: HashMap<String, WeightId>,
}

impl Weights {
    /// Reads every tensor of `tensors` (the validated list of the drafter's
    /// file, data at `data_offset`) from `file` into buffers of the devices
    /// `device_of` chooses.
    pub fn load(
        file: &File,
        data_offset: u64,
        tensors: &[TensorInfo],
        device_of: impl Fn(Slot) -> Device,
    ) -> Result<Weights> {
        let mut stores: Vec<(Device, TensorStore)> = Vec::new();
        let mut ids = HashMap::new();
        for t in tensors {
            if must_be_f32(&t.name) && t.ggml_type.id != GGML_TYPE_F32 {
                return Err(Error::invalid(format!(
                    "tensor '{}' is {}: the draft graph needs f32 for norm weights, convolution bases and scales",
                    t.name, t.ggml_type.name
                )));
            }
            if t.name == "d2t" && t.ggml_type.id != GGML_TYPE_I64 {
                return Err(Error::invalid(format!("tensor 'd2t' is {}, not i64", t.ggml_type.name)));
            }
            if t.name != "d2t" && !must_be_f32(&t.name) && !is_matrix_type(t.ggml_type.id) {
                return Err(Error::invalid(format!(
                    "tensor '{}' is {}: the draft graph multiplies by weights in f32, f16, bf16 or a quantized type",
                    t.name, t.ggml_type.name
                )));
            }
            let dev = device_of(slot_of(&t.name));
            let store = match stores.iter().position(|(d, _)| d.dev == dev.dev) {
                Some(i) => i,
                None => {
                    stores.push((dev, TensorStore::new(tensors.len())?));
                    stores.len() - 1
                }
            };
            let ne: Vec<i64> = t.dims.iter().map(|&d| d as i64).collect();
            let index = stores[store].1.add(&t.name, t.ggml_type.id, &ne)?;
            ids.insert(t.name.clone(), WeightId { store, index });
        }
        for (dev, store) in &mut stores {
            store.allocate(dev, true)?;
        }
        let weights = Weights { stores, ids };
        let mut staging = Vec::new();
        for t in tensors {
            let tensor = weights.get(weights.ids[&t.name]);
            if tensor.nbytes() as u64 != t.nbytes {
                return Err(Error::internal(format!(
                    "tensor '{}': ggml sizes it {} bytes, the file {}",
                    t.name,
                    tensor.nbytes(),
                    t.nbytes
                )));
            }
            staging.resize(t.nbytes as usize, 0u8);
            file.read_exact_at(&mut staging, data_offset + t.offset).map_err(|e| {
                Error::io(format!("cannot read tensor '{}' of the drafter (was the file changed?): {e}", t.name))
            })?;
            tensor.write(0, &staging)?;
        }
        Ok(weights)
    }

    pub fn id(&self, name: &str) -> Option<WeightId> {
        self.ids.get(name).copied()
    }

    pub fn get(&self, id: WeightId) -> Tensor<'_> {
        self.stores[id.store].1.get(id.index)
    }

    /// Bytes of weights on `dev`.
    pub fn bytes_on(&self, dev: ggml_backend_dev_t) -> usize {
        self.stores.iter().filter(|(d, _)| d.dev == dev).map(|(_, s)| s.allocated_bytes()).sum()
    }

    /// Bytes of weights on every device.
    pub fn bytes(&self) -> usize {
        self.stores.iter().map(|(_, s)| s.allocated_bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_go_to_their_slots() {
        assert_eq!(slot_of("token_embd.weight"), Slot::Input);
        assert_eq!(slot_of("fc.weight"), Slot::Fusion);
        assert_eq!(slot_of("fc.scale"), Slot::Fusion);
        assert_eq!(slot_of("enc.output_norm.weight"), Slot::Fusion);
        assert_eq!(slot_of("blk.0.attn_q.weight"), Slot::Layer(0));
        assert_eq!(slot_of("blk.12.ffn_conv_base"), Slot::Layer(12));
        assert_eq!(slot_of("output.weight"), Slot::Output);
        assert_eq!(slot_of("selector_hidden.weight"), Slot::Output);
        assert_eq!(slot_of("d2t"), Slot::Output);
    }

    #[test]
    fn matrices_are_floats_or_quantized() {
        for ty in [GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, 2, 8, 12] {
            assert!(is_matrix_type(ty), "{ty}");
        }
        // i8, i16, i32, i64, f64
        for ty in [24, 25, 26, 27, 28] {
            assert!(!is_matrix_type(ty), "{ty}");
        }
    }

    #[test]
    fn elementwise_weights_must_be_f32() {
        for name in ["blk.0.attn_norm.weight", "blk.1.ffn_conv_base", "fc.scale", "rope_freqs.weight"] {
            assert!(must_be_f32(name), "{name}");
        }
        for name in ["blk.0.attn_q.weight", "blk.0.attn_conv_proj.weight", "output.weight", "d2t"] {
            assert!(!must_be_f32(name), "{name}");
        }
    }
}
