//! Tree drafts in the C API: draft a tree per sequence from the one
//! noise-block decode, verify it in one target batch, accept a path; at
//! temperature 0 greedily, above it losslessly against the host's sampling
//! distribution (recursive rejection sampling over each node's children).

use super::boundary::{count, engine_status, output, slice, slice_mut};
use super::engine::{llama_spec_dflash2, request_truncation};
use super::sampling::{dense_rows, sparse_dist};
use crate::engine::TreeRequest;
use crate::error::Error;
use crate::sampling::Dist;
use crate::sys::{llama_token, llama_token_data_array};

/// One sequence's part of a tree draft call (llama_spec_dflash2_draft_tree).
/// Zero-initialised limits give the defaults; zero-initialised sampling fields
/// the greedy tree.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct llama_spec_dflash2_tree_request {
    pub seq_id: i32,
    /// The token the host sampled last: it anchors the tree. The target has not
    /// decoded it yet; it is the first row of the verify batch.
    pub id_last: i32,
    /// Most nodes, i.e. verify rows beyond the anchor's; 0: the engine's n_max
    /// (as many rows as the chain). The tree's 1 + n_nodes rows must fit the
    /// target's n_batch and n_ctx.
    pub n_nodes: i32,
    /// Deepest node (draft position); 0: the engine's n_max. The lattice's
    /// nodes go at most n_max deep (the noise block), n-gram branches
    /// (params.ngram_branches) as deep as this, at most
    /// LLAMA_SPEC_DFLASH2_MAX_DRAFT and n_nodes: a host that wants longer
    /// copies verified asks for more (API version 5 and before: capped at n_max).
    pub max_depth: i32,
    /// Most children of one node, or of the anchor; 0: no limit. 1 makes the
    /// tree the greedy chain llama_spec_dflash2_draft gives.
    pub max_children: i32,
    /// Most leaves = path sequence ids the host has for this tree (see
    /// llama_spec_dflash2_draft_tree); 0: the target context's n_seq_max.
    /// More than n_seq_max is refused.
    pub max_leaves: i32,
    /// The host's sampling temperature for this sequence (finite, >= 0), as in
    /// llama_spec_dflash2_draft_request. 0: the greedy tree (the fields below
    /// are ignored), bit for bit what it was before these fields existed.
    /// Above 0: a sampled tree (see llama_spec_dflash2_draft_tree), verified
    /// with llama_spec_dflash2_verify_tree_sampled[_step].
    pub temperature: f32,
    /// Temperature of the tree's draws when temperature > 0: < 0 or 0 (unset) =
    /// the engine's choice (params.adapt_sampled_drafts; with it off,
    /// temperature); > 0 = this value. NaN and infinities are refused.
    pub draft_temperature: f32,
    /// Seed of the sequence's generators, shared with its sampled chain drafts
    /// (see llama_spec_dflash2_draft_request.seed: seeded once, then carried on
    /// across steps; the same seed and calls give the same trees and output).
    pub seed: u32,
    /// As llama_spec_dflash2_draft_request's: q cut like the host sampler's p,
    /// where the tree's n_nodes (0: the engine's n_max) is at most 15;
    /// a bigger tree draws from the whole q: the drafter's cut is a guess at
    /// p's, and a wide tree loses more by the tokens it wrongly drops.
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
}

/// One node of a draft tree. The tree hangs from the anchor (id_last), which
/// is not a node. Nodes come in tree order: a parent before its children, so
/// the first k nodes of a tree are a tree too (the one a budget of k grows);
/// children of one parent carry distinct tokens.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llama_spec_dflash2_tree_node {
    pub token: i32,
    /// Index of the parent node in this tree (0-based), or -1 for a child of the anchor.
    pub parent: i32,
    /// 1-based depth (draft position): the node is verified at pos = n_past + depth,
    /// where n_past is the anchor's position.
    pub depth: i32,
    /// Edge probability: the lattice's softmax of this token given its parent
    /// (the drafter's estimate that it is the target's argmax there). In a
    /// sampled tree: q(token | parent), the probability the token was drawn
    /// with as its parent's first child (at the draft temperature). A node only
    /// an n-gram branch proposed (params.ngram_branches): its measured
    /// acceptance given its parent's.
    pub prob: f32,
    /// Product of the edge probabilities from the anchor down to this node; the
    /// sum over nodes is the lattice's expectation of accepted tokens. In a
    /// sampled tree: the growth's estimate that the target accepts this node
    /// (see llama_spec_dflash2_draft_tree), known before the node was drawn.
    pub path_prob: f32,
}

