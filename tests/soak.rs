//! Soak (issue 11 item 3): thousands of greedy speculative steps over 4
//! interleaved sequences on SmolLM2, with random seq_rm / seq_cp / context
//! shifts / state round trips and engine re-creation in between. A second,
//! target-only context mirrors every memory operation and generates each
//! sequence one token at a time: every emitted token must be its greedy token,
//! or (at most 1 in 1000) differ from it by a top-2 tie within ROUNDING_TIE —
//! verify batches have other shapes than the reference's, and ggml's CPU
//! kernels round per shape.
//! At the end the process RSS must be within 5% of the RSS after warm-up.
//!
//! Ignored by `cargo test` (it takes minutes); scripts/reliability.sh runs it:
//!
//!   DFLASH2_SOAK_STEPS=10000 cargo test --release --test soak -- --ignored --nocapture
//!
//! DFLASH2_SOAK_STEPS (default 500), DFLASH2_SOAK_SEED, DFLASH2_SOAK_THREADS,
//! DFLASH2_SOAK_REPORT (progress every N steps), DFLASH2_SOAK_DRAFTER
//! (default: a generated random-weight drafter for the target; the trained one
//! drafts longer accepted runs).

mod common;

use std::path::PathBuf;
use std::time::Instant;

use common::spec::{Spec, default_params};
use common::target::{TRow, Target, argmax};
use common::{last_error, smollm2};
use dflash2::ffi::*;
use dflash2::sys;

const N_SEQ: usize = 4;
/// Largest reference-logit gap a differing token may have to count as a
/// top-2 tie broken the other way by rounding (observed: 0.006).
const ROUNDING_TIE: f32 = 0.02;
/// A sequence starts over with a new prompt past this many positions.
const MAX_PAST: i32 = 640;
const PROMPTS: [&str; 6] = [
    "Write a Python function that reverses a string.",
    "What is 17 times 23? Explain step by step.",
    "List three colors and a fruit of each color.",
    "Explain in one sentence why the sky is blue.",
    "Write a short story about a robot learning to paint.",
    "Give a JSON object describing a book with title, author and year.",
];

/// xorshift64*: a reproducible stream without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Uniform in [lo, hi] (lo when hi < lo).
    fn range(&mut self, lo: i32, hi: i32) -> i32 {
        if hi <= lo { lo } else { lo + self.below((hi - lo + 1) as u64) as i32 }
    }
}

/// One sequence as host, speculative target and reference all see it: rows at
/// positions 0..n_past are decoded, `id_last` (at n_past) is not yet.
#[derive(Clone, Copy, Debug)]
struct Seq {
    n_past: i32,
    id_last: i32,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn mem(t: &Target) -> sys::llama_memory_t {
    unsafe { sys::llama_get_memory(t.ctx) }
}

fn ok(rc: i32, what: &str) {
    assert_eq!(rc, 0, "{what}: {}", last_error());
}

struct Soak {
    /// First: fields drop in order, and the engine must be freed before the
    /// target context it runs on (freed after it, its free read the freed
    /// context: a GGML_ASSERT abort after a failed soak).
    spec: Option<Spec>,
    spec_target: Target,
    reference: Target,
    drafter: PathBuf,
    seqs: Vec<Seq>,
    /// The tokens at positions 0..n_past of every sequence (the host's history).
    history: Vec<Vec<i32>>,
    prompts: Vec<Vec<i32>>,
    rng: Rng,
    /// Tokens checked against the reference, steps, and what was done in between.
    n_tokens: u64,
    n_steps: u64,
    ops: [u64; 6],
    margin_min: f32,
    /// Tokens equal to the reference's greedy token.
    n_identical: u64,
    /// Reference logit gaps of the tokens that differed by a rounding tie.
    ties: Vec<f32>,
    threads: i32,
}

fn params(threads: i32) -> llama_spec_dflash2_params {
    let mut p = default_params(N_SEQ as u32);
    p.n_threads = threads;
    p.n_threads_batch = threads;
    p
}

const OP_NAMES: [&str; 6] = ["seq_rm", "seq_cp", "shift", "state", "re-create", "restart"];

impl Soak {
    fn spec(&self) -> &Spec {
        self.spec.as_ref().unwrap()
    }

