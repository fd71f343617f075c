//! A host's greedy speculative loop driven only through dflash2's C API:
//! draft for every active sequence in one call, verify all drafts in one target
//! batch, accept, roll the target back to the accepted prefix.
#![allow(dead_code)]

use std::path::Path;
use std::ptr;

use dflash2::ffi::*;

use super::target::{TRow, Target};
use super::{cstr, last_error};

pub struct Spec(pub *mut llama_spec_dflash2);

impl Spec {
    pub fn new(target: &Target, drafter: &Path, params: llama_spec_dflash2_params) -> Spec {
        let spec = unsafe { llama_spec_dflash2_init(target.ctx, cstr(drafter).as_ptr(), params) };
        assert!(!spec.is_null(), "init: {}", last_error());
        Spec(spec)
    }

    /// Hands the target's last decoded rows to the engine.
    /// Passes the rows of the target's last decode with their tokens (the
    /// text n-gram branches match against).
    pub fn process(&self, target: &Target) {
        let rows: Vec<llama_spec_dflash2_row> = target
            .last_rows
            .iter()
            .enumerate()
            .map(|(i, r)| llama_spec_dflash2_row { i_batch: i as i32, seq_id: r.seq, pos: r.pos, embd: r.embd })
            .collect();
        let tokens: Vec<i32> = target.last_rows.iter().map(|r| r.token).collect();
        let rc =
            unsafe { llama_spec_dflash2_process_tokens(self.0, rows.as_ptr(), tokens.as_ptr(), rows.len() as i32) };
        assert_eq!(rc, 0, "process: {}", last_error());
    }

    pub fn draft(&self, reqs: &[llama_spec_dflash2_draft_request]) -> Vec<Vec<i32>> {
        let cap: i32 = reqs.iter().map(|r| r.n_max).sum();
        let mut tokens = vec![0i32; cap as usize];
        let mut n = vec![0i32; reqs.len()];
        let rc = unsafe {
            llama_spec_dflash2_draft(self.0, reqs.as_ptr(), reqs.len() as i32, tokens.as_mut_ptr(), cap, n.as_mut_ptr())
        };
        assert_eq!(rc, 0, "draft: {}", last_error());
        let mut at = 0;
        n.iter()
            .map(|&k| {
                let d = tokens[at..at + k as usize].to_vec();
                at += k as usize;
                d
            })
            .collect()
    }

    pub fn accept(&self, seq: i32, n: i32) {
        let rc = unsafe { llama_spec_dflash2_accept(self.0, seq, n) };
        assert_eq!(rc, 0, "accept: {}", last_error());
    }

    /// llama_spec_dflash2_verify_greedy: the tokens the host emits this step.
    pub fn verify_greedy(&self, seq: i32, i_batch: &[i32]) -> Vec<i32> {
        let mut out = vec![0i32; i_batch.len()];
        let mut n = 0;
        let rc = unsafe {
            llama_spec_dflash2_verify_greedy(
                self.0,
                seq,
                i_batch.as_ptr(),
                i_batch.len() as i32,
                out.as_mut_ptr(),
                out.len() as i32,
                &mut n,
            )
        };
        assert_eq!(rc, 0, "verify_greedy: {}", last_error());
        out.truncate(n as usize);
        out
    }

    pub fn seq_rm(&self, seq: i32, p0: i32, p1: i32) {
        let rc = unsafe { llama_spec_dflash2_seq_rm(self.0, seq, p0, p1) };
        assert_eq!(rc, 0, "seq_rm: {}", last_error());
    }

    pub fn info(&self, seq: i32) -> llama_spec_dflash2_seq_info {
        let mut info = std::mem::MaybeUninit::zeroed();
        let rc = unsafe { llama_spec_dflash2_seq_info(self.0, seq, info.as_mut_ptr()) };
        assert_eq!(rc, 0, "seq_info: {}", last_error());
        unsafe { info.assume_init() }
    }

    pub fn stats(&self) -> llama_spec_dflash2_stats {
        let mut s = std::mem::MaybeUninit::zeroed();
        assert_eq!(unsafe { llama_spec_dflash2_get_stats(self.0, s.as_mut_ptr()) }, 0);
        unsafe { s.assume_init() }
    }

    pub fn n_max(&self) -> i32 {
        unsafe { llama_spec_dflash2_n_max(self.0) }
    }
}

impl Drop for Spec {
    fn drop(&mut self) {
        unsafe { llama_spec_dflash2_free(self.0) }
    }
}

/// One sequence's progress in the loop.
pub struct Stream {
    pub seq: i32,
    pub n_past: i32,
    pub id_last: i32,
    pub out: Vec<i32>,
}

