//! Tree drafts through the C API on real libllama: a host verifies each
//! sequence's tree in one target batch with the multi-sequence encoding (one
//! sequence id per root-to-leaf path, a unified KV cache), accepts the longest
//! greedy path and keeps only that path in the target's KV. The outputs are
//! target-only greedy's, token for token; a one-child tree is the chain draft;
//! bad calls are refused and change nothing.
//!
//! Token for token needs the target to round the same way in both runs. On the
//! CPU it does while every sequence's KV cells lie in position order: ggml's
//! flash attention skips masked cells but accumulates V in f16 in cell order.
//! A chain keeps that order (its rejected cells are the newest); a tree's
//! rejected cells lie between kept ones, and once freed the next rows reuse
//! them, out of order. The SmolLM2 tests therefore park each step's cells under
//! an unused sequence id (never freed, invisible to every query) to prove the
//! encoding exact, and measure the plain commit apart: where it leaves
//! target-only, it is at a near-tie. Likewise batches of 64+ rows take ggml's
//! tiled attention, so the 4-sequence SmolLM2 target decodes in ubatches of 32.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::ptr;

use common::spec::{Spec, Stream, default_params, generate, prefill};
use common::target::{DecodedRow, ERow, Target, argmax, greedy_reference};
use common::{fixtures, last_error, smollm2, status_code};
use dflash2::ffi::*;
use dflash2::sys;
use dflash2::tree::{KvOp, Node, Tree, accept_greedy};

// ---- the host's side -------------------------------------------------------

/// A target context with one KV stream for all sequences (kv_unified), as
/// tree verification needs, otherwise as the other tests make theirs.
fn unified_target(path: &Path, n_seq_max: u32, n_ctx: u32, n_batch: u32, n_ubatch: u32) -> Target {
    Target::with_params(path, |cp| {
        cp.n_ctx = n_ctx;
        cp.n_batch = n_batch;
        cp.n_ubatch = n_ubatch;
        cp.n_seq_max = n_seq_max;
        cp.kv_unified = true;
    })
}

/// A verify row with all its sequence ids; `owner` is the engine's sequence.
struct MRow {
    owner: i32,
    token: i32,
    pos: i32,
    seq_ids: Vec<i32>,
}

/// Decodes rows that may belong to several sequences, all with logits; the
/// engine is told each row once, under its owner. Returns each row's argmax.
fn decode_multi(t: &mut Target, rows: &[MRow]) -> Vec<i32> {
    let width = rows.iter().map(|r| r.seq_ids.len()).max().unwrap_or(1) as i32;
    unsafe {
        let mut b = sys::llama_batch_init(rows.len() as i32, 0, width);
        for (i, r) in rows.iter().enumerate() {
            *b.token.add(i) = r.token;
            *b.pos.add(i) = r.pos;
            *b.n_seq_id.add(i) = r.seq_ids.len() as i32;
            for (j, &id) in r.seq_ids.iter().enumerate() {
                *(*b.seq_id.add(i)).add(j) = id;
            }
            *b.logits.add(i) = 1;
        }
        b.n_tokens = rows.len() as i32;
        let rc = sys::llama_decode(t.ctx, b);
        sys::llama_batch_free(b);
        assert_eq!(rc, 0, "tree verify decode");
    }
    t.last_rows = rows.iter().map(|r| DecodedRow { seq: r.owner, pos: r.pos, embd: false, token: r.token }).collect();
    (0..rows.len())
        .map(|i| argmax(unsafe { std::slice::from_raw_parts(sys::llama_get_logits_ith(t.ctx, i as i32), t.n_vocab) }))
        .collect()
}

fn memory(t: &Target) -> sys::llama_memory_t {
    unsafe { sys::llama_get_memory(t.ctx) }
}

fn apply(t: &Target, ops: &[KvOp]) {
    for op in ops {
        unsafe {
            match *op {
                KvOp::SeqCp { src, dst, p0, p1 } => sys::llama_memory_seq_cp(memory(t), src, dst, p0, p1),
                KvOp::SeqRm { seq, p0, p1 } => assert!(sys::llama_memory_seq_rm(memory(t), seq, p0, p1)),
            }
        }
    }
}

fn pos_max(t: &Target, seq: i32) -> i32 {
    unsafe { sys::llama_memory_seq_pos_max(memory(t), seq) }
}

/// The user message in the model's chat template, as the bench tokenizes it.
fn tokenize_chat(t: &Target, message: &str) -> Vec<i32> {
    unsafe {
        let tmpl = sys::llama_model_chat_template(t.model.0, ptr::null());
        assert!(!tmpl.is_null(), "the target has a chat template");
        let (role, content) = (c"user", std::ffi::CString::new(message).unwrap());
        let msg = sys::llama_chat_message { role: role.as_ptr(), content: content.as_ptr() };
        let mut buf = vec![0u8; message.len() * 2 + 1024];
        let n = sys::llama_chat_apply_template(tmpl, &msg, 1, true, buf.as_mut_ptr().cast(), buf.len() as i32);
        assert!(n > 0 && (n as usize) < buf.len());
        t.tokenize(std::str::from_utf8(&buf[..n as usize]).unwrap(), false)
    }
}

// ---- the tree API ------------------------------------------------------------

type CNode = llama_spec_dflash2_tree_node;

fn request(seq: i32, id_last: i32, shape: Shape) -> llama_spec_dflash2_tree_request {
    llama_spec_dflash2_tree_request {
        seq_id: seq,
        id_last,
        n_nodes: shape.n_nodes,
        max_depth: 0,
        max_children: shape.max_children,
        max_leaves: shape.max_leaves,
        ..Default::default()
    }
}

fn try_draft_tree(spec: &Spec, reqs: &[llama_spec_dflash2_tree_request], room: i32) -> (i32, Vec<Vec<CNode>>) {
    let empty = CNode { token: -1, parent: -9, depth: -1, prob: -1.0, path_prob: -1.0 };
    let mut nodes = vec![empty; room.max(0) as usize];
    let mut n = vec![-1i32; reqs.len()];
    let rc = unsafe {
        llama_spec_dflash2_draft_tree(
            spec.0,
            reqs.as_ptr(),
            reqs.len() as i32,
            nodes.as_mut_ptr(),
            room,
            n.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return (rc, Vec::new());
    }
    let mut at = 0;
    let trees = n
        .iter()
        .map(|&k| {
            let t = nodes[at..at + k as usize].to_vec();
            at += k as usize;
            t
        })
        .collect();
    (rc, trees)
}

fn draft_tree(spec: &Spec, reqs: &[llama_spec_dflash2_tree_request]) -> Vec<Vec<CNode>> {
    let (rc, trees) = try_draft_tree(spec, reqs, 64 * reqs.len() as i32);
    assert_eq!(rc, 0, "draft_tree: {}", last_error());
    trees
}

/// The C nodes as the library's pure tree (checks the invariants on the way).
fn to_tree(nodes: &[CNode]) -> Tree {
    let nodes = nodes
        .iter()
        .map(|n| Node {
            token: n.token,
            parent: n.parent,
            depth: n.depth as usize,
            prob: n.prob,
            path_prob: n.path_prob,
            candidate: 0,
            ngram: 0,
        })
        .collect();
    Tree::from_nodes(nodes).expect("draft_tree returns a valid tree")
}

fn accept_tree(spec: &Spec, seq: i32, path: &[i32]) -> i32 {
    unsafe { llama_spec_dflash2_accept_tree(spec.0, seq, path.as_ptr(), path.len() as i32) }
}

/// llama_spec_dflash2_verify_tree_greedy: (status, emitted, path).
fn verify_tree(spec: &Spec, seq: i32, i_batch: &[i32], room: usize) -> (i32, Vec<i32>, Vec<i32>) {
    let mut out = vec![-1; room];
    let mut path = vec![-1; room.saturating_sub(1)];
    let mut n = -1;
    let rc = unsafe {
        llama_spec_dflash2_verify_tree_greedy(
            spec.0,
            seq,
            i_batch.as_ptr(),
            i_batch.len() as i32,
            out.as_mut_ptr(),
            room as i32,
            &mut n,
            path.as_mut_ptr(),
        )
    };
    if rc == 0 {
        out.truncate(n as usize);
        path.truncate(n as usize - 1);
    }
    (rc, out, path)
}

fn process_rows(spec: &Spec, rows: &[llama_spec_dflash2_row]) -> i32 {
    unsafe { llama_spec_dflash2_process(spec.0, rows.as_ptr(), rows.len() as i32) }
}

fn tree_kv_init(spec: &Spec, n_leaves: i32) -> i32 {
    unsafe { llama_spec_dflash2_tree_kv_init(spec.0, n_leaves) }
}

/// llama_spec_dflash2_tree_kv_rows with room for `room` rows and their ids:
/// (status, rows with their sequence ids).
fn tree_kv_rows(spec: &Spec, seq: i32, id_last: i32, n_past: i32, room: usize) -> (i32, Vec<(i32, i32, Vec<i32>)>) {
    let mut rows = vec![llama_spec_dflash2_tree_row::default(); room];
    let mut ids = vec![-1; room * room.max(1)];
    let mut n = -1;
    let rc = unsafe {
        llama_spec_dflash2_tree_kv_rows(
            spec.0,
            seq,
            id_last,
            n_past,
            rows.as_mut_ptr(),
            room as i32,
            ids.as_mut_ptr(),
            ids.len() as i32,
            &mut n,
        )
    };
    if rc != 0 {
        return (rc, Vec::new());
    }
    let rows = rows[..n as usize]
        .iter()
        .map(|r| {
            let first = r.seq_id_first as usize;
            (r.token, r.pos, ids[first..first + r.n_seq_id as usize].to_vec())
        })
        .collect();
    (rc, rows)
}

fn tree_kv_commit(spec: &Spec, seq: i32, path: &[usize]) -> i32 {
    let path: Vec<i32> = path.iter().map(|&i| i as i32).collect();
    unsafe { llama_spec_dflash2_tree_kv_commit(spec.0, seq, path.as_ptr(), path.len() as i32) }
}

/// Cells parked by the engine's bookkeeping, and whether any were freed.
fn tree_kv_parked(spec: &Spec) -> (i64, bool) {
    let (mut n, mut unparked) = (-1, true);
    assert_eq!(unsafe { llama_spec_dflash2_tree_kv_parked(spec.0, &mut n, &mut unparked) }, 0, "{}", last_error());
    (n, unparked)
}

// ---- the loop ---------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Shape {
    n_nodes: i32,
    max_children: i32,
    max_leaves: i32,
}