    /// Starts sequence `s` over with a random prompt on both targets.
    fn restart(&mut self, s: usize) {
        let p = self.prompts[self.rng.below(self.prompts.len() as u64) as usize].clone();
        let seq = s as i32;
        self.spec_target.seq_rm(seq, -1, -1);
        self.reference.seq_rm(seq, -1, -1);
        ok(unsafe { llama_spec_dflash2_seq_clear(self.spec().0, seq) }, "seq_clear");
        let rows: Vec<TRow> = p
            .iter()
            .enumerate()
            .map(|(i, &token)| TRow { seq, token, pos: i as i32, logits: i + 1 == p.len() })
            .collect();
        let first = self.spec_target.decode(&rows)[0];
        self.spec().process(&self.spec_target);
        let want = self.reference.decode(&rows)[0];
        assert_eq!(first, want, "first token of a prompt on seq {s}");
        self.seqs[s] = Seq { n_past: p.len() as i32, id_last: first };
        self.history[s] = p;
    }

    /// One speculative step for every sequence, checked token by token against
    /// the reference generating one token per sequence per decode.
    fn step(&mut self) {
        let n_max = self.spec().n_max();
        // draft lengths vary per sequence and step (1..=n_max): partial drafts
        // and uneven verify batches are exercised too, and a step costs fewer
        // verify rows, so 10,000 steps fit in a CI-machine hour
        let reqs: Vec<llama_spec_dflash2_draft_request> = (0..N_SEQ)
            .map(|s| llama_spec_dflash2_draft_request {
                seq_id: s as i32,
                id_last: self.seqs[s].id_last,
                n_max: self.rng.range(1, n_max),
                ..Default::default()
            })
            .collect();
        let drafts = self.spec().draft(&reqs);
        let mut rows = Vec::new();
        let mut first = Vec::new();
        for (s, d) in drafts.iter().enumerate() {
            let q = self.seqs[s];
            first.push(rows.len());
            rows.push(TRow { seq: s as i32, token: q.id_last, pos: q.n_past, logits: true });
            for (j, &t) in d.iter().enumerate() {
                rows.push(TRow { seq: s as i32, token: t, pos: q.n_past + 1 + j as i32, logits: true });
            }
        }
        let verdicts = self.spec_target.decode(&rows);
        self.spec().process(&self.spec_target);
        let mut emitted = Vec::new();
        for (s, d) in drafts.iter().enumerate() {
            let v = &verdicts[first[s]..first[s] + d.len() + 1];
            let n_acc = d.iter().zip(v).take_while(|(t, want)| t == want).count();
            self.spec().accept(s as i32, n_acc as i32);
            let keep = self.seqs[s].n_past + n_acc as i32 + 1;
            self.spec().seq_rm(s as i32, keep, -1);
            self.spec_target.seq_rm(s as i32, keep, -1);
            emitted.push(v[..=n_acc].to_vec());
        }
        self.check_with_reference(&emitted, &first);
        for (s, e) in emitted.iter().enumerate() {
            self.history[s].push(self.seqs[s].id_last);
            self.history[s].extend_from_slice(&e[..e.len() - 1]);
            self.seqs[s].n_past += e.len() as i32;
            self.seqs[s].id_last = *e.last().unwrap();
        }
        self.n_steps += 1;
    }

