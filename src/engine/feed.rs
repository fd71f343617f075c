//! Target rows into the engine: process() reads the tap features of the rows
//! the target decoded and commits or holds them, flush() injects committed
//! rows into the draft KV, accept() settles the held verify rows of a draft.

use std::time::Instant;

use super::stats::us_since;
use super::{Engine, Row};
use crate::draft::InjectRow;
use crate::error::{Error, Result};
use crate::positions::MAX_TARGET_POS;

/// Committed rows waiting for injection beyond which process() injects at once.
const FLUSH_ROWS: usize = 64;

impl Engine {
    /// Checks a batch of rows against the arguments' ranges and the call
    /// order, before anything changes; returns whether some sequence that
    /// holds no draft has more than one row in it (a prompt chunk).
    fn check_rows(&self, rows: &[Row]) -> Result<bool> {
        let n_batch = self.target.n_batch() as i32;
        for r in rows {
            self.seq_index(r.seq)?;
            if r.i_batch < 0 || r.i_batch >= n_batch {
                return Err(Error::invalid(format!(
                    "row index {} is outside the target's batch (n_batch {n_batch})",
                    r.i_batch
                )));
            }
            if !(0..MAX_TARGET_POS).contains(&r.pos) {
                return Err(Error::invalid(format!(
                    "row {} has position {} (positions lie in [0, {MAX_TARGET_POS}))",
                    r.i_batch, r.pos
                )));
            }
        }
        // per sequence: rows in this call, and the newest position seen
        let mut seen: Vec<(usize, Option<i32>)> = self.seqs.iter().map(|q| (0, q.last_seen_pos())).collect();
        for r in rows {
            let (n, last) = &mut seen[r.seq as usize];
            if let Some(last) = *last {
                // a tree's verify rows share positions (siblings): check_tree_rows
                if r.pos < last && !self.seqs[r.seq as usize].holds_tree() {
                    return Err(Error::invalid_state(format!(
                        "sequence {}: a row at position {} after one at {last}: positions went back without \
                         llama_spec_dflash2_seq_rm(); after verifying a draft call llama_spec_dflash2_accept(), \
                         and mirror every rollback of the target's memory",
                        r.seq, r.pos
                    )));
                }
            }
            *last = Some(r.pos);
            *n += 1;
        }
        self.check_tree_rows(rows)?;
        let mut chunk = false;
        for (s, q) in self.seqs.iter().enumerate() {
            let incoming = seen[s].0;
            if incoming > 0 && q.holds_rows() && q.held.len() + incoming > q.verify_rows() {
                let n = q.verify_rows() - 1;
                return Err(Error::invalid_state(format!(
                    "sequence {s} has a draft of {n} tokens awaiting accept() and {} of its {} verify rows were \
                     received already; {incoming} more came: call llama_spec_dflash2_accept() after verifying, \
                     before decoding more rows of the sequence",
                    q.held.len(),
                    n + 1
                )));
            }
            chunk |= incoming > 1 && !q.holds_rows();
        }
        Ok(chunk)
    }