const DEFAULT: Shape = Shape { n_nodes: 0, max_children: 0, max_leaves: 0 };

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verify {
    /// The host's argmax and tree::accept_greedy, then accept_tree().
    Host,
    /// llama_spec_dflash2_verify_tree_greedy.
    Library,
}

/// What the trees looked like: nodes per depth, how often.
#[derive(Default)]
struct Shapes(BTreeMap<Vec<usize>, usize>);

impl Shapes {
    fn add(&mut self, tree: &Tree) {
        let depth = tree.nodes().iter().map(|n| n.depth).max().unwrap_or(0);
        let mut per = vec![0; depth];
        tree.nodes().iter().for_each(|n| per[n.depth - 1] += 1);
        *self.0.entry(per).or_default() += 1;
    }

    fn top(&self, n: usize) -> String {
        let mut v: Vec<_> = self.0.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        v.iter().take(n).map(|(s, c)| format!("{s:?} x{c}")).collect::<Vec<_>>().join(", ")
    }
}

/// How the host drives the trees.
#[derive(Clone, Copy)]
struct Host<'a> {
    /// Path ids per stream.
    pools: &'a [Vec<i32>],
    shape: Shape,
    verify: Verify,
    /// Some(id): before committing a step, every cell of its verify batch is
    /// also tagged with this otherwise unused sequence id, so no cell is ever
    /// freed and every sequence's cells stay in position order in the cache
    /// (see `reference`). None: the plain commit frees the rejected cells.
    park: Option<i32>,
    /// Target-only outputs per stream, to locate the first divergence.
    reference: Option<&'a [Vec<i32>]>,
    /// Who keeps the target's KV: the host (`Tree::kv_prepare`/`kv_commit`
    /// with `pools` and `park`) or the engine (llama_spec_dflash2_tree_kv_*,
    /// its own ids and park ids; `pools` and `park` unused).
    kv: Kv,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kv {
    Host,
    Engine,
}

/// Where a stream first left the reference: its output index and how far
/// the reference token's logit was below the row's maximum.
type Divergence = Option<(usize, f32)>;

/// Tree steps until every stream has `n_gen` tokens: one draft_tree call for
/// all active sequences, one verify batch, a greedy path accepted per
/// sequence, the target's KV cut to that path.
fn generate_trees(
    target: &mut Target,
    spec: &Spec,
    streams: &mut [Stream],
    n_gen: usize,
    host: Host,
    shapes: &mut Shapes,
) -> Vec<Divergence> {
    let mut diverged: Vec<Divergence> = vec![None; streams.len()];
    let n_streams = streams.len();
    loop {
        let active: Vec<usize> = (0..streams.len()).filter(|&i| streams[i].out.len() < n_gen).collect();
        if active.is_empty() {
            return diverged;
        }
        let reqs: Vec<_> = active.iter().map(|&i| request(streams[i].seq, streams[i].id_last, host.shape)).collect();
        let drafted = draft_tree(spec, &reqs);
        let trees: Vec<Tree> = drafted.iter().map(|n| to_tree(n)).collect();
        let mut rows = Vec::new();
        let mut first = Vec::new();
        for (k, &i) in active.iter().enumerate() {
            let (s, tree) = (&streams[i], &trees[k]);
            first.push(rows.len());
            if host.kv == Kv::Engine {
                let (rc, verify) = tree_kv_rows(spec, s.seq, s.id_last, s.n_past, tree.len() + 1);
                assert_eq!(rc, 0, "tree_kv_rows: {}", last_error());
                // the engine's rows are the encoding's, on its own ids
                let pool = engine_pool(n_streams, host.shape.max_leaves, s.seq);
                let want = tree.verify_rows(s.id_last, s.n_past, s.seq, &pool).unwrap();
                assert_eq!(verify.len(), want.len());
                for ((token, pos, seq_ids), w) in verify.into_iter().zip(want) {
                    assert_eq!((token, pos, &seq_ids), (w.token, w.pos, &w.seq_ids));
                    rows.push(MRow { owner: s.seq, token, pos, seq_ids });
                }
                continue;
            }
            let pool = &host.pools[i];
            assert!(tree.leaves().len() <= pool.len(), "a tree with more leaves than max_leaves");
            apply(target, &tree.kv_prepare(s.seq, pool).unwrap());
            for r in tree.verify_rows(s.id_last, s.n_past, s.seq, pool).unwrap() {
                rows.push(MRow { owner: s.seq, token: r.token, pos: r.pos, seq_ids: r.seq_ids });
            }
        }
        let argmaxes = decode_multi(target, &rows);
        spec.process(target);
        for (k, &i) in active.iter().enumerate() {
            let tree = &trees[k];
            shapes.add(tree);
            let s = &mut streams[i];
            let range = first[k]..first[k] + tree.len() + 1;
            let (path, tokens) = match host.verify {
                Verify::Host => {
                    let v = accept_greedy(tree, &argmaxes[range]).unwrap();
                    let path: Vec<i32> = v.path.iter().map(|&n| n as i32).collect();
                    assert_eq!(accept_tree(spec, s.seq, &path), 0, "accept_tree: {}", last_error());
                    (v.path, v.tokens)
                }
                Verify::Library => {
                    let i_batch: Vec<i32> = range.map(|r| r as i32).collect();
                    let (rc, out, path) = verify_tree(spec, s.seq, &i_batch, 65);
                    assert_eq!(rc, 0, "verify_tree_greedy: {}", last_error());
                    (path.iter().map(|&n| n as usize).collect(), out)
                }
            };
            if let (Some(want), None) = (host.reference.map(|r| &r[i]), diverged[i]) {
                let at = s.out.len();
                if let Some(j) = (0..tokens.len()).find(|&j| at + j < want.len() && tokens[j] != want[at + j]) {
                    let row = if j == 0 { first[k] } else { first[k] + path[j - 1] + 1 };
                    let logits = unsafe {
                        std::slice::from_raw_parts(sys::llama_get_logits_ith(target.ctx, row as i32), target.n_vocab)
                    };
                    diverged[i] = Some((at + j, logits[tokens[j] as usize] - logits[want[at + j] as usize]));
                }
            }
            let pool = if host.kv == Kv::Engine {
                let parked = tree_kv_parked(spec).0;
                assert_eq!(tree_kv_commit(spec, s.seq, &path), 0, "tree_kv_commit: {}", last_error());
                // every cell of the step is parked but the anchor's and the path's
                assert_eq!(tree_kv_parked(spec), (parked + (tree.len() - path.len()) as i64, false));
                let park = engine_park(n_streams, host.shape.max_leaves, s.seq);
                // (an earlier, deeper tree's parked cells may reach further)
                let deepest = s.n_past + tree.nodes().iter().map(|n| n.depth).max().unwrap_or(0) as i32;
                assert!(pos_max(target, park) >= deepest, "park id {park} lacks the step's cells");
                engine_pool(n_streams, host.shape.max_leaves, s.seq)
            } else {
                if let Some(park) = host.park {
                    for &id in std::iter::once(&s.seq).chain(&host.pools[i]) {
                        apply(target, &[KvOp::SeqCp { src: id, dst: park, p0: s.n_past, p1: -1 }]);
                    }
                }
                apply(target, &tree.kv_commit(&path, s.n_past, s.seq, &host.pools[i]).unwrap());
                host.pools[i].clone()
            };
            s.out.extend_from_slice(&tokens);
            s.n_past += tokens.len() as i32;
            s.id_last = *tokens.last().unwrap();
            // the target keeps the prefix and the accepted path, in seq only
            assert_eq!(pos_max(target, s.seq), s.n_past - 1);
            for &id in pool.iter().filter(|&&id| id != s.seq) {
                assert_eq!(pos_max(target, id), -1, "path id {id} still holds cells");
            }
        }
    }
}

