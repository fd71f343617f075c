//! The target's KV bookkeeping of tree verification, kept by the engine for
//! its sequences so that every host verifies trees one way: the sequence ids
//! of each sequence's paths and its park id, the prefix tagged onto the path
//! ids before the verify decode, the accepted path committed after it, and
//! the step's other cells parked (never freed while the sequence lives, so
//! that later rows never reuse a cell between kept ones: ggml's CPU attention
//! accumulates in cell order, and target-only decoding's order is kept).
//!
//! Sequence ids of a context serving S sequences with trees of at most L
//! leaves (`seq_ids`): sequence k's own id k serves its first path; ids
//! S + k (L - 1) .. S + (k + 1) (L - 1) its other paths; S L + k its park id.

use super::Engine;
use crate::error::{Error, Result};
use crate::sys::TargetContext;
use crate::tree::{KvOp, Tree, VerifyRow};

/// The sequence ids a target context needs for `n_seq` sequences verifying
/// trees of at most `n_leaves` leaves.
pub fn seq_ids(n_seq: usize, n_leaves: usize) -> usize {
    n_seq * (n_leaves + 1)
}

/// llama pads the cells a batch attends to to a multiple of this (flash
/// attention); ggml's CPU flash attention splits a one-row ubatch's cells
/// across its threads from `SPLIT_KV_CELLS` on (f16/f32 caches) and sums the
/// parts, which rounds by where each cell lies; ubatches of two rows or more
/// are summed in one pass, in cell order.
const KV_PAD: usize = 256;
const SPLIT_KV_CELLS: usize = 512;

fn cells_attended(cells: usize) -> usize {
    cells.div_ceil(KV_PAD).max(1) * KV_PAD
}

/// One sequence's tree in flight and its parked cells.
#[derive(Clone, Debug, Default)]
struct SlotKv {
    /// the anchor's position and the tree while its rows are out (tagged,
    /// not committed)
    in_flight: Option<(i32, Tree)>,
    /// positions of the cells only the park id holds
    parked: Vec<i32>,
}

#[derive(Clone, Debug)]
pub struct TreeKv {
    n_leaves: usize,
    slots: Vec<SlotKv>,
    /// whether parked cells were freed since the sequences were last emptied
    /// (cells are then reused out of position order)
    unparked: bool,
    /// the target's attention runs on the CPU, where ggml splits a one-row
    /// ubatch's cells (read once: the placement does not change)
    cpu_attention: bool,
}

impl TreeKv {
    fn pool(&self, k: usize) -> Vec<i32> {
        let (s, l) = (self.slots.len(), self.n_leaves);
        std::iter::once(k as i32).chain((1..l).map(|j| (s + k * (l - 1) + (j - 1)) as i32)).collect()
    }

    fn park(&self, k: usize) -> i32 {
        (self.slots.len() * self.n_leaves + k) as i32
    }

    fn n_parked(&self) -> usize {
        self.slots.iter().map(|s| s.parked.len()).sum()
    }

    /// Cells in use on the target: each sequence's span (shared prompt cells
    /// counted for each) and the parked ones.
    fn cells_in_use(&self, target: &TargetContext) -> usize {
        let span = |k: i32| {
            let (p0, p1) = (target.memory_seq_pos_min(k), target.memory_seq_pos_max(k));
            if p0 >= 0 && p1 >= p0 { (p1 - p0 + 1) as usize } else { 0 }
        };
        (0..self.slots.len() as i32).map(span).sum::<usize>() + self.n_parked()
    }
}

fn no_bookkeeping() -> Error {
    Error::invalid_state("the engine keeps no tree KV bookkeeping: call llama_spec_dflash2_tree_kv_init first")
}

fn apply(target: &TargetContext, ops: &[KvOp]) -> Result<()> {
    for op in ops {
        let ok = match *op {
            KvOp::SeqCp { src, dst, p0, p1 } => {
                target.memory_seq_cp(src, dst, p0, p1);
                true
            }
            KvOp::SeqRm { seq, p0, p1 } => target.memory_seq_rm(seq, p0, p1),
        };
        if !ok {
            return Err(Error::backend(format!("the target's memory refused {op:?}")));
        }
    }
    Ok(())
}

