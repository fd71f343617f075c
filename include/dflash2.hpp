// dflash2 for C++ hosts: an owning engine handle over the C API of dflash2.h.
//
// Header-only, no dependency beyond dflash2.h (and llama.h through it). Every call
// that returns a negative status in C throws dflash2::error here, carrying that
// status and the message of llama_spec_dflash2_last_error().
//
//   dflash2::engine eng(ctx_tgt, "drafter.gguf", params);
//   eng.process_batch(batch);                        // after every target decode
//   auto drafts = eng.draft({ { seq, id_last, n_max } });
//   ...verify on the target...
//   eng.accept(seq, n_accepted);
//
// The engine is freed when the dflash2::engine goes out of scope; it must not
// outlive the target context it was created for.
#pragma once

#include "dflash2.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dflash2 {

using params          = llama_spec_dflash2_params;
using row             = llama_spec_dflash2_row;
using draft_request   = llama_spec_dflash2_draft_request;
using tree_request    = llama_spec_dflash2_tree_request;
using tree_node       = llama_spec_dflash2_tree_node;

// a draft request: greedy (temperature 0, upstream's chain) unless a temperature
// is given; a sampled draft needs the request's seed, and a draft temperature
// below 0 means "the library's choice" (params.adapt_sampled_drafts; off: the request's)
inline draft_request make_request(llama_seq_id seq_id, llama_token id_last, int32_t n_max, float temperature = 0.0f,
        uint32_t seed = 0, float draft_temperature = -1.0f) {
    draft_request r = {};
    r.seq_id            = seq_id;
    r.id_last           = id_last;
    r.n_max             = n_max;
    r.temperature       = temperature;
    r.draft_temperature = draft_temperature;
    r.seed              = seed;
    return r;
}
// a tree request: the greedy tree (temperature 0) unless a temperature is given,
// then a sampled tree verified with verify_tree_sampled[_step]; limits of 0 take
// the engine's defaults
inline tree_request make_tree_request(llama_seq_id seq_id, llama_token id_last, int32_t n_nodes, int32_t max_depth = 0,
        int32_t max_leaves = 0, float temperature = 0.0f, uint32_t seed = 0, float draft_temperature = -1.0f) {
    tree_request r = {};
    r.seq_id            = seq_id;
    r.id_last           = id_last;
    r.n_nodes           = n_nodes;
    r.max_depth         = max_depth;
    r.max_leaves        = max_leaves;
    r.temperature       = temperature;
    r.draft_temperature = draft_temperature;
    r.seed              = seed;
    return r;
}
// a request whose q is cut like the host sampler's p (top-k, top-p, min-p; 0 = off):
// works on draft and tree requests alike
template <typename request> inline request with_truncation(request r, int32_t top_k, float top_p, float min_p) {
    r.top_k = top_k;
    r.top_p = top_p;
    r.min_p = min_p;
    return r;
}
using stats           = llama_spec_dflash2_stats;
using seq_info        = struct llama_spec_dflash2_seq_info; // the function of that name hides the plain tag
using checkpoint_info = llama_spec_dflash2_checkpoint_info;

// a failed dflash2 call: what() is "dflash2 CALL: STATUS NAME: MESSAGE"
struct error : std::runtime_error {
    int32_t     status;  // an enum llama_spec_dflash2_status value (< 0)
    std::string message; // llama_spec_dflash2_last_error() right after the call

    error(int32_t status, const char * call, std::string message)
        : std::runtime_error(std::string("dflash2 ") + call + ": " + llama_spec_dflash2_status_name(status) + ": " + message),
          status(status),
          message(std::move(message)) {}
};

// throws dflash2::error when rc is a negative status; returns rc otherwise
inline int32_t check(int32_t rc, const char * call) {
    if (rc < 0) {
        throw error(rc, call, llama_spec_dflash2_last_error());
    }
    return rc;
}

inline params default_params() {
    return llama_spec_dflash2_default_params();
}

inline const char * version() {
    return llama_spec_dflash2_version();
}

// what the drafter at path declares; with model_tgt, also checked against that target
inline checkpoint_info checkpoint_check(const std::string & path_draft, const llama_model * model_tgt = nullptr) {
    checkpoint_info info;
    check(llama_spec_dflash2_checkpoint_check(path_draft.c_str(), model_tgt, &info), "checkpoint_check");
    return info;
}

// bytes an engine with these params needs for this drafter (weights, a draft KV for
// n_ctx_seq target rows per sequence, working buffers); model_tgt may be NULL when
// the target is not loaded yet
inline size_t estimate_memory(const llama_model * model_tgt, const std::string & path_draft, const params & p,
        uint32_t n_ctx_seq) {
    size_t bytes = 0;
    check(llama_spec_dflash2_estimate_memory(model_tgt, path_draft.c_str(), p, n_ctx_seq, &bytes), "estimate_memory");
    return bytes;
}