/// Every stream's output is the reference, and the engine holds exactly the
/// committed rows.
fn check_lossless(spec: &Spec, streams: &[Stream], reference: &[Vec<i32>], n_gen: usize, what: &str) {
    for (s, want) in streams.iter().zip(reference) {
        assert_eq!(&s.out[..n_gen], &want[..n_gen], "{what}: seq {}", s.seq);
        let info = spec.info(s.seq);
        assert_eq!((info.n_held, info.n_outstanding), (0, -1), "{what}: seq {}", s.seq);
        assert_eq!(info.n_in_kv + info.n_queued, s.n_past, "{what}: seq {}", s.seq);
        assert_eq!(info.last_target_pos, s.n_past - 1, "{what}: seq {}", s.seq);
    }
}

/// The path ids and park id of sequence `seq` of `n_seq` in the engine's
/// bookkeeping for trees of `leaves` leaves (llama_spec_dflash2_tree_kv_seq_ids).
fn engine_pool(n_seq: usize, leaves: i32, seq: i32) -> Vec<i32> {
    let (n, l) = (n_seq as i32, leaves);
    std::iter::once(seq).chain((1..l).map(|j| n + seq * (l - 1) + (j - 1))).collect()
}

fn engine_park(n_seq: usize, leaves: i32, seq: i32) -> i32 {
    n_seq as i32 * leaves + seq
}

/// Path ids for `n_seq` sequences with `leaves` each, after the sequences'
/// own ids: even sequences reuse their own id as the first path's.
fn pools(n_seq: i32, leaves: i32) -> Vec<Vec<i32>> {
    (0..n_seq)
        .map(|s| {
            let fresh = (0..leaves).map(|j| n_seq + s * leaves + j);
            if s % 2 == 0 {
                std::iter::once(s).chain(fresh.take(leaves as usize - 1)).collect()
            } else {
                fresh.collect()
            }
        })
        .collect()
}

