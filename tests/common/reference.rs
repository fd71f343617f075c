//! The host's sampling distribution p and the exact target-only distribution
//! of the first tokens after a prompt, binned, for distribution checks of
//! speculative sampling (the approach of tests/engine_sampling.rs, shared).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use dflash2::sampling::{Dist, Rng, sample};
use dflash2::sys::{self, llama_token_data};

use super::target::{TRow, Target};

/// The logits of row `i` of the target's last decode.
pub fn logits(target: &Target, i: usize) -> &[f32] {
    unsafe { std::slice::from_raw_parts(sys::llama_get_logits_ith(target.ctx, i as i32), target.n_vocab) }
}

/// The host's sampler chain: top-k (0 = off; ties by id), then softmax(l / t)
/// over what is left, in f64, handed on as f32 (dense, n_vocab long).
pub fn host_p(logits: &[f32], t: f32, top_k: usize) -> Vec<f32> {
    let mut keep: Vec<usize> = (0..logits.len()).collect();
    if top_k > 0 && top_k < logits.len() {
        keep.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        keep.truncate(top_k);
    }
    let max = keep.iter().map(|&i| logits[i] as f64).fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = keep.iter().map(|&i| ((logits[i] as f64 - max) / t as f64).exp()).collect();
    let sum: f64 = w.iter().sum();
    let mut p = vec![0.0f32; logits.len()];
    for (&i, &w) in keep.iter().zip(&w) {
        p[i] = (w / sum) as f32;
    }
    p
}

/// `p` as llama.cpp's chain leaves `cur_p`: the candidates left (p > 0), in
/// no particular order (here: by descending id).
pub fn cur_p(p: &[f32]) -> Vec<llama_token_data> {
    (0..p.len())
        .rev()
        .filter(|&i| p[i] > 0.0)
        .map(|i| llama_token_data { id: i as i32, logit: p[i].ln(), p: p[i] })
        .collect()
}

/// A target context on one thread: ggml's threads spin at every barrier, and
/// on a loaded machine two of them can take a hundred times longer than one.
pub fn target_1t(model: &Path, n_seq: u32, n_ctx: u32) -> Target {
    let t = Target::new(model, n_seq, n_ctx, 64);
    unsafe { sys::llama_set_n_threads(t.ctx, 1, 1) };
    t
}

/// Decodes `tokens` at positions from `pos` on sequence `seq`, every row with
/// logits or none.
pub fn decode_rows(target: &mut Target, seq: i32, tokens: &[i32], pos: i32, logits: bool) {
    let rows: Vec<TRow> =
        tokens.iter().enumerate().map(|(i, &token)| TRow { seq, token, pos: pos + i as i32, logits }).collect();
    target.decode(&rows);
}

/// Tokens per outcome: the first three a host emits after the prompt.
pub const DEPTH: usize = 3;
/// A prefix of an outcome is a bin of its own (split further) when its
/// target probability is at least this; the rest of its children share one bin.
const TAU: f64 = 0.02;
/// The distribution check may fail an honest engine with at most this probability.
const FAIL: f64 = 1e-9;

/// Target-only sampling after a fixed prompt, exactly: p of every prefix it
/// needs, from single-row decodes of a second context (memoized), and a
/// partition of the outcomes (first DEPTH tokens) into bins with their exact
/// probabilities: every prefix s with P(s) >= TAU is split by its next
/// token into the children with P >= TAU and one bin for all the others;
/// prefixes of DEPTH tokens are bins.
pub struct Reference {
    target: Target,
    /// The prompt but its last token, decoded once; the last token is the
    /// anchor (id_last) of every draft.
    n_ctx: i32,
    anchor: i32,
    t: f32,
    top_k: usize,
    pub memo: HashMap<Vec<i32>, Vec<f32>>,
    /// (prefix, is the "others" bin of that prefix) -> bin index
    bins: HashMap<(Vec<i32>, bool), usize>,
    pub probs: Vec<f64>,
}