/// Decodes every prompt in one target batch with the rows of the sequences
/// interleaved (round-robin), feeds the rows to the engine, and returns each
/// sequence's first greedy token.
pub fn prefill(target: &mut Target, spec: &Spec, prompts: &[Vec<i32>]) -> Vec<Stream> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut rows = Vec::new();
    for i in 0..longest {
        for (s, p) in prompts.iter().enumerate() {
            if i < p.len() {
                rows.push(TRow { seq: s as i32, token: p[i], pos: i as i32, logits: i + 1 == p.len() });
            }
        }
    }
    let firsts = target.decode(&rows);
    spec.process(target);
    // logits rows come back in batch order; map them to sequences
    let mut order: Vec<i32> = rows.iter().filter(|r| r.logits).map(|r| r.seq).collect();
    let mut by_seq = vec![0; prompts.len()];
    for (k, s) in order.drain(..).enumerate() {
        by_seq[s as usize] = firsts[k];
    }
    prompts
        .iter()
        .enumerate()
        .map(|(s, p)| Stream { seq: s as i32, n_past: p.len() as i32, id_last: by_seq[s], out: vec![by_seq[s]] })
        .collect()
}

/// Who verifies the drafts in `generate_by`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verifier {
    /// The host: its own argmax, then accept() and seq_rm() on the engine.
    Host,
    /// llama_spec_dflash2_verify_greedy (which accepts).
    Library,
}

/// Runs speculative steps until every stream has `n_gen` tokens. Returns the
/// number of verify steps.
pub fn generate(target: &mut Target, spec: &Spec, streams: &mut [Stream], n_gen: usize, n_max: i32) -> usize {
    generate_by(Verifier::Host, target, spec, streams, n_gen, n_max)
}

/// `generate` with the verification done by llama_spec_dflash2_verify_greedy
/// instead of the host's own argmax. Returns the number of verify steps.
pub fn generate_verified(target: &mut Target, spec: &Spec, streams: &mut [Stream], n_gen: usize, n_max: i32) -> usize {
    generate_by(Verifier::Library, target, spec, streams, n_gen, n_max)
}

/// One draft call for every active stream, one target batch verifying all
/// drafts, then each stream verified by `verifier`.
pub fn generate_by(
    verifier: Verifier,
    target: &mut Target,
    spec: &Spec,
    streams: &mut [Stream],
    n_gen: usize,
    n_max: i32,
) -> usize {
    generate_traced(verifier, target, spec, streams, n_gen, n_max).len()
}

/// `generate_by`, returning for every step the drafted tokens of each
/// sequence in it (in the order of the step's active streams).
pub fn generate_traced(
    verifier: Verifier,
    target: &mut Target,
    spec: &Spec,
    streams: &mut [Stream],
    n_gen: usize,
    n_max: i32,
) -> Vec<Vec<usize>> {
    let mut trace = Vec::new();
    loop {
        let active: Vec<usize> = (0..streams.len()).filter(|&i| streams[i].out.len() < n_gen).collect();
        if active.is_empty() {
            return trace;
        }
        let reqs: Vec<llama_spec_dflash2_draft_request> = active
            .iter()
            .map(|&i| llama_spec_dflash2_draft_request {
                seq_id: streams[i].seq,
                id_last: streams[i].id_last,
                n_max,
                ..Default::default()
            })
            .collect();
        let drafts = spec.draft(&reqs);
        trace.push(drafts.iter().map(Vec::len).collect());
        let mut rows = Vec::new();
        let mut first = Vec::new();
        for (k, &i) in active.iter().enumerate() {
            let s = &streams[i];
            first.push(rows.len());
            rows.push(TRow { seq: s.seq, token: s.id_last, pos: s.n_past, logits: true });
            for (j, &t) in drafts[k].iter().enumerate() {
                rows.push(TRow { seq: s.seq, token: t, pos: s.n_past + 1 + j as i32, logits: true });
            }
        }
        let verdicts = target.decode(&rows);
        spec.process(target);
        for (k, &i) in active.iter().enumerate() {
            let d = &drafts[k];
            let s = &mut streams[i];
            let emitted = match verifier {
                Verifier::Host => {
                    let v = &verdicts[first[k]..first[k] + d.len() + 1];
                    let n_acc = d.iter().zip(v).take_while(|(t, want)| t == want).count();
                    spec.accept(s.seq, n_acc as i32);
                    spec.seq_rm(s.seq, s.n_past + n_acc as i32 + 1, -1);
                    v[..=n_acc].to_vec()
                }
                Verifier::Library => {
                    let i_batch: Vec<i32> = (0..=d.len()).map(|j| (first[k] + j) as i32).collect();
                    spec.verify_greedy(s.seq, &i_batch)
                }
            };
            s.out.extend_from_slice(&emitted);
            s.n_past += emitted.len() as i32;
            target.seq_rm(s.seq, s.n_past, -1);
            s.id_last = *emitted.last().unwrap();
        }
    }
}

pub fn default_params(n_seq: u32) -> llama_spec_dflash2_params {
    let mut p = llama_spec_dflash2_default_params();
    p.n_seq = n_seq;
    p.n_threads = 2;
    p.n_threads_batch = 2;
    p
}

pub fn null_spec() -> *mut llama_spec_dflash2 {
    ptr::null_mut()
}
