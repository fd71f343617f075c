// What the files of the llama-server adapter share among themselves (the patched
// server sources see only dflash2-server.h).
#pragma once

#include "dflash2-server.h"
#include "dflash2.hpp"

#include <cstdint>
#include <string>
#include <vector>

// the most nodes --spec-dflash2-tree takes per slot
#define DFLASH2_SERVER_TREE_MAX_NODES 256
// the tree budget per slot and step of the adaptive walk (the default) when
// --spec-dflash2-tree is not given: the controller picks k <= this many nodes
// (a slot's tree and its anchor: 64 rows, one tile of a GPU's attention kernels)
#define DFLASH2_SERVER_TREE_DEFAULT_NODES 63

// our command-line options (dflash2-server-args.cpp)
struct dflash2_server_options {
    int32_t walk         = LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE;
    int32_t block_size   = 0;
    int32_t image_rows   = LLAMA_SPEC_DFLASH2_IMAGE_ROWS_INJECT;
    int32_t tree_nodes   = 0;     // nodes per slot and step; 0 = chains (--spec-dflash2-tree, else the walk's default)
    bool    tree_given   = false; // --spec-dflash2-tree was given (else the default budget, which yields where trees do not fit)
    int32_t ngram_branches = -1;  // --spec-dflash2-ngram: n-gram branches per tree (-1: the library's default, 0: none)
    int32_t adapt_sampled  = -1;  // --spec-dflash2-adapt-sampled: sampled drafts adapt to what was measured (-1: default, on)
    int32_t draft_graph    = -1;  // --spec-dflash2-draft-graph: own or libllama (-1: the library's default, own)
    bool    use_upstream = false;
    int32_t identical_rows = 0;   // verify rows per step that keep T = 0 outputs target-only's (0: any)
    bool    init_failed  = false; // dflash2 was asked for and no engine could be created

    // the start-up plan for trees (dflash2_server_tree_plan)
    int32_t     tree_leaves  = 0; // path sequence ids per slot; 0 = chains
    std::string tree_refusal;     // why the server must not start with --spec-dflash2-tree (empty: it may)
};

dflash2_server_options & dflash2_server_opts();

// the two implementations of dflash2_server_spec:
// llama.cpp's common_speculative; NULL when there is nothing to speculate with
dflash2_server_spec * dflash2_server_spec_upstream(common_params & params);
// a dflash2 engine on ctx_tgt; throws dflash2::error when it cannot be created
dflash2_server_spec * dflash2_server_spec_dflash2(llama_context * ctx_tgt, const std::string & path_draft,
        const dflash2::params & params, int32_t n_parallel);

// the spec serving a target context, for the hooks that only see contexts (slot
// memory, prompt cache); NULL when none does
dflash2_server_spec * dflash2_server_spec_for(llama_context * ctx_tgt);

// dflash2's statistics after a step, kept for /metrics (rendered on the HTTP thread)
void dflash2_server_publish_stats(const dflash2::stats & stats, int32_t n_max);
// the slots' counters summed (accepted_at left empty)
dflash2_server_slot_counters dflash2_server_counters_sum(const std::vector<dflash2_server_slot_counters> & counters);
// the slots' step counters after a draft, summed for /metrics
void dflash2_server_publish_steps(const std::vector<dflash2_server_slot_counters> & counters);
// a pad row added to a verify batch (dflash2_server_pad_batch), for /metrics
void dflash2_server_count_pad_row();
// dflash2's statistics as log lines
void dflash2_server_log_stats(const dflash2::stats & stats, int32_t n_max);

// what the last verification of a sequence's draft keeps for the probabilities
// of the tokens it emitted (dflash2_server_draft_probs_row)
struct dflash2_server_verified {
    std::vector<int32_t>                       rows; // per emitted token: the batch row it was sampled from
    std::vector<std::vector<llama_token_data>> top;  // per emitted token, when post-sampling probs are asked:
                                                     // the n_probs most probable candidates, then the token itself

    void clear() {
        rows.clear();
        top.clear();
    }

    // emitted token `token` was sampled from batch row `row`, the sampler's candidates being cur_p
    void keep(int32_t row, const llama_token_data_array & cur_p, llama_token token, size_t n_probs_post);

    // see dflash2_server_draft_probs_row
    int32_t row_for_probs(common_sampler * smpl, size_t i);
};

// the three verifications of dflash2_server_sample_and_accept_n; each clears
// `verified` and keeps what the emitted tokens' probabilities need
// sample-and-match: llama.cpp's common_sampler_sample_and_accept_n, step for step
std::vector<llama_token> dflash2_server_verify_match(common_sampler * smpl, llama_context * ctx,
        const std::vector<int> & idxs, const llama_tokens & draft, size_t n_probs_post, dflash2_server_verified & verified);
// lossless rejection sampling of a sampled draft; `n_verified` receives the
// positions the library accepted (what accept() must pass it: more than the
// emitted tokens when an end-of-generation token ends them early)
std::vector<llama_token> dflash2_server_verify_sampled(dflash2::engine & engine, llama_seq_id seq_id,
        common_sampler * smpl, llama_context * ctx, const std::vector<int> & idxs, const llama_tokens & draft,
        size_t n_probs_post, dflash2_server_verified & verified, int32_t & n_verified);
// a replay of a sampled draft verified before a checkpoint restore: its tokens as
// they are, then the target's token after them
std::vector<llama_token> dflash2_server_verify_replay(common_sampler * smpl, llama_context * ctx,
        const std::vector<int> & idxs, const llama_tokens & draft, size_t n_probs_post, dflash2_server_verified & verified);

// a draft state file, whole; read gives an empty blob when the file is missing
bool                 dflash2_server_write_file(const std::string & path, const std::vector<uint8_t> & data);
std::vector<uint8_t> dflash2_server_read_file(const std::string & path);