impl Reference {
    pub fn new(model: &Path, prompt: &[i32], t: f32, top_k: usize) -> Reference {
        let mut target = target_1t(model, 1, 256);
        let n_ctx = prompt.len() as i32 - 1;
        decode_rows(&mut target, 0, &prompt[..n_ctx as usize], 0, false);
        let mut r = Reference {
            target,
            n_ctx,
            anchor: prompt[n_ctx as usize],
            t,
            top_k,
            memo: HashMap::new(),
            bins: HashMap::new(),
            probs: Vec::new(),
        };
        r.split(Vec::new(), 1.0);
        let total: f64 = r.probs.iter().sum();
        assert!((total - 1.0).abs() < 1e-9, "bins sum to {total}");
        r
    }

    /// The host's p after the prompt and `suffix`.
    pub fn p(&mut self, suffix: &[i32]) -> &[f32] {
        if !self.memo.contains_key(suffix) {
            let mut toks = vec![self.anchor];
            toks.extend_from_slice(suffix);
            decode_rows(&mut self.target, 0, &toks, self.n_ctx, true);
            let p = host_p(logits(&self.target, toks.len() - 1), self.t, self.top_k);
            self.target.seq_rm(0, self.n_ctx, -1);
            self.memo.insert(suffix.to_vec(), p);
        }
        &self.memo[suffix]
    }

    fn add_bin(&mut self, key: (Vec<i32>, bool), prob: f64) {
        self.bins.insert(key, self.probs.len());
        self.probs.push(prob);
    }

    fn split(&mut self, prefix: Vec<i32>, prob: f64) {
        if prefix.len() == DEPTH {
            return self.add_bin((prefix, false), prob);
        }
        let p = self.p(&prefix).to_vec();
        let mut rest = prob;
        for (x, &px) in p.iter().enumerate() {
            let child = prob * px as f64;
            if child >= TAU {
                rest -= child;
                let mut s = prefix.clone();
                s.push(x as i32);
                self.split(s, child);
            }
        }
        self.add_bin((prefix, true), rest.max(0.0));
    }

    /// The bin of an outcome that starts with `emitted`; its missing tokens are
    /// drawn from the target (only inside split prefixes, whose p is known).
    pub fn bin(&mut self, emitted: &[i32], rng: &mut Rng) -> usize {
        let mut s: Vec<i32> = Vec::with_capacity(DEPTH);
        loop {
            if let Some(&b) = self.bins.get(&(s.clone(), false)) {
                return b;
            }
            let x = match emitted.get(s.len()) {
                Some(&x) => x,
                None => {
                    let n_vocab = self.target.n_vocab;
                    sample(Dist::Dense(self.p(&s)), n_vocab, rng).unwrap()
                }
            };
            let mut child = s.clone();
            child.push(x);
            let is_bin = self.bins.contains_key(&(child.clone(), false));
            let is_split = self.bins.contains_key(&(child.clone(), true));
            if !is_bin && !is_split {
                return self.bins[&(s, true)];
            }
            s = child;
        }
    }

    /// The most an honest engine's total variation over these bins exceeds,
    /// with probability FAIL, after `n` samples: E[TV] <= 1/2 sum_i
    /// sqrt(P_i (1 - P_i) / n) (Jensen), and TV moves by at most 1/n per sample,
    /// so McDiarmid adds sqrt(ln(1/FAIL) / 2n).
    pub fn threshold(&self, n: usize) -> f64 {
        let n = n as f64;
        let mean: f64 = self.probs.iter().map(|&p| (p * (1.0 - p) / n).sqrt()).sum::<f64>() / 2.0;
        mean + ((1.0 / FAIL).ln() / (2.0 * n)).sqrt()
    }

    pub fn tv(&self, counts: &[usize]) -> f64 {
        let n: usize = counts.iter().sum();
        counts.iter().zip(&self.probs).map(|(&c, &p)| (c as f64 / n as f64 - p).abs()).sum::<f64>() / 2.0
    }
}