fn per_depth(st: &llama_spec_dflash2_stats, n: usize) -> String {
    (0..n)
        .map(|i| {
            let d = st.drafted_at[i];
            if d == 0 { "-".to_string() } else { format!("{:.0}%", 100.0 * st.accepted_at[i] as f64 / d as f64) }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn fixture_prompts(t: &Target) -> Vec<Vec<i32>> {
    ["the draft model is fast", "one two three", "code: a list of the", "it is not a block but a token and"]
        .iter()
        .map(|p| t.tokenize(p, true))
        .collect()
}

const N_GEN: usize = 40;

/// The library's greedy verification on the host's pools, each step's cells
/// parked under `park`, against target-only's outputs.
fn parked_exact<'a>(pools: &'a [Vec<i32>], shape: Shape, park: i32, reference: &'a [Vec<i32>]) -> Host<'a> {
    Host { pools, shape, verify: Verify::Library, park: Some(park), reference: Some(reference), kv: Kv::Host }
}

fn plain<'a>(pools: &'a [Vec<i32>], shape: Shape, verify: Verify) -> Host<'a> {
    Host { pools, shape, verify, park: None, reference: None, kv: Kv::Host }
}

// ---- lossless -------------------------------------------------------------

#[test]
fn fixture_pair_trees_are_lossless_on_one_sequence() {
    let fx = fixtures();
    const LEAVES: i32 = 6;
    let mut target = unified_target(&fx.target, 1 + LEAVES as u32, 1024, 512, 512);
    let prompts = fixture_prompts(&target);
    let reference = greedy_reference(&fx.target, &prompts, N_GEN);
    let shapes_tried = [
        DEFAULT,
        Shape { n_nodes: 6, max_children: 0, max_leaves: LEAVES },
        Shape { n_nodes: 8, max_children: 2, max_leaves: 3 },
    ];
    let mut branched = 0;
    for (p, (prompt, want)) in prompts.iter().zip(&reference).enumerate() {
        for (k, &shape) in shapes_tried.iter().enumerate() {
            target.seq_rm(-1, -1, -1);
            let spec = Spec::new(&target, &fx.drafter, default_params(1));
            let mut streams = prefill(&mut target, &spec, std::slice::from_ref(prompt));
            // fresh path ids, or the sequence's own id first
            let pool: Vec<i32> = if (p + k) % 2 == 0 { (1..=LEAVES).collect() } else { (0..LEAVES).collect() };
            let verify = if k == 1 { Verify::Library } else { Verify::Host };
            let mut shapes = Shapes::default();
            let pools = [pool];
            generate_trees(&mut target, &spec, &mut streams, N_GEN, plain(&pools, shape, verify), &mut shapes);
            check_lossless(&spec, &streams, std::slice::from_ref(want), N_GEN, &format!("{shape:?}"));
            branched += shapes.0.keys().filter(|s| s.iter().any(|&n| n > 1)).count();
            let st = spec.stats();
            assert!(st.n_drafted > 0 && st.n_verify_steps > 0);
        }
    }
    assert!(branched > 0, "no tree ever branched");
}

#[test]
fn fixture_pair_trees_are_lossless_on_four_interleaved_sequences() {
    let fx = fixtures();
    const LEAVES: i32 = 4;
    let mut target = unified_target(&fx.target, 4 + 4 * LEAVES as u32, 2048, 512, 512);
    let prompts = fixture_prompts(&target);
    let reference = greedy_reference(&fx.target, &prompts, N_GEN);
    let pools = pools(4, LEAVES);
    let shape = Shape { n_nodes: 6, max_children: 0, max_leaves: LEAVES };
    for (drafter, verify) in
        [(&fx.drafter, Verify::Host), (&fx.drafter_swa, Verify::Library), (&fx.drafter_own_head, Verify::Host)]
    {
        target.seq_rm(-1, -1, -1);
        let spec = Spec::new(&target, drafter, default_params(4));
        let mut streams = prefill(&mut target, &spec, &prompts);
        generate_trees(&mut target, &spec, &mut streams, N_GEN, plain(&pools, shape, verify), &mut Shapes::default());
        check_lossless(&spec, &streams, &reference, N_GEN, &drafter.display().to_string());
        for s in &streams {
            let info = spec.info(s.seq);
            assert_eq!((info.kv_pos_min, info.kv_pos_max), (0, info.n_in_kv - 1), "seq {}", s.seq);
        }
    }
}

/// The engine keeping the target's KV (llama_spec_dflash2_tree_kv_*, as the
/// bench and the server do): four interleaved sequences stay target-only
/// greedy, with every step's off-path cells parked and counted.
#[test]
fn fixture_pair_trees_are_lossless_with_the_engine_keeping_the_target_kv() {
    let fx = fixtures();
    const LEAVES: i32 = 4;
    let n_ids = llama_spec_dflash2_tree_kv_seq_ids(4, LEAVES);
    let mut target = unified_target(&fx.target, n_ids as u32, 2048, 512, 512);
    let prompts = fixture_prompts(&target);
    let reference = greedy_reference(&fx.target, &prompts, N_GEN);
    let shape = Shape { n_nodes: 6, max_children: 0, max_leaves: LEAVES };
    for verify in [Verify::Host, Verify::Library] {
        target.seq_rm(-1, -1, -1);
        let spec = Spec::new(&target, &fx.drafter, default_params(4));
        assert_eq!(tree_kv_init(&spec, LEAVES), 0, "{}", last_error());
        let mut streams = prefill(&mut target, &spec, &prompts);
        let host = Host { pools: &[], shape, verify, park: None, reference: Some(&reference), kv: Kv::Engine };
        let mut shapes = Shapes::default();
        let diverged = generate_trees(&mut target, &spec, &mut streams, N_GEN, host, &mut shapes);
        assert!(diverged.iter().all(Option::is_none), "{diverged:?}");
        check_lossless(&spec, &streams, &reference, N_GEN, "the engine's bookkeeping");
        assert!(shapes.0.keys().any(|s| s.iter().any(|&n| n > 1)), "no tree branched: {}", shapes.top(3));
        let (parked, unparked) = tree_kv_parked(&spec);
        assert!(parked > 0 && !unparked, "{parked} {unparked}");
        // emptying every sequence (mirrored to the engine) frees the parked cells too
        target.seq_rm(-1, -1, -1);
        spec.seq_rm(-1, -1, -1);
        assert_eq!(tree_kv_parked(&spec), (0, false));
        for k in 0..4 {
            assert_eq!(pos_max(&target, engine_park(4, LEAVES, k)), -1, "park id of sequence {k}");
        }
    }
}

/// A call was refused with `status` and a message naming `needle`.
fn refused(rc: i32, status: &str, needle: &str) {
    assert_eq!(rc, status_code(status), "{status} '{needle}': {}", last_error());
    assert!(last_error().contains(needle), "'{}' lacks '{needle}'", last_error());
}

/// The bookkeeping's calls refuse what they cannot do, with the reason, and
/// change nothing on the target.
#[test]
fn bad_tree_kv_calls_are_refused_and_change_nothing() {
    let fx = fixtures();
    const LEAVES: i32 = 3;
    assert_eq!(llama_spec_dflash2_tree_kv_seq_ids(2, LEAVES), 8);
    refused(llama_spec_dflash2_tree_kv_seq_ids(-1, LEAVES), "INVALID_ARGUMENT", "n_seq");
    // contexts that cannot hold the bookkeeping
    let short = unified_target(&fx.target, 7, 1024, 64, 64);
    let spec = Spec::new(&short, &fx.drafter, default_params(2));
    refused(tree_kv_init(&spec, LEAVES), "INVALID_ARGUMENT", "n_seq_max >= 8");
    refused(tree_kv_init(&spec, 0), "INVALID_ARGUMENT", "at least one leaf");
    drop(spec);
    let split = Target::with_params(&fx.target, |cp| {
        cp.n_ctx = 1024;
        cp.n_seq_max = 8;
        cp.kv_unified = false;
    });
    let spec = Spec::new(&split, &fx.drafter, default_params(2));
    refused(tree_kv_init(&spec, LEAVES), "INVALID_ARGUMENT", "not unified");
    drop(spec);

    let mut target = unified_target(&fx.target, 8, 1024, 64, 64);
    let prompts = fixture_prompts(&target);
    let spec = Spec::new(&target, &fx.drafter, default_params(2));
    let streams = prefill(&mut target, &spec, &prompts[..2]);
    let (id_last, n_past) = (streams[0].id_last, streams[0].n_past);
    refused(tree_kv_rows(&spec, 0, id_last, n_past, 8).0, "INVALID_STATE", "tree_kv_init");
    refused(tree_kv_commit(&spec, 0, &[]), "INVALID_STATE", "tree_kv_init");
    assert_eq!(tree_kv_init(&spec, LEAVES), 0, "{}", last_error());
    refused(tree_kv_rows(&spec, 0, id_last, n_past, 8).0, "INVALID_STATE", "no tree draft");
    refused(tree_kv_commit(&spec, 0, &[]), "INVALID_STATE", "no tree rows out");
    refused(tree_kv_rows(&spec, 9, id_last, n_past, 8).0, "UNKNOWN_SEQUENCE", "9");
    let shape = Shape { n_nodes: 6, max_children: 0, max_leaves: LEAVES };
    let tree = to_tree(&draft_tree(&spec, &[request(0, id_last, shape)])[0]);
    assert!(tree.leaves().len() > 1, "the fixture tree branches: {tree:?}");
    // too small a buffer: nothing tagged on the target
    refused(tree_kv_rows(&spec, 0, id_last, n_past, tree.len()).0, "BUFFER_TOO_SMALL", "verify rows");
    for id in engine_pool(2, LEAVES, 0).into_iter().skip(1) {
        assert_eq!(pos_max(&target, id), -1, "path id {id} was tagged");
    }
    let (rc, rows) = tree_kv_rows(&spec, 0, id_last, n_past, tree.len() + 1);
    assert_eq!(rc, 0, "{}", last_error());
    assert_eq!(rows.len(), tree.len() + 1);
    // the path ids now hold the prefix; the rows are out once
    for id in engine_pool(2, LEAVES, 0).into_iter().take(tree.leaves().len()) {
        assert_eq!(pos_max(&target, id), n_past - 1, "path id {id}");
    }
    refused(tree_kv_rows(&spec, 0, id_last, n_past, tree.len() + 1).0, "INVALID_STATE", "already handed out");
    refused(tree_kv_commit(&spec, 0, &[5, 0]), "INVALID_ARGUMENT", "not a path");
    // a removal through the anchor drops the tree and empties its path ids
    target.seq_rm(0, n_past, -1);
    spec.seq_rm(0, n_past, -1);
    for id in engine_pool(2, LEAVES, 0).into_iter().skip(1) {
        assert_eq!(pos_max(&target, id), -1, "path id {id} kept cells of a dropped tree");
    }
    refused(tree_kv_commit(&spec, 0, &[]), "INVALID_STATE", "no tree rows out");
    assert_eq!(tree_kv_parked(&spec), (0, false));
}

/// llama_spec_dflash2_tree_kv_pad with output slots: (status, row, seq id).
fn tree_kv_pad(spec: &Spec, n_rows: i32, n_rows_max: i32, seq_last: i32) -> (i32, llama_spec_dflash2_tree_row, i32) {
    let (mut row, mut id) = (llama_spec_dflash2_tree_row::default(), -1);
    // SAFETY: live engine, writable outputs.
    let rc = unsafe { llama_spec_dflash2_tree_kv_pad(spec.0, n_rows, n_rows_max, seq_last, &mut row, &mut id) };
    (rc, row, id)
}

/// The pad row goes where a decode's last ubatch would be one row over 512+
/// cells (llama pads 257+ to 512; sequence 1 holds 300) while the last row's
/// sequence alone holds fewer than 256: under that sequence's park id, right
/// after the cells it holds, so llama accepts it and it is parked as decoded;
/// nowhere else, and bad calls are refused.
#[test]
fn the_pad_row_goes_under_the_park_id_where_a_one_row_ubatch_would_split() {
    let fx = fixtures();
    const LEAVES: i32 = 3;
    let n_ids = llama_spec_dflash2_tree_kv_seq_ids(2, LEAVES);
    let mut target = unified_target(&fx.target, n_ids as u32, 2048, 512, 63);
    let short = target.tokenize("one two three", true);
    let long: Vec<i32> = short.iter().copied().cycle().take(300).collect();
    let spec = Spec::new(&target, &fx.drafter, default_params(2));
    let streams = prefill(&mut target, &spec, &[short.clone(), long]);
    refused(tree_kv_pad(&spec, 1, 512, 0).0, "INVALID_STATE", "tree_kv_init");
    assert_eq!(tree_kv_init(&spec, LEAVES), 0, "{}", last_error());
    refused(tree_kv_pad(&spec, 0, 512, 0).0, "INVALID_ARGUMENT", "empty batch");
    refused(tree_kv_pad(&spec, 1, 512, 99).0, "UNKNOWN_SEQUENCE", "99");
    let null = unsafe { llama_spec_dflash2_tree_kv_pad(spec.0, 1, 512, 0, ptr::null_mut(), ptr::null_mut()) };
    refused(null, "NULL_ARGUMENT", "row");
    // ubatches of two rows or more, or no room for the row: none
    assert_eq!(tree_kv_pad(&spec, 2, 512, 0).0, 0);
    assert_eq!(tree_kv_pad(&spec, 63, 512, 0).0, 0);
    assert_eq!(tree_kv_pad(&spec, 1, 1, 0).0, 0);
    // the last row's sequence holds 300 cells: target-only splits as well
    assert_eq!(tree_kv_pad(&spec, 1, 512, 1).0, 0);
    assert_eq!(tree_kv_parked(&spec), (0, false));
    let park = engine_park(2, LEAVES, 0);
    let (mut n_past, mut id_last) = (streams[0].n_past, streams[0].id_last);
    // the park id holds nothing yet: the row takes the sequence's next position
    let mut expect_pos = n_past;
    for step in 0..3 {
        let (rc, pad, id) = tree_kv_pad(&spec, 1, 512, 0);
        assert_eq!(rc, 1, "step {step}: {}", last_error());
        assert_eq!((id, pad.n_seq_id), (park, 1));
        assert_eq!(pad.pos, expect_pos, "step {step}: right after the park id's cells");
        let rows = [
            MRow { owner: 0, token: id_last, pos: n_past, seq_ids: vec![0] },
            MRow { owner: 0, token: pad.token, pos: pad.pos, seq_ids: vec![id] },
        ];
        let argmax = decode_multi(&mut target, &rows);
        target.last_rows.truncate(1); // the pad row is not the engine's
        spec.process(&target);
        assert_eq!(pos_max(&target, park), pad.pos, "the pad's cell is parked as decoded");
        assert_eq!(tree_kv_parked(&spec), (step + 1, false));
        (n_past, id_last) = (n_past + 1, argmax[0]);
        expect_pos = pad.pos + 1;
    }
    // 64 rows at ubatch 63 end in a one-row ubatch too
    let (rc, pad, _) = tree_kv_pad(&spec, 64, 512, 0);
    assert_eq!((rc, pad.pos), (1, expect_pos));
    // few cells: the one-row ubatch is not split
    target.seq_rm(1, -1, -1);
    spec.seq_rm(1, -1, -1);
    assert_eq!(tree_kv_pad(&spec, 1, 512, 0).0, 0);
    // a whole-sequence removal frees the parked pad cells with the rest
    target.seq_rm(0, -1, -1);
    spec.seq_rm(0, -1, -1);
    assert_eq!(tree_kv_parked(&spec), (0, false));
    assert_eq!(pos_max(&target, park), -1);
}

const SMOL_PROMPTS: [&str; 8] = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What is 48 multiplied by 12? Show the steps.",
    "Write a short paragraph about the history of the bicycle.",
    "List five fruits that are rich in vitamin C.",
    "Return a JSON object describing a book with title, author and year.",
    "Explain what a hash table is in two sentences.",
    "Write a C function that returns the maximum of an integer array.",
    "Give three tips for writing clear emails.",
];