    /// Reads the tap features of the rows the target just decoded. Rows of a
    /// sequence with an outstanding draft are held until accept(); the others
    /// are committed: injected before the call returns when they are a prompt
    /// chunk or 64 or more rows wait, else by the next draft (one decode for
    /// all sequences).
    pub fn process(&mut self, rows: &[Row]) -> Result<()> {
        let chunk = self.check_rows(rows)?;
        if rows.is_empty() {
            return Ok(());
        }
        if let Some(policy) = self.controller.policy.as_mut() {
            policy.verify_seen(Instant::now(), rows.len());
        }
        if !self.link.decoded {
            // libllama aborts on reading captured rows before any decode
            if self.target.decode_marker() == self.link.decode_marker_at_init {
                return Err(Error::invalid_state(
                    "process() before the target decoded anything since the engine was created",
                ));
            }
            self.link.decoded = true;
        }

        let t = Instant::now();
        let n_embd = self.link.n_embd;
        let mut layers = Vec::with_capacity(self.link.taps.len());
        for &lid in &self.link.taps {
            let layer = self.target.layer_input(lid).ok_or_else(|| {
                Error::backend(format!("the target has no captured input of layer {lid}; was this context decoded?"))
            })?;
            layers.push(layer);
        }
        for r in rows {
            if r.embd && self.link.skip_image_rows {
                self.stats.n_skipped_rows += 1;
                continue;
            }
            self.link.scratch.clear();
            let at = r.i_batch as usize * n_embd;
            for layer in &layers {
                self.link.scratch.extend_from_slice(&layer[at..at + n_embd]);
            }
            self.seqs[r.seq as usize].take_row(r.pos, &self.link.scratch, r.token);
        }
        self.stats.t_process_us += us_since(t);
        // prompt chunks (a sequence committing rows by the batch) go in as they
        // come: the first draft then injects only what its steps gained, and
        // the controller has timed an injection before it; a decode step's row
        // per sequence waits for the next draft, which injects every
        // sequence's rows in one decode, or for 64 to wait
        let queued: usize = self.seqs.iter().map(|q| q.queued.len()).sum();
        if chunk || queued >= FLUSH_ROWS { self.flush() } else { Ok(()) }
    }

    /// Injects every queued row of every sequence into the draft KV.
    pub(super) fn flush(&mut self) -> Result<()> {
        let n_ubatch = self.drafter.model.n_ubatch() as usize;
        loop {
            let mut rows = Vec::new();
            let mut plan = Vec::new();
            let mut room = n_ubatch;
            for (s, seq) in self.seqs.iter().enumerate() {
                let n = seq.queued.len().min(room);
                if n == 0 {
                    continue;
                }
                for (i, pos) in seq.map.pending_draft_positions(n).enumerate() {
                    rows.push(InjectRow { stream: s, pos, features: seq.queued.row(i) });
                }
                plan.push((s, n));
                room -= n;
            }
            if plan.is_empty() {
                return Ok(());
            }
            let t = Instant::now();
            self.drafter.model.inject(&rows)?;
            let us = us_since(t);
            self.stats.t_inject_us += us;
            if let Some(policy) = self.controller.policy.as_mut() {
                policy.inject_seen(rows.len(), us as f64 * 1e-6);
            }
            self.stats.n_inject_decodes += 1;
            for (s, n) in plan {
                self.seqs[s].injected(n);
                self.stats.n_injected += n as u64;
            }
        }
    }

    /// The host verified the last draft of `seq` and kept its first `n_accepted`
    /// tokens: the anchor row and those tokens' rows are committed, the rest of
    /// the verify rows are dropped before reaching the draft KV.
    pub fn accept(&mut self, seq: i32, n_accepted: i32) -> Result<()> {
        let s = self.seq_index(seq)?;
        let q = &mut self.seqs[s];
        let Some(o) = q.outstanding.as_ref() else {
            return Err(Error::invalid_state(format!("accept() on sequence {seq}, which has no draft to accept")));
        };
        if o.tree.is_some() {
            return Err(Error::invalid_state(format!(
                "sequence {seq}'s draft is a tree: call llama_spec_dflash2_accept_tree()"
            )));
        }
        let n_drafted = o.tokens.len();
        if n_accepted < 0 || n_accepted as usize > n_drafted {
            return Err(Error::invalid(format!("accept({seq}, {n_accepted}): the draft has {n_drafted} tokens")));
        }
        let n_accepted = n_accepted as usize;
        if let Some(sd) = o.sampled.as_ref() {
            sd.check_accept(seq, n_accepted)?;
        }
        let n_rows = if n_drafted > 0 { n_accepted + 1 } else { 0 };
        if q.held.len() < n_rows {
            return Err(Error::invalid_state(format!(
                "accept({seq}, {n_accepted}) needs {n_rows} verify rows, but process() received {} since the draft",
                q.held.len()
            )));
        }
        if let Some(policy) = self.controller.policy.as_mut() {
            policy.accepted(&o.confidences, n_accepted);
        }
        let dropped = q.resolve_held(n_rows);
        self.stats.n_rejected_rows += dropped as u64;
        self.stats.record_accept(n_drafted, n_accepted);
        Ok(())
    }
}