/// Drafts a tree for each of `n_requests` sequences (`requests` points to that
/// many) with one noise-block decode (after one injection decode for any rows
/// still waiting), the decode llama_spec_dflash2_draft runs: the trees grow
/// best-first by path probability over each block's selector lattice (K
/// candidates per position, edge scores from each candidate of the position
/// before), so that a tree of one child per node is exactly the greedy chain
/// of llama_spec_dflash2_draft (same n_max, p_min, n_min, same other requests).
/// Greedy trees (temperature 0) order the growth by each edge's calibrated
/// acceptance: its lattice probability mapped, per depth and monotonically, to
/// the rate at which the target accepted such edges in the trees this engine
/// verified before (every child of an accepted node counts); the lattice
/// probability itself until there are such measurements. The nodes' prob and
/// path_prob stay the lattice's. N-gram branches (params.ngram_branches): for
/// each of the sequence's earlier occurrences of its current suffix (ending in
/// id_last; the best few by match length, one per next token) the tokens that
/// followed it join the tree as a branch, merged into the lattice's nodes
/// where they agree; the budget then goes to the nodes of highest estimated
/// reach of either kind (a branch token's estimate is its measured acceptance
/// by match length and depth), so a tree may hold fewer lattice nodes than
/// without branches. A branch's own nodes have no lattice children.
/// `nodes` (room for `n_nodes_max`, at least the sum of the requests' n_nodes,
/// n_max for a 0)
/// receives the trees concatenated in request order; `n_nodes` (room for
/// `n_requests`) the node count of each. A tree whose depth is below params.n_min
/// is empty. With the adaptive walk (params.walk) the engine's controller
/// decides per call (see LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE): no tree at all
/// (every n_nodes is 0), one request's tree (in turn; the others empty), or
/// every request's, each grown tree cut to its first k nodes, the k that
/// maximizes the expected accepted tokens (measured acceptance by depth and
/// edge probability) minus the measured cost of its k verify rows along the
/// cost curve — a tree whose siblings do not pay becomes its chain. With the greedy walk trees
/// always grow to their request.
///
/// A request with temperature > 0 gets a sampled tree instead, for lossless
/// verification at that temperature: the same best-first growth, but each
/// child is drawn when its slot comes up, from q = softmax(S[parent's
/// candidate] / draft_temperature) over the usable candidates (duplicate ids
/// merged), without its earlier siblings; slots are ordered by the estimated
/// probability that the child is accepted: its parent's, times that of its
/// earlier siblings all rejected (a sibling is tested only then), times its
/// own once tested, read from the expected q of the next draw, its depth and
/// its sibling index, calibrated per depth and sibling index on the children
/// this engine's sampled verification tested before (the expected q itself
/// until there are such measurements). So which children a node gets is
/// decided before they are drawn (what the verification needs). When the
/// request leaves draft_temperature unset, the engine chooses it
/// (params.adapt_sampled_drafts).
/// q is kept per parent for llama_spec_dflash2_verify_tree_sampled[_step].
/// Some children are taken without a draw, verified as point masses (accepted
/// with the target's probability of them, the siblings after them drawn from
/// q without them): n-gram branch tokens (params.ngram_branches), each where
/// its measured acceptance ranks it before the parent's next draw, and with
/// params.first_child greedy each parent's first child, q's most probable token
/// (by default: in trees of more than 15 nodes, whose q is not cut).
/// p_min cuts a node's children on its row's temperature-1 confidence, known
/// before any draw; n_min does not apply (dropping a short sampled tree would
/// bias it); the adaptive walk sizes the tree (its n_nodes) from the greedy
/// tree of the same lattice, before any draw. A sampled tree of 0 nodes (no
/// block decoded) still verifies: its bonus token, from the anchor's p.
/// The draws use the sequence's draft generator (request.seed), the
/// verification its verify generator.
///
/// Every requested sequence then has its tree awaiting
/// llama_spec_dflash2_accept_tree (or verify_tree_greedy); an empty tree needs
/// none. The host verifies a tree in one target batch (llama.cpp, no new kernel):
/// - the target context needs a unified KV cache (llama_context_params.kv_unified)
///   and a pure-attention model; otherwise (a split cache with n_seq_max > 1, a
///   recurrent or hybrid target) every tree is grown as a chain (one leaf,
///   logged once per process), and verifies as one.
/// - sequence ids: leaf l (the nodes without children, in tree order) owns path
///   id pool[l] from a pool of distinct ids the host keeps per sequence, unused
///   otherwise and not sequences the engine serves; the sequence's own id may be
///   pool[0]. Before the decode: llama_memory_seq_cp(mem, seq_id, pool[l], -1, -1)
///   for every pool[l] != seq_id (a tag in a unified cache, not a copy).
/// - rows, added to the batch in this order, all with logits: the anchor
///   (id_last at n_past) with seq ids {seq_id, every pool[l] != seq_id}; then
///   node i = 0, 1, ... at n_past + depth with the ids pool[l] of every leaf l
///   below it (itself included), first the smallest l: its attention follows
///   its first id, whose cells are the prefix, the anchor and its ancestors.
/// - pass the rows to llama_spec_dflash2_process in that order, with seq_id
///   the sequence's own id (not the path ids, so not process_batch on this
///   batch): row 0 the anchor, row i + 1 node i, each at its position (checked:
///   _INVALID_STATE otherwise). A seq_rm that removes any of these rows before
///   accept_tree drops the whole tree.
/// - after accepting the path of nodes a_1 .. a_d (depth 1 .. d), on the
///   target only (do not mirror these calls on the engine: accept_tree did its
///   part): keep the prefix, the anchor and the path in seq_id, free the rest,
///   with start = n_past + 1, end = n_past + 1 + d, l = the first leaf below a_d:
///   if d > 0 and pool[l] == seq_id: llama_memory_seq_rm(mem, seq_id, end, -1);
///   else: llama_memory_seq_rm(mem, seq_id, start, -1) (needed only when
///   pool[0] == seq_id) and, if d > 0, llama_memory_seq_cp(mem, pool[l], seq_id,
///   start, end); then llama_memory_seq_rm(mem, pool[l'], -1, -1) for every
///   pool[l'] != seq_id. The next anchor goes to n_past + 1 + d.
/// - exactness: the masks make every row's attention the one a chain of its
///   path would get, but the freed cells of rejected nodes lie between kept
///   ones and later rows reuse them, so a sequence's cells leave position
///   order; ggml's CPU flash attention accumulates V in f16 in cell order, so
///   results may then differ from target-only decoding in the last bits, and a
///   near-tie argmax may flip (as batch shapes can make it flip). Tagging each
///   step's cells with one spare sequence id before the commit (never freeing
///   them) keeps the order and the outputs bit-identical, at the cost of cells.
///
/// Budget per sequence, a tree of N nodes and L leaves (L <= N, <= max_leaves):
/// the verify batch has 1 + N rows and writes 1 + N KV cells (as a chain of N
/// drafted tokens), 1 + d remain; L path ids, L - 1 beyond the sequence's own
/// when it serves as pool[0]. S sequences drafting trees of at most L_max leaves
/// need a target n_seq_max >= S * L_max (own ids reused) or S * (1 + L_max)
/// (fresh ids), at most 256 (LLAMA_MAX_SEQ), n_batch >= S * (1 + N) for one
/// verify batch, and S * (1 + N) free cells beyond the sequences' prefixes.
///
/// Returns 0, or _INVALID_ARGUMENT (more requests than the engine's sequences,
/// found before `requests` is read; a negative limit, an id_last outside the
/// vocabulary, a bad temperature or draft_temperature, a sequence twice, a tree
/// the target cannot hold: 1 + n_nodes rows beyond its n_batch or n_ctx,
/// max_leaves beyond its n_seq_max) /
/// _BUFFER_TOO_SMALL / _INVALID_STATE (a sequence's previous draft, chain or
/// tree, was never accepted) / _NULL_ARGUMENT / _UNKNOWN_SEQUENCE / _BACKEND;
/// nothing changes on an error found before the decode.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_draft_tree(
    spec: *mut llama_spec_dflash2,
    requests: *const llama_spec_dflash2_tree_request,
    n_requests: i32,
    nodes: *mut llama_spec_dflash2_tree_node,
    n_nodes_max: i32,
    n_nodes: *mut i32,
) -> i32 {
    engine_status(spec, |e| {
        let n_requests = count(n_requests, "requests")?;
        // a sequence drafts once per call: more requests than sequences is a
        // bad count, refused before the array is read
        if n_requests > e.n_seq() {
            return Err(Error::invalid(format!("{n_requests} requests for an engine of {} sequence(s)", e.n_seq())));
        }
        let reqs = slice(requests, n_requests, "requests")?;
        let out = slice_mut(nodes, count(n_nodes_max, "nodes")?, "nodes")?;
        let n_out = slice_mut(n_nodes, n_requests, "n_nodes")?;
        let reqs: Vec<TreeRequest> = reqs
            .iter()
            .map(|r| {
                Ok(TreeRequest {
                    seq: r.seq_id,
                    id_last: r.id_last,
                    n_nodes: r.n_nodes,
                    max_depth: r.max_depth,
                    max_children: r.max_children,
                    max_leaves: r.max_leaves,
                    temperature: r.temperature,
                    draft_temperature: r.draft_temperature,
                    seed: r.seed,
                    truncation: request_truncation(r.seq_id, r.top_k, r.top_p, r.min_p)?,
                })
            })
            .collect::<Result<_, Error>>()?;
        let trees = e.draft_tree(&reqs, out.len())?;
        let mut at = 0;
        for (tree, n) in trees.iter().zip(n_out.iter_mut()) {
            for (slot, node) in out[at..].iter_mut().zip(tree.nodes()) {
                *slot = llama_spec_dflash2_tree_node {
                    token: node.token,
                    parent: node.parent,
                    depth: node.depth as i32,
                    prob: node.prob,
                    path_prob: node.path_prob,
                };
            }
            at += tree.len();
            *n = tree.len() as i32;
        }
        Ok(())
    })
}