struct engine_deleter {
    void operator()(llama_spec_dflash2 * spec) const { llama_spec_dflash2_free(spec); }
};

using engine_ptr = std::unique_ptr<llama_spec_dflash2, engine_deleter>;

// a dflash2 engine bound to one target context; move-only, freed on destruction
struct engine {
    engine(llama_context * ctx_tgt, const std::string & path_draft, const params & p = default_params())
        : ptr(llama_spec_dflash2_init(ctx_tgt, path_draft.c_str(), p)) {
        if (!ptr) {
            throw error(init_status(), "init", llama_spec_dflash2_last_error());
        }
    }

    // the C handle, for calls this header does not wrap; still owned here
    llama_spec_dflash2 * get() const { return ptr.get(); }

    // the rows of the batch the target just decoded
    void process(const std::vector<row> & rows) {
        check(llama_spec_dflash2_process(get(), rows.data(), (int32_t) rows.size()), "process");
    }

    // the same with each row's token (tokens[i] of rows[i]; negative: unknown), the text
    // n-gram branches match against
    void process(const std::vector<row> & rows, const std::vector<llama_token> & tokens) {
        if (tokens.size() != rows.size()) {
            throw error(LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT, "process_tokens",
                    std::to_string(tokens.size()) + " tokens for " + std::to_string(rows.size()) + " rows");
        }
        check(llama_spec_dflash2_process_tokens(get(), rows.data(), tokens.data(), (int32_t) rows.size()),
                "process_tokens");
    }

    void process_batch(llama_batch batch) {
        check(llama_spec_dflash2_process_batch(get(), batch), "process_batch");
    }

    // one draft call for every request; out[i] receives request i's draft (maybe empty)
    void draft(const std::vector<draft_request> & requests, std::vector<std::vector<llama_token>> & out) {
        out.resize(requests.size());
        if (requests.empty()) {
            return;
        }
        int32_t capacity = 0;
        for (const auto & r : requests) {
            capacity += r.n_max > 0 ? r.n_max : 0;
        }
        tokens.resize(capacity);
        n_drafted.resize(requests.size());
        check(llama_spec_dflash2_draft(get(), requests.data(), (int32_t) requests.size(), tokens.data(), capacity,
                n_drafted.data()), "draft");
        size_t at = 0;
        for (size_t k = 0; k < requests.size(); ++k) {
            out[k].assign(tokens.begin() + at, tokens.begin() + at + n_drafted[k]);
            at += n_drafted[k];
        }
    }

    std::vector<std::vector<llama_token>> draft(const std::vector<draft_request> & requests) {
        std::vector<std::vector<llama_token>> out;
        draft(requests, out);
        return out;
    }

    // one tree draft call for every request; out[i] receives request i's tree (maybe empty)
    void draft_tree(const std::vector<tree_request> & requests, std::vector<std::vector<tree_node>> & out) {
        out.resize(requests.size());
        if (requests.empty()) {
            return;
        }
        int32_t capacity = 0;
        for (const auto & r : requests) {
            capacity += r.n_nodes > 0 ? r.n_nodes : n_max();
        }
        nodes.resize(capacity);
        n_drafted.resize(requests.size());
        check(llama_spec_dflash2_draft_tree(get(), requests.data(), (int32_t) requests.size(), nodes.data(), capacity,
                n_drafted.data()), "draft_tree");
        size_t at = 0;
        for (size_t k = 0; k < requests.size(); ++k) {
            out[k].assign(nodes.begin() + at, nodes.begin() + at + n_drafted[k]);
            at += n_drafted[k];
        }
    }

    // greedy verification of seq_id's tree from the target rows i_batch (anchor
    // first) and its accept_tree(); emitted receives the accepted nodes' tokens
    // and the next id_last, path the accepted node indices
    void verify_tree_greedy(llama_seq_id seq_id, const std::vector<int32_t> & i_batch, std::vector<llama_token> & emitted,
            std::vector<int32_t> & path) {
        emitted.resize(i_batch.size());
        path.resize(i_batch.size());
        int32_t n_emitted = 0;
        check(llama_spec_dflash2_verify_tree_greedy(get(), seq_id, i_batch.data(), (int32_t) i_batch.size(),
                emitted.data(), (int32_t) emitted.size(), &n_emitted, path.data()), "verify_tree_greedy");
        emitted.resize(n_emitted);
        path.resize(n_emitted - 1);
    }

