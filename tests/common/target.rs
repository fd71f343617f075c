//! A target model and context in the linked libllama, driven the way a host
//! drives it: batches of (sequence, token, position, wants logits) rows.
#![allow(dead_code)]

use std::path::Path;

use dflash2::sys;

use super::Model;

/// One row of a target batch.
#[derive(Clone, Copy, Debug)]
pub struct TRow {
    pub seq: i32,
    pub token: i32,
    pub pos: i32,
    pub logits: bool,
}

/// One row of a target batch in the extended form: a token or an embedding
/// (an image row), with all four M-RoPE position sections.
#[derive(Clone, Debug)]
pub struct ERow {
    pub seq: i32,
    pub token: Option<i32>,
    pub embd: Vec<f32>,
    pub pos: [i32; 4],
    pub logits: bool,
}

/// What the engine is told about a decoded row.
#[derive(Clone, Copy, Debug)]
pub struct DecodedRow {
    pub seq: i32,
    pub pos: i32,
    pub embd: bool,
    /// The row's token (-1 for an embedding row).
    pub token: i32,
}

pub struct Target {
    pub model: Model,
    pub ctx: *mut sys::llama_context,
    pub n_vocab: usize,
    /// Rows of the last decode, for handing them to the engine.
    pub last_rows: Vec<DecodedRow>,
    /// Every decode() takes at least this long (sleeping the rest): a stand-in
    /// for a big memory-bound target, whose decode time hardly depends on its rows.
    pub min_decode: Option<std::time::Duration>,
}

impl Target {
    pub fn new(path: &Path, n_seq: u32, n_ctx: u32, n_batch: u32) -> Target {
        Target::with_rs_seq(path, n_seq, n_ctx, n_batch, 0)
    }

    /// `new` with `n_rs_seq` recurrent-state snapshots per sequence: how deep a
    /// recurrent or hybrid target can roll back after a decode (0 = not at all).
    pub fn with_rs_seq(path: &Path, n_seq: u32, n_ctx: u32, n_batch: u32, n_rs_seq: u32) -> Target {
        Target::with_params(path, |cp| {
            sized(cp, n_seq, n_ctx, n_batch);
            cp.n_rs_seq = n_rs_seq;
        })
    }

    /// A context on the model at `path` with 2 threads and what `configure` sets.
    pub fn with_params(path: &Path, configure: impl FnOnce(&mut sys::llama_context_params)) -> Target {
        Target::on_model(Model::load(path), configure)
    }

    /// A context with `n_seq` sequences on a model already loaded (placed on devices).
    pub fn with_model(model: Model, n_seq: u32, n_ctx: u32, n_batch: u32) -> Target {
        Target::on_model(model, |cp| sized(cp, n_seq, n_ctx, n_batch))
    }

