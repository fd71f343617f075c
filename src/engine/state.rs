//! Saving and restoring one sequence: its position map, queued rows and draft
//! KV cells in a state blob (`state_blob` holds the format).

use super::{Engine, Sequence, state_blob};
use crate::error::{Error, Result};
use crate::positions::TargetRange;

impl Engine {
    fn check_saveable(&self, s: usize) -> Result<()> {
        if !self.seqs[s].held.is_empty() {
            return Err(Error::invalid_state(format!(
                "sequence {s} has verify rows awaiting accept(); save its state after accept()"
            )));
        }
        Ok(())
    }

    /// Bytes `state_get` writes for `seq`. Injects waiting rows first: KV cells
    /// are far smaller than the raw tap features of queued rows.
    pub fn state_size(&mut self, seq: i32) -> Result<usize> {
        let s = self.seq_index(seq)?;
        self.check_saveable(s)?;
        self.flush()?;
        let q = &self.seqs[s];
        Ok(state_blob::header_len(&q.map, &q.queued, &q.history) + self.drafter.model.state_seq_size(seq))
    }

    /// Writes the state of `seq` into `dst`; returns the bytes written.
    pub fn state_get(&mut self, seq: i32, dst: &mut [u8]) -> Result<usize> {
        let size = self.state_size(seq)?;
        if dst.len() < size {
            return Err(Error::buffer_too_small(format!(
                "state of sequence {seq} needs {size} bytes, the buffer has {}",
                dst.len()
            )));
        }
        let q = &self.seqs[seq as usize];
        let h = state_blob::header_len(&q.map, &q.queued, &q.history);
        let kv_len = size - h;
        let n = self.drafter.model.state_seq_get(seq, &mut dst[h..h + kv_len]);
        if n == 0 || n > kv_len {
            return Err(Error::backend(format!("libllama could not save the draft KV of sequence {seq}")));
        }
        let d = &self.drafter;
        let header = state_blob::encode_header(d.model.graph(), d.fingerprint, &q.map, &q.queued, &q.history, n);
        dst[..h].copy_from_slice(&header);
        Ok(h + n)
    }

    /// Removes every cell a refused blob loaded into `seq` (whose map is empty
    /// by now). libllama's seq_rm reaches positions in [0, i32::MAX) only, and
    /// the KV bytes of a forged blob can hold cells at negative positions or at
    /// i32::MAX, which libllama loads as they are: they would stay for good,
    /// attended by every later draft of the sequence and taking a cell each (a
    /// cell at -1 even reads as an empty sequence). So the whole draft cache is
    /// cleared and the other sequences' cells are put back from their saved
    /// state. A sequence that does not load back is left empty, and said so.
    fn drop_loaded_cells(&mut self, seq: i32) -> Result<()> {
        let mut others = Vec::new();
        for (i, q) in self.seqs.iter().enumerate() {
            let other = i as i32;
            if other == seq || q.map.in_kv().is_empty() {
                continue;
            }
            let mut kv = vec![0u8; self.drafter.model.state_seq_size(other)];
            let n = self.drafter.model.state_seq_get(other, &mut kv);
            kv.truncate(n);
            others.push((i, kv));
        }
        self.drafter.model.clear();
        let mut lost = Vec::new();
        for (i, kv) in others {
            if kv.is_empty() || self.drafter.model.state_seq_set(i as i32, &kv) != kv.len() {
                self.drafter.model.seq_rm(i as i32, -1, -1);
                self.seqs[i] = Sequence::new(self.link.n_feat);
                lost.push(i);
            }
        }
        if !lost.is_empty() {
            return Err(Error::backend(format!(
                "a refused state blob for sequence {seq} left cells libllama cannot remove; clearing them lost \
                 sequences {lost:?} (now empty)"
            )));
        }
        Ok(())
    }

    /// Replaces the state of `seq` with a blob from `state_get` (of this or
    /// another engine with the same drafter). On a libllama failure the
    /// sequence is left empty.
    pub fn state_set(&mut self, seq: i32, src: &[u8]) -> Result<()> {
        let s = self.seq_index(seq)?;
        let d = &self.drafter;
        let blob = state_blob::decode(src, d.model.graph(), d.fingerprint, self.link.n_feat, d.can_shift)?;
        let expected_max = blob.map.in_kv().last().map_or(-1, |e| e.draft);
        if expected_max >= self.drafter.model.n_ctx_seq() as i32 {
            return Err(Error::invalid("state blob holds more positions than the draft KV of this engine"));
        }
        self.remove_range(s, TargetRange::all())?;
        if !blob.map.in_kv().is_empty() {
            let n = self.drafter.model.state_seq_set(seq, blob.kv);
            let expected_min = blob.map.in_kv()[0].draft;
            if n == 0
                || self.drafter.model.seq_pos_max(seq) != expected_max
                || self.drafter.model.seq_pos_min(seq) != expected_min
            {
                self.drop_loaded_cells(seq)?;
                return Err(Error::invalid(format!(
                    "the draft KV in the state blob does not load into sequence {seq} (or does not match its map)"
                )));
            }
        }
        let q = &mut self.seqs[s];
        q.map = blob.map;
        q.queued = blob.queued;
        q.history = blob.history;
        Ok(())
    }
}