/// The SmolLM2 tests take turns: several ggml thread pools spinning on two
/// cores at once slow each other down many times over.
static SMOLLM2: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    SMOLLM2.lock().unwrap_or_else(|e| e.into_inner())
}

fn trained_drafter() -> std::path::PathBuf {
    common::smollm2_drafter(&smollm2())
}

fn total(v: &[llama_spec_dflash2_stats]) -> llama_spec_dflash2_stats {
    let mut t = v[0];
    for s in &v[1..] {
        t.n_accepted += s.n_accepted;
        t.n_verify_steps += s.n_verify_steps;
        t.n_drafted += s.n_drafted;
        for i in 0..t.drafted_at.len() {
            t.drafted_at[i] += s.drafted_at[i];
            t.accepted_at[i] += s.accepted_at[i];
        }
    }
    t.tau = (t.n_accepted + t.n_verify_steps) as f64 / t.n_verify_steps as f64;
    t
}

/// SmolLM2 with the trained drafter, np = 1: trees of 7 nodes (8 verified
/// rows per step, as the chain of 7) are lossless; tau tree vs chain, per-depth
/// acceptance and the tree shapes are printed. Then the plain commit, which
/// frees rejected cells for reuse: where it leaves target-only, it is at a
/// near-tie of the target's own rounding.
#[test]
fn smollm2_trained_drafter_trees_are_lossless_tau_tree_vs_chain() {
    let _turn = one_at_a_time();
    // kept short for CI: `dflash2-bench --modes dflash2,dflash2-tree` measures tau on more
    const N: usize = 24;
    const LEAVES: i32 = 7;
    let target_path = smollm2();
    let drafter = trained_drafter();
    const PARK: i32 = LEAVES + 1; // after the path ids 0..=LEAVES
    let mut target = unified_target(&target_path, 2 + LEAVES as u32, 2048, 512, 512);
    let prompts: Vec<Vec<i32>> = SMOL_PROMPTS[..2].iter().map(|m| tokenize_chat(&target, m)).collect();
    let reference = greedy_reference(&target_path, &prompts, N);
    let shape = Shape { n_nodes: 7, max_children: 0, max_leaves: LEAVES };

    let (mut chain_stats, mut tree_stats, mut shapes, mut plain_runs) = (Vec::new(), Vec::new(), Shapes::default(), 0);
    for (p, (prompt, want)) in prompts.iter().zip(&reference).enumerate() {
        target.seq_rm(-1, -1, -1);
        let spec = Spec::new(&target, &drafter, default_params(1));
        assert_eq!(spec.n_max(), 7);
        let mut streams = prefill(&mut target, &spec, std::slice::from_ref(prompt));
        generate(&mut target, &spec, &mut streams, N, 7);
        assert_eq!(&streams[0].out[..N], &want[..], "chain, prompt {p}");
        chain_stats.push(spec.stats());
        drop(spec);

        for park in [Some(PARK), None] {
            if park.is_none() && p >= 1 {
                continue;
            }
            target.seq_rm(-1, -1, -1);
            target.seq_rm(PARK, -1, -1);
            let spec = Spec::new(&target, &drafter, default_params(1));
            let mut streams = prefill(&mut target, &spec, std::slice::from_ref(prompt));
            let pools = [if p % 2 == 0 { (0..LEAVES).collect() } else { (1..=LEAVES).collect::<Vec<i32>>() }];
            let verify = if p % 2 == 0 { Verify::Host } else { Verify::Library };
            let host =
                Host { pools: &pools, shape, verify, park, reference: Some(std::slice::from_ref(want)), kv: Kv::Host };
            let mut seen = Shapes::default();
            let diverged = generate_trees(&mut target, &spec, &mut streams, N, host, &mut seen)[0];
            if park.is_some() {
                assert_eq!(diverged, None, "prompt {p}");
                check_lossless(&spec, &streams, std::slice::from_ref(want), N, &format!("tree, prompt {p}"));
                tree_stats.push(spec.stats());
                shapes = Shapes(seen.0.into_iter().fold(shapes.0, |mut m, (k, v)| {
                    *m.entry(k).or_default() += v;
                    m
                }));
            } else {
                plain_runs += 1;
                eprintln!("  plain commit, prompt {p}: first divergence (index, logit margin) {diverged:?}");
                if let Some((_, margin)) = diverged {
                    assert!(margin < 0.5, "prompt {p}: a divergence that is no near-tie: {margin}");
                }
            }
        }
    }
    let (chain, tree) = (total(&chain_stats), total(&tree_stats));
    eprintln!("SmolLM2 + trained drafter, np 1, {} prompts x {N} tokens, 8 verified rows per step:", prompts.len());
    for (p, (c, t)) in chain_stats.iter().zip(&tree_stats).enumerate() {
        eprintln!("  prompt {p}: tau chain {:.3}  tree {:.3}", c.tau, t.tau);
    }
    eprintln!(
        "  tau chain {:.3} ({} steps), tree {:.3} ({} steps): {:.3}x",
        chain.tau,
        chain.n_verify_steps,
        tree.tau,
        tree.n_verify_steps,
        tree.tau / chain.tau
    );
    eprintln!("  acceptance by depth (accepted / drafted at that depth), chain: {}", per_depth(&chain, 7));
    eprintln!("  acceptance by depth (accepted / drafted at that depth), tree:  {}", per_depth(&tree, 7));
    eprintln!("  tree shapes (nodes per depth): {}", shapes.top(10));
    assert!(plain_runs == 1 && chain.tau >= 1.0 && tree.tau >= 1.0);
}

