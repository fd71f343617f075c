//! The DFlash2 engine: one per target context. It owns the draft model and
//! context, maps every committed target row to a dense draft position, injects
//! the target's tap features into the draft KV, decodes the noise blocks of all
//! drafting sequences together, walks the selector lattice, and keeps the draft
//! KV equal to the accepted prefix of every sequence.

mod sequence;
mod setup;
mod state_blob;
pub mod stats;

use std::path::Path;
use std::time::Instant;

use crate::adaptive::AdaptivePolicy;
use crate::error::{Error, Result, Status};
use crate::log;
use crate::params::{llama_spec_dflash2_params, llama_spec_dflash2_walk};
use crate::positions::{KvEdit, TargetRange};
use crate::selector::{Lattice, Pick, WalkLimits, greedy_walk_scored};
use crate::sys::{Batch, DraftContext, DraftModel, TargetContext, ggml_backend_dev_t};

use sequence::{Outstanding, Sequence};
pub use setup::Limits;
use stats::{llama_spec_dflash2_stats, us_since};

/// A row of the batch the target just decoded.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// Index of the row in the target batch (its captured layer-input row).
    pub i_batch: i32,
    pub seq: i32,
    /// Target position (the first component for M-RoPE).
    pub pos: i32,
    /// Decoded from an embedding (an image or audio row), not a token.
    pub embd: bool,
}

/// One sequence's part of a draft call.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub seq: i32,
    /// The last token the host sampled; the target has not decoded it yet.
    pub id_last: i32,
    pub n_max: i32,
}

/// What the engine holds for one sequence (for hosts and tests to check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqInfo {
    pub n_in_kv: usize,
    pub n_queued: usize,
    pub n_held: usize,
    /// Tokens of the draft awaiting accept(), or None.
    pub outstanding: Option<usize>,
    pub next_draft_pos: i32,
    pub last_target_pos: Option<i32>,
    /// Cells of the sequence in the draft KV, from libllama (-1 when empty).
    pub kv_pos_min: i32,
    pub kv_pos_max: i32,
}

pub struct Engine {
    // drop order: the batch and the context before the model
    batch: Batch,
    ctx: DraftContext,
    _model: DraftModel,
    target: TargetContext,
    taps: Vec<u32>,
    n_embd_tgt: usize,
    n_feat: usize,
    n_embd_draft: usize,
    top_k: usize,
    n_vocab: usize,
    mask_token: i32,
    limits: Limits,
    can_shift: bool,
    skip_image_rows: bool,
    seqs: Vec<Sequence>,
    fingerprint: u64,
    evaluated_at_init: u64,
    target_decoded: bool,
    stats: llama_spec_dflash2_stats,
    scratch: Vec<f32>,
    /// The adaptive walk's model and the timings it learns from.
    policy: Option<AdaptivePolicy>,
    last_draft_start: Option<Instant>,
    last_draft_end: Option<Instant>,
    tokens_since_draft: usize,
}

/// Committed rows waiting for injection beyond which process() injects at once.
const FLUSH_ROWS: usize = 64;

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn unknown_sequence(seq: i32, n_seq: usize) -> Error {
    Error::new(
        Status::LLAMA_SPEC_DFLASH2_ERR_UNKNOWN_SEQUENCE,
        format!("sequence {seq} is outside 0..{n_seq} (params.n_seq)"),
    )
}

fn invalid_state(message: impl Into<String>) -> Error {
    Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE, message)
}

fn backend(message: impl Into<String>) -> Error {
    Error::new(Status::LLAMA_SPEC_DFLASH2_ERR_BACKEND, message)
}