/// The host verified the outstanding tree of `seq_id` and accepts `path`
/// (`n_path` node indices, depth 1 first, each a child of the one before; 0
/// nodes when the target rejected every child of the anchor). The anchor's
/// verify row and the path's rows enter the draft KV at the sequence's next
/// dense draft positions; every other row of the tree never does. The host then
/// keeps the same rows in its target (the commit calls in
/// llama_spec_dflash2_draft_tree's comment). The rows of the path must have
/// been passed to process() (a host may verify only the first k nodes, which
/// form a tree, and accept a path among them). An empty tree held no rows:
/// accept_tree(seq_id, NULL, 0) closes it, and skipping it is allowed too.
/// A sampled tree verified with llama_spec_dflash2_verify_tree_sampled_step
/// must be accepted with the path that call accepted, once it emitted its
/// token; one not verified by it takes any path (a host may verify a sampled
/// tree by sample-and-match, lossless for any tree drawn independently of the
/// target's samples).
/// Returns 0, or _INVALID_STATE (no draft, a chain draft: accept() it; the
/// path's rows not passed to process(); verify_tree_sampled_step not finished)
/// / _INVALID_ARGUMENT (a node index out of range, a path that does not go from
/// the anchor parent to child, not the path verify_tree_sampled_step accepted) /
/// _NULL_ARGUMENT / _UNKNOWN_SEQUENCE; nothing changes then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_accept_tree(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    path: *const i32,
    n_path: i32,
) -> i32 {
    engine_status(spec, |e| {
        let path = slice(path, count(n_path, "path")?, "path")?;
        e.accept_tree(seq_id, path)
    })
}

