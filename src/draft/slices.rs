//! The top-k of a head split by tensor where ggml's is not the one to use:
//! a slice in host memory takes the library's own (`crate::topk`, on its
//! logits in place) and, with the `cuda` feature, a slice on a CUDA device
//! takes the kernel of `cuda/` on ggml's buffer. Their candidates and those
//! of the slices ggml ranks in the graph are merged on the host under the
//! library's order; the selection graph then scores them (`graph::select_lattice`).

use super::io;
use crate::error::{Error, Result};
use crate::log;
use crate::sys::ggml::{GraphCtx, Tensor};
use crate::topk::{self, Scored};

/// Who takes a slice's top-k.
pub enum SliceTopK {
    /// ggml's top-k, in the graph, on the slice's device.
    Graph,
    /// The library's, on the host: the slice's logits are in host memory.
    Host,
    /// The CUDA kernel on the slice's device (its ordinal).
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::TopK),
}

impl SliceTopK {
    pub fn outside(&self) -> bool {
        !matches!(self, SliceTopK::Graph)
    }

    fn name(&self) -> &'static str {
        match self {
            SliceTopK::Graph => "ggml",
            SliceTopK::Host => "the library's (host)",
            #[cfg(feature = "cuda")]
            SliceTopK::Cuda(_) => "the CUDA kernel",
        }
    }
}

/// The top-k of each slice of a split head (weights as read in place; an
/// unsplit head: none). Slices in host memory take the library's top-k; with
/// the `cuda` feature, slices on a CUDA device whose kernel loads take it.
pub fn choose(weights: &[Tensor<'_>]) -> Vec<SliceTopK> {
    if weights.len() < 2 {
        return Vec::new();
    }
    let kinds: Vec<SliceTopK> =
        weights.iter().map(|w| if w.in_host_memory() { SliceTopK::Host } else { on_device(w) }).collect();
    if kinds.iter().any(SliceTopK::outside) {
        let names: Vec<&str> = kinds.iter().map(SliceTopK::name).collect();
        log::info(&format!("head slices' top-k: {}; merged on the host", names.join(", ")));
    }
    kinds
}

#[cfg(feature = "cuda")]
fn on_device(w: &Tensor<'_>) -> SliceTopK {
    let Some(dev) = w.device() else { return SliceTopK::Graph };
    let Some(ordinal) = dev.name.strip_prefix("CUDA").and_then(|n| n.parse::<usize>().ok()) else {
        return SliceTopK::Graph;
    };
    match crate::cuda::TopK::new(ordinal) {
        Ok(kernel) => SliceTopK::Cuda(kernel),
        Err(e) => {
            log::warn(&format!("the CUDA top-k kernel is not used on {}: {}", dev.name, e.message));
            SliceTopK::Graph
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn on_device(_: &Tensor<'_>) -> SliceTopK {
    SliceTopK::Graph
}

/// Each of the `n` rows' merged top `k` (ids and logits, best first, k
/// each) from a computed noise graph whose slices `kinds` left their
/// logits or top-k as outputs (`graph::noise`); `firsts`: each slice's
/// first token id.
pub fn merge(g: &GraphCtx, kinds: &[SliceTopK], firsts: &[i64], k: usize, n: usize) -> Result<(Vec<i32>, Vec<f32>)> {
    let find = |name: &str| g.tensor(name).ok_or_else(|| Error::internal(format!("the noise graph has no '{name}'")));
    let mut parts: Vec<Vec<Vec<Scored>>> = Vec::with_capacity(kinds.len());
    for (j, (kind, &first)) in kinds.iter().zip(firsts).enumerate() {
        let first = first as i32;
        let rows: Vec<Vec<Scored>> = match kind {
            SliceTopK::Graph => match g.tensor(&io::head_part_ids(j)) {
                None => vec![Vec::new(); n], // a slice of no rows
                Some(ids_t) => {
                    let k_slice = ids_t.ne()[0] as usize;
                    let mut ids = vec![0i32; k_slice * n];
                    let mut vals = vec![0f32; k_slice * n];
                    ids_t.read(0, &mut ids)?;
                    find(&io::head_part_logits(j))?.read(0, &mut vals)?;
                    (0..n)
                        .map(|r| (0..k_slice).map(|i| (first + ids[r * k_slice + i], vals[r * k_slice + i])).collect())
                        .collect()
                }
            },
            SliceTopK::Host => {
                let logits = find(&io::head_logits(j))?;
                let width = logits.ne()[0] as usize;
                let mut all = vec![0f32; width * n];
                logits.read(0, &mut all)?;
                all.chunks(width.max(1)).take(n).map(|row| topk::top_k(row, k, first)).collect()
            }
            #[cfg(feature = "cuda")]
            SliceTopK::Cuda(kernel) => {
                let (ids, vals) = kernel.run_on_output(find(&io::head_logits(j))?, n, k, first)?;
                (0..n)
                    .map(|r| {
                        (0..k).filter(|&i| ids[r * k + i] >= 0).map(|i| (ids[r * k + i], vals[r * k + i])).collect()
                    })
                    .collect()
            }
        };
        parts.push(rows);
    }
    let mut ids = Vec::with_capacity(k * n);
    let mut vals = Vec::with_capacity(k * n);
    for r in 0..n {
        let row: Vec<Vec<Scored>> = parts.iter().map(|p| p[r].clone()).collect();
        let merged = topk::merge(&row, k);
        if merged.len() < k {
            return Err(Error::internal(format!(
                "{} candidates for a row of a head of more than {k} tokens",
                merged.len()
            )));
        }
        ids.extend(merged.iter().map(|c| c.0));
        vals.extend(merged.iter().map(|c| c.1));
    }
    Ok((ids, vals))
}