// ---- trees (dflash2-server-tree.cpp) ----

// start-up, before the target context exists: decides whether slots verify
// trees (--spec-dflash2-tree on a unified KV cache and a target whose memory can
// branch; one log line says why not), fills opts.tree_leaves / tree_refusal and
// returns the n_seq_max the target context needs (n_parallel for chains). One
// slot gets a unified cache (the same cells as a split one).
int32_t dflash2_server_tree_plan(common_params & params);

// Tree verification of the slots' drafts with the multi-sequence encoding of
// dflash2.h (llama_spec_dflash2_draft_tree). The target's KV bookkeeping is the
// library's (llama_spec_dflash2_tree_kv_*: path and park sequence ids, the prefix
// tagged before the verify decode, the accepted path committed and the step's
// other cells parked after it, parked cells kept with the history through the
// engine's seq_rm / seq_shift mirrors); this keeps the server's side: the budget,
// each slot's tree from draft to accept, the chains a slot drafts after the cache
// ran short, the counters.
struct dflash2_server_tree {
    // a slot's tree from draft to accept
    struct slot_tree {
        bool                            active = false; // drafted, not yet accepted
        std::vector<dflash2::tree_node> nodes;
        bool                            branched = false; // a node (or the anchor) has more than one child
        llama_pos                       anchor   = -1;  // the anchor's position (n_past)
        std::vector<int32_t>            path;           // accepted nodes, set by verification
        bool                            verified = false;
        bool                            chains_only = false; // the cache ran short: chains until the next cut
    };

    llama_context *   ctx_tgt  = nullptr;
    dflash2::engine * engine   = nullptr;
    int32_t           n_slots  = 0;
    int32_t           n_nodes  = 0; // per slot and step; 0 = trees off
    int32_t           n_leaves = 0;
    std::vector<slot_tree> slots;

    // the sequence id of the pad row in the batch being decoded (pad), -1: none
    llama_seq_id pad_id = -1;

    // the library's rows of a tree (add_rows)
    std::vector<llama_spec_dflash2_tree_row> verify_rows;
    std::vector<llama_seq_id>                verify_ids;
    std::vector<llama_seq_id>                row_ids;

    // reduces n_nodes to what the context holds (one verify batch of every slot's
    // tree), or turns trees off with one log line when the context cannot branch;
    // hands the target's KV bookkeeping to the engine
    void init(llama_context * ctx, dflash2::engine & engine, int32_t n_slots, int32_t n_nodes, int32_t n_leaves);

    bool on() const { return n_nodes > 0; }

    // whether the KV cache has cells for one more slot's tree this step beyond
    // `n_trees` others; when it does not, every slot's parked cells are freed and
    // the slots draft chains until their history is next cut (logged)
    bool has_room(llama_seq_id seq, int32_t n_trees);

    // a drafted tree (empty: none) awaiting its verify rows
    void set(llama_seq_id seq, std::vector<dflash2::tree_node> && nodes);
    bool active(llama_seq_id seq) const { return seq >= 0 && (size_t) seq < slots.size() && slots[seq].active; }

    // the verify rows of seq's tree (the library tags the path ids with the slot's
    // cells): adds the anchor and every node
    bool add_rows(llama_seq_id seq, llama_token id_last, llama_pos pos0, const dflash2_server_add_row & add);

    // after accept_tree: the library keeps the prefix, the anchor and the path in
    // seq and parks the step's cells; counts the step in `counters`
    void commit(llama_seq_id seq, dflash2_server_slot_counters & counters);

    // the slot's seq_rm (after the engine's mirror); cuts_history: it removed
    // committed rows (a new request, a shift), not a rejected draft's
    void on_seq_rm(llama_seq_id seq, llama_pos p0, llama_pos p1, bool cuts_history);

    // the library's pad row for the batch about to be decoded (dflash2_server_pad_batch)
    void pad(int32_t n_rows, int32_t n_rows_max, llama_seq_id seq_last, const dflash2_server_add_row & add);

    // the rows of a decoded batch for process(): every row once per slot, with the
    // slot's own id (the path ids of a tree row all belong to one slot); the pad
    // row, last in the batch, is left out (and forgotten once seen)
    void rows_from_batch(const common_batch & batch, std::vector<dflash2::row> & rows,
            std::vector<llama_token> & tokens);
};

// sample-and-match on a tree: from the anchor's row (idxs[0]) the slot's sampler
// picks a token; while a child of the current node carries it, that child is
// accepted and its row (idxs[node + 1]) sampled next. Returns the emitted tokens
// (the accepted nodes' tokens, then the sampler's own), `path` the accepted nodes.
std::vector<llama_token> dflash2_server_verify_tree(common_sampler * smpl, llama_context * ctx,
        const std::vector<int> & idxs, const std::vector<dflash2::tree_node> & nodes, size_t n_probs_post,
        dflash2_server_verified & verified, std::vector<int32_t> & path);

// lossless verification of a sampled tree (drafted at the slot's temperature):
// at the anchor, then at each accepted node, the slot's sampler gives p at the
// node's row and the library (llama_spec_dflash2_verify_tree_sampled_step)
// accepts one of its children or draws the residual / bonus token. Returns the
// emitted tokens, `path` the accepted nodes (past an end-of-generation token too:
// the library's verification runs to its end)
std::vector<llama_token> dflash2_server_verify_tree_sampled(dflash2::engine & engine, llama_seq_id seq_id,
        common_sampler * smpl, llama_context * ctx, const std::vector<int> & idxs,
        const std::vector<dflash2::tree_node> & nodes, size_t n_probs_post, dflash2_server_verified & verified,
        std::vector<int32_t> & path);
