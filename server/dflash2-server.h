// dflash2 inside llama-server: what the patched server sources call.
//
// The server drives speculative decoding through a handful of hooks: the
// common_speculative_* functions and common_memory. This header gives the server
// one type, dflash2_server_spec: an interface with two implementations, llama.cpp's
// own common_speculative (any spec type, or draft-dflash with --spec-dflash2-upstream)
// and a dflash2 engine, plus overloads of every hook for that type, each a forward
// to the interface. The patch changes the type of the server's `spec` and slot `mem`
// members; the call sites stay as they are and resolve to these overloads.
#pragma once

#include "common.h"
#include "sampling.h"
#include "speculative.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

// our command-line options, parsed and removed from argv before llama.cpp parses it:
//   --spec-dflash2-block-size N   noise block below the drafter's trained one (0 = trained)
//   --spec-dflash2-image-rows M   inject | skip: what the drafter does with image rows
//   --spec-dflash2-walk W         adaptive (the default: the controller drafts, per step, nothing, a chain
//                                 or a tree of k <= the tree budget nodes, what pays for its verification)
//                                 | greedy (as upstream: the greedy chain, trees only with --spec-dflash2-tree)
//   --spec-dflash2-upstream       serve draft-dflash with llama.cpp's own path (for comparison)
//   --spec-dflash2-tree N         slots draft and verify trees of up to N nodes per step (greedy
//                                 or sampled; 0 = chains); default 63 with the adaptive walk (on a CPU
//                                 target with an f16/f32 cache and ubatches of 64+ rows: every slot's tree
//                                 within 63 verify rows, for T = 0 identity), 0 with the greedy one; needs a unified KV cache (-kvu; one slot gets one,
//                                 and so does llama-server's automatic -np) and a pure-attention
//                                 target, otherwise chains; the default budget also drafts chains
//                                 under --context-shift and shrinks in a small context
//   --spec-dflash2-ngram N        n-gram branches per tree: continuations of the slot's own text where
//                                 its current suffix occurred before (default 2; 0 = none)
// The value options may also be set, as llama.cpp's own, by environment variables
// LLAMA_ARG_SPEC_DFLASH2_BLOCK_SIZE, _IMAGE_ROWS, _WALK, _TREE and _NGRAM; the command line
// wins. Returns false with a message on stderr for a bad value.
bool dflash2_server_take_args(int & argc, char ** argv);

// an RPC server that does not answer at start-up or goes away while serving
// ends the server with a message and exit status 1 instead of SIGABRT (see
// dflash2-server-faults.cpp); called first thing, before --rpc is parsed
void dflash2_server_exit_on_backend_abort();

// true when this configuration drafts through dflash2: a DFlash2 drafter with the
// draft-dflash spec type (explicit or inferred from the GGUF), unless --spec-dflash2-upstream
bool dflash2_server_routes(const common_params & params);

// the draft length the target's outputs are sized for (1 + n_max per sequence)
int32_t dflash2_server_output_n_max(const common_params & params);

// replaces common_init_from_params(params) for the target: when dflash2 serves, the
// drafter's memory is budgeted into the fit margins (as the server does for a
// multimodal projector) and upstream's fit pass does not try to build a draft
// context it cannot measure (a drafter sharing the target's head needs ctx_other)
common_init_result_ptr dflash2_server_init_target(common_params & params);

// adds one row of a slot's verify batch to the server's batch: token, position and
// its sequence ids (empty: the slot's own id alone); false when the batch is full
using dflash2_server_add_row = std::function<bool(llama_token, llama_pos, const std::vector<llama_seq_id> &)>;

// draft counters of one slot over its lifetime, for /slots
struct dflash2_server_slot_counters {
    int64_t n_drafted      = 0;
    int64_t n_accepted     = 0;
    int64_t n_verify_steps = 0;
    std::vector<int64_t> accepted_at; // by draft position

