//! The draft step: one noise-block decode for every drafting sequence, the
//! selector walk over each block's lattice, the drafts handed out. Its start
//! and end (`open_step`, `begin_step`, `end_step`) are the tree's too
//! (`tree_step`), which grows trees where the chain walks.

use std::time::Instant;

use super::sampled::{self, Mode, Walked};
use super::sequence::Outstanding;
use super::stats::us_since;
use super::{Engine, Request};
use crate::adaptive::Plan;
use crate::draft::NoiseBlock;
use crate::error::{Error, Result};
use crate::log;
use crate::selector::{Lattice, WalkLimits};

/// What the shared start of a draft step settled (`begin_step`).
pub(super) struct StepStart {
    /// Each request's most tokens (a chain) or deepest node (a tree), as the
    /// controller's plan capped them.
    pub caps: Vec<usize>,
    /// Rows of each noise block (0: nothing drafts this step).
    pub width: usize,
    /// The noise blocks to decode: of the requests with a cap and room.
    pub blocks: Vec<Block>,
}

/// A request's noise block in the draft batch.
#[derive(Clone, Copy)]
pub(super) struct Block {
    /// Index of the request.
    pub request: usize,
    seq: i32,
    /// Draft position of the block's anchor.
    anchor: i32,
    id_last: i32,
}

impl Engine {
    /// Most tokens one request may draft now.
    fn request_cap(&self, r: &Request) -> usize {
        (r.n_max as usize).min(self.drafter.limits.n_max)
    }

    /// Checks a draft call before anything changes.
    pub(super) fn check_requests(&self, reqs: &[Request], n_tokens: usize, n_lengths: usize) -> Result<()> {
        let mut seen = vec![false; self.seqs.len()];
        for r in reqs {
            let s = self.seq_index(r.seq)?;
            if std::mem::replace(&mut seen[s], true) {
                return Err(Error::invalid(format!("sequence {} appears twice in one draft call", r.seq)));
            }
            if r.id_last < 0 || r.id_last as usize >= self.drafter.n_vocab {
                return Err(Error::invalid(format!("id_last {} is not a token of the vocabulary", r.id_last)));
            }
            if r.n_max <= 0 {
                return Err(Error::invalid(format!("n_max {} for sequence {} (must be > 0)", r.n_max, r.seq)));
            }
            sampled::mode(r)?;
        }
        let needed: usize = reqs.iter().map(|r| self.request_cap(r)).sum();
        if n_tokens < needed || n_lengths < reqs.len() {
            return Err(Error::buffer_too_small(format!(
                "the output holds {n_tokens} tokens, these requests may draft {needed}"
            )));
        }
        for r in reqs {
            let q = &self.seqs[r.seq as usize];
            if q.map.in_kv().is_empty() && q.queued.is_empty() {
                return Err(Error::invalid_state(format!(
                    "sequence {}: nothing to draft from: decode its prompt on the target and pass the rows to \
                     llama_spec_dflash2_process() first",
                    r.seq
                )));
            }
            if let Some(n) = self.seqs[r.seq as usize].outstanding.as_ref().map(|o| o.tokens.len()).filter(|&n| n > 0) {
                return Err(Error::invalid_state(format!(
                    "sequence {}: the previous draft ({n} tokens) was never accepted; call \
                     llama_spec_dflash2_{}() after verifying it (or llama_spec_dflash2_seq_clear() to drop it)",
                    r.seq,
                    if self.seqs[r.seq as usize].tree().is_some() { "accept_tree" } else { "accept" }
                )));
            }
        }
        Ok(())
    }

    /// The start of every draft call, chain or tree: checks the requests as
    /// `check_requests` does and sets each sequence's anchor (the token its
    /// verify rows begin with).
    pub(super) fn open_step(&mut self, reqs: &[Request], n_tokens: usize, n_lengths: usize) -> Result<()> {
        self.check_requests(reqs, n_tokens, n_lengths)?;
        for r in reqs {
            self.seqs[r.seq as usize].history.set_anchor(r.id_last);
        }
        Ok(())
    }