/// Greedy tree verification and accept_tree() in one call, for a host that
/// samples the target greedily (llama_spec_dflash2_verify_greedy for trees).
/// After the verify batch was decoded and passed to process(), reads the
/// target's logits at rows `i_batch[0 .. n_rows)` of that decode (each must
/// have asked for logits): row 0 the anchor's, row i + 1 node i's, so n_rows
/// is the tree's node count + 1 (1 for an empty tree). From the anchor it
/// follows the child whose token is the argmax (first maximum) of the current
/// row, as long as there is one, and accepts that path.
///
/// `emitted` (room for `n_emitted_max` >= the tree's depth + 1 tokens) receives
/// what the host emits this step: the d accepted nodes' tokens, then the argmax
/// of the last accepted row; `*n_emitted` = d + 1, and the last token is the
/// next step's id_last. `path`: NULL, or room for n_emitted_max - 1 entries
/// (at least the tree's depth): receives the d accepted node indices, for the
/// target's commit calls (see llama_spec_dflash2_draft_tree).
///
/// Returns 0, or _INVALID_STATE (no tree awaiting accept, or its verify rows
/// not passed to process()) / _INVALID_ARGUMENT (n_rows is not the node count
/// plus one, a row is outside the batch or has no logits) / _BUFFER_TOO_SMALL /
/// _NULL_ARGUMENT / _UNKNOWN_SEQUENCE; nothing changes then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_verify_tree_greedy(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    i_batch: *const i32,
    n_rows: i32,
    emitted: *mut i32,
    n_emitted_max: i32,
    n_emitted: *mut i32,
    path: *mut i32,
) -> i32 {
    engine_status(spec, |e| {
        let rows = slice(i_batch, count(n_rows, "i_batch")?, "i_batch")?;
        let n_max = count(n_emitted_max, "emitted")?;
        let out = slice_mut(emitted, n_max, "emitted")?;
        let n_out = output(n_emitted, "n_emitted")?;
        let path = if path.is_null() { None } else { Some(slice_mut(path, n_max.saturating_sub(1), "path")?) };
        *n_out = e.verify_tree_greedy(seq_id, rows, out, path)? as i32;
        Ok(())
    })
}