#[test]
fn smollm2_trained_drafter_trees_are_lossless_on_four_interleaved_sequences() {
    let _turn = one_at_a_time();
    const N: usize = 24;
    const LEAVES: i32 = 7;
    let target_path = smollm2();
    // ubatches below 64 rows: ggml's tiled CPU attention (64+ rows) rounds unlike one-row decodes
    const PARK: i32 = 4 + 4 * LEAVES; // after the sequences and their path ids
    let mut target = unified_target(&target_path, 1 + PARK as u32, 4096, 512, 32);
    let prompts: Vec<Vec<i32>> = SMOL_PROMPTS[..4].iter().map(|m| tokenize_chat(&target, m)).collect();
    let reference = greedy_reference(&target_path, &prompts, N);
    let spec = Spec::new(&target, &trained_drafter(), default_params(4));
    let mut streams = prefill(&mut target, &spec, &prompts);
    let pools = pools(4, LEAVES);
    let shape = Shape { n_nodes: 7, max_children: 0, max_leaves: LEAVES };
    let host = parked_exact(&pools, shape, PARK, &reference);
    let mut shapes = Shapes::default();
    let diverged = generate_trees(&mut target, &spec, &mut streams, N, host, &mut shapes);
    assert!(diverged.iter().all(Option::is_none), "{diverged:?}");
    check_lossless(&spec, &streams, &reference, N, "smollm2 np 4");
    let st = spec.stats();
    eprintln!("SmolLM2 np 4, trees of 7: tau {:.3}, by depth {}, shapes {}", st.tau, per_depth(&st, 7), shapes.top(4));
}

/// The largest trees a budget may pick, on the default f16 KV cache: 63 nodes
/// (64 verify rows) on one sequence, and 4 sequences x 32 nodes (132 rows) in
/// one verify batch. A target context whose ubatches stay below 64 rows
/// (`n_ubatch` 63, `-ub 63`) decodes every one of them on the attention path of
/// a one-row decode, so the outputs are target-only's token for token (the
/// host splitting nothing itself: llama_decode cuts the batch). With ubatches
/// of 512 both tests fail: the second prompt's 63-node trees leave target-only
/// at its 15th token (a logit gap of 0.067), and so do the four 32-node trees.
/// The target's KV is kept by the engine's bookkeeping (llama_spec_dflash2_tree_kv_*),
/// as the bench and the server keep it.
fn largest_trees_are_lossless(messages: &[&str], n_nodes: i32, leaves: i32, n_gen: usize) -> f64 {
    let n_seq = messages.len();
    let target_path = smollm2();
    let n_ids = llama_spec_dflash2_tree_kv_seq_ids(n_seq as i32, leaves);
    assert_eq!(n_ids, n_seq as i32 * (leaves + 1));
    let mut target = unified_target(&target_path, n_ids as u32, 4096, 512, 63);
    let prompts: Vec<Vec<i32>> = messages.iter().map(|m| tokenize_chat(&target, m)).collect();
    let reference = greedy_reference(&target_path, &prompts, n_gen);
    let spec = Spec::new(&target, &trained_drafter(), default_params(n_seq as u32));
    assert_eq!(tree_kv_init(&spec, leaves), 0, "tree_kv_init: {}", last_error());
    let mut streams = prefill(&mut target, &spec, &prompts);
    let shape = Shape { n_nodes, max_children: 0, max_leaves: leaves };
    let host =
        Host { pools: &[], shape, verify: Verify::Library, park: None, reference: Some(&reference), kv: Kv::Engine };
    let mut shapes = Shapes::default();
    let diverged = generate_trees(&mut target, &spec, &mut streams, n_gen, host, &mut shapes);
    assert!(diverged.iter().all(Option::is_none), "{diverged:?}");
    check_lossless(&spec, &streams, &reference, n_gen, &format!("smollm2 np {n_seq}, trees of {n_nodes}"));
    let st = spec.stats();
    assert!(st.n_drafted >= (n_nodes as u64) * st.n_verify_steps / 2, "the trees were not full: {st:?}");
    eprintln!(
        "SmolLM2 np {n_seq}, trees of {n_nodes}, f16 cache, ubatches of 63: tau {:.3}, shapes {}",
        st.tau,
        shapes.top(3)
    );
    st.tau
}

#[test]
fn smollm2_trees_of_63_nodes_are_lossless_on_the_f16_cache() {
    let _turn = one_at_a_time();
    for m in &SMOL_PROMPTS[..3] {
        largest_trees_are_lossless(&[m], 63, 16, 64);
    }
}

#[test]
fn smollm2_four_trees_of_32_nodes_in_one_batch_are_lossless_on_the_f16_cache() {
    let _turn = one_at_a_time();
    largest_trees_are_lossless(&SMOL_PROMPTS[..4], 32, 8, 24);
}

// ---- n-gram branches --------------------------------------------------------------

/// N-gram branches (params.ngram_branches, on by default): where the answer
/// copies the prompt, continuations of the text's earlier occurrences join
/// the trees; the target reaches and accepts them, the trees stay lossless,
/// and tau is at least that of the same trees without branches (0: none is
/// drafted).
#[test]
fn ngram_branches_follow_copied_text_losslessly() {
    let _turn = one_at_a_time();
    const N: usize = 40;
    const LEAVES: i32 = 7;
    const PARK: i32 = LEAVES + 1;
    let target_path = smollm2();
    let drafter = trained_drafter();
    let mut target = unified_target(&target_path, 2 + LEAVES as u32, 2048, 512, 512);
    let prompt = tokenize_chat(
        &target,
        "Copy the following sentence three times: The red train leaves the old station at seven in the morning.",
    );
    let reference = greedy_reference(&target_path, std::slice::from_ref(&prompt), N);
    let shape = Shape { n_nodes: 7, max_children: 0, max_leaves: LEAVES };
    let mut taus = Vec::new();
    for branches in [0, 2] {
        target.seq_rm(-1, -1, -1);
        target.seq_rm(PARK, -1, -1);
        let spec =
            Spec::new(&target, &drafter, llama_spec_dflash2_params { ngram_branches: branches, ..default_params(1) });
        let mut streams = prefill(&mut target, &spec, std::slice::from_ref(&prompt));
        let pools = [(0..LEAVES).collect::<Vec<i32>>()];
        let host = parked_exact(&pools, shape, PARK, &reference);
        let diverged = generate_trees(&mut target, &spec, &mut streams, N, host, &mut Shapes::default());
        assert_eq!(diverged[0], None, "{branches} branches");
        check_lossless(&spec, &streams, &reference, N, &format!("{branches} n-gram branches"));
        let st = spec.stats();
        eprintln!(
            "  {branches} n-gram branches: tau {:.3}, n-gram nodes {} reached {} accepted {}",
            st.tau, st.n_ngram_nodes, st.n_ngram_reached, st.n_ngram_accepted
        );
        if branches == 0 {
            assert_eq!((st.n_ngram_nodes, st.n_ngram_reached, st.n_ngram_accepted), (0, 0, 0));
        } else {
            assert!(st.n_ngram_accepted > 0 && st.n_ngram_reached >= st.n_ngram_accepted, "{st:?}");
            assert!(st.n_ngram_nodes >= st.n_ngram_reached);
        }
        taus.push(st.tau);
    }
    assert!(taus[1] > taus[0], "tau with branches {:.3} below without {:.3}", taus[1], taus[0]);
}

// ---- the chain is a one-child tree ----------------------------------------------