    /// The reference decodes one token per sequence per batch (target-only
    /// greedy decoding) for as many tokens as the step emitted.
    fn check_with_reference(&mut self, emitted: &[Vec<i32>], first: &[usize]) {
        let rounds = emitted.iter().map(Vec::len).max().unwrap();
        for r in 0..rounds {
            let live: Vec<usize> = (0..N_SEQ).filter(|&s| r < emitted[s].len()).collect();
            let rows: Vec<TRow> = live
                .iter()
                .map(|&s| TRow {
                    seq: s as i32,
                    token: if r == 0 { self.seqs[s].id_last } else { emitted[s][r - 1] },
                    pos: self.seqs[s].n_past + r as i32,
                    logits: true,
                })
                .collect();
            let greedy = self.reference.decode(&rows);
            for (k, &s) in live.iter().enumerate() {
                let logits = unsafe {
                    std::slice::from_raw_parts(
                        sys::llama_get_logits_ith(self.reference.ctx, k as i32),
                        self.reference.n_vocab,
                    )
                };
                let top = argmax(logits) as usize;
                let second =
                    logits.iter().enumerate().filter(|&(i, _)| i != top).fold(f32::NEG_INFINITY, |m, (_, &v)| m.max(v));
                let best = logits[top];
                self.margin_min = self.margin_min.min(best - second);
                let got = emitted[s][r];
                if std::env::var_os("DFLASH2_SOAK_TRACE").is_some() {
                    let spec_row = unsafe {
                        std::slice::from_raw_parts(
                            sys::llama_get_logits_ith(self.spec_target.ctx, (first[s] + r) as i32),
                            self.reference.n_vocab,
                        )
                    };
                    let spread = spec_row.iter().zip(logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                    if spread > 0.05 {
                        eprintln!(
                            "soak trace: step {} seq {s} pos {} spread {spread}",
                            self.n_steps,
                            self.seqs[s].n_past + r as i32
                        );
                    }
                }
                if got != greedy[k] {
                    // Verify rows are decoded in batches of other shapes than the
                    // reference's one-row-per-sequence batches, and ggml's CPU
                    // kernels round differently per shape: a top-2 tie can flip.
                    // Anything beyond rounding (a stale or missing KV cell) moves
                    // logits far more than ROUNDING_TIE.
                    let gap = best - logits[got as usize];
                    // the verify row's logits, to tell rounding (small spread over
                    // the whole vocabulary) from a wrong KV (large)
                    let spec_row = unsafe {
                        std::slice::from_raw_parts(
                            sys::llama_get_logits_ith(self.spec_target.ctx, (first[s] + r) as i32),
                            self.reference.n_vocab,
                        )
                    };
                    let spread = spec_row.iter().zip(logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                    assert!(
                        gap <= ROUNDING_TIE,
                        "step {} seq {s} token {r} at position {}: speculative {got} vs target-only {} \
                         (its reference logit is {gap} below the best; largest logit difference between the \
                         verify row and the reference row {spread})",
                        self.n_steps,
                        self.seqs[s].n_past + r as i32 + 1,
                        greedy[k],
                    );
                    self.ties.push(gap);
                } else {
                    self.n_identical += 1;
                }
                self.n_tokens += 1;
            }
        }
    }

    /// One random memory operation between steps, done alike on the host's
    /// bookkeeping, the speculative target, the engine and the reference.
    fn random_op(&mut self) {
        let s = self.rng.below(N_SEQ as u64) as usize;
        let seq = s as i32;
        let op = self.rng.below(OP_NAMES.len() as u64) as usize;
        self.ops[op] += 1;
        if std::env::var_os("DFLASH2_SOAK_TRACE").is_some() {
            eprintln!("soak trace: step {} {} on seq {s} (n_past {})", self.n_steps, OP_NAMES[op], self.seqs[s].n_past);
        }
        match op {
            // roll back to a random earlier position (into the prompt too): the
            // token decoded there becomes id_last again, and both targets
            // continue greedily from the same history
            0 => {
                let q = self.seqs[s];
                let cut = self.rng.range(q.n_past - 32, q.n_past).max(1);
                self.spec_target.seq_rm(seq, cut, -1);
                self.reference.seq_rm(seq, cut, -1);
                ok(unsafe { llama_spec_dflash2_seq_rm(self.spec().0, seq, cut, -1) }, "seq_rm");
                let id_last = if cut == q.n_past { q.id_last } else { self.history[s][cut as usize] };
                self.history[s].truncate(cut as usize);
                self.seqs[s] = Seq { n_past: cut, id_last };
            }
            // a whole sequence copied over another (a prompt-cache hit, n_cmpl > 1)
            1 => {
                let dst = (s + 1 + self.rng.below(N_SEQ as u64 - 1) as usize) % N_SEQ;
                for t in [&self.spec_target, &self.reference] {
                    unsafe {
                        sys::llama_memory_seq_rm(mem(t), dst as i32, -1, -1);
                        sys::llama_memory_seq_cp(mem(t), seq, dst as i32, -1, -1);
                    }
                }
                ok(unsafe { llama_spec_dflash2_seq_cp(self.spec().0, seq, dst as i32, -1, -1) }, "seq_cp");
                self.seqs[dst] = self.seqs[s];
                self.history[dst] = self.history[s].clone();
            }
            // a context shift: drop [keep, keep + discard), move the rest down
            2 => {
                let q = self.seqs[s];
                let keep = self.rng.range(4, q.n_past / 2);
                let discard = self.rng.range(1, (q.n_past - keep) / 2);
                if keep + discard >= q.n_past {
                    return;
                }
                for t in [&self.spec_target, &self.reference] {
                    unsafe {
                        assert!(sys::llama_memory_seq_rm(mem(t), seq, keep, keep + discard));
                        sys::llama_memory_seq_add(mem(t), seq, keep + discard, -1, -discard);
                    }
                }
                ok(unsafe { llama_spec_dflash2_seq_rm(self.spec().0, seq, keep, keep + discard) }, "shift rm");
                ok(unsafe { llama_spec_dflash2_seq_shift(self.spec().0, seq, keep + discard, -1, -discard) }, "shift");
                self.seqs[s].n_past -= discard;
                self.history[s].drain(keep as usize..(keep + discard) as usize);
            }
            // target state and engine blob saved, the sequence dropped, both
            // restored into a random sequence (the prompt cache, /slots save)
            3 => {
                let dst = self.rng.below(N_SEQ as u64) as i32;
                let blob = self.blob(seq);
                // the reference goes through the same target-state round trip:
                // the restored cells sit elsewhere in the cache than the reference's
                // cells would, and their order changes the CPU attention's rounding
                for t in [&self.spec_target, &self.reference] {
                    let target_state = unsafe {
                        let mut buf = vec![0u8; sys::llama_state_seq_get_size(t.ctx, seq)];
                        let n = sys::llama_state_seq_get_data(t.ctx, buf.as_mut_ptr(), buf.len(), seq);
                        assert_eq!(n, buf.len(), "target state of seq {seq}");
                        buf
                    };
                    let n = unsafe {
                        sys::llama_memory_seq_rm(mem(t), seq, -1, -1);
                        sys::llama_memory_seq_rm(mem(t), dst, -1, -1);
                        sys::llama_state_seq_set_data(t.ctx, target_state.as_ptr(), target_state.len(), dst)
                    };
                    assert_eq!(n, target_state.len(), "target state restored into seq {dst}");
                }
                ok(unsafe { llama_spec_dflash2_seq_clear(self.spec().0, seq) }, "seq_clear");
                self.restore(dst, &blob);
                let q = self.seqs[s];
                if dst != seq {
                    // the source is gone on the speculative side: start it over
                    self.seqs[dst as usize] = q;
                    self.history[dst as usize] = self.history[s].clone();
                    self.restart(s);
                }
            }
            // the engine freed and created again; every sequence carried over
            // in its state blob
            4 => {
                let blobs: Vec<Vec<u8>> = (0..N_SEQ as i32).map(|q| self.blob(q)).collect();
                self.spec = None;
                self.spec = Some(Spec::new(&self.spec_target, &self.drafter, params(self.threads)));
                for (q, b) in blobs.iter().enumerate() {
                    self.restore(q as i32, b);
                }
            }
            // a sequence starts over with a new prompt
            _ => self.restart(s),
        }
    }

    fn blob(&self, seq: i32) -> Vec<u8> {
        let spec = self.spec().0;
        let mut size = 0usize;
        ok(unsafe { llama_spec_dflash2_state_size(spec, seq, &mut size) }, "state_size");
        let mut blob = vec![0u8; size];
        let mut written = 0usize;
        ok(unsafe { llama_spec_dflash2_state_get(spec, seq, blob.as_mut_ptr(), size, &mut written) }, "state_get");
        blob.truncate(written);
        blob
    }

    fn restore(&self, seq: i32, blob: &[u8]) {
        ok(unsafe { llama_spec_dflash2_state_set(self.spec().0, seq, blob.as_ptr(), blob.len()) }, "state_set");
    }
}

fn drafter_for(target: &std::path::Path) -> PathBuf {
    if let Some(p) = std::env::var_os("DFLASH2_SOAK_DRAFTER") {
        return PathBuf::from(p);
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let drafter = dir.join("drafter.gguf");
    dflash2_fixtures::drafter_for_target(target, &drafter, &Default::default()).unwrap();
    drafter
}

#[test]
#[ignore = "minutes long: scripts/reliability.sh runs it (DFLASH2_SOAK_STEPS)"]
fn soak_speculative_steps_with_random_memory_operations_stay_lossless_and_flat() {
    let steps: u64 = env_or("DFLASH2_SOAK_STEPS", 500);
    let seed: u64 = env_or("DFLASH2_SOAK_SEED", 0x5eed_d1a5_u64);
    let target_path = smollm2();
    let drafter = drafter_for(&target_path);
    let spec_target = Target::new(&target_path, N_SEQ as u32, 4096, 512);
    let reference = Target::new(&target_path, N_SEQ as u32, 4096, 512);
    // DFLASH2_SOAK_THREADS (default 1): on a loaded machine, 1 avoids ggml's
    // threads spinning at barriers against each other
    let threads: i32 = env_or("DFLASH2_SOAK_THREADS", 1);
    for t in [&spec_target, &reference] {
        unsafe { sys::llama_set_n_threads(t.ctx, threads, threads) };
    }
    let prompts = PROMPTS.iter().map(|p| spec_target.tokenize(p, false)).collect();
    let spec = Spec::new(&spec_target, &drafter, params(threads));
    let mut soak = Soak {
        spec: Some(spec),
        spec_target,
        reference,
        drafter: drafter.clone(),
        seqs: vec![Seq { n_past: 0, id_last: 0 }; N_SEQ],
        history: vec![Vec::new(); N_SEQ],
        prompts,
        rng: Rng(seed | 1),
        n_tokens: 0,
        n_steps: 0,
        ops: [0; 6],
        margin_min: f32::INFINITY,
        n_identical: 0,
        ties: Vec::new(),
        threads,
    };
    for s in 0..N_SEQ {
        soak.restart(s);
    }
    // RSS still rises over the first ~150 steps (default seed, trained drafter:
    // 509 MB at 50 steps, 524 at 100, 553 at 150, 555 at 200): the reference point is
    // after that, however short the soak (reliability.sh --quick: 200 steps)
    let warm_up = (steps / 10).max(150).min(steps);
    let started = Instant::now();
    let mut rss_warm = 0;
    while soak.n_steps < steps {
        let n_max = soak.spec().n_max();
        for s in 0..N_SEQ {
            if soak.seqs[s].n_past + n_max + 1 > MAX_PAST {
                soak.restart(s);
            }
        }
        soak.step();
        if soak.rng.below(8) == 0 {
            soak.random_op();
        }
        if soak.n_steps == warm_up {
            rss_warm = rss_kib();
        }
        if soak.n_steps % env_or("DFLASH2_SOAK_REPORT", 1000u64) == 0 {
            eprintln!(
                "soak: {} steps, {}/{} tokens identical ({} rounding ties), RSS {} KiB, {:.0}s",
                soak.n_steps,
                soak.n_identical,
                soak.n_tokens,
                soak.ties.len(),
                rss_kib(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let rss_end = rss_kib();
    let st = soak.spec().stats();
    let ops: Vec<String> = OP_NAMES.iter().zip(soak.ops).map(|(n, c)| format!("{n} {c}")).collect();
    eprintln!(
        "soak result: {} speculative steps over {N_SEQ} sequences ({}), {}/{} tokens identical to target-only, \
         {} top-2 ties broken the other way by rounding (reference logit gaps {:?}), \
         smallest reference top-2 logit margin {:.4}; operations: {}; last engine tau {:.2}; \
         RSS after warm-up ({warm_up} steps) {rss_warm} KiB, at the end {rss_end} KiB ({:+.2}%); {:.0}s",
        soak.n_steps,
        drafter.display(),
        soak.n_identical,
        soak.n_tokens,
        soak.ties.len(),
        soak.ties,
        soak.margin_min,
        ops.join(", "),
        st.tau,
        (rss_end as f64 / rss_warm as f64 - 1.0) * 100.0,
        started.elapsed().as_secs_f64()
    );
    assert!(
        soak.ties.len() as u64 * 1000 <= soak.n_tokens.max(1000),
        "more than one rounding tie per 1000 tokens: {:?}",
        soak.ties
    );
    assert!(soak.ops.iter().all(|&c| c > 0) || steps < 200, "some operation never ran: {ops:?}");
    assert!(steps > warm_up, "{steps} steps: too few for the RSS check (it measures from step {warm_up})");
    assert!(
        rss_end as f64 <= rss_warm as f64 * 1.05,
        "RSS grew from {rss_warm} KiB after warm-up to {rss_end} KiB at the end"
    );
}