/// Lossless verification of one node of the sampled tree of `seq_id` (drafted
/// with temperature > 0), for a host that computes the target's distribution
/// row by row (llama.cpp's sampler chain per verify row): the tree form of
/// llama_spec_dflash2_verify_sampled_step.
///
/// `node` is -1 for the anchor, else the node whose verify row `p` comes from
/// (row node + 1 of the tree's rows in llama_spec_dflash2_draft_tree's order).
/// `p` is the host's sampling distribution at that row, the candidates as its
/// sampler chain leaves `cur_p` (temperature, top-k, top-p, min-p, ... applied
/// by the host; read through `.id` and `.p` only, any order, possibly
/// truncated; every `.p` finite and >= 0, ids in the vocabulary, summing to 1
/// within 1e-3, then renormalized; a chain that truncates without
/// renormalizing must end with a softmax, as llama.cpp's `dist` does).
///
/// With the sequence's verify generator, the node's children c_1, c_2, ... (in
/// tree order, the order they were drawn in) are tried one after another: c_k
/// is accepted with probability min(1, p_k(c_k) / q_k(c_k)), where p_1 = p and
/// q_1 = q (the distribution the children were drawn from); after a rejection
/// p_{k+1} = max(0, p_k - q_k) normalized and q_{k+1} = q_k without c_k,
/// normalized. An accepted child: `*child` = its node index, `*token` = its
/// token, and the next call is at that child with p of its row. All rejected,
/// or a node without children: `*child` = -1, `*token` = a token drawn from the
/// last p_k (the residual; p itself for a node without children: the bonus),
/// and the verification ends. Every token written is distributed as the
/// target's p at its position, whatever the tree; a node's rejected children
/// are never emitted. Cost: one call per row of the accepted path (the host's
/// sampler chain runs on those rows only), O(|q's support| + |p|) each.
///
/// Caveats: the random numbers are the engine's (the sequence's verify
/// generator, request.seed), not the host's sampler's: the output follows the
/// host's distribution with other draws than target-only sampling. A stateful
/// chain (penalties, grammar) must give p at a node's row as it stands after
/// the anchor and that node's path, and advance only along the tokens emitted.
/// A node accepts one of its children at least as often as its first child
/// alone (a chain's draw) would be accepted; how much the siblings add depends
/// on how much of p the first draw leaves uncovered, and a tree spends verify
/// rows on siblings that a chain spends on depth.
///
/// Call it for node -1 first, then for each accepted child, until `*child` is
/// -1; then llama_spec_dflash2_accept_tree(spec, seq_id, path, n) with the
/// accepted children in order (accept_tree checks it), and commit the target's
/// KV to that path (llama_spec_dflash2_draft_tree). Returns 0, or
/// _INVALID_STATE (no tree awaiting accept_tree, a greedy tree or a chain
/// draft, `node` not the next one down the accepted path, the verification
/// ended) / _INVALID_ARGUMENT (`node` outside -1 .. n_nodes - 1, a bad p) /
/// _NULL_ARGUMENT / _UNKNOWN_SEQUENCE; on error nothing changes (no random
/// number is used) and the same node may be retried.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_verify_tree_sampled_step(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    node: i32,
    p: *const llama_token_data_array,
    token: *mut llama_token,
    child: *mut i32,
) -> i32 {
    engine_status(spec, |e| {
        let (ids, probs) = sparse_dist(p)?;
        let token = output(token, "token")?;
        let child = output(child, "child")?;
        let (c, t) = e.verify_tree_sampled_step(seq_id, node, Dist::Sparse { ids: &ids, probs: &probs })?;
        *token = t;
        *child = c.map_or(-1, |c| c as i32);
        Ok(())
    })
}