    /// The step both draft calls share once their own checks passed: counts
    /// the call and, unless it has no request (None), asks the controller
    /// (adaptive walk) for its plan (no draft, a probe of one sequence, or
    /// all), caps each request's `wanted` (most tokens, or a tree's depth) by
    /// it, closes the requested sequences' drafts, flushes the waiting rows
    /// when anything drafts and lays out the noise blocks.
    pub(super) fn begin_step(&mut self, reqs: &[Request], wanted: &[usize]) -> Result<Option<StepStart>> {
        self.stats.n_draft_calls += 1;
        if reqs.is_empty() {
            return Ok(None);
        }
        let plan = self.controller.policy.as_mut().map_or(Plan::All, |p| p.begin_step(Instant::now(), reqs.len()));
        let caps: Vec<usize> = wanted.iter().enumerate().map(|(i, &w)| plan.cap(i, w)).collect();
        // a zero-length draft needs no accept(): it closes here
        for r in reqs {
            self.seqs[r.seq as usize].outstanding = None;
        }
        let width = plan.block_rows(caps.iter().copied().max().unwrap_or(0));
        if width > 0 {
            // not drafting, the rows wait: process() injects them 64 at a time,
            // far cheaper per row than a small injection decode every step
            // (so the controller prices this one as the step's)
            let (t, waiting) = (Instant::now(), self.seqs.iter().map(|q| q.queued.len()).sum());
            self.flush()?;
            if let Some(policy) = self.controller.policy.as_mut() {
                policy.flush_seen(waiting, t.elapsed().as_secs_f64());
            }
        }
        let blocks = if width > 0 { self.noise_blocks(reqs, &caps, width) } else { Vec::new() };
        Ok(Some(StepStart { caps, width, blocks }))
    }

    /// The end both draft calls share: holds `drafts[i]` as request i's
    /// draft until its accept (a sampled one's generators seeded for its
    /// seed: even a draft of no tokens verifies, the bonus draw), counts the
    /// tuned drafts and tells the controller the drafting is done.
    pub(super) fn end_step(&mut self, reqs: &[Request], modes: &[Mode], drafts: Vec<Outstanding>) {
        for ((r, &mode), draft) in reqs.iter().zip(modes).zip(drafts) {
            let seq = &mut self.seqs[r.seq as usize];
            if let Mode::Sampled { seed, .. } = mode {
                sampled::seeded(&mut seq.rng, seed, r.seq);
            }
            seq.outstanding = Some(draft);
            self.record_tuning(r, mode);
        }
        if let Some(policy) = self.controller.policy.as_mut() {
            policy.draft_done(Instant::now());
        }
    }

    /// Drafts for several sequences with one noise-block decode. `tokens`
    /// receives the drafts concatenated in request order, `n_drafted[i]` the
    /// length of request i's draft.
    pub fn draft(&mut self, reqs: &[Request], tokens: &mut [i32], n_drafted: &mut [i32]) -> Result<()> {
        self.open_step(reqs, tokens.len(), n_drafted.len())?;
        let wanted: Vec<usize> = reqs.iter().map(|r| self.request_cap(r)).collect();
        let Some(StepStart { caps, width, blocks }) = self.begin_step(reqs, &wanted)? else {
            return Ok(());
        };
        let modes = reqs.iter().map(|r| self.mode_of(r, None)).collect::<Result<Vec<Mode>>>()?;
        let drafts = self.decode_and_walk(&caps, &modes, blocks, width)?;

        let mut at = 0;
        let mut held = Vec::with_capacity(reqs.len());
        for (i, (r, d)) in reqs.iter().zip(drafts).enumerate() {
            let n = d.len();
            tokens[at..at + n].copy_from_slice(&d.tokens());
            at += n;
            n_drafted[i] = n as i32;
            self.stats.record_draft(n);
            held.push(d.into_outstanding(self.seqs[r.seq as usize].last_target_pos(), modes[i]));
        }
        self.end_step(reqs, &modes, held);
        Ok(())
    }