impl Engine {
    /// Creates an engine for the host's target context. `devices`: the devices
    /// named in params, None for the default placement.
    pub fn new(
        target: TargetContext,
        path: &Path,
        params: &llama_spec_dflash2_params,
        devices: Option<Vec<ggml_backend_dev_t>>,
    ) -> Result<Engine> {
        let s = setup::create(&target, path, params, devices)?;
        let taps: Vec<u32> = s.ckpt.hparams.target_layers.iter().map(|&l| l as u32).collect();
        let n_embd_tgt = target.n_embd();
        let batch = Batch::new(&s.ctx)?;
        for &lid in &taps {
            target.set_layer_capture(lid, true);
        }
        let evaluated_at_init = target.evaluated_tokens();
        let fingerprint = fnv1a(format!("{:?}", s.ckpt).as_bytes());
        let can_shift = s.ctx.can_shift();
        log::info(&format!(
            "drafter '{}': block {} (n_max {}), top-k {}, taps {:?}, {} sequence(s)",
            path.display(),
            s.limits.block_size,
            s.limits.n_max,
            s.ckpt.hparams.selector_top_k,
            taps,
            s.n_seq
        ));
        Ok(Engine {
            n_feat: taps.len() * n_embd_tgt,
            n_embd_draft: s.model.n_embd(),
            top_k: s.ckpt.hparams.selector_top_k as usize,
            n_vocab: s.ckpt.hparams.n_vocab as usize,
            mask_token: s.ckpt.mask_token as i32,
            limits: s.limits,
            can_shift,
            skip_image_rows: s.skip_image_rows,
            seqs: (0..s.n_seq).map(|_| Sequence::default()).collect(),
            batch,
            ctx: s.ctx,
            _model: s.model,
            target,
            taps,
            n_embd_tgt,
            fingerprint,
            evaluated_at_init,
            target_decoded: false,
            stats: llama_spec_dflash2_stats::default(),
            scratch: Vec::new(),
            policy: (params.walk_kind() == Some(llama_spec_dflash2_walk::LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE))
                .then(|| AdaptivePolicy::new(s.limits.n_max)),
            last_draft_start: None,
            last_draft_end: None,
            tokens_since_draft: 0,
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn stats(&self) -> llama_spec_dflash2_stats {
        self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats = llama_spec_dflash2_stats::default();
    }

    fn seq_index(&self, seq: i32) -> Result<usize> {
        if seq >= 0 && (seq as usize) < self.seqs.len() {
            Ok(seq as usize)
        } else {
            Err(unknown_sequence(seq, self.seqs.len()))
        }
    }

    /// The sequences a memory call addresses: one, or all for seq < 0.
    fn seq_targets(&self, seq: i32) -> Result<std::ops::Range<usize>> {
        if seq < 0 {
            Ok(0..self.seqs.len())
        } else {
            let s = self.seq_index(seq)?;
            Ok(s..s + 1)
        }
    }

    pub fn seq_info(&self, seq: i32) -> Result<SeqInfo> {
        let s = self.seq_index(seq)?;
        let q = &self.seqs[s];
        Ok(SeqInfo {
            n_in_kv: q.map.in_kv().len(),
            n_queued: q.map.queued().len(),
            n_held: q.held.len(),
            outstanding: q.outstanding.map(|o| o.n_drafted),
            next_draft_pos: q.map.next_draft_pos(),
            last_target_pos: q.map.last_target_pos(),
            kv_pos_min: self.ctx.seq_pos_min(seq),
            kv_pos_max: self.ctx.seq_pos_max(seq),
        })
    }

    /// Reads the tap features of the rows the target just decoded. Rows of a
    /// sequence with an outstanding draft are held until accept(); the others
    /// are committed: injected before the call returns once 64 or more rows wait
    /// (prompt chunks), else by the next draft (one decode for all sequences).
    pub fn process(&mut self, rows: &[Row]) -> Result<()> {
        let n_batch = self.target.n_batch() as i32;
        for r in rows {
            self.seq_index(r.seq)?;
            if r.i_batch < 0 || r.i_batch >= n_batch {
                return Err(Error::invalid(format!(
                    "row index {} is outside the target's batch (n_batch {n_batch})",
                    r.i_batch
                )));
            }
            if r.pos < 0 {
                return Err(Error::invalid(format!("row {} has position {}", r.i_batch, r.pos)));
            }
        }
        if rows.is_empty() {
            return Ok(());
        }
        // the first rows after a draft are the host's verify decode
        if let (Some(policy), Some(t)) = (self.policy.as_mut(), self.last_draft_end.take()) {
            policy.verify_cost.observe(rows.len(), t.elapsed().as_secs_f64());
        }
        if !self.target_decoded {
            // libllama aborts on reading captured rows before any decode
            if self.target.evaluated_tokens() == self.evaluated_at_init {
                return Err(invalid_state("process() before the target decoded anything since the engine was created"));
            }
            self.target_decoded = true;
        }

        let t = Instant::now();
        let n_embd = self.n_embd_tgt;
        let mut layers = Vec::with_capacity(self.taps.len());
        for &lid in &self.taps {
            let layer = self.target.layer_input(lid).ok_or_else(|| {
                backend(format!("the target has no captured input of layer {lid}; was this context decoded?"))
            })?;
            layers.push(layer);
        }
        for r in rows {
            if r.embd && self.skip_image_rows {
                self.stats.n_skipped_rows += 1;
                continue;
            }
            self.scratch.clear();
            let at = r.i_batch as usize * n_embd;
            for layer in &layers {
                self.scratch.extend_from_slice(&layer[at..at + n_embd]);
            }
            let seq = &mut self.seqs[r.seq as usize];
            if seq.holds_rows() {
                seq.hold(r.pos, &self.scratch);
            } else {
                seq.commit(r.pos, &self.scratch);
            }
        }
        self.stats.t_process_us += us_since(t);
        // prompt chunks go in as they come; a few rows of a decode step wait for
        // the next draft, which injects every sequence's rows in one decode
        let queued: usize = self.seqs.iter().map(|q| q.map.queued().len()).sum();
        if queued >= FLUSH_ROWS { self.flush() } else { Ok(()) }
    }

    /// Injects every queued row of every sequence into the draft KV.
    fn flush(&mut self) -> Result<()> {
        let n_ubatch = self.ctx.n_ubatch() as usize;
        let nf = self.n_feat;
        loop {
            self.batch.clear();
            let mut plan = Vec::new();
            let mut room = n_ubatch;
            for (s, seq) in self.seqs.iter().enumerate() {
                let n = seq.map.queued().len().min(room);
                if n == 0 {
                    continue;
                }
                for (i, pos) in seq.map.pending_draft_positions().take(n).enumerate() {
                    self.batch.add_embd(s as i32, &seq.queued[i * nf..(i + 1) * nf], pos)?;
                }
                plan.push((s, n));
                room -= n;
            }
            if plan.is_empty() {
                return Ok(());
            }
            let t = Instant::now();
            self.ctx.decode(&self.batch).map_err(|rc| {
                backend(format!(
                    "draft injection decode failed (llama_process returned {rc}{})",
                    if rc == 1 { ": the draft KV is full" } else { "" }
                ))
            })?;
            self.stats.t_inject_us += us_since(t);
            self.stats.n_inject_decodes += 1;
            for (s, n) in plan {
                let seq = &mut self.seqs[s];
                seq.map.inject(n);
                seq.queued.drain(..n * nf);
                self.stats.n_injected += n as u64;
            }
        }
    }

    /// Most tokens one request may draft now.
    fn request_cap(&self, r: &Request) -> usize {
        (r.n_max as usize).min(self.limits.n_max)
    }

    /// Drafts for several sequences with one noise-block decode. `tokens`
    /// receives the drafts concatenated in request order, `n_drafted[i]` the
    /// length of request i's draft.
    pub fn draft(&mut self, reqs: &[Request], tokens: &mut [i32], n_drafted: &mut [i32]) -> Result<()> {
        let mut seen = vec![false; self.seqs.len()];
        for r in reqs {
            let s = self.seq_index(r.seq)?;
            if std::mem::replace(&mut seen[s], true) {
                return Err(Error::invalid(format!("sequence {} appears twice in one draft call", r.seq)));
            }
            if r.id_last < 0 || r.id_last as usize >= self.n_vocab {
                return Err(Error::invalid(format!("id_last {} is not a token of the vocabulary", r.id_last)));
            }
            if r.n_max <= 0 {
                return Err(Error::invalid(format!("n_max {} for sequence {} (must be > 0)", r.n_max, r.seq)));
            }
        }
        let needed: usize = reqs.iter().map(|r| self.request_cap(r)).sum();
        if tokens.len() < needed || n_drafted.len() < reqs.len() {
            return Err(Error::new(
                Status::LLAMA_SPEC_DFLASH2_ERR_BUFFER_TOO_SMALL,
                format!("the output holds {} tokens, these requests may draft {needed}", tokens.len()),
            ));
        }
        self.stats.n_draft_calls += 1;
        if reqs.is_empty() {
            return Ok(());
        }
        let drafting = self.observe_step(reqs.len());

        // a previous draft never accepted: the host kept what it decoded since
        for r in reqs {
            let seq = &mut self.seqs[r.seq as usize];
            if seq.outstanding.is_some() {
                let n = seq.held.len();
                seq.resolve_held(n, self.n_feat);
            }
        }
        self.flush()?;

        let width = if drafting { reqs.iter().map(|r| self.request_cap(r)).max().unwrap_or(0) + 1 } else { 0 };
        let mut order: Vec<usize> = (0..reqs.len()).collect();
        order.sort_by_key(|&i| reqs[i].seq);
        let n_ctx_seq = self.ctx.n_ctx_seq() as i32;
        self.batch.clear();
        let mut blocks = Vec::with_capacity(reqs.len()); // (request, anchor draft position)
        for &i in order.iter().filter(|_| drafting) {
            let r = reqs[i];
            let anchor = self.seqs[r.seq as usize].map.next_draft_pos();
            if anchor + width as i32 > n_ctx_seq {
                log::warn(&format!("sequence {}: the draft KV has no room for a block; not drafting", r.seq));
                continue;
            }
            for p in 0..width {
                let token = if p == 0 { r.id_last } else { self.mask_token };
                self.batch.add_token(r.seq, token, anchor + p as i32)?;
            }
            blocks.push((i, anchor));
        }

        let mut drafts: Vec<Vec<Pick>> = vec![Vec::new(); reqs.len()];
        if !blocks.is_empty() {
            let t = Instant::now();
            let decoded = self.ctx.decode(&self.batch);
            self.stats.t_draft_us += us_since(t);
            if let Some(policy) = self.policy.as_mut() {
                policy.observe_draft_decode(t.elapsed().as_secs_f64());
            }
            if let Err(rc) = decoded {
                self.remove_noise(reqs, &blocks);
                return Err(backend(format!("draft noise-block decode failed (llama_process returned {rc})")));
            }
            let t = Instant::now();
            let n_rows = blocks.len() * width;
            let lattice = self.ctx.lattice(n_rows).ok_or_else(|| backend("the drafter produced no lattice"));
            let lattice = match lattice {
                Ok(l) => l,
                Err(e) => {
                    self.remove_noise(reqs, &blocks);
                    return Err(e);
                }
            };
            let row = width * self.n_embd_draft;
            for (b, &(i, _)) in blocks.iter().enumerate() {
                let block = Lattice::new(&lattice[b * row..(b + 1) * row], self.n_embd_draft, self.top_k)
                    .expect("the checkpoint check guarantees n_embd >= k(k+1)");
                let limits = WalkLimits {
                    n_max: self.request_cap(&reqs[i]),
                    n_min: self.limits.n_min,
                    p_min: self.limits.p_min,
                };
                drafts[i] = greedy_walk_scored(&block, limits, self.n_vocab);
                if let Some(policy) = self.policy.as_mut() {
                    let confidences: Vec<f32> = drafts[i].iter().map(|p| p.confidence).collect();
                    drafts[i].truncate(policy.keep(&confidences));
                }
            }
            self.stats.t_walk_us += us_since(t);
            self.remove_noise(reqs, &blocks);
        }

        let mut at = 0;
        for (i, r) in reqs.iter().enumerate() {
            let d = &drafts[i];
            for (slot, pick) in tokens[at..at + d.len()].iter_mut().zip(d) {
                *slot = pick.token;
            }
            at += d.len();
            n_drafted[i] = d.len() as i32;
            let seq = &mut self.seqs[r.seq as usize];
            seq.outstanding = Some(Outstanding { n_drafted: d.len() });
            seq.draft_confidences.clear();
            seq.draft_confidences.extend(d.iter().map(|p| p.confidence));
            self.stats.record_draft(d.len());
        }
        self.last_draft_end = Some(Instant::now());
        Ok(())
    }

    /// For the adaptive walk: closes the previous step (tokens gained over its
    /// wall time) and decides whether this one drafts. Always true otherwise.
    fn observe_step(&mut self, n_requests: usize) -> bool {
        let Some(policy) = self.policy.as_mut() else { return true };
        let now = Instant::now();
        if let Some(t) = self.last_draft_start.replace(now) {
            policy.observe_step(self.tokens_since_draft, (now - t).as_secs_f64());
        }
        // every requesting sequence gains at least its anchor's successor this step
        self.tokens_since_draft = n_requests;
        policy.should_draft(n_requests)
    }

    /// Takes the noise blocks back out of the draft KV.
    fn remove_noise(&self, reqs: &[Request], blocks: &[(usize, i32)]) {
        for &(i, anchor) in blocks {
            self.ctx.seq_rm(reqs[i].seq, anchor, -1);
        }
    }

    /// The host verified the last draft of `seq` and kept its first `n_accepted`
    /// tokens: the anchor row and those tokens' rows are committed, the rest of
    /// the verify rows are dropped before reaching the draft KV.
    pub fn accept(&mut self, seq: i32, n_accepted: i32) -> Result<()> {
        let s = self.seq_index(seq)?;
        let nf = self.n_feat;
        let q = &mut self.seqs[s];
        let Some(o) = q.outstanding else {
            return Err(invalid_state(format!("accept() on sequence {seq}, which has no draft to accept")));
        };
        if n_accepted < 0 || n_accepted as usize > o.n_drafted {
            return Err(Error::invalid(format!("accept({seq}, {n_accepted}): the draft has {} tokens", o.n_drafted)));
        }
        let n_rows = if o.n_drafted > 0 { n_accepted as usize + 1 } else { 0 };
        if q.held.len() < n_rows {
            return Err(invalid_state(format!(
                "accept({seq}, {n_accepted}) needs {n_rows} verify rows, but process() received {} since the draft",
                q.held.len()
            )));
        }
        if let Some(policy) = self.policy.as_mut() {
            policy.acceptance.observe(&q.draft_confidences, n_accepted as usize);
            self.tokens_since_draft += n_accepted as usize;
        }
        let dropped = q.resolve_held(n_rows, nf);
        self.stats.n_rejected_rows += dropped as u64;
        self.stats.record_accept(n_accepted as usize);
        Ok(())
    }

    fn apply(&self, seq: usize, edits: &[KvEdit]) -> Result<()> {
        for e in edits {
            match *e {
                KvEdit::Remove { p0, p1 } => {
                    if !self.ctx.seq_rm(seq as i32, p0, p1) {
                        return Err(backend(format!("the draft KV refused to remove [{p0}, {p1}) of sequence {seq}")));
                    }
                }
                KvEdit::Shift { p0, p1, delta } => self.ctx.seq_add(seq as i32, p0, p1, delta),
            }
        }
        Ok(())
    }

    fn remove_range(&mut self, s: usize, range: TargetRange) -> Result<()> {
        let nf = self.n_feat;
        let removal = self.seqs[s].map.remove(range, self.can_shift);
        let q = &mut self.seqs[s];
        q.retain_queued(&removal.queued_kept, nf);
        q.drop_held(range, nf);
        if range == TargetRange::all() {
            q.outstanding = None;
        }
        self.apply(s, &removal.edits)
    }

    /// Removes the rows at target positions [p0, p1) (llama's conventions for
    /// negative bounds; seq < 0: every sequence).
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> Result<()> {
        if p1 >= 0 && p0 > p1 {
            return Err(Error::invalid(format!("seq_rm range [{p0}, {p1}) is reversed")));
        }
        for s in self.seq_targets(seq)? {
            self.remove_range(s, TargetRange::new(p0, p1))?;
        }
        Ok(())
    }

    /// Forgets a sequence (seq < 0: every sequence), outstanding draft included.
    pub fn seq_clear(&mut self, seq: i32) -> Result<()> {
        self.seq_rm(seq, -1, -1)
    }

    /// The target moved positions [p0, p1) by `delta` (context shift, cache
    /// reuse). Draft positions stay dense; only the map changes.
    pub fn seq_shift(&mut self, seq: i32, p0: i32, p1: i32, delta: i32) -> Result<()> {
        let range = TargetRange::new(p0, p1);
        for s in self.seq_targets(seq)? {
            let q = &mut self.seqs[s];
            q.map.shift_target(range, delta);
            for h in &mut q.held {
                if range.contains(h.target) {
                    h.target = h.target.saturating_add(delta);
                }
            }
        }
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
            return Err(invalid_state(format!("seq_cp from sequence {src}, whose verify rows await accept()")));
        }
        self.remove_range(d, TargetRange::all())?;
        if !self.seqs[s].map.in_kv().is_empty() {
            self.ctx.seq_cp_all(src, dst);
        }
        let (map, queued) = (self.seqs[s].map.clone(), self.seqs[s].queued.clone());
        self.seqs[d].map = map;
        self.seqs[d].queued = queued;
        if p0 > 0 {
            self.remove_range(d, TargetRange::new(0, p0))?;
        }
        if p1 >= 0 {
            self.remove_range(d, TargetRange::new(p1, -1))?;
        }
        Ok(())
    }

    fn check_saveable(&self, s: usize) -> Result<()> {
        if !self.seqs[s].held.is_empty() {
            return Err(invalid_state(format!(
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
        Ok(state_blob::header_len(&self.seqs[s].map, self.n_feat) + self.ctx.state_seq_size(seq))
    }

    /// Writes the state of `seq` into `dst`; returns the bytes written.
    pub fn state_get(&mut self, seq: i32, dst: &mut [u8]) -> Result<usize> {
        let size = self.state_size(seq)?;
        if dst.len() < size {
            return Err(Error::new(
                Status::LLAMA_SPEC_DFLASH2_ERR_BUFFER_TOO_SMALL,
                format!("state of sequence {seq} needs {size} bytes, the buffer has {}", dst.len()),
            ));
        }
        let q = &self.seqs[seq as usize];
        let h = state_blob::header_len(&q.map, self.n_feat);
        let kv_len = size - h;
        let n = self.ctx.state_seq_get(seq, &mut dst[h..h + kv_len]);
        if n == 0 || n > kv_len {
            return Err(backend(format!("libllama could not save the draft KV of sequence {seq}")));
        }
        let header = state_blob::encode_header(self.fingerprint, self.n_feat, &q.map, &q.queued, n);
        dst[..h].copy_from_slice(&header);
        Ok(h + n)
    }

    /// Replaces the state of `seq` with a blob from `state_get` (of this or
    /// another engine with the same drafter). On a libllama failure the
    /// sequence is left empty.
    pub fn state_set(&mut self, seq: i32, src: &[u8]) -> Result<()> {
        let s = self.seq_index(seq)?;
        let blob = state_blob::decode(src, self.fingerprint, self.n_feat)?;
        let expected_max = blob.map.in_kv().last().map_or(-1, |e| e.draft);
        if expected_max >= self.ctx.n_ctx_seq() as i32 {
            return Err(Error::invalid("state blob holds more positions than the draft KV of this engine"));
        }
        self.remove_range(s, TargetRange::all())?;
        if !blob.map.in_kv().is_empty() {
            let n = self.ctx.state_seq_set(seq, blob.kv);
            if n == 0 || self.ctx.seq_pos_max(seq) != expected_max {
                self.ctx.seq_rm(seq, -1, -1);
                return Err(Error::invalid(format!(
                    "the draft KV in the state blob does not load into sequence {seq} (or does not match its map)"
                )));
            }
        }
        let q = &mut self.seqs[s];
        q.map = blob.map;
        q.queued = blob.queued;
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for &lid in &self.taps {
            self.target.set_layer_capture(lid, false);
        }
    }
}
