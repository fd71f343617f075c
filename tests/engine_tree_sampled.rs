//! Sampled trees (tree requests with temperature > 0) verified losslessly
//! through the C API on real libllama: the first tokens a host emits with
//! dflash2's sampled trees are distributed exactly as target-only sampling
//! (binned total variation against the exact distribution, the approach of
//! tests/engine_sampling.rs), deliberately lossy hosts are caught by the same
//! check, SmolLM2 runs 4 interleaved sequences of sampled trees end to end,
//! the same seed gives the same output, and misuse gets a status and changes
//! nothing.

mod common;

use std::path::Path;
use std::ptr;

use common::reference::{DEPTH, Reference, cur_p, decode_rows, host_p, logits};
use common::spec::{Spec, Stream, default_params, prefill};
use common::target::{DecodedRow, Target};
use common::{fixtures, last_error, smollm2, status_code};
use dflash2::ffi::*;
use dflash2::sampling::{Dist, Rng, sample};
use dflash2::sys::{self, llama_token_data_array};
use dflash2::tree::{KvOp, Node, Tree};

// ---- the host's side -------------------------------------------------------

/// A target with one KV stream for all sequences (kv_unified, what tree
/// verification needs), on one thread.
fn unified_1t(path: &Path, n_seq_max: u32, n_ctx: u32, n_batch: u32) -> Target {
    Target::with_params(path, |cp| {
        cp.n_ctx = n_ctx;
        cp.n_batch = n_batch;
        cp.n_ubatch = n_batch.min(64);
        cp.n_seq_max = n_seq_max;
        cp.kv_unified = true;
        cp.n_threads = 1;
        cp.n_threads_batch = 1;
    })
}

fn params_1t(n_seq: u32) -> llama_spec_dflash2_params {
    llama_spec_dflash2_params { n_threads: 1, n_threads_batch: 1, ..default_params(n_seq) }
}

/// Decodes rows that may belong to several sequences, all with logits; the
/// engine is told each row once, under its owner (`owner`, `token`, `pos`, ids).
fn decode_multi(t: &mut Target, rows: &[(i32, i32, i32, Vec<i32>)]) {
    let width = rows.iter().map(|r| r.3.len()).max().unwrap_or(1) as i32;
    unsafe {
        let mut b = sys::llama_batch_init(rows.len() as i32, 0, width);
        for (i, (_, token, pos, ids)) in rows.iter().enumerate() {
            *b.token.add(i) = *token;
            *b.pos.add(i) = *pos;
            *b.n_seq_id.add(i) = ids.len() as i32;
            for (j, &id) in ids.iter().enumerate() {
                *(*b.seq_id.add(i)).add(j) = id;
            }
            *b.logits.add(i) = 1;
        }
        b.n_tokens = rows.len() as i32;
        let rc = sys::llama_decode(t.ctx, b);
        sys::llama_batch_free(b);
        assert_eq!(rc, 0, "tree verify decode");
    }
    t.last_rows = rows.iter().map(|r| DecodedRow { seq: r.0, pos: r.2, embd: false, token: r.1 }).collect();
}

fn apply(t: &Target, ops: &[KvOp]) {
    let mem = unsafe { sys::llama_get_memory(t.ctx) };
    for op in ops {
        unsafe {
            match *op {
                KvOp::SeqCp { src, dst, p0, p1 } => sys::llama_memory_seq_cp(mem, src, dst, p0, p1),
                KvOp::SeqRm { seq, p0, p1 } => assert!(sys::llama_memory_seq_rm(mem, seq, p0, p1)),
            }
        }
    }
}

fn pos_max(t: &Target, seq: i32) -> i32 {
    unsafe { sys::llama_memory_seq_pos_max(sys::llama_get_memory(t.ctx), seq) }
}

/// Path ids of sequence `s` of `n_seq`: its own id first, then fresh ones.
fn pool(s: i32, n_seq: i32, leaves: i32) -> Vec<i32> {
    std::iter::once(s).chain((0..leaves - 1).map(|j| n_seq + s * (leaves - 1) + j)).collect()
}

/// Adds a tree's verify rows (anchor first) to `rows`, tagging the prefix with
/// the path ids first; returns the index of the anchor's row.
fn add_tree_rows(
    target: &Target,
    rows: &mut Vec<(i32, i32, i32, Vec<i32>)>,
    tree: &Tree,
    s: &Stream,
    pool: &[i32],
) -> usize {
    apply(target, &tree.kv_prepare(s.seq, pool).unwrap());
    let first = rows.len();
    for r in tree.verify_rows(s.id_last, s.n_past, s.seq, pool).unwrap() {
        rows.push((s.seq, r.token, r.pos, r.seq_ids));
    }
    first
}

// ---- the API ------------------------------------------------------------------

type CNode = llama_spec_dflash2_tree_node;

#[derive(Clone, Copy, Debug)]
struct Shape {
    n_nodes: i32,
    max_depth: i32,
    max_leaves: i32,
}

fn request(seq: i32, id_last: i32, shape: Shape, t: f32, seed: u32) -> llama_spec_dflash2_tree_request {
    llama_spec_dflash2_tree_request {
        seq_id: seq,
        id_last,
        n_nodes: shape.n_nodes,
        max_depth: shape.max_depth,
        max_leaves: shape.max_leaves,
        temperature: t,
        seed,
        ..Default::default()
    }
}