    // the draft each step asking for one got (the adaptive walk's controller chooses
    // none, a chain or a tree; the greedy walk drafts to its request); n_drafted
    // holds their tokens or nodes
    int64_t n_steps_none  = 0; // nothing drafted: the step decodes its sampled token alone
    int64_t n_steps_chain = 0; // a chain (a drafted tree without a branch is one)
    int64_t n_steps_tree  = 0; // a tree with a node (or the anchor) of more than one child
    int64_t n_nodes_last  = 0; // tokens or nodes of the last step's draft (0: none)

    // tree verification (--spec-dflash2-tree)
    int64_t n_tree_steps         = 0; // trees verified
    int64_t n_tree_branched      = 0; // of them, trees with a node (or the anchor) of more than one child
    int64_t n_tree_side_accepted = 0; // accepted paths through a node that is not its parent's first child
};

// The draft side of the server. Every hook below forwards to one of these.
struct dflash2_server_spec {
    virtual ~dflash2_server_spec() = default;

    // "upstream" or "dflash2", for /slots
    virtual const char * name() const = 0;
    // the walk over the drafter's lattice, "greedy" or "adaptive", for /slots
    virtual const char * walk() const { return "greedy"; }
    // the most tree nodes a slot drafts per step (0: chains), for /slots
    virtual int32_t tree_budget() const { return 0; }
    // the graph of the drafter's forward, "own" or "libllama" (upstream: "-"), for /slots
    virtual const char * draft_graph() const { return "-"; }
    // whether the last draft of the slot is a tree with a branch (for the counters)
    virtual bool drafted_branch(llama_seq_id seq_id) const { (void) seq_id; return false; }

    // as the common_speculative_* function of the same name
    virtual common_speculative_draft_params & draft_params(llama_seq_id seq_id) = 0;
    virtual void    begin(llama_seq_id seq_id, const llama_tokens & prompt) = 0;
    virtual bool    process(const common_batch & batch) = 0;
    virtual void    draft() = 0;
    virtual void    accept(llama_seq_id seq_id, uint16_t n_accepted) = 0;
    virtual bool    get_state(llama_seq_id seq_id, std::vector<uint8_t> & data) = 0;
    virtual void    set_state(llama_seq_id seq_id, const std::vector<uint8_t> & data) = 0;
    virtual void    print_stats() const = 0;
    virtual int32_t n_max() const = 0;
    virtual const std::vector<double> & synth_probs() const = 0;

    // process() takes batches with embedding rows (images)
    virtual bool takes_embd_batches() const = 0;

    // sampling: see dflash2_server_set_sampling, dflash2_server_sample_and_accept_n
    // and dflash2_server_draft_probs_row
    virtual void set_sampling(llama_seq_id seq_id, const common_params_sampling & params, const common_sampler * smpl) = 0;
    virtual std::vector<llama_token> sample_and_accept_n(llama_seq_id seq_id, common_sampler * smpl, llama_context * ctx,
            const std::vector<int> & idxs, const llama_tokens & draft, bool is_replay, size_t n_probs_post) = 0;
    virtual int32_t draft_probs_row(llama_seq_id seq_id, common_sampler * smpl, size_t i) = 0;
    // how the slot's drafts are verified, for /slots
    virtual std::string verify_mode(llama_seq_id seq_id) const = 0;

    // see dflash2_server_add_draft_rows; a chain unless the spec drafted a tree
    virtual bool add_draft_rows(llama_seq_id seq_id, llama_token id_last, const llama_tokens & draft, llama_pos pos0,
            const dflash2_server_add_row & add);

    // see dflash2_server_pad_batch; nothing unless the spec verifies trees
    virtual void pad_batch(int32_t n_rows, int32_t n_rows_max, llama_seq_id seq_last, const dflash2_server_add_row & add) {
        (void) n_rows; (void) n_rows_max; (void) seq_last; (void) add;
    }