    // lossless verification of one node of seq_id's sampled tree (-1: the anchor)
    // against the host's distribution p at its verify row
    // (llama_spec_dflash2_verify_tree_sampled_step): returns the accepted child's
    // node index, the next node to verify, or -1 at the end; `token` receives
    // what the host emits (the child's token, or the residual/bonus token)
    int32_t verify_tree_sampled_step(llama_seq_id seq_id, int32_t node, const llama_token_data_array & p,
            llama_token & token) {
        int32_t child = -1;
        check(llama_spec_dflash2_verify_tree_sampled_step(get(), seq_id, node, &p, &token, &child),
                "verify_tree_sampled_step");
        return child;
    }

    // lossless verification of seq_id's whole sampled tree from dense p rows
    // (n_rows x n_vocab, anchor first) and its accept_tree(); as verify_tree_greedy
    void verify_tree_sampled(llama_seq_id seq_id, const std::vector<float> & p_rows, int32_t n_rows, int32_t n_vocab,
            std::vector<llama_token> & emitted, std::vector<int32_t> & path) {
        emitted.resize(n_rows);
        path.resize(n_rows);
        int32_t n_emitted = 0;
        check(llama_spec_dflash2_verify_tree_sampled(get(), seq_id, p_rows.data(), n_rows, n_vocab, emitted.data(),
                (int32_t) emitted.size(), &n_emitted, path.data()), "verify_tree_sampled");
        emitted.resize(n_emitted);
        path.resize(n_emitted - 1);
    }

    // the host verified seq_id's tree itself and accepts `path` (node indices, depth 1
    // first; empty when the target rejected every child of the anchor)
    void accept_tree(llama_seq_id seq_id, const std::vector<int32_t> & path) {
        check(llama_spec_dflash2_accept_tree(get(), seq_id, path.data(), (int32_t) path.size()), "accept_tree");
    }

    // the target's KV bookkeeping of trees of at most n_leaves leaves, kept by the
    // engine (llama_spec_dflash2_tree_kv_init): the target context needs
    // llama_spec_dflash2_tree_kv_seq_ids(n_seq, n_leaves) sequence ids
    void tree_kv_init(int32_t n_leaves) {
        check(llama_spec_dflash2_tree_kv_init(get(), n_leaves), "tree_kv_init");
    }

    // the verify rows of seq_id's tree, its path ids tagged on the target
    // (llama_spec_dflash2_tree_kv_rows): row r's sequence ids are
    // seq_ids[rows[r].seq_id_first .. + rows[r].n_seq_id)
    void tree_kv_rows(llama_seq_id seq_id, llama_token id_last, llama_pos n_past, int32_t n_nodes,
            std::vector<llama_spec_dflash2_tree_row> & rows, std::vector<llama_seq_id> & seq_ids) {
        rows.resize(n_nodes + 1);
        seq_ids.resize((size_t) (n_nodes + 1) * (size_t) std::max(n_nodes, 1) + 1);
        int32_t n_rows = 0;
        check(llama_spec_dflash2_tree_kv_rows(get(), seq_id, id_last, n_past, rows.data(), (int32_t) rows.size(),
                seq_ids.data(), (int32_t) seq_ids.size(), &n_rows), "tree_kv_rows");
        rows.resize(n_rows);
    }

    // after verification accepted `path`: the step's cells parked, the path kept in
    // seq_id (llama_spec_dflash2_tree_kv_commit)
    void tree_kv_commit(llama_seq_id seq_id, const std::vector<int32_t> & path) {
        check(llama_spec_dflash2_tree_kv_commit(get(), seq_id, path.data(), (int32_t) path.size()), "tree_kv_commit");
    }

    // frees every parked cell (the cache ran short: retry the decode)
    void tree_kv_unpark() { check(llama_spec_dflash2_tree_kv_unpark(get()), "tree_kv_unpark"); }

    // whether the cache has cells for n_trees more trees of n_nodes this step; when it
    // does not, every parked cell was freed (llama_spec_dflash2_tree_kv_room)
    bool tree_kv_room(int32_t n_trees, int32_t n_nodes) {
        bool room = false;
        check(llama_spec_dflash2_tree_kv_room(get(), n_trees, n_nodes, &room), "tree_kv_room");
        return room;
    }

    // the engine's sequence a path or park id belongs to (llama_spec_dflash2_tree_kv_owner)
    llama_seq_id tree_kv_owner(llama_seq_id seq_id) const {
        const int32_t owner = llama_spec_dflash2_tree_kv_owner(get(), seq_id);
        check(owner < 0 ? owner : 0, "tree_kv_owner");
        return owner;
    }

