//! The host's memory operations on the target, mirrored: seq_rm, seq_cp,
//! seq_shift, seq_clear, in target positions, applied to the draft KV in
//! dense draft positions.

use super::Engine;
use crate::error::{Error, Result};
use crate::positions::{KvEdit, MAX_TARGET_POS, TargetRange};

impl Engine {
    /// The sequences a memory call addresses: one, or all for seq < 0.
    fn seq_targets(&self, seq: i32) -> Result<std::ops::Range<usize>> {
        if seq < 0 {
            Ok(0..self.seqs.len())
        } else {
            let s = self.seq_index(seq)?;
            Ok(s..s + 1)
        }
    }

    fn apply(&mut self, seq: usize, edits: &[KvEdit]) -> Result<()> {
        for e in edits {
            match *e {
                KvEdit::Remove { p0, p1 } => {
                    if !self.drafter.model.seq_rm(seq as i32, p0, p1) {
                        return Err(Error::backend(format!(
                            "the draft KV refused to remove [{p0}, {p1}) of sequence {seq}"
                        )));
                    }
                }
                KvEdit::Shift { p0, p1, delta } => self.drafter.model.seq_add(seq as i32, p0, p1, delta)?,
            }
        }
        Ok(())
    }

    pub(super) fn remove_range(&mut self, s: usize, range: TargetRange) -> Result<()> {
        let edits = self.seqs[s].remove(range, self.drafter.can_shift);
        self.apply(s, &edits)
    }

    /// Removes the rows at target positions [p0, p1) (llama's conventions for
    /// negative bounds; seq < 0: every sequence). Removing every position from
    /// an outstanding draft's anchor on cancels that draft.
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> Result<()> {
        if p1 >= 0 && p0 > p1 {
            return Err(Error::invalid(format!("seq_rm range [{p0}, {p1}) is reversed")));
        }
        // whether each sequence loses committed rows (not only a rejected
        // draft's): what the trees' parked cells follow (none without trees)
        let cuts_history: Vec<bool> = if self.tree_kv.is_none() {
            Vec::new()
        } else {
            self.seq_targets(seq)?
                .map(|s| self.seqs[s].last_target_pos().is_some_and(|last| p0 <= last) || (p0 < 0 && p1 < 0))
                .collect()
        };
        for s in self.seq_targets(seq)? {
            self.remove_range(s, TargetRange::new(p0, p1))?;
        }
        self.tree_kv_seq_rm(seq, p0, p1, &cuts_history)
    }

    /// Forgets a sequence (seq < 0: every sequence), outstanding draft included.
    pub fn seq_clear(&mut self, seq: i32) -> Result<()> {
        self.seq_rm(seq, -1, -1)
    }

    /// The target moved positions [p0, p1) by `delta` (context shift, cache
    /// reuse). Draft positions stay dense; only the map changes. As in
    /// libllama, rows moved below position 0 are removed; a shift that would
    /// move a row to MAX_TARGET_POS or beyond is refused before anything changes.
    pub fn seq_shift(&mut self, seq: i32, p0: i32, p1: i32, delta: i32) -> Result<()> {
        if p1 >= 0 && p0 > p1 {
            return Err(Error::invalid(format!("seq_shift range [{p0}, {p1}) is reversed")));
        }
        let range = TargetRange::new(p0, p1);
        let targets = self.seq_targets(seq)?;
        if delta > 0 {
            for s in targets.clone() {
                if let Some(top) = self.seqs[s].last_target_in(range) {
                    if top as i64 + delta as i64 >= MAX_TARGET_POS as i64 {
                        return Err(Error::invalid(format!(
                            "seq_shift by {delta} moves sequence {s}'s row at {top} past position {MAX_TARGET_POS}"
                        )));
                    }
                }
            }
        }
        for s in targets {
            if delta < 0 {
                // the rows that would land below 0
                let below = TargetRange::new(range.p0, range.p1.min(delta.saturating_neg()));
                if below.p0 < below.p1 {
                    self.remove_range(s, below)?;
                }
            }
            self.seqs[s].shift_target(range, delta);
        }
        self.tree_kv_seq_add(seq, p0, p1, delta);
        Ok(())
    }

    /// Makes `dst` a copy of the rows of `src` at target positions [p0, p1);
    /// whatever `dst` held is replaced.
    pub fn seq_cp(&mut self, src: i32, dst: i32, p0: i32, p1: i32) -> Result<()> {
        let (s, d) = (self.seq_index(src)?, self.seq_index(dst)?);
        if s == d {
            return Ok(());
        }
        if !self.seqs[s].held.is_empty() {
            return Err(Error::invalid_state(format!("seq_cp from sequence {src}, whose verify rows await accept()")));
        }
        self.remove_range(d, TargetRange::all())?;
        if !self.seqs[s].map.in_kv().is_empty() {
            self.drafter.model.seq_cp_all(src, dst)?;
        }
        let (map, queued, history) =
            (self.seqs[s].map.clone(), self.seqs[s].queued.clone(), self.seqs[s].history.clone());
        self.seqs[d].map = map;
        self.seqs[d].queued = queued;
        self.seqs[d].history = history;
        if p0 > 0 {
            self.remove_range(d, TargetRange::new(0, p0))?;
        }
        if p1 >= 0 {
            self.remove_range(d, TargetRange::new(p1, -1))?;
        }
        Ok(())
    }
}