    fn on_model(model: Model, configure: impl FnOnce(&mut sys::llama_context_params)) -> Target {
        unsafe {
            let mut cp = sys::llama_context_default_params();
            cp.n_threads = 2;
            cp.n_threads_batch = 2;
            configure(&mut cp);
            let ctx = sys::llama_init_from_model(model.0, cp);
            assert!(!ctx.is_null(), "target context");
            let n_vocab = sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(model.0)) as usize;
            Target { model, ctx, n_vocab, last_rows: Vec::new(), min_decode: None }
        }
    }

    /// Decodes the rows; returns the greedy token of every row that asked for logits, in order.
    pub fn decode(&mut self, rows: &[TRow]) -> Vec<i32> {
        let start = std::time::Instant::now();
        unsafe {
            let mut b = sys::llama_batch_init(rows.len() as i32, 0, 1);
            for (i, r) in rows.iter().enumerate() {
                *b.token.add(i) = r.token;
                *b.pos.add(i) = r.pos;
                *b.n_seq_id.add(i) = 1;
                **b.seq_id.add(i) = r.seq;
                *b.logits.add(i) = r.logits as i8;
            }
            b.n_tokens = rows.len() as i32;
            let rc = sys::llama_decode(self.ctx, b);
            sys::llama_batch_free(b);
            assert_eq!(rc, 0, "target decode");
            self.last_rows =
                rows.iter().map(|r| DecodedRow { seq: r.seq, pos: r.pos, embd: false, token: r.token }).collect();
        }
        if let Some(rest) = self.min_decode.and_then(|d| d.checked_sub(start.elapsed())) {
            std::thread::sleep(rest);
        }
        self.greedy_of(rows.iter().map(|r| r.logits))
    }

    fn greedy_of(&self, wants: impl Iterator<Item = bool>) -> Vec<i32> {
        let mut out = Vec::new();
        for (i, want) in wants.enumerate() {
            if want {
                let logits =
                    unsafe { std::slice::from_raw_parts(sys::llama_get_logits_ith(self.ctx, i as i32), self.n_vocab) };
                out.push(argmax(logits));
            }
        }
        out
    }

    /// Decodes extended rows (tokens or embeddings, 4 position sections) with
    /// llama_batch_ext; returns the greedy token of every row that asked for logits.
    pub fn decode_ext(&mut self, rows: &[ERow]) -> Vec<i32> {
        unsafe {
            let b = sys::llama_batch_ext_init(self.ctx);
            for r in rows {
                let idx = match r.token {
                    Some(t) => sys::llama_batch_ext_add_token(b, r.seq, t),
                    None => {
                        let e = sys::llama_embd { data: r.embd.as_ptr(), n_rows: 1, n_embd: r.embd.len() };
                        sys::llama_batch_ext_add_embd(b, r.seq, e)
                    }
                };
                assert!(idx >= 0, "batch add: {idx}");
                assert!(sys::llama_batch_ext_set_pos(b, idx, r.pos.as_ptr()));
                assert!(sys::llama_batch_ext_set_output_logits(b, idx, r.logits));
            }
            let rc = sys::llama_process(self.ctx, sys::LLAMA_PROCESS_TYPE_DECODE, b);
            sys::llama_batch_ext_free(b);
            assert_eq!(rc, 0, "target decode (ext)");
        }
        self.last_rows = rows
            .iter()
            .map(|r| DecodedRow { seq: r.seq, pos: r.pos[0], embd: r.token.is_none(), token: r.token.unwrap_or(-1) })
            .collect();
        self.greedy_of(rows.iter().map(|r| r.logits))
    }

    pub fn n_embd(&self) -> usize {
        unsafe { sys::llama_model_n_embd(self.model.0) as usize }
    }

    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) {
        unsafe {
            assert!(sys::llama_memory_seq_rm(sys::llama_get_memory(self.ctx), seq, p0, p1));
        }
    }

    pub fn tokenize(&self, text: &str, bos: bool) -> Vec<i32> {
        unsafe {
            let vocab = sys::llama_model_get_vocab(self.model.0);
            let mut toks = vec![0i32; text.len() + 8];
            let n = sys::llama_tokenize(
                vocab,
                text.as_ptr().cast(),
                text.len() as i32,
                toks.as_mut_ptr(),
                toks.len() as i32,
                bos,
                true,
            );
            assert!(n > 0);
            toks.truncate(n as usize);
            toks
        }
    }
}

/// A context of `n_ctx` cells for `n_seq` sequences (one KV stream each, unified
/// for one), batches of `n_batch` rows.
fn sized(cp: &mut sys::llama_context_params, n_seq: u32, n_ctx: u32, n_batch: u32) {
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_batch;
    cp.n_seq_max = n_seq;
    cp.kv_unified = n_seq == 1;
}

impl Drop for Target {
    fn drop(&mut self) {
        unsafe { sys::llama_free(self.ctx) }
    }
}

/// First maximum, like the host's greedy sampler.
pub fn argmax(v: &[f32]) -> i32 {
    let mut best = 0;
    for i in 1..v.len() {
        if v[i] > v[best] {
            best = i;
        }
    }
    best as i32
}

/// Target-only greedy generation of `n_gen` tokens after each prompt, one
/// sequence at a time (the reference output).
pub fn greedy_reference(path: &Path, prompts: &[Vec<i32>], n_gen: usize) -> Vec<Vec<i32>> {
    prompts
        .iter()
        .map(|prompt| {
            let mut t = Target::new(path, 1, 1024, 512);
            let rows: Vec<TRow> = prompt
                .iter()
                .enumerate()
                .map(|(i, &token)| TRow { seq: 0, token, pos: i as i32, logits: i + 1 == prompt.len() })
                .collect();
            let mut next = t.decode(&rows)[0];
            let mut out = vec![next];
            let mut pos = prompt.len() as i32;
            while out.len() < n_gen {
                next = t.decode(&[TRow { seq: 0, token: next, pos, logits: true }])[0];
                out.push(next);
                pos += 1;
            }
            out
        })
        .collect()
}