fn try_draft_trees(spec: &Spec, reqs: &[llama_spec_dflash2_tree_request]) -> Result<Vec<Tree>, i32> {
    let room = 64 * reqs.len();
    let empty = CNode { token: -1, parent: -9, depth: -1, prob: -1.0, path_prob: -1.0 };
    let mut nodes = vec![empty; room];
    let mut n = vec![-1i32; reqs.len()];
    let rc = unsafe {
        llama_spec_dflash2_draft_tree(
            spec.0,
            reqs.as_ptr(),
            reqs.len() as i32,
            nodes.as_mut_ptr(),
            room as i32,
            n.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(rc);
    }
    let mut at = 0;
    Ok(n.iter()
        .map(|&k| {
            let t: Vec<Node> = nodes[at..at + k as usize]
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
            at += k as usize;
            Tree::from_nodes(t).expect("draft_tree returns a valid tree")
        })
        .collect())
}

fn draft_trees(spec: &Spec, reqs: &[llama_spec_dflash2_tree_request]) -> Vec<Tree> {
    try_draft_trees(spec, reqs).unwrap_or_else(|rc| panic!("draft_tree {rc}: {}", last_error()))
}

/// llama_spec_dflash2_verify_tree_sampled_step with `p` as cur_p: (child, token).
fn try_step(spec: &Spec, seq: i32, node: i32, p: &[f32]) -> Result<(i32, i32), i32> {
    let mut cands = cur_p(p);
    let arr = llama_token_data_array { data: cands.as_mut_ptr(), size: cands.len(), selected: -1, sorted: false };
    let (mut token, mut child) = (-7, -7);
    let rc = unsafe { llama_spec_dflash2_verify_tree_sampled_step(spec.0, seq, node, &arr, &mut token, &mut child) };
    if rc != 0 {
        return Err(rc);
    }
    Ok((child, token))
}

/// Node-by-node verification from the anchor with p of each row from `p_of`
/// (None: the anchor's); returns (path, emitted). No accept_tree().
fn verify_steps(spec: &Spec, seq: i32, mut p_of: impl FnMut(Option<usize>) -> Vec<f32>) -> (Vec<i32>, Vec<i32>) {
    let (mut path, mut emitted, mut node) = (Vec::new(), Vec::new(), -1);
    loop {
        let p = p_of(usize::try_from(node).ok());
        let (child, token) = try_step(spec, seq, node, &p).unwrap_or_else(|rc| panic!("step {rc}: {}", last_error()));
        emitted.push(token);
        if child < 0 {
            return (path, emitted);
        }
        path.push(child);
        node = child;
    }
}

/// llama_spec_dflash2_verify_tree_sampled (which accepts): (emitted, path).
fn try_verify_whole(
    spec: &Spec,
    seq: i32,
    p_rows: &[f32],
    n_rows: usize,
    n_vocab: usize,
    room: usize,
) -> Result<(Vec<i32>, Vec<i32>), i32> {
    let (mut out, mut path, mut n) = (vec![-1; room], vec![-1; room.saturating_sub(1)], -1);
    let rc = unsafe {
        llama_spec_dflash2_verify_tree_sampled(
            spec.0,
            seq,
            p_rows.as_ptr(),
            n_rows as i32,
            n_vocab as i32,
            out.as_mut_ptr(),
            room as i32,
            &mut n,
            path.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(rc);
    }
    out.truncate(n as usize);
    path.truncate(n as usize - 1);
    Ok((out, path))
}

fn accept_tree(spec: &Spec, seq: i32, path: &[i32]) -> i32 {
    unsafe { llama_spec_dflash2_accept_tree(spec.0, seq, path.as_ptr(), path.len() as i32) }
}

// ---- lossy hosts, from the same tree and the same p ---------------------------

/// Keeps the first child at every node down to a leaf, then samples p there.
fn accept_always(tree: &Tree, p_of: &mut dyn FnMut(Option<usize>) -> Vec<f32>, rng: &mut Rng) -> Vec<i32> {
    let mut at = None;
    while let Some(c) = tree.children(at).next() {
        at = Some(c);
    }
    let mut out = at.map_or(Vec::new(), |a| tree.tokens(&tree.path_to(a)));
    let p = p_of(at);
    out.push(sample(Dist::Dense(&p), p.len(), rng).unwrap());
    out
}

/// Tests each child against p itself (no residual update between siblings)
/// with the drawn-without-replacement q of the tree's own node probabilities,
/// and draws from p when all are rejected.
fn no_residual(tree: &Tree, p_of: &mut dyn FnMut(Option<usize>) -> Vec<f32>, rng: &mut Rng) -> Vec<i32> {
    let (mut at, mut out) = (None, Vec::new());
    'down: loop {
        let p = p_of(at);
        let mut used = 0.0f64;
        for c in tree.children(at).collect::<Vec<_>>() {
            let n = tree.nodes()[c];
            let q = n.prob as f64 / (1.0 - used).max(1e-12);
            used += n.prob as f64;
            if rng.next_f64() < (p[n.token as usize] as f64 / q).min(1.0) {
                out.push(n.token);
                at = Some(c);
                continue 'down;
            }
        }
        out.push(sample(Dist::Dense(&p), p.len(), rng).unwrap());
        return out;
    }
}

// ---- the distribution check ----------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Verify {
    /// The host decodes every tree's verify batch (multi-sequence encoding in
    /// a unified KV cache), passes it to process(), makes p of every row from
    /// its logits and calls llama_spec_dflash2_verify_tree_sampled (which
    /// accepts).
    Whole,
    /// The host makes p of each row of the accepted path lazily from the
    /// reference context (memoized by prefix) and calls
    /// llama_spec_dflash2_verify_tree_sampled_step; no verify batch is
    /// decoded and each sample is rolled back from the anchor on (which drops
    /// the tree without accept_tree), as the chain's test does.
    Steps,
}