impl Engine {
    /// Takes over the target's KV bookkeeping of trees of at most `n_leaves`
    /// leaves for every sequence of the engine. The target context must be
    /// unified, pure attention, and hold `seq_ids(n_seq, n_leaves)` sequence ids.
    pub fn tree_kv_init(&mut self, n_leaves: usize) -> Result<()> {
        let room = self.target.tree_room();
        let need = seq_ids(self.seqs.len(), n_leaves);
        let why = if n_leaves == 0 {
            Some("trees need at least one leaf".to_string())
        } else if !room.branching {
            Some("the target's memory is recurrent or hybrid and cannot branch".to_string())
        } else if !room.unified {
            Some("the target's KV cache is not unified (llama_context_params.kv_unified)".to_string())
        } else if (room.n_seq_max as usize) < need {
            Some(format!(
                "{} sequence(s) with trees of up to {n_leaves} leaves need n_seq_max >= {need} \
                 (llama_spec_dflash2_tree_kv_seq_ids); the target context has {}",
                self.seqs.len(),
                room.n_seq_max
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::invalid(format!("tree KV bookkeeping: {why}")));
        }
        self.tree_kv = Some(TreeKv {
            n_leaves,
            slots: vec![SlotKv::default(); self.seqs.len()],
            unparked: false,
            cpu_attention: self.target.devices().is_empty(),
        });
        Ok(())
    }

    fn tree_kv_mut(&mut self) -> Result<&mut TreeKv> {
        self.tree_kv.as_mut().ok_or_else(no_bookkeeping)
    }

    fn tree_kv_ref(&self) -> Result<&TreeKv> {
        self.tree_kv.as_ref().ok_or_else(no_bookkeeping)
    }

    /// The verify rows of `seq`'s outstanding tree, its anchor `id_last` at
    /// `n_past`, with the tree's path ids tagged with the sequence's cells on
    /// the target (a tag in a unified cache, not a copy). Add them to the
    /// verify batch in this order, all with logits. `room`: the most rows and
    /// sequence ids (all rows together) the host holds.
    pub fn tree_kv_rows(
        &mut self,
        seq: i32,
        id_last: i32,
        n_past: i32,
        room: (usize, usize),
    ) -> Result<Vec<VerifyRow>> {
        let s = self.seq_index(seq)?;
        self.tree_kv_ref()?; // no bookkeeping is said before no tree
        let tree = self.seqs[s]
            .tree()
            .cloned()
            .ok_or_else(|| Error::invalid_state(format!("sequence {seq} has no tree draft awaiting verification")))?;
        let kv = self.tree_kv_mut()?;
        if kv.slots[s].in_flight.is_some() {
            return Err(Error::invalid_state(format!(
                "sequence {seq}'s tree rows were already handed out: commit its path first"
            )));
        }
        if tree.leaves().len() > kv.n_leaves {
            return Err(Error::invalid(format!(
                "sequence {seq}'s tree has {} leaves; the bookkeeping was set up for {}: draft with max_leaves <= {}",
                tree.leaves().len(),
                kv.n_leaves,
                kv.n_leaves
            )));
        }
        let pool = kv.pool(s);
        let rows = tree.verify_rows(id_last, n_past, seq, &pool)?;
        let n_ids: usize = rows.iter().map(|r| r.seq_ids.len()).sum();
        if rows.len() > room.0 || n_ids > room.1 {
            return Err(Error::buffer_too_small(format!(
                "sequence {seq}'s tree has {} verify rows with {n_ids} sequence ids; the host holds {} and {}",
                rows.len(),
                room.0,
                room.1
            )));
        }
        let ops = tree.kv_prepare(seq, &pool)?;
        kv.slots[s].in_flight = Some((n_past, tree));
        apply(&self.target, &ops)?;
        Ok(rows)
    }

    /// After `seq`'s tree was verified and `path` accepted (node indices from
    /// depth 1 down; accept_tree or a verify call did the engine's part): the
    /// step's cells parked, the sequence keeping its prefix, the anchor and the
    /// path, its other path ids emptied.
    pub fn tree_kv_commit(&mut self, seq: i32, path: &[usize]) -> Result<()> {
        let s = self.seq_index(seq)?;
        let kv = self.tree_kv_mut()?;
        let Some((n_past, tree)) = kv.slots[s].in_flight.as_ref() else {
            return Err(Error::invalid_state(format!("sequence {seq} has no tree rows out to commit")));
        };
        let (pool, park, n_past) = (kv.pool(s), kv.park(s), *n_past);
        // every cell of the step parked first, then the path kept in seq
        let n_leaves = tree.leaves().len().max(1);
        let mut ops: Vec<KvOp> =
            pool[..n_leaves].iter().map(|&id| KvOp::SeqCp { src: id, dst: park, p0: n_past, p1: -1 }).collect();
        ops.extend(tree.kv_commit(path, n_past, seq, &pool)?);
        let parked: Vec<i32> =
            (0..tree.len()).filter(|i| !path.contains(i)).map(|i| n_past + tree.nodes()[i].depth as i32).collect();
        kv.slots[s].parked.extend(parked);
        kv.slots[s].in_flight = None;
        apply(&self.target, &ops)
    }

    /// A row more for a target decode of `n_rows` rows (its batch holds
    /// `n_rows_max`; `seq_last` is its last row's sequence id) whose last
    /// ubatch would hold one row over 512 or more cells (parked ones of earlier
    /// trees, other sequences' in a unified cache) where ggml's CPU attention
    /// would split them across threads while target-only decoding, whose
    /// sequence holds fewer cells, sums them in one pass. The
    /// row goes to the last row's sequence's park id, right after its parked
    /// cells (the batch's rows of a sequence id must follow the cells it
    /// holds), logits off: its cell is parked as it is decoded and no query
    /// reads it. None where no such row is needed or none fits.
    pub fn tree_kv_pad(&mut self, n_rows: usize, n_rows_max: usize, seq_last: i32) -> Result<Option<VerifyRow>> {
        let kv = self.tree_kv_ref()?;
        if n_rows == 0 {
            return Err(Error::invalid("a pad row for an empty batch: add the step's rows first"));
        }
        let owner = self.tree_kv_owner(seq_last)?;
        let last = self.seq_index(owner)?;
        let n_ubatch = self.target.n_ubatch() as usize;
        // a CPU target's attention: the kernels of other backends do not split a
        // one-row ubatch's cells this way
        let one_row = kv.cpu_attention && n_ubatch > 1 && n_rows % n_ubatch == 1;
        if !one_row || n_rows + 1 > n_rows_max || kv.unparked {
            return Ok(None);
        }
        let cells = kv.cells_in_use(&self.target) + n_rows;
        // the last row's sequence alone, as target-only decoding holds it: its
        // committed cells and the row
        let next = self.target.memory_seq_pos_max(owner) + 1;
        if cells_attended(cells) < SPLIT_KV_CELLS || cells_attended((next + 1).max(1) as usize) >= SPLIT_KV_CELLS {
            return Ok(None);
        }
        let park = kv.park(last);
        let pos = match self.target.memory_seq_pos_max(park) {
            p if p >= 0 => p + 1,
            _ => next,
        };
        let token = self.seqs[last].history.anchor().unwrap_or(0);
        self.tree_kv_mut()?.slots[last].parked.push(pos);
        Ok(Some(VerifyRow { token, pos, seq_ids: vec![park] }))
    }

    /// Frees every parked cell (the target's cache is short of cells); cells
    /// are reused out of position order from then on.
    pub fn tree_kv_unpark(&mut self) -> Result<()> {
        let kv = self.tree_kv_mut()?;
        let ops: Vec<KvOp> = (0..kv.slots.len()).map(|k| KvOp::SeqRm { seq: kv.park(k), p0: -1, p1: -1 }).collect();
        for slot in &mut kv.slots {
            slot.parked.clear();
        }
        kv.unparked = true;
        apply(&self.target, &ops)
    }

    /// Cells the engine's sequences hold parked, and whether parked cells
    /// were freed since the sequences were last emptied.
    pub fn tree_kv_parked(&self) -> Result<(usize, bool)> {
        let kv = self.tree_kv_ref()?;
        Ok((kv.n_parked(), kv.unparked))
    }

    /// Whether the target's cache has free cells for `n_trees` trees of
    /// `n_nodes` nodes beyond a tree's rows for every sequence (cells in use:
    /// each sequence's span and the parked ones). When it does not, every
    /// parked cell is freed (`tree_kv_unpark`): a host must not fail for them.
    pub fn tree_kv_room(&mut self, n_trees: usize, n_nodes: usize) -> Result<bool> {
        let kv = self.tree_kv_ref()?;
        let n_slots = kv.slots.len();
        let used = kv.cells_in_use(&self.target);
        let need = (n_trees + 1 + n_slots) * (1 + n_nodes);
        if used + need <= self.target.tree_room().n_ctx as usize {
            return Ok(true);
        }
        self.tree_kv_unpark()?;
        Ok(false)
    }

    /// The engine's sequence that sequence id `id` of the bookkeeping
    /// belongs to (its own id, a path id or its park id); other ids as they are.
    pub fn tree_kv_owner(&self, id: i32) -> Result<i32> {
        let kv = self.tree_kv_ref()?;
        let (n, l) = (kv.slots.len() as i32, kv.n_leaves as i32);
        Ok(match id {
            id if id < n => id,
            id if l > 1 && id < n + n * (l - 1) => (id - n) / (l - 1),
            id if id < n * l + n => id - n * l,
            id => id,
        })
    }

    /// The host removed target positions [p0, p1) of `seq` (< 0: every
    /// sequence): a tree in flight whose rows go with them is dropped (its
    /// path ids emptied); where committed history was cut (`cuts_history`,
    /// per sequence), so are the parked cells at those positions (the host's
    /// trim of rejected rows after an accept keeps them).
    pub(super) fn tree_kv_seq_rm(&mut self, seq: i32, p0: i32, p1: i32, cuts_history: &[bool]) -> Result<()> {
        let Some(kv) = self.tree_kv.as_mut() else { return Ok(()) };
        let range = if seq < 0 { 0..kv.slots.len() } else { seq as usize..seq as usize + 1 };
        let (lo, hi) = (p0.max(0), if p1 < 0 { i32::MAX } else { p1 });
        let mut ops = Vec::new();
        for (k, &cut) in range.zip(cuts_history) {
            if kv.slots[k].in_flight.as_ref().is_some_and(|(anchor, _)| lo <= *anchor && hi > *anchor) {
                ops.extend(kv.pool(k).into_iter().skip(1).map(|id| KvOp::SeqRm { seq: id, p0: -1, p1: -1 }));
                kv.slots[k].in_flight = None;
            }
            if cut {
                ops.push(KvOp::SeqRm { seq: kv.park(k), p0, p1 });
                kv.slots[k].parked.retain(|&p| p < lo || p >= hi);
            }
        }
        if seq < 0 && p0 < 0 && p1 < 0 {
            kv.unparked = false;
        }
        apply(&self.target, &ops)
    }

    /// The host moved target positions [p0, p1) of `seq` by `delta`: so move
    /// its parked cells.
    pub(super) fn tree_kv_seq_add(&mut self, seq: i32, p0: i32, p1: i32, delta: i32) {
        let Some(kv) = self.tree_kv.as_mut() else { return };
        let range = if seq < 0 { 0..kv.slots.len() } else { seq as usize..seq as usize + 1 };
        let (lo, hi) = (p0.max(0), if p1 < 0 { i32::MAX } else { p1 });
        for k in range {
            self.target.memory_seq_add(kv.park(k), p0, p1, delta);
            for p in kv.slots[k].parked.iter_mut().filter(|p| **p >= lo && **p < hi) {
                *p += delta;
            }
        }
    }
}