/// Lossless verification of the whole sampled tree of `seq_id` and
/// accept_tree() in one call, with the target's distributions as dense rows,
/// for a host that has them at once: the tree form of
/// llama_spec_dflash2_verify_sampled. After the verify batch was decoded and
/// passed to process(): `p_rows` holds `n_rows` = n_nodes + 1 rows of
/// `n_vocab` floats (row-major; n_vocab the model's), row 0 the host's
/// sampling distribution at the anchor's verify row, row i + 1 at node i's
/// (the target's logits of that row put through the host's sampler chain,
/// e.g. softmax(logits / temperature)), each finite, >= 0, summing to 1 within
/// 1e-3 (then renormalized). Every row is checked before any random number is
/// drawn.
///
/// It runs llama_spec_dflash2_verify_tree_sampled_step's rule from the anchor
/// down (the same draws: the same output as calling it node by node with
/// these rows) and accepts the path. `emitted` (room for `n_emitted_max` >= the
/// tree's depth + 1 tokens) receives what the host emits this step: the d
/// accepted nodes' tokens, then the residual or bonus token; `*n_emitted` =
/// d + 1, and the last token is the next step's id_last. `path`: NULL, or room
/// for n_emitted_max - 1 entries (at least the tree's depth): receives the d
/// accepted node indices, for the target's commit calls. Cost: the host makes
/// p for all n_nodes + 1 rows (the step form needs only the path's d + 1).
///
/// Returns 0, or _INVALID_STATE (no tree awaiting accept_tree, a greedy tree or
/// a chain draft, one that verify_tree_sampled_step began, its verify rows not
/// passed to process()) / _INVALID_ARGUMENT (n_rows not the node count + 1,
/// n_vocab not the model's, a row that is not a distribution) /
/// _BUFFER_TOO_SMALL / _NULL_ARGUMENT / _UNKNOWN_SEQUENCE; nothing changes then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llama_spec_dflash2_verify_tree_sampled(
    spec: *mut llama_spec_dflash2,
    seq_id: i32,
    p_rows: *const f32,
    n_rows: i32,
    n_vocab: i32,
    emitted: *mut llama_token,
    n_emitted_max: i32,
    n_emitted: *mut i32,
    path: *mut i32,
) -> i32 {
    engine_status(spec, |e| {
        let (p, rows, vocab) = dense_rows(p_rows, n_rows, n_vocab)?;
        let n_max = count(n_emitted_max, "emitted")?;
        let out = slice_mut(emitted, n_max, "emitted")?;
        let n_out = output(n_emitted, "n_emitted")?;
        let path = if path.is_null() { None } else { Some(slice_mut(path, n_max.saturating_sub(1), "path")?) };
        *n_out = e.verify_tree_sampled(seq_id, p, rows, vocab, out, path)? as i32;
        Ok(())
    })
}