/// Sequences drafting together: one draft call gives this many samples.
const N_PAR: usize = 16;
/// Path ids per sequence (max_leaves) in these checks.
const LEAVES: i32 = 4;
/// Trees of at most 6 nodes 2 deep: the first DEPTH = 3 emitted tokens are
/// what one tree step emits (up to 2 accepted nodes, then the residual or
/// bonus token), and the anchor gets several children to try in turn.
const SHAPE: Shape = Shape { n_nodes: 6, max_depth: 2, max_leaves: LEAVES };

struct Outcome {
    n: usize,
    threshold: f64,
    n_bins: usize,
    /// TV of the honest host, then of the lossy ones: keep the first child
    /// down to a leaf ("accept always"), redraw the emitted token from p
    /// instead of the residual ("resample p"), test siblings against p
    /// without the residual update ("no residual").
    tv: [f64; 4],
    /// Accepted nodes per tree, nodes per tree, share of trees where a node
    /// (or the anchor) has two children or more.
    accepted: f64,
    nodes: f64,
    branched: f64,
    /// Nodes per tree an n-gram branch proposed (taken without a draw).
    ngram_nodes: f64,
}

const HOSTS: [&str; 4] = ["honest", "accept always", "resample p", "no residual"];

/// `n` (rounded up to N_PAR) independent samples of the first DEPTH tokens
/// after `prompt` with sampled trees at temperature `t` (top-k `top_k`; 0 =
/// off). N_PAR sequences hold the same prompt; each round drafts a tree for
/// each in one call anchored at the prompt's last token, verifies, and rolls
/// every sequence back to the prompt (its generators carry on).
#[allow(clippy::too_many_arguments)]
fn speculate(
    model: &Path,
    drafter: &Path,
    prompt: &[i32],
    t: f32,
    top_k: usize,
    how: Verify,
    n: usize,
    seed: u32,
    first_child: i32,
) -> Outcome {
    assert_eq!(SHAPE.max_depth as usize + 1, DEPTH, "one tree step emits the tokens of an outcome");
    let clock = std::time::Instant::now();
    let mut reference = Reference::new(model, prompt, t, top_k);
    let n_ctx = prompt.len() as i32 - 1;
    let n_seq_max = N_PAR as u32 * LEAVES as u32;
    let mut target = unified_1t(model, n_seq_max, N_PAR as u32 * (n_ctx as u32 + 16) + 256, 512);
    let spec = Spec::new(&target, drafter, llama_spec_dflash2_params { first_child, ..params_1t(N_PAR as u32) });
    let anchor = prompt[n_ctx as usize];
    for s in 0..N_PAR as i32 {
        decode_rows(&mut target, s, &prompt[..n_ctx as usize], 0, false);
        spec.process(&target);
    }
    let n_vocab = target.n_vocab;
    let mut rng = Rng::new(u64::from(seed) + 1000); // the harness's own draws
    let n_bins = reference.probs.len();
    let mut counts = vec![vec![0usize; n_bins]; HOSTS.len()];
    let (mut n_accepted, mut n_nodes, mut n_branched) = (0usize, 0usize, 0usize);
    let stats0 = spec.stats();
    let rounds = n.div_ceil(N_PAR);
    let streams: Vec<Stream> =
        (0..N_PAR as i32).map(|s| Stream { seq: s, n_past: n_ctx, id_last: anchor, out: Vec::new() }).collect();
    for _ in 0..rounds {
        // a host that truncates p passes its truncation on: q is cut too (here also
        // by a min-p the host's p lacks: any q verifies losslessly)
        let reqs: Vec<_> = (0..N_PAR as i32)
            .map(|s| llama_spec_dflash2_tree_request {
                top_k: top_k as i32,
                min_p: if top_k > 0 { 0.2 } else { 0.0 },
                ..request(s, anchor, SHAPE, t, seed)
            })
            .collect();
        let trees = draft_trees(&spec, &reqs);
        // the host's p at a tree's row: the anchor's (None) or node i's
        let mut firsts = Vec::new();
        if how == Verify::Whole {
            let mut rows = Vec::new();
            for (s, tree) in trees.iter().enumerate() {
                firsts.push(add_tree_rows(
                    &target,
                    &mut rows,
                    tree,
                    &streams[s],
                    &pool(s as i32, N_PAR as i32, LEAVES),
                ));
            }
            decode_multi(&mut target, &rows);
            spec.process(&target);
        }
        for (s, tree) in trees.iter().enumerate() {
            let seq = s as i32;
            let rows_p: Vec<Vec<f32>> = match how {
                Verify::Whole => (0..=tree.len()).map(|r| host_p(logits(&target, firsts[s] + r), t, top_k)).collect(),
                Verify::Steps => Vec::new(),
            };
            let mut p_of = |row: Option<usize>| match how {
                Verify::Whole => rows_p[row.map_or(0, |i| i + 1)].clone(),
                Verify::Steps => reference.p(&row.map_or(Vec::new(), |i| tree.tokens(&tree.path_to(i)))).to_vec(),
            };
            let (path, emitted) = match how {
                Verify::Whole => {
                    let (e, p) = try_verify_whole(&spec, seq, &rows_p.concat(), tree.len() + 1, n_vocab, 8)
                        .unwrap_or_else(|rc| panic!("verify_tree_sampled {rc}: {}", last_error()));
                    (p, e)
                }
                Verify::Steps => verify_steps(&spec, seq, &mut p_of),
            };
            let path_nodes: Vec<usize> = path.iter().map(|&i| i as usize).collect();
            assert_eq!(emitted.len(), path.len() + 1);
            assert_eq!(tree.tokens(&path_nodes), emitted[..path.len()], "the path's tokens come first");
            assert!(
                !tree.children(path_nodes.last().copied()).any(|c| tree.nodes()[c].token == *emitted.last().unwrap()),
                "a rejected child is never the emitted token"
            );
            n_accepted += path.len();
            n_nodes += tree.len();
            n_branched +=
                (std::iter::once(None).chain((0..tree.len()).map(Some)).any(|a| tree.children(a).count() > 1)) as usize;
            let always = accept_always(tree, &mut p_of, &mut rng);
            let mut resample = emitted.clone();
            let last = p_of(path_nodes.last().copied());
            *resample.last_mut().unwrap() = sample(Dist::Dense(&last), n_vocab, &mut rng).unwrap();
            let plain = no_residual(tree, &mut p_of, &mut rng);
            for (c, e) in counts.iter_mut().zip([&emitted, &always, &resample, &plain]) {
                c[reference.bin(e, &mut rng)] += 1;
            }
            if how == Verify::Whole {
                target.seq_rm(seq, n_ctx, -1);
                for &id in &pool(seq, N_PAR as i32, LEAVES)[1..] {
                    target.seq_rm(id, -1, -1);
                }
            }
            spec.seq_rm(seq, n_ctx, -1);
        }
    }
    let st = spec.stats();
    if how == Verify::Whole {
        assert_eq!((st.n_accepted - stats0.n_accepted) as usize, n_accepted);
        assert_eq!((st.n_drafted - stats0.n_drafted) as usize, n_nodes);
    }
    let n = rounds * N_PAR;
    eprintln!(
        "  {n} samples, {n_bins} bins from {} reference decodes, {:.1}s",
        reference.memo.len(),
        clock.elapsed().as_secs_f64()
    );
    Outcome {
        n,
        threshold: reference.threshold(n),
        n_bins,
        tv: std::array::from_fn(|h| reference.tv(&counts[h])),
        accepted: n_accepted as f64 / n as f64,
        nodes: n_nodes as f64 / n as f64,
        branched: n_branched as f64 / n as f64,
        ngram_nodes: (st.n_ngram_nodes - stats0.n_ngram_nodes) as f64 / n as f64,
    }
}