/// At every step: the chain draft, dropped again (seq_rm from its anchor), then
/// one-child trees from the same state: the same tokens, parent to child.
#[test]
fn a_one_child_tree_is_the_chain_draft() {
    let _turn = one_at_a_time();
    const N: usize = 24;
    let target_path = smollm2();
    const PARK: i32 = 7;
    let mut target = unified_target(&target_path, 8, 2048, 512, 512);
    let prompts: Vec<Vec<i32>> = SMOL_PROMPTS[..1].iter().map(|m| tokenize_chat(&target, m)).collect();
    let reference = greedy_reference(&target_path, &prompts, N);
    let pools = [(0..7).collect::<Vec<i32>>()];
    let host =
        Host { pools: &pools, shape: DEFAULT, verify: Verify::Host, park: Some(PARK), reference: None, kv: Kv::Host };
    let mut compared = 0;
    for (prompt, want) in prompts.iter().zip(&reference) {
        target.seq_rm(-1, -1, -1);
        target.seq_rm(PARK, -1, -1);
        let spec = Spec::new(&target, &trained_drafter(), default_params(1));
        let mut streams = prefill(&mut target, &spec, std::slice::from_ref(prompt));
        while streams[0].out.len() < N {
            let (seq, id_last, n_past) = (streams[0].seq, streams[0].id_last, streams[0].n_past);
            for n_max in [7, 4] {
                let chain = spec.draft(&[llama_spec_dflash2_draft_request {
                    seq_id: seq,
                    id_last,
                    n_max,
                    ..Default::default()
                }]);
                spec.seq_rm(seq, n_past, -1); // drops the chain draft: nothing of it was decoded
                for shape in [
                    Shape { n_nodes: n_max, max_children: 1, max_leaves: 0 },
                    Shape { n_nodes: n_max, max_children: 0, max_leaves: 1 },
                ] {
                    let tree = draft_tree(&spec, &[request(seq, id_last, shape)]).remove(0);
                    let tokens: Vec<i32> = tree.iter().map(|n| n.token).collect();
                    assert_eq!(tokens, chain[0], "{shape:?}");
                    for (i, n) in tree.iter().enumerate() {
                        assert_eq!((n.parent, n.depth), (i as i32 - 1, i as i32 + 1));
                        assert!(n.prob > 0.0 && n.prob <= 1.0);
                    }
                    spec.seq_rm(seq, n_past, -1);
                    compared += 1;
                }
            }
            // one tree step to move on
            let n_gen = streams[0].out.len() + 1;
            generate_trees(&mut target, &spec, &mut streams, n_gen, host, &mut Shapes::default());
        }
        check_lossless(&spec, &streams, std::slice::from_ref(want), N, "one-child");
    }
    // 4 comparisons per step, a few steps whatever the acceptance
    assert!(compared >= 8, "{compared}");
}

/// On a target context whose KV cache is split per sequence (not kv_unified),
/// a tree cannot be verified in one batch: trees come back as chains.
#[test]
fn trees_are_chains_when_the_target_cannot_verify_them() {
    let fx = fixtures();
    let mut target = Target::new(&fx.target, 4, 2048, 512); // kv_unified only for one sequence
    let prompts = fixture_prompts(&target);
    let reference = greedy_reference(&fx.target, &prompts, N_GEN);
    let spec = Spec::new(&target, &fx.drafter, default_params(4));
    let mut streams = prefill(&mut target, &spec, &prompts);
    let pools: Vec<Vec<i32>> = (0..4).map(|s| vec![s]).collect();
    let mut shapes = Shapes::default();
    let shape = Shape { n_nodes: 6, max_children: 0, max_leaves: 0 };
    generate_trees(&mut target, &spec, &mut streams, N_GEN, plain(&pools, shape, Verify::Library), &mut shapes);
    check_lossless(&spec, &streams, &reference, N_GEN, "split cache");
    assert!(shapes.0.keys().all(|s| s.iter().all(|&n| n == 1)), "{}", shapes.top(8));
}

/// A hybrid target (recurrent state per sequence, here the qwen35 fixture in
/// a unified cache) cannot branch: its trees come back as the chain draft.
#[test]
fn trees_are_chains_on_a_hybrid_target() {
    let fx = fixtures();
    let mut target = unified_target(&fx.qwen35_target, 4, 512, 128, 128);
    let prompt = target.tokenize("the draft model is fast and the list", true);
    let rows: Vec<ERow> = prompt
        .iter()
        .enumerate()
        .map(|(i, &t)| ERow {
            seq: 0,
            token: Some(t),
            embd: Vec::new(),
            pos: [i as i32; 4],
            logits: i + 1 == prompt.len(),
        })
        .collect();
    let spec = Spec::new(&target, &fx.qwen35_drafter, default_params(1));
    let id_last = target.decode_ext(&rows)[0];
    spec.process(&target);
    let n_past = prompt.len() as i32;
    let chain = spec.draft(&[llama_spec_dflash2_draft_request {
        seq_id: 0,
        id_last,
        n_max: spec.n_max(),
        ..Default::default()
    }]);
    spec.seq_rm(0, n_past, -1);
    assert!(!chain[0].is_empty(), "the fixture drafter drafts");
    for max_leaves in [0, 4] {
        let shape = Shape { n_nodes: spec.n_max(), max_children: 0, max_leaves };
        let tree = draft_tree(&spec, &[request(0, id_last, shape)]).remove(0);
        assert_eq!(tree.iter().map(|n| n.token).collect::<Vec<_>>(), chain[0]);
        assert!(tree.iter().enumerate().all(|(i, n)| n.parent == i as i32 - 1));
        spec.seq_rm(0, n_past, -1);
    }
}

// ---- misuse ---------------------------------------------------------------------