    // the target's memory operations on a slot, mirrored into the drafter
    virtual void seq_rm (llama_seq_id seq_id, llama_pos p0, llama_pos p1) = 0;
    virtual void seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos delta) = 0;
    virtual void seq_cp (llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1) = 0;

    // the draft part of a slot's state in the prompt cache (ctx_dft: upstream's
    // draft context, NULL when dflash2 serves); state_load returns false when the
    // server restores it into ctx_dft itself
    virtual size_t state_size(llama_context * ctx_dft, llama_seq_id seq_id) const = 0;
    virtual void   state_save(llama_context * ctx_dft, llama_seq_id seq_id, std::vector<uint8_t> & dst) const = 0;
    virtual bool   state_load(llama_seq_id seq_id, const std::vector<uint8_t> & data) = 0;

    // /slots save and restore: the draft state of a slot in its own file
    virtual void slot_file_save(llama_seq_id seq_id, const std::string & path) const = 0;
    virtual void slot_file_load(llama_seq_id seq_id, const std::string & path) = 0;

    std::vector<dflash2_server_slot_counters> counters; // per sequence, counted by the hooks
};

// frees a spec after withdrawing it from the lookup by target context
struct dflash2_server_spec_deleter {
    void operator()(dflash2_server_spec * spec) const;
};

using dflash2_server_spec_ptr = std::unique_ptr<dflash2_server_spec, dflash2_server_spec_deleter>;

// replaces common_speculative_init(params.speculative, n_parallel); returns NULL when
// there is nothing to speculate with, throws std::runtime_error when dflash2 should
// serve but cannot (bad drafter, drafter for another target, ...)
dflash2_server_spec * dflash2_server_spec_init(common_params & params, llama_context * ctx_tgt);

// true when dflash2 was asked for and failed: the server must not start
bool dflash2_server_init_failed(const common_params & params);

// the hooks, for dflash2_server_spec
common_speculative_draft_params & common_speculative_get_draft_params(dflash2_server_spec * spec, llama_seq_id seq_id);

void common_speculative_begin  (dflash2_server_spec * spec, llama_seq_id seq_id, const llama_tokens & prompt);
bool common_speculative_process(dflash2_server_spec * spec, const common_batch & batch);
void common_speculative_draft  (dflash2_server_spec * spec);
void common_speculative_accept (dflash2_server_spec * spec, llama_seq_id seq_id, uint16_t n_accepted);

bool common_speculative_get_state(dflash2_server_spec * spec, llama_seq_id seq_id, std::vector<uint8_t> & data);
void common_speculative_set_state(dflash2_server_spec * spec, llama_seq_id seq_id, const std::vector<uint8_t> & data);

void    common_speculative_print_stats(const dflash2_server_spec * spec);
int32_t common_speculative_n_max(const dflash2_server_spec * spec);

const std::vector<double> & common_speculative_get_synth_probs(const dflash2_server_spec * spec);

// the sampling of a slot about to draft (its task's parameters and sampler), set
// before common_speculative_draft. When dflash2 serves a slot that samples
// (temperature > 0) it drafts by sampling the lattice with the slot's
// temperature and seed (the sampler's resolved seed); a greedy slot drafts the
// greedy chain as before.
void dflash2_server_set_sampling(dflash2_server_spec * spec, llama_seq_id seq_id, const common_params_sampling & params,
        const common_sampler * smpl);

// replaces common_sampler_sample_and_accept_n(smpl, ctx, idxs, draft) in the
// verification of a slot's draft; returns the tokens to emit (the kept drafted
// tokens, then the target's own), the sampler having accepted them.
// - upstream, or a dflash2 greedy draft: sample-and-match, as llama.cpp does
// - a dflash2 sampled draft: lossless rejection sampling: per draft position one
//   pass of the slot's sampler (grammar first, then its chain: penalties, top-k,
//   top-p, min-p, temperature, ...) gives p, the library accepts the drafted
//   token with probability min(1, p/q) or draws the replacement from
//   max(0, p - q), with its generator seeded by the slot's seed
// is_replay: the server replays a verified draft after restoring a checkpoint
// (a target that cannot drop the rejected rows): a sampled one is taken as is.
// n_probs_post > 0: the slot wants that many post-sampling probabilities per
// token; the candidates of every emitted token are kept for them.
std::vector<llama_token> dflash2_server_sample_and_accept_n(dflash2_server_spec * spec, llama_seq_id seq_id,
        common_sampler * smpl, llama_context * ctx, const std::vector<int> & idxs, const llama_tokens & draft,
        bool is_replay, size_t n_probs_post);