/// Samples per check: 5000 (rounded up to N_PAR); DFLASH2_SAMPLING_SAMPLES
/// overrides it.
fn n_samples() -> usize {
    std::env::var("DFLASH2_SAMPLING_SAMPLES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000)
}

/// Asserts the honest host passes and the lossy hosts in `caught` fail.
fn check(what: &str, o: &Outcome, caught: &[usize]) {
    let tvs: Vec<String> = HOSTS.iter().zip(&o.tv).map(|(h, tv)| format!("{h} {tv:.4}")).collect();
    eprintln!(
        "{what}: {} samples, {} bins, threshold {:.4}: TV {}; {:.3} of {:.2} nodes accepted per tree ({:.2} from \
         n-gram branches), {:.0}% of trees branch",
        o.n,
        o.n_bins,
        o.threshold,
        tvs.join(", "),
        o.accepted,
        o.nodes,
        o.ngram_nodes,
        100.0 * o.branched
    );
    assert!(o.tv[0] < o.threshold, "{what}: sampled trees do not emit the target's distribution");
    assert!(o.branched > 0.5, "{what}: the trees hardly branch, the check says little about the tree rule");
    for &h in caught {
        assert!(o.tv[h] > o.threshold, "{what}: the check does not catch the '{}' host", HOSTS[h]);
    }
}

// The random fixture drafter's q hardly overlaps the target's p: most children
// are rejected, so these check the residual chain across siblings and the
// draws from it. The SmolLM2 pair below accepts often.

fn fixture_prompt() -> Vec<i32> {
    Target::new(&fixtures().target, 1, 64, 64).tokenize("one two three", true)
}

#[test]
fn fixture_pair_at_t_0_8_whole_trees_emit_the_target_distribution_and_an_accept_always_host_does_not() {
    let fx = fixtures();
    let o = speculate(&fx.target, &fx.drafter, &fixture_prompt(), 0.8, 0, Verify::Whole, n_samples(), 1, -1);
    check("fixture T=0.8 whole", &o, &[1]);
}

#[test]
fn fixture_pair_at_t_1_top_k_40_trees_by_steps_emit_the_target_distribution_and_an_accept_always_host_does_not() {
    let fx = fixtures();
    let o = speculate(&fx.target, &fx.drafter, &fixture_prompt(), 1.0, 40, Verify::Steps, n_samples(), 2, -1);
    check("fixture T=1.0 top-k 40 steps", &o, &[1]);
}

fn chat(question: &str) -> String {
    format!("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
}

#[test]
fn smollm2_trained_drafter_at_t_0_8_trees_emit_the_target_distribution_and_lossy_hosts_do_not() {
    let model = smollm2();
    let drafter = common::smollm2_drafter(&model);
    let prompt = Target::new(&model, 1, 64, 64).tokenize(&chat("What is the capital of France?"), false);
    let o = speculate(&model, &drafter, &prompt, 0.8, 0, Verify::Steps, n_samples(), 3, -1);
    check("smollm2 T=0.8 steps", &o, &[1, 2, 3]);
}

#[test]
fn smollm2_trained_drafter_with_greedy_first_children_emits_the_target_distribution_and_lossy_hosts_do_not() {
    // each parent's first child is q's most probable token, verified as a point mass
    let model = smollm2();
    let drafter = common::smollm2_drafter(&model);
    let prompt = Target::new(&model, 1, 64, 64).tokenize(&chat("What is the capital of France?"), false);
    let greedy = llama_spec_dflash2_first_child::LLAMA_SPEC_DFLASH2_FIRST_CHILD_GREEDY as i32;
    let o = speculate(&model, &drafter, &prompt, 0.8, 0, Verify::Whole, n_samples(), 4, greedy);
    check("smollm2 T=0.8 whole, greedy first children", &o, &[1, 2, 3]);
}

#[test]
fn smollm2_sampled_trees_with_n_gram_branches_emit_the_target_distribution_and_lossy_hosts_do_not() {
    // the prompt repeats itself: the suffix match proposes its continuation,
    // taken into each tree without a draw (a point mass) ahead of the draws
    let model = smollm2();
    let drafter = common::smollm2_drafter(&model);
    let text = "the cat sat on the mat, the dog lay by the door; the cat sat on the mat, the dog lay by the";
    let prompt = Target::new(&model, 1, 64, 64).tokenize(text, false);
    let o = speculate(&model, &drafter, &prompt, 0.8, 0, Verify::Steps, n_samples(), 5, -1);
    check("smollm2 T=0.8 steps, n-gram branches", &o, &[1, 2, 3]);
    assert!(o.ngram_nodes >= 1.0, "the trees carry n-gram branch nodes: {:.2} per tree", o.ngram_nodes);
}

// ---- end to end ---------------------------------------------------------------

/// Sampled tree steps until every stream has `n_gen` tokens: one draft_tree
/// call for all active sequences, one verify batch, each tree verified (even
/// sequences node by node, odd ones whole) against p = softmax(logits / t) of
/// its rows, the target's KV cut to the accepted path. Returns (steps,
/// accepted nodes).
fn generate_sampled_trees(
    target: &mut Target,
    spec: &Spec,
    streams: &mut [Stream],
    n_gen: usize,
    shape: Shape,
    t: f32,
    seed: u32,
) -> (usize, usize) {
    let n_seq = streams.len() as i32;
    let (mut steps, mut accepted) = (0, 0);
    loop {
        let active: Vec<usize> = (0..streams.len()).filter(|&i| streams[i].out.len() < n_gen).collect();
        if active.is_empty() {
            return (steps, accepted);
        }
        let reqs: Vec<_> =
            active.iter().map(|&i| request(streams[i].seq, streams[i].id_last, shape, t, seed + i as u32)).collect();
        let trees = draft_trees(spec, &reqs);
        let mut rows = Vec::new();
        let firsts: Vec<usize> = active
            .iter()
            .zip(&trees)
            .map(|(&i, tree)| {
                add_tree_rows(target, &mut rows, tree, &streams[i], &pool(i as i32, n_seq, shape.max_leaves))
            })
            .collect();
        decode_multi(target, &rows);
        spec.process(target);
        for (k, &i) in active.iter().enumerate() {
            let (tree, first) = (&trees[k], firsts[k]);
            let s = &mut streams[i];
            let p_row = |r: usize| host_p(logits(target, first + r), t, 0);
            let (path, emitted) = if s.seq % 2 == 0 {
                let (path, emitted) = verify_steps(spec, s.seq, |row| p_row(row.map_or(0, |i| i + 1)));
                assert_eq!(accept_tree(spec, s.seq, &path), 0, "accept_tree: {}", last_error());
                (path, emitted)
            } else {
                let p: Vec<f32> = (0..=tree.len()).flat_map(p_row).collect();
                let (e, path) = try_verify_whole(spec, s.seq, &p, tree.len() + 1, target.n_vocab, 65)
                    .unwrap_or_else(|rc| panic!("verify_tree_sampled {rc}: {}", last_error()));
                (path, e)
            };
            let path: Vec<usize> = path.iter().map(|&n| n as usize).collect();
            assert_eq!(tree.tokens(&path), emitted[..path.len()]);
            let pool = pool(s.seq, n_seq, shape.max_leaves);
            apply(target, &tree.kv_commit(&path, s.n_past, s.seq, &pool).unwrap());
            s.out.extend_from_slice(&emitted);
            s.n_past += emitted.len() as i32;
            s.id_last = *emitted.last().unwrap();
            assert_eq!(pos_max(target, s.seq), s.n_past - 1);
            for &id in &pool[1..] {
                assert_eq!(pos_max(target, id), -1, "path id {id} still holds cells");
            }
            steps += 1;
            accepted += path.len();
        }
    }
}

/// The engine holds exactly the committed rows of every stream.
fn check_settled(spec: &Spec, streams: &[Stream]) {
    for s in streams {
        let info = spec.info(s.seq);
        assert_eq!((info.n_held, info.n_outstanding), (0, -1), "seq {}", s.seq);
        assert_eq!(info.n_in_kv + info.n_queued, s.n_past, "seq {}", s.seq);
        assert_eq!(info.last_target_pos, s.n_past - 1, "seq {}", s.seq);
    }
}

const SMOL_PROMPTS: [&str; 4] = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What is 48 multiplied by 12? Show the steps.",
    "List five fruits that are rich in vitamin C.",
    "Explain what a hash table is in two sentences.",
];

/// SmolLM2 with the trained drafter, 4 interleaved sequences, trees of 7
/// nodes at T = 0.8: every step verifies and commits without error, the
/// drafter's nodes are accepted, and the same seeds give the same output.
#[test]
fn smollm2_sampled_trees_on_four_interleaved_sequences_accept_tokens_and_reproduce() {
    const N: usize = 32;
    let model = smollm2();
    let drafter = common::smollm2_drafter(&model);
    let shape = Shape { n_nodes: 7, max_depth: 0, max_leaves: 7 };
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut target = unified_1t(&model, 4 * 7, 4096, 512);
        let prompts: Vec<Vec<i32>> = SMOL_PROMPTS.iter().map(|q| target.tokenize(&chat(q), false)).collect();
        let spec = Spec::new(&target, &drafter, params_1t(4));
        let mut streams = prefill(&mut target, &spec, &prompts);
        let clock = std::time::Instant::now();
        let (steps, accepted) = generate_sampled_trees(&mut target, &spec, &mut streams, N, shape, 0.8, 11);
        check_settled(&spec, &streams);
        let st = spec.stats();
        let by_depth: Vec<String> = (0..7)
            .filter(|&i| st.drafted_at[i] > 0)
            .map(|i| format!("{:.0}%", 100.0 * st.accepted_at[i] as f64 / st.drafted_at[i] as f64))
            .collect();
        eprintln!(
            "smollm2 T=0.8 trees of 7, np 4: {steps} steps, {accepted} nodes accepted, tau {:.3} (engine {:.3}), \
             acceptance by depth {}, {:.1}s",
            (steps + accepted) as f64 / steps as f64,
            st.tau,
            by_depth.join(" "),
            clock.elapsed().as_secs_f64()
        );
        assert!(accepted > 0, "the trained drafter's nodes are never accepted");
        assert_eq!(st.n_accepted as usize, accepted);
        runs.push(streams.into_iter().map(|s| s.out).collect::<Vec<_>>());
    }
    assert_eq!(runs[0], runs[1], "the same seeds and calls give the same output");
}