    /// The noise blocks, [id_last, mask, mask, ...] of `width` rows, of every
    /// request with a cap (`caps[i]` > 0) whose sequence has room, in
    /// sequence order.
    pub(super) fn noise_blocks(&self, reqs: &[Request], caps: &[usize], width: usize) -> Vec<Block> {
        let mut order: Vec<usize> = (0..reqs.len()).collect();
        order.sort_by_key(|&i| reqs[i].seq);
        let n_ctx_seq = self.drafter.model.n_ctx_seq() as i32;
        let mut blocks = Vec::with_capacity(reqs.len());
        for i in order.into_iter().filter(|&i| caps[i] > 0) {
            let r = reqs[i];
            let anchor = self.seqs[r.seq as usize].map.next_draft_pos();
            if anchor + width as i32 > n_ctx_seq {
                log::warn(&format!("sequence {}: the draft KV has no room for a block; not drafting", r.seq));
                continue;
            }
            blocks.push(Block { request: i, seq: r.seq, anchor, id_last: r.id_last });
        }
        blocks
    }

    /// Decodes the noise blocks and walks each block's lattice with the
    /// request's walk (greedy or sampled, at most `caps[i]` tokens, then the
    /// adaptive walk's cut).
    fn decode_and_walk(
        &mut self,
        caps: &[usize],
        modes: &[Mode],
        blocks: Vec<Block>,
        width: usize,
    ) -> Result<Vec<Walked>> {
        let mut drafts: Vec<Walked> = modes.iter().map(|&m| Walked::empty(m)).collect();
        let lattices = self.decode_noise(blocks, width)?;

        let t = Instant::now();
        for (block, lattice) in lattices.iter(self.drafter.n_embd, self.drafter.top_k) {
            let limits = WalkLimits {
                n_max: caps[block.request],
                n_min: self.drafter.limits.n_min,
                p_min: self.drafter.limits.p_min,
            };
            let rng = &mut self.seqs[block.seq as usize].rng;
            let mut picks =
                sampled::walk(&lattice, limits, self.drafter.n_vocab, modes[block.request], block.seq, rng)?;
            if let Some(policy) = self.controller.policy.as_mut() {
                picks.truncate(policy.keep(&picks.confidences()));
            }
            drafts[block.request] = picks;
        }
        self.stats.t_walk_us += us_since(t);
        Ok(drafts)
    }

    /// The one noise-block decode of a draft call, shared by the chain and the
    /// tree: decodes the blocks (`width` rows each, from `noise_blocks`) and
    /// copies their lattices out (a few KiB: the walks then borrow the engine
    /// freely). The blocks leave the draft KV before this returns, whatever
    /// happens.
    pub(super) fn decode_noise(&mut self, blocks: Vec<Block>, width: usize) -> Result<NoiseLattices> {
        let mut out =
            NoiseLattices { blocks: blocks.clone(), rows: Vec::new(), per_block: width * self.drafter.n_embd };
        if blocks.is_empty() {
            return Ok(out);
        }
        let noise: Vec<NoiseBlock> = blocks
            .iter()
            .map(|b| NoiseBlock { stream: b.seq as usize, anchor: b.anchor, id_last: b.id_last })
            .collect();
        let t = Instant::now();
        let rows = self.drafter.model.noise(&noise, width, self.drafter.mask_token);
        self.stats.t_draft_us += us_since(t);
        if rows.is_ok() {
            self.stats.record_noise(&self.drafter.model.head_traffic());
        }
        if let Some(policy) = self.controller.policy.as_mut() {
            policy.draft_decode_seen(blocks.len() * width, t.elapsed().as_secs_f64());
        }
        out.rows = rows?;
        if out.rows.len() != blocks.len() * out.per_block {
            return Err(Error::internal(format!(
                "the drafter returned {} lattice floats for {} blocks of {width} rows",
                out.rows.len(),
                blocks.len()
            )));
        }
        Ok(out)
    }
}

/// The lattices of one noise-block decode, block by block.
pub(super) struct NoiseLattices {
    blocks: Vec<Block>,
    rows: Vec<f32>,
    /// Floats per block: width rows of n_embd.
    per_block: usize,
}

impl NoiseLattices {
    pub fn iter(&self, n_embd: usize, top_k: usize) -> impl Iterator<Item = (Block, Lattice<'_>)> {
        self.blocks.iter().enumerate().map(move |(b, &block)| {
            let rows = &self.rows[b * self.per_block..(b + 1) * self.per_block];
            let lattice = Lattice::new(rows, n_embd, top_k).expect("the checkpoint check guarantees n_embd >= k(k+1)");
            (block, lattice)
        })
    }
}