// for the probabilities of emitted token i of the last verification (by
// populate_token_probs, as a plain step): the batch row it was sampled from, or
// -1 when none is known (upstream); when post-sampling candidates were kept,
// the sampler's candidates (common_sampler_get_candidates) now show them, until
// its next sampling
int32_t dflash2_server_draft_probs_row(dflash2_server_spec * spec, common_sampler * smpl, llama_seq_id seq_id, size_t i);

// why a sampling slot cannot be verified by rejection sampling (it then drafts
// greedily and verifies by sample-and-match, as upstream), or NULL when it can:
// the chain must leave its distribution in cur_p and draw its token from it
// statelessly; mirostat and adaptive-p update their state from the token they
// drew themselves (backend sampling is fine: it leaves its probabilities in cur_p)
const char * dflash2_server_sampled_verify_blocker(const common_params_sampling & params);

// a slot's memory: the target's, and the same operation on the spec serving that
// target context (dflash2 maps target positions to its own dense draft positions)
struct dflash2_server_memory : common_memory {
    void seq_rm (llama_seq_id seq_id, llama_pos p0, llama_pos p1) const;
    void seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos delta) const;
    void seq_cp (llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1) const;
};

// the prompt cache: the draft part of a saved slot state
size_t dflash2_server_state_size(const dflash2_server_spec * spec, llama_context * ctx_dft, llama_seq_id seq_id);
void   dflash2_server_state_save(const dflash2_server_spec * spec, llama_context * ctx_dft, llama_seq_id seq_id,
                                 std::vector<uint8_t> & dst);
// restores the draft part for the spec serving ctx_tgt; false when the server
// restores it itself (no spec, or upstream's draft context)
bool   dflash2_server_state_load(llama_context * ctx_tgt, llama_seq_id seq_id, const std::vector<uint8_t> & data);

// /slots save and restore: the sequence's draft state travels in PATH.dflash2 beside
// the target's file; a restore without it starts the draft of that sequence over
void dflash2_server_slot_file_save(const dflash2_server_spec * spec, llama_seq_id seq_id, const std::string & path);
void dflash2_server_slot_file_load(llama_context * ctx_tgt, llama_seq_id seq_id, const std::string & path);

// replaces the server's rows of a slot's draft in its verify batch: the anchor
// (id_last at pos0), then for a chain its tokens at pos0 + 1, 2, ..., for a tree
// (--spec-dflash2-tree) its nodes at pos0 + depth, each with the path sequence
// ids of the leaves below it; false when the batch is full
bool dflash2_server_add_draft_rows(dflash2_server_spec * spec, llama_seq_id seq_id, llama_token id_last,
        const llama_tokens & draft, llama_pos pos0, const dflash2_server_add_row & add);

// before a batch is decoded: where its last llama_decode (n_rows rows, room for
// n_rows_max, last row's sequence id seq_last) would leave its last ubatch one row
// over parked cells of trees on a CPU target, the library gives a row more, added
// through `add` (logits off) and parked by the library after the decode
// (llama_spec_dflash2_tree_kv_pad); nothing for upstream's spec or chains
void dflash2_server_pad_batch(dflash2_server_spec * spec, int32_t n_rows, int32_t n_rows_max, llama_seq_id seq_last,
        const dflash2_server_add_row & add);

// draft statistics of a slot for /slots (JSON text)
std::string dflash2_server_slot_json(const dflash2_server_spec * spec, llama_seq_id seq_id);

// dflash2 and the llama.cpp it was built against, for /props (JSON text):
// {"version", "api_version", "llama_build": {"llama_version", "ggml_version",
// "ggml_commit", "origin", "prefix"}, "llama_check": "ok" or the refusal}
std::string dflash2_server_props_json();

// dflash2's counters for /metrics (prometheus text, empty when no engine serves):
// the engine's statistics, and the steps by the draft they got (none, chain,
// tree) with their drafted nodes, summed over the slots
std::string dflash2_server_metrics();