/// The adaptive walk at T > 0 on the fixture pair: the controller sizes each
/// sampled tree (or drafts none: an empty tree still verifies its bonus token)
/// and the loop runs without error.
#[test]
fn fixture_pair_sampled_trees_with_the_adaptive_walk_run_without_error() {
    let fx = fixtures();
    let mut target = unified_1t(&fx.target, 4 * 4, 2048, 512);
    let prompts: Vec<Vec<i32>> = ["the draft model is fast", "one two three", "code: a list of the", "it is not a"]
        .iter()
        .map(|p| target.tokenize(p, true))
        .collect();
    let mut params = params_1t(4);
    params.walk = llama_spec_dflash2_walk::LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE as i32;
    let spec = Spec::new(&target, &fx.drafter, params);
    let mut streams = prefill(&mut target, &spec, &prompts);
    let shape = Shape { n_nodes: 6, max_depth: 0, max_leaves: 4 };
    let twice = [request(1, streams[1].id_last, shape, 1.0, 5), request(1, streams[1].id_last, shape, 1.0, 5)];
    refused(try_draft_trees(&spec, &twice), "INVALID_ARGUMENT", "sequence 1 appears twice");
    let (steps, _) = generate_sampled_trees(&mut target, &spec, &mut streams, 60, shape, 1.0, 5);
    check_settled(&spec, &streams);
    assert!(steps >= 4 * 10, "{steps}");
}