    // a row more for a decode of n_rows rows (room for n_rows_max; seq_last: its last row's
    // sequence id) whose last ubatch would be one row over parked cells: add it with the one
    // sequence id, logits off, and do not pass it to process (llama_spec_dflash2_tree_kv_pad)
    bool tree_kv_pad(int32_t n_rows, int32_t n_rows_max, llama_seq_id seq_last, llama_spec_dflash2_tree_row & row,
            llama_seq_id & seq_id) {
        const int32_t ret = llama_spec_dflash2_tree_kv_pad(get(), n_rows, n_rows_max, seq_last, &row, &seq_id);
        check(ret < 0 ? ret : 0, "tree_kv_pad");
        return ret == 1;
    }

    // cells parked, and whether parked cells were freed since the sequences were emptied
    std::pair<int64_t, bool> tree_kv_parked() const {
        int64_t n = 0;
        bool unparked = false;
        check(llama_spec_dflash2_tree_kv_parked(get(), &n, &unparked), "tree_kv_parked");
        return { n, unparked };
    }

    void accept(llama_seq_id seq_id, int32_t n_accepted) {
        check(llama_spec_dflash2_accept(get(), seq_id, n_accepted), "accept");
    }

    // lossless verification of position i of the sampled draft of seq_id against
    // the host's distribution p there (llama_spec_dflash2_verify_sampled_step):
    // `token` receives what the host emits; true while the drafted token was kept
    bool verify_sampled_step(llama_seq_id seq_id, int32_t i, const llama_token_data_array & p, llama_token & token) {
        bool accepted = false;
        check(llama_spec_dflash2_verify_sampled_step(get(), seq_id, i, &p, &token, &accepted), "verify_sampled_step");
        return accepted;
    }

    // mirrors of the target's llama_memory_seq_* calls
    void seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) {
        check(llama_spec_dflash2_seq_rm(get(), seq_id, p0, p1), "seq_rm");
    }

    void seq_cp(llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1) {
        check(llama_spec_dflash2_seq_cp(get(), seq_id_src, seq_id_dst, p0, p1), "seq_cp");
    }

    void seq_shift(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos delta) {
        check(llama_spec_dflash2_seq_shift(get(), seq_id, p0, p1, delta), "seq_shift");
    }

    void seq_clear(llama_seq_id seq_id) {
        check(llama_spec_dflash2_seq_clear(get(), seq_id), "seq_clear");
    }

    // the state blob of one sequence, its size, and its restore
    size_t state_size(llama_seq_id seq_id) const {
        size_t size = 0;
        check(llama_spec_dflash2_state_size(get(), seq_id, &size), "state_size");
        return size;
    }

    std::vector<uint8_t> state_get(llama_seq_id seq_id) const {
        std::vector<uint8_t> blob(state_size(seq_id));
        size_t written = 0;
        check(llama_spec_dflash2_state_get(get(), seq_id, blob.data(), blob.size(), &written), "state_get");
        blob.resize(written);
        return blob;
    }

    void state_set(llama_seq_id seq_id, const std::vector<uint8_t> & blob) {
        check(llama_spec_dflash2_state_set(get(), seq_id, blob.data(), blob.size()), "state_set");
    }

    stats get_stats() const {
        stats s;
        check(llama_spec_dflash2_get_stats(get(), &s), "get_stats");
        return s;
    }

    void reset_stats() {
        check(llama_spec_dflash2_reset_stats(get()), "reset_stats");
    }

    seq_info get_seq_info(llama_seq_id seq_id) const {
        seq_info info;
        check(llama_spec_dflash2_seq_info(get(), seq_id, &info), "seq_info");
        return info;
    }

    int32_t n_max() const { return check(llama_spec_dflash2_n_max(get()), "n_max"); }

    int32_t block_size() const { return check(llama_spec_dflash2_block_size(get()), "block_size"); }
    // the graph of the drafter's forward: LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_OWN or _LIBLLAMA
    int32_t draft_graph() const { return check(llama_spec_dflash2_draft_graph(get()), "draft_graph"); }

private:
    engine_ptr ptr;

    // scratch of draft(), kept to avoid allocating every step
    std::vector<llama_token> tokens;
    std::vector<int32_t>     n_drafted;
    std::vector<tree_node>   nodes;

    // llama_spec_dflash2_init returns NULL; the status it failed with is the thread's last
    static int32_t init_status() {
        const int32_t rc = llama_spec_dflash2_last_status();
        return rc != LLAMA_SPEC_DFLASH2_OK ? rc : LLAMA_SPEC_DFLASH2_ERR_INTERNAL;
    }
};

} // namespace dflash2
