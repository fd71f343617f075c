//! The draft KV cache: per layer one K and one V tensor of
//! [n_embd_kv, n_cells, n_stream], one stream per sequence, and which cells
//! hold a row.
//!
//! Cell `p` of a stream holds the sequence's draft position `p`: draft
//! positions are dense (`crate::positions`), so a sequence's rows fill cells
//! 0.. in order and attention reads them in position order, as libllama's
//! cache does when it fills cells in order. A noise block is written at the
//! cells after its sequence's rows for one decode and never marked used.

use crate::error::Result;
use crate::sys::ggml::{Tensor, TensorStore, row_size};
use crate::sys::{Device, ggml_backend_dev_t, ggml_type};

/// One layer's K and V tensors.
#[derive(Clone, Copy, Debug)]
struct LayerKv {
    store: usize,
    k: usize,
    v: usize,
}

/// Which cells of one stream hold rows, as a bitset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Cells {
    bits: Vec<u64>,
    /// One past the highest used cell (0: empty).
    end: usize,
}

impl Cells {
    fn new(n: usize) -> Cells {
        Cells { bits: vec![0; n.div_ceil(64)], end: 0 }
    }

    fn get(&self, c: usize) -> bool {
        self.bits.get(c / 64).is_some_and(|w| w >> (c % 64) & 1 == 1)
    }

    fn set_range(&mut self, c0: usize, c1: usize, used: bool) {
        for c in c0..c1 {
            let (w, b) = (c / 64, c % 64);
            if used {
                self.bits[w] |= 1 << b;
            } else {
                self.bits[w] &= !(1 << b);
            }
        }
        self.end = if used { self.end.max(c1) } else { self.last_used_below(self.end).map_or(0, |c| c + 1) };
    }

    fn last_used_below(&self, end: usize) -> Option<usize> {
        (0..end).rev().find(|&c| self.get(c))
    }

    fn first_used(&self) -> Option<usize> {
        (0..self.end).find(|&c| self.get(c))
    }

    fn used(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.end).filter(|&c| self.get(c))
    }
}

/// The draft KV cache.
pub struct KvCache {
    stores: Vec<(Device, TensorStore)>,
    layers: Vec<LayerKv>,
    pub n_cells: usize,
    pub n_stream: usize,
    pub n_embd_kv: i64,
    cells: Vec<Cells>,
}

impl KvCache {
    /// A cache of `n_cells` per stream for `n_layer` layers, layer `il` on
    /// `device_of(il)`.
    pub fn new(
        n_layer: usize,
        n_embd_kv: i64,
        n_cells: usize,
        n_stream: usize,
        types: (ggml_type, ggml_type),
        device_of: impl Fn(usize) -> Device,
    ) -> Result<KvCache> {
        let mut stores: Vec<(Device, TensorStore)> = Vec::new();
        let mut layers = Vec::with_capacity(n_layer);
        for il in 0..n_layer {
            let dev = device_of(il);
            let store = match stores.iter().position(|(d, _)| d.dev == dev.dev) {
                Some(i) => i,
                None => {
                    stores.push((dev, TensorStore::new(2 * n_layer)?));
                    stores.len() - 1
                }
            };
            let shape = [n_embd_kv, n_cells as i64, n_stream as i64];
            let k = stores[store].1.add(&format!("cache_k_l{il}"), types.0, &shape)?;
            let v = stores[store].1.add(&format!("cache_v_l{il}"), types.1, &shape)?;
            layers.push(LayerKv { store, k, v });
        }
        for (dev, store) in &mut stores {
            store.allocate(dev, false)?;
            // unused cells are masked, but never NaN: a masked NaN still poisons some kernels
            store.clear(0);
        }
        Ok(KvCache { stores, layers, n_cells, n_stream, n_embd_kv, cells: vec![Cells::new(n_cells); n_stream] })
    }

    pub fn k(&self, il: usize) -> Tensor<'_> {
        let l = self.layers[il];
        self.stores[l.store].1.get(l.k)
    }

    pub fn v(&self, il: usize) -> Tensor<'_> {
        let l = self.layers[il];
        self.stores[l.store].1.get(l.v)
    }

    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Bytes of the cache on `dev` (None: on every device).
    pub fn bytes_on(&self, dev: Option<ggml_backend_dev_t>) -> usize {
        self.stores.iter().filter(|(d, _)| dev.is_none_or(|x| x == d.dev)).map(|(_, s)| s.allocated_bytes()).sum()
    }

    pub fn is_used(&self, stream: usize, cell: usize) -> bool {
        self.cells[stream].get(cell)
    }

    /// One past the highest used cell of a stream.
    pub fn end(&self, stream: usize) -> usize {
        self.cells[stream].end
    }

    pub fn pos_min(&self, stream: usize) -> i32 {
        self.cells[stream].first_used().map_or(-1, |c| c as i32)
    }

    pub fn pos_max(&self, stream: usize) -> i32 {
        self.cells[stream].end as i32 - 1
    }

    /// Marks cells [c0, c1) used (rows written there).
    pub fn mark_used(&mut self, stream: usize, c0: usize, c1: usize) {
        self.cells[stream].set_range(c0, c1.min(self.n_cells), true);
    }

    /// Forgets the rows at positions [p0, p1) (llama's bounds: p0 < 0 is 0,
    /// p1 < 0 no end).
    pub fn remove(&mut self, stream: usize, p0: i32, p1: i32) {
        let end = self.cells[stream].end;
        let c0 = p0.max(0) as usize;
        let c1 = if p1 < 0 { end } else { (p1 as usize).min(end) };
        if c0 < c1 {
            self.cells[stream].set_range(c0, c1, false);
        }
    }

    /// The used cells of a stream, in position order.
    pub fn used_cells(&self, stream: usize) -> Vec<usize> {
        self.cells[stream].used().collect()
    }

    /// Marks exactly `cells` used in a stream (a state load, a copy).
    pub fn set_used(&mut self, stream: usize, cells: &[usize]) {
        let mut fresh = Cells::new(self.n_cells);
        for &c in cells {
            fresh.set_range(c, c + 1, true);
        }
        self.cells[stream] = fresh;
    }

    /// Forgets every row of every stream (the data stays, masked).
    pub fn clear(&mut self) {
        for c in &mut self.cells {
            *c = Cells::new(self.n_cells);
        }
    }

    /// Bytes of one cell's K row and V row.
    pub fn row_bytes(&self) -> (usize, usize) {
        (row_size(self.k(0).ty(), self.n_embd_kv), row_size(self.v(0).ty(), self.n_embd_kv))
    }

    /// Byte offset of a cell's row in a layer tensor of `row` bytes per cell.
    pub fn offset(&self, row: usize, stream: usize, cell: usize) -> usize {
        row * (stream * self.n_cells + cell)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_track_their_end_through_removals() {
        let mut c = Cells::new(200);
        c.set_range(0, 70, true);
        assert_eq!((c.end, c.first_used()), (70, Some(0)));
        c.set_range(60, 70, false);
        assert_eq!(c.end, 60);
        c.set_range(0, 10, false);
        assert_eq!((c.end, c.first_used()), (60, Some(10)));
        assert_eq!(c.used().count(), 50);
        c.set_range(10, 60, false);
        assert_eq!((c.end, c.first_used()), (0, None));
    }
}