/// The host sampler's cut applies to q for sampled trees of up to 15 nodes,
/// not to bigger ones: with the host's top-k at 1, a 15-node tree is a chain
/// (q holds one candidate per parent), a 16-node one branches.
#[test]
fn the_host_samplers_cut_shapes_small_sampled_trees_only() {
    let params = llama_spec_dflash2_params { ngram_branches: 0, ..params_1t(1) };
    for (n_nodes, branched) in [(15, false), (16, true)] {
        let (_target, spec, s) = fixture_engine(params);
        let shape = Shape { n_nodes, max_depth: 2, max_leaves: LEAVES };
        let req = llama_spec_dflash2_tree_request { top_k: 1, ..request(s.seq, s.id_last, shape, 1.0, 3) };
        let tree = draft_trees(&spec, &[req]).remove(0);
        assert!(!tree.is_empty(), "{n_nodes} nodes");
        let widest = std::iter::once(None).chain((0..tree.len()).map(Some)).map(|a| tree.children(a).count()).max();
        assert_eq!(widest.unwrap_or(0) > 1, branched, "{n_nodes} nodes: {:?}", tree.nodes());
    }
}

/// By default a sampled tree of more than 15 nodes takes q's most probable
/// token as each parent's first child (the same token whatever the seed),
/// a smaller one draws it; params.first_child set says for every size.
#[test]
fn big_sampled_trees_take_qs_most_probable_token_first_by_default() {
    let drawn = llama_spec_dflash2_first_child::LLAMA_SPEC_DFLASH2_FIRST_CHILD_DRAWN as i32;
    for (first_child, n_nodes, fixed) in [(-1, 15, false), (-1, 16, true), (drawn, 16, false)] {
        let params = llama_spec_dflash2_params { ngram_branches: 0, first_child, ..params_1t(1) };
        let firsts: std::collections::BTreeSet<i32> = (1..=8)
            .map(|seed| {
                let (_target, spec, s) = fixture_engine(params);
                let shape = Shape { n_nodes, max_depth: 2, max_leaves: LEAVES };
                let tree = draft_trees(&spec, &[request(s.seq, s.id_last, shape, 1.0, seed)]).remove(0);
                let first = tree.children(None).next().expect("the anchor has a child");
                tree.nodes()[first].token
            })
            .collect();
        assert_eq!(firsts.len() == 1, fixed, "first_child {first_child}, {n_nodes} nodes: {firsts:?}");
    }
}

// ---- the contract -----------------------------------------------------------------

fn refused<T: std::fmt::Debug>(r: Result<T, i32>, status: &str, needle: &str) {
    assert_eq!(r.unwrap_err(), status_code(status), "{status} '{needle}': {}", last_error());
    assert!(last_error().contains(needle), "'{}' lacks '{needle}'", last_error());
}

fn rc(rc: i32) -> Result<(), i32> {
    if rc == 0 { Ok(()) } else { Err(rc) }
}