/// Every bad tree call is refused with a status and a message, and leaves the
/// engine as it was: the generation that follows is still target-only greedy.
#[test]
fn bad_tree_calls_are_refused_and_change_nothing() {
    let fx = fixtures();
    let mut target = unified_target(&fx.target, 5, 1024, 64, 64);
    let prompts = fixture_prompts(&target);
    let reference = greedy_reference(&fx.target, &prompts[..1], N_GEN);
    let spec = Spec::new(&target, &fx.drafter, default_params(1));
    let mut streams = prefill(&mut target, &spec, &prompts[..1]);
    let pool: Vec<i32> = (1..5).collect();
    let (seq, id_last, n_past) = (0, streams[0].id_last, streams[0].n_past);
    let info = spec.info(seq);
    let unchanged = |want: &llama_spec_dflash2_seq_info| assert_eq!(&spec.info(seq), want);

    // no draft at all
    refused(accept_tree(&spec, seq, &[]), "INVALID_STATE", "no draft");
    refused(verify_tree(&spec, seq, &[0], 8).0, "INVALID_STATE", "no tree");
    unchanged(&info);
    // a chain draft is not a tree (the draft call injects the prompt's rows first)
    let chain =
        spec.draft(&[llama_spec_dflash2_draft_request { seq_id: seq, id_last, n_max: 3, ..Default::default() }]);
    assert!(!chain[0].is_empty());
    let with_chain = spec.info(seq);
    refused(accept_tree(&spec, seq, &[]), "INVALID_STATE", "chain");
    refused(verify_tree(&spec, seq, &[0], 8).0, "INVALID_STATE", "chain");
    let r = request(seq, id_last, DEFAULT);
    refused(try_draft_tree(&spec, &[r], 16).0, "INVALID_STATE", "never accepted");
    unchanged(&with_chain);
    spec.seq_rm(seq, n_past, -1);
    let info = spec.info(seq);
    assert_eq!((info.n_outstanding, info.n_queued, info.n_in_kv), (-1, 0, n_past));

    // requests the target cannot hold, bad arguments, small buffers
    let shaped = |n_nodes, max_children, max_leaves| request(seq, id_last, Shape { n_nodes, max_children, max_leaves });
    refused(try_draft_tree(&spec, &[shaped(-1, 0, 0)], 16).0, "INVALID_ARGUMENT", "n_nodes -1");
    refused(try_draft_tree(&spec, &[shaped(0, -2, 0)], 16).0, "INVALID_ARGUMENT", "max_children -2");
    refused(try_draft_tree(&spec, &[shaped(6, 0, 6)], 16).0, "INVALID_ARGUMENT", "n_seq_max 5");
    refused(try_draft_tree(&spec, &[shaped(64, 0, 4)], 128).0, "INVALID_ARGUMENT", "n_batch 64");
    refused(try_draft_tree(&spec, &[shaped(6, 0, 4)], 5).0, "BUFFER_TOO_SMALL", "6");
    refused(try_draft_tree(&spec, &[shaped(0, 0, 4)], 2).0, "BUFFER_TOO_SMALL", "3");
    let mut bad = shaped(6, 0, 4);
    bad.id_last = -3;
    refused(try_draft_tree(&spec, &[bad], 16).0, "INVALID_ARGUMENT", "id_last");
    bad = shaped(6, 0, 4);
    bad.seq_id = 1;
    refused(try_draft_tree(&spec, &[bad], 16).0, "UNKNOWN_SEQUENCE", "sequence 1");
    // a sequence twice is two requests for this engine of one sequence: the count is refused first
    // (engine_tree_sampled checks "twice" on four sequences)
    let twice = [shaped(2, 0, 4), shaped(2, 0, 4)];
    refused(try_draft_tree(&spec, &twice, 16).0, "INVALID_ARGUMENT", "2 requests for an engine of 1");
    let mut n = [0i32];
    let rc = unsafe { llama_spec_dflash2_draft_tree(spec.0, ptr::null(), 1, ptr::null_mut(), 0, n.as_mut_ptr()) };
    refused(rc, "NULL_ARGUMENT", "requests");
    // more requests than the engine's sequences: a bad count, refused before the array is read
    let rc = unsafe { llama_spec_dflash2_draft_tree(spec.0, ptr::null(), 2, ptr::null_mut(), 0, n.as_mut_ptr()) };
    refused(rc, "INVALID_ARGUMENT", "2 requests for an engine of 1");
    unchanged(&info);

    // a tree that branches
    let tree = draft_tree(&spec, &[shaped(8, 0, 4)]).remove(0);
    let t = to_tree(&tree);
    let deep = (0..t.len()).find(|&i| t.nodes()[i].depth == 2).expect("a node at depth 2") as i32;
    let top = tree[deep as usize].parent;
    let sibling = (0..t.len() as i32).find(|&i| i != top && tree[i as usize].parent == -1);
    assert!(t.leaves().len() > 1 && sibling.is_some(), "the fixture drafter's tree branches: {tree:?}");
    let with_tree = spec.info(seq);
    assert_eq!((with_tree.n_outstanding, with_tree.n_held), (tree.len() as i32, 0));
    refused(try_draft_tree(&spec, &[r], 16).0, "INVALID_STATE", "accept_tree");
    refused(unsafe { llama_spec_dflash2_accept(spec.0, seq, 0) }, "INVALID_STATE", "llama_spec_dflash2_accept_tree");
    let mut out = [0i32; 8];
    let mut n_out = 0;
    let rc = unsafe { llama_spec_dflash2_verify_greedy(spec.0, seq, [0].as_ptr(), 1, out.as_mut_ptr(), 8, &mut n_out) };
    refused(rc, "INVALID_STATE", "verify_tree_greedy");
    refused(accept_tree(&spec, seq, &[]), "INVALID_STATE", "process() received 0");
    unchanged(&with_tree);

    // verify rows out of tree order: node `deep` sits at the anchor's position + 2
    let row = |i_batch: i32, pos: i32| llama_spec_dflash2_row { i_batch, seq_id: seq, pos, embd: false };
    let mut rows: Vec<_> = std::iter::once(row(0, n_past))
        .chain(tree.iter().enumerate().map(|(i, n)| row(i as i32 + 1, n_past + n.depth)))
        .collect();
    rows[deep as usize + 1].pos = n_past + 1;
    refused(process_rows(&spec, &rows), "INVALID_STATE", "anchor, node 0, node 1");
    refused(process_rows(&spec, &[row(0, n_past - 2)]), "INVALID_STATE", "anchor row");
    unchanged(&with_tree);

    // the real verify batch
    apply(&target, &t.kv_prepare(seq, &pool).unwrap());
    let vrows: Vec<MRow> = t
        .verify_rows(id_last, n_past, seq, &pool)
        .unwrap()
        .into_iter()
        .map(|r| MRow { owner: seq, token: r.token, pos: r.pos, seq_ids: r.seq_ids })
        .collect();
    let argmaxes = decode_multi(&mut target, &vrows);
    spec.process(&target);
    let held = spec.info(seq);
    assert_eq!(held.n_held, tree.len() as i32 + 1);
    refused(process_rows(&spec, &[row(0, n_past + 1)]), "INVALID_STATE", "awaiting accept()");
    let n = tree.len() as i32;
    refused(accept_tree(&spec, seq, &[n]), "INVALID_ARGUMENT", "not one of the tree's");
    refused(accept_tree(&spec, seq, &[-1]), "INVALID_ARGUMENT", "not one of the tree's");
    refused(accept_tree(&spec, seq, &[deep]), "INVALID_ARGUMENT", "not a path from the anchor");
    refused(accept_tree(&spec, seq, &[sibling.unwrap(), deep]), "INVALID_ARGUMENT", "not a child of node");
    refused(accept_tree(&spec, seq, &[top, top]), "INVALID_ARGUMENT", "not a child of node");
    let rc = unsafe { llama_spec_dflash2_accept_tree(spec.0, seq, ptr::null(), 2) };
    refused(rc, "NULL_ARGUMENT", "path");
    let rc = unsafe { llama_spec_dflash2_accept_tree(spec.0, seq, [0].as_ptr(), -1) };
    refused(rc, "INVALID_ARGUMENT", "negative");
    refused(unsafe { llama_spec_dflash2_accept_tree(spec.0, 3, ptr::null(), 0) }, "UNKNOWN_SEQUENCE", "sequence 3");
    let all: Vec<i32> = (0..=n).collect();
    refused(verify_tree(&spec, seq, &all[..n as usize], 8).0, "INVALID_ARGUMENT", "rows for a tree");
    let depth = tree.iter().map(|n| n.depth).max().unwrap() as usize;
    refused(verify_tree(&spec, seq, &all, depth).0, "BUFFER_TOO_SMALL", "may emit");
    let mut far = all.clone();
    far[1] = 64;
    refused(verify_tree(&spec, seq, &far, 8).0, "INVALID_ARGUMENT", "outside the target's batch");
    let (p_all, p_out) = (all.as_ptr(), out.as_mut_ptr());
    let rc = unsafe {
        llama_spec_dflash2_verify_tree_greedy(spec.0, seq, p_all, n + 1, p_out, 8, ptr::null_mut(), ptr::null_mut())
    };
    refused(rc, "NULL_ARGUMENT", "n_emitted");
    unchanged(&held);

    // and the right call still works, the path NULL; the loop goes on losslessly
    let mut n_emitted = 0;
    let rc = unsafe {
        llama_spec_dflash2_verify_tree_greedy(spec.0, seq, p_all, n + 1, p_out, 8, &mut n_emitted, ptr::null_mut())
    };
    assert_eq!(rc, 0, "{}", last_error());
    let v = accept_greedy(&t, &argmaxes).unwrap();
    assert_eq!(&out[..n_emitted as usize], &v.tokens[..]);
    apply(&target, &t.kv_commit(&v.path, n_past, seq, &pool).unwrap());
    let s = &mut streams[0];
    s.out.extend_from_slice(&v.tokens);
    s.n_past += v.tokens.len() as i32;
    s.id_last = *v.tokens.last().unwrap();
    let pools = [pool.clone()];
    generate_trees(
        &mut target,
        &spec,
        &mut streams,
        N_GEN,
        plain(&pools, DEFAULT, Verify::Host),
        &mut Shapes::default(),
    );
    check_lossless(&spec, &streams, &reference, N_GEN, "after the bad calls");
}

/// A seq_rm that takes any of a held tree's verify rows drops the whole tree
/// (its rows are nodes by index).
#[test]
fn a_removal_through_held_tree_rows_drops_the_tree() {
    let fx = fixtures();
    let mut target = unified_target(&fx.target, 5, 1024, 64, 64);
    let prompts = fixture_prompts(&target);
    let spec = Spec::new(&target, &fx.drafter, default_params(1));
    let streams = prefill(&mut target, &spec, &prompts[1..2]);
    let pool: Vec<i32> = (1..5).collect();
    let (seq, id_last, n_past) = (0, streams[0].id_last, streams[0].n_past);
    let shape = Shape { n_nodes: 6, max_children: 0, max_leaves: 4 };
    for cut in [n_past + 2, n_past + 1] {
        let tree = draft_tree(&spec, &[request(seq, id_last, shape)]).remove(0);
        let t = to_tree(&tree);
        apply(&target, &t.kv_prepare(seq, &pool).unwrap());
        let rows: Vec<MRow> = t
            .verify_rows(id_last, n_past, seq, &pool)
            .unwrap()
            .into_iter()
            .map(|r| MRow { owner: seq, token: r.token, pos: r.pos, seq_ids: r.seq_ids })
            .collect();
        decode_multi(&mut target, &rows);
        spec.process(&target);
        assert_eq!(spec.info(seq).n_held, tree.len() as i32 + 1);
        assert!(tree.iter().any(|n| n_past + n.depth >= cut), "the fixture drafter's tree reaches depth 2: {tree:?}");
        spec.seq_rm(seq, cut, -1);
        let info = spec.info(seq);
        assert_eq!((info.n_outstanding, info.n_held), (-1, 0), "cut at {cut}");
        assert_eq!(accept_tree(&spec, seq, &[]), status_code("INVALID_STATE"));
        // the host drops the tree too
        apply(&target, &t.kv_commit(&[], n_past, seq, &pool).unwrap());
        target.seq_rm(seq, n_past, -1);
        assert_eq!(spec.stats().n_rejected_rows, 0);
    }
}