/// The fixture pair on one sequence (a unified target), its prompt decoded.
fn fixture_engine(params: llama_spec_dflash2_params) -> (Target, Spec, Stream) {
    let fx = fixtures();
    let mut target = unified_1t(&fx.target, 1 + LEAVES as u32, 1024, 64);
    let spec = Spec::new(&target, &fx.drafter, params);
    let stream = prefill(&mut target, &spec, &[fixture_prompt()]).remove(0);
    (target, spec, stream)
}

/// Decodes `tree`'s verify batch for `s` and feeds it to the engine; returns
/// p (temperature `t`) of every row, anchor first.
fn decode_tree(target: &mut Target, spec: &Spec, tree: &Tree, s: &Stream, t: f32) -> Vec<Vec<f32>> {
    let mut rows = Vec::new();
    add_tree_rows(target, &mut rows, tree, s, &pool(s.seq, 1, LEAVES));
    decode_multi(target, &rows);
    spec.process(target);
    (0..rows.len()).map(|r| host_p(logits(target, r), t, 0)).collect()
}

/// Every misuse of sampled trees gets a status and a message and changes
/// nothing, not even the verify generator: a second engine making the same
/// calls without the bad ones emits the same tokens.
#[test]
fn bad_sampled_tree_calls_are_refused_and_change_nothing() {
    let t = 0.9;
    let mut outputs = Vec::new();
    for misuse in [true, false] {
        let (mut target, spec, s) = fixture_engine(params_1t(1));
        let (seq, id_last) = (s.seq, s.id_last);
        let snapshot = |spec: &Spec| {
            let st = spec.stats();
            (spec.info(seq), st.n_draft_calls, st.n_accept_calls, st.n_accepted)
        };
        let req = request(seq, id_last, SHAPE, t, 21);
        if misuse {
            let before = snapshot(&spec);
            // bad requests, found before anything changes
            for (tt, dt, needle) in [
                (f32::NAN, 0.0, "temperature NaN"),
                (-1.0, 0.0, "temperature -1"),
                (t, f32::INFINITY, "draft temperature inf"),
            ] {
                let r = llama_spec_dflash2_tree_request { temperature: tt, draft_temperature: dt, ..req };
                refused(try_draft_trees(&spec, &[r]), "INVALID_ARGUMENT", needle);
            }
            // more requests than sequences: refused before the array is read
            let mut n = [0i32; 2];
            let r =
                unsafe { llama_spec_dflash2_draft_tree(spec.0, ptr::null(), 2, ptr::null_mut(), 0, n.as_mut_ptr()) };
            refused(rc(r), "INVALID_ARGUMENT", "2 requests for an engine of 1");
            // nothing to verify
            let p = vec![1.0 / target.n_vocab as f32; target.n_vocab];
            refused(try_step(&spec, seq, -1, &p), "INVALID_STATE", "no tree draft");
            refused(try_verify_whole(&spec, seq, &p, 1, target.n_vocab, 8), "INVALID_STATE", "no tree draft");
            // a greedy tree and a sampled chain draft have no tree q
            let greedy = draft_trees(&spec, &[request(seq, id_last, SHAPE, 0.0, 0)]).remove(0);
            assert!(!greedy.is_empty());
            refused(try_step(&spec, seq, -1, &p), "INVALID_STATE", "greedy tree");
            refused(try_verify_whole(&spec, seq, &p, 1, target.n_vocab, 8), "INVALID_STATE", "greedy tree");
            spec.seq_rm(seq, s.n_past, -1);
            let chain = llama_spec_dflash2_draft_request {
                seq_id: seq,
                id_last,
                n_max: 2,
                temperature: t,
                draft_temperature: 0.0,
                seed: 99,
                ..Default::default()
            };
            assert!(!spec.draft(&[chain])[0].is_empty());
            refused(try_step(&spec, seq, -1, &p), "INVALID_STATE", "a chain");
            spec.seq_rm(seq, s.n_past, -1);
            // the chain reseeded the generators (seed 99): clear the sequence's
            // rows, which drops them, and restore the prompt
            assert_eq!(unsafe { llama_spec_dflash2_seq_clear(spec.0, seq) }, 0);
            target.seq_rm(seq, -1, -1);
            let prompt = fixture_prompt();
            decode_rows(&mut target, seq, &prompt, 0, false);
            spec.process(&target);
            let (a, b) = (snapshot(&spec), before);
            assert_eq!((a.0, a.3), (b.0, b.3));
        }
        let tree = draft_trees(&spec, &[req]).remove(0);
        assert!(tree.children(None).count() > 1, "the fixture drafter's sampled tree branches: {tree:?}");
        let n = tree.len();
        let p = decode_tree(&mut target, &spec, &tree, &s, t);
        let n_vocab = target.n_vocab;
        let held = snapshot(&spec);
        if misuse {
            // out of order, out of range, bad p, null pointers
            refused(try_step(&spec, seq, 0, &p[1]), "INVALID_STATE", "the next one is -1");
            refused(try_step(&spec, seq, n as i32, &p[0]), "INVALID_ARGUMENT", "nodes");
            refused(try_step(&spec, seq, -2, &p[0]), "INVALID_ARGUMENT", "nodes");
            let half: Vec<f32> = p[0].iter().map(|x| x / 2.0).collect();
            refused(try_step(&spec, seq, -1, &half), "INVALID_ARGUMENT", "sum");
            let (mut token, mut child) = (0, 0);
            let r = unsafe {
                llama_spec_dflash2_verify_tree_sampled_step(spec.0, seq, -1, ptr::null(), &mut token, &mut child)
            };
            refused(rc(r), "NULL_ARGUMENT", "p");
            let mut cands = cur_p(&p[0]);
            let arr =
                llama_token_data_array { data: cands.as_mut_ptr(), size: cands.len(), selected: -1, sorted: false };
            let r = unsafe {
                llama_spec_dflash2_verify_tree_sampled_step(spec.0, seq, -1, &arr, &mut token, ptr::null_mut())
            };
            refused(rc(r), "NULL_ARGUMENT", "child");
            refused(try_step(&spec, 3, -1, &p[0]), "UNKNOWN_SEQUENCE", "sequence 3");
            // the whole form: counts, vocabulary, rows, buffers
            let rows = p.concat();
            refused(try_verify_whole(&spec, seq, &rows[..n * n_vocab], n, n_vocab, 8), "INVALID_ARGUMENT", "rows of p");
            refused(try_verify_whole(&spec, seq, &rows, n + 1, n_vocab - 1, 8), "INVALID_ARGUMENT", "n_vocab");
            let mut bad = rows.clone();
            bad[n * n_vocab] += 0.5; // the last row sums to 1.5
            refused(try_verify_whole(&spec, seq, &bad, n + 1, n_vocab, 8), "INVALID_ARGUMENT", "sum");
            refused(try_verify_whole(&spec, seq, &rows, n + 1, n_vocab, 2), "BUFFER_TOO_SMALL", "may emit");
            // accept_tree of an unverified sampled tree takes any path: not tried here, it would close the tree
            assert_eq!(snapshot(&spec), held);
        }
        // the verification, node by node
        let (mut path, mut emitted, mut node) = (Vec::new(), Vec::new(), -1);
        loop {
            let (child, token) = try_step(&spec, seq, node, &p[(node + 1) as usize]).unwrap();
            emitted.push(token);
            if misuse && child >= 0 {
                refused(rc(accept_tree(&spec, seq, &path)), "INVALID_STATE", "go on until it emits");
            }
            if child < 0 {
                break;
            }
            path.push(child);
            node = child;
        }
        if misuse {
            refused(try_step(&spec, seq, node, &p[(node + 1) as usize]), "INVALID_STATE", "ended");
            refused(try_verify_whole(&spec, seq, &p.concat(), n + 1, n_vocab, 8), "INVALID_STATE", "is verifying");
            let other = (0..n as i32).find(|&i| tree.nodes()[i as usize].parent == -1 && path.first() != Some(&i));
            refused(rc(accept_tree(&spec, seq, &[other.unwrap()])), "INVALID_ARGUMENT", "pass it");
            if !path.is_empty() {
                refused(rc(accept_tree(&spec, seq, &[])), "INVALID_ARGUMENT", "pass it");
            }
            assert_eq!(snapshot(&spec).0, held.0);
        }
        assert_eq!(accept_tree(&spec, seq, &path), 0, "{}", last_error());
        let info = spec.info(seq);
        assert_eq!((info.n_outstanding, info.n_held), (-1, 0));
        assert_eq!(info.n_in_kv + info.n_queued, s.n_past + 1 + path.len() as i32);
        outputs.push((tree.nodes().to_vec(), path, emitted));
    }
    assert_eq!(outputs[0], outputs[1], "the refused calls drew no random number");
}

/// A sampled tree of no nodes (p_min 1 cuts every row) still verifies: its
/// bonus token, from the anchor's p, by steps or whole.
#[test]
fn an_empty_sampled_tree_verifies_its_bonus_token() {
    let mut params = params_1t(1);
    params.p_min = 1.0;
    let (mut target, spec, s) = fixture_engine(params);
    let n_vocab = target.n_vocab;
    let onehot = |x: usize| (0..n_vocab).map(|i| (i == x) as u8 as f32).collect::<Vec<f32>>();
    let tree = draft_trees(&spec, &[request(s.seq, s.id_last, SHAPE, 0.7, 3)]).remove(0);
    assert!(tree.is_empty());
    assert_eq!(try_step(&spec, s.seq, -1, &onehot(5)).unwrap(), (-1, 5));
    assert_eq!(accept_tree(&spec, s.seq, &[]), 0, "{}", last_error());
    let tree = draft_trees(&spec, &[request(s.seq, s.id_last, SHAPE, 0.7, 3)]).remove(0);
    assert!(tree.is_empty());
    assert_eq!(try_verify_whole(&spec, s.seq, &onehot(9), 1, n_vocab, 1).unwrap(), (vec![9], vec![]));
    // nothing was held: the anchor row is committed as any row
    decode_rows(&mut target, s.seq, &[s.id_last], s.n_past, false);
    spec.process(&target);
    assert_eq!(spec.info(s.seq).n_queued + spec.info(s.seq).n_in_kv, s.n_past + 1);
}

/// A sampled tree of one child per node is the sampled chain draft, draw for
/// draw: same seed, same calls, same tokens (two fresh engines).
#[test]
fn a_one_child_sampled_tree_is_the_sampled_chain_draft() {
    let mut compared = 0;
    for seed in 0..6u32 {
        let (_t1, chain_spec, s) = fixture_engine(params_1t(1));
        let (_t2, tree_spec, _) = fixture_engine(params_1t(1));
        let n_max = chain_spec.n_max();
        let chain = chain_spec.draft(&[llama_spec_dflash2_draft_request {
            seq_id: s.seq,
            id_last: s.id_last,
            n_max,
            temperature: 1.2,
            draft_temperature: 0.0,
            seed,
            ..Default::default()
        }]);
        let r = llama_spec_dflash2_tree_request {
            max_children: 1,
            ..request(s.seq, s.id_last, Shape { n_nodes: n_max, max_depth: 0, max_leaves: 0 }, 1.2, seed)
        };
        let tree = draft_trees(&tree_spec, &[r]).remove(0);
        assert_eq!(tree.tokens(&(0..tree.len()).collect::<Vec<_>>()), chain[0], "seed {seed}");
        compared += chain[0].len();
    }
    assert!(compared > 6, "{compared}");
}
