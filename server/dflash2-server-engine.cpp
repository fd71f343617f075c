// dflash2_server_spec over a dflash2 engine (dflash2.hpp): the drafter loaded once,
// by dflash2, on the server's target context; no draft context in the server.
#include "dflash2-server-impl.h"
#include "dflash2-batch-rows.h"

#include "log.h"

namespace {

// how one slot samples, set before each draft
struct slot_sampling {
    float       temp = 0.0f;      // > 0: sampled drafts, verified by rejection sampling
    int32_t     top_k = 0;        // the slot's truncation of p, applied to q too (0 / 1 / 0: off)
    float       top_p = 1.0f;
    float       min_p = 0.0f;
    uint32_t    seed = 0;         // the slot's sampler seed: the library's generators'
    std::string mode = "greedy";  // for /slots

    bool    restart       = true;  // a new generation began: the library's generators start over
    bool    tree          = false; // --spec-dflash2-tree and a sampler trees can verify: the slot drafts trees
    bool    sampled_draft = false; // the draft awaiting verification was sampled
    int32_t n_verified    = -1;    // positions the library's sampled verification accepted, until accept()

    dflash2_server_verified verified; // for the emitted tokens' probabilities
};

struct spec_dflash2 : dflash2_server_spec {
    dflash2::engine engine;

    std::vector<common_speculative_draft_params> dparams;  // per sequence, filled by the server
    std::vector<slot_sampling>                   sampling; // per sequence

    // scratch of the calls, kept to avoid allocating every step
    std::vector<dflash2::row>             rows;
    std::vector<llama_token>              tokens;
    std::vector<dflash2::draft_request>   requests;
    std::vector<std::vector<llama_token>> drafts;
    std::vector<dflash2::tree_request>           tree_requests;
    std::vector<std::vector<dflash2::tree_node>> trees;

    dflash2_server_tree tree; // off unless --spec-dflash2-tree and the context can branch

    spec_dflash2(llama_context * ctx_tgt, const std::string & path_draft, const dflash2::params & params,
            int32_t n_parallel)
        : engine(ctx_tgt, path_draft, params), dparams(n_parallel), sampling(n_parallel) {
        dflash2_server_publish_stats(engine.get_stats(), engine.n_max());
        LOG_INF("%s: dflash2 %s serves the DFlash2 drafter '%s' (n_max %d, block %d)\n", __func__, dflash2::version(),
                path_draft.c_str(), engine.n_max(), engine.block_size());
        const dflash2_server_options & opts = dflash2_server_opts();
        tree.init(ctx_tgt, engine, n_parallel, opts.tree_nodes, opts.tree_leaves);
        const std::string budget = tree.on() ? string_format("trees of up to %d nodes per slot and step", tree.n_nodes)
                                             : std::string("chains");
        LOG_INF("dflash2: %s walk, %s (default: the adaptive walk with trees of up to %d nodes where the KV cache "
                "can branch, chains elsewhere; --spec-dflash2-walk greedy: upstream's greedy chains; "
                "--spec-dflash2-tree N: the tree budget, 0 = chains)\n", walk(), budget.c_str(),
                DFLASH2_SERVER_TREE_DEFAULT_NODES);
    }

    const char * name() const override { return "dflash2"; }

    const char * walk() const override {
        return dflash2_server_opts().walk == LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE ? "adaptive" : "greedy";
    }

    int32_t tree_budget() const override { return tree.n_nodes; }

    const char * draft_graph() const override {
        return engine.draft_graph() == LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_LIBLLAMA ? "libllama" : "own";
    }

    bool drafted_branch(llama_seq_id seq_id) const override {
        return tree.active(seq_id) && tree.slots[seq_id].branched;
    }

    common_speculative_draft_params & draft_params(llama_seq_id seq_id) override { return dparams.at(seq_id); }

    // dflash2 already holds every committed row of the prompt
    void begin(llama_seq_id seq_id, const llama_tokens &) override { sampling.at(seq_id).restart = true; }

    bool process(const common_batch & batch) override {
        if (tree.on()) {
            tree.rows_from_batch(batch, rows, tokens);
        } else {
            dflash2_rows_from_batch(batch, rows, tokens);
        }
        try {
            engine.process(rows, tokens);
        } catch (const dflash2::error & e) {
            LOG_ERR("%s\n", e.what());
            return false;
        }
        return true;
    }

    void pad_batch(int32_t n_rows, int32_t n_rows_max, llama_seq_id seq_last, const dflash2_server_add_row & add) override {
        tree.pad(n_rows, n_rows_max, seq_last, add);
    }

    void draft() override {
        requests.clear();
        tree_requests.clear();
        for (size_t seq = 0; seq < dparams.size(); ++seq) {
            auto & dp = dparams[seq];
            if (!dp.drafting || dp.n_max <= 0 || !dp.result) {
                continue;
            }
            dp.result->clear();
            const slot_sampling & s = sampling[seq];
            if (s.tree && tree.has_room((llama_seq_id) seq, (int32_t) tree_requests.size())) {
                // temperature 0: the greedy tree; > 0: a sampled tree for lossless verification
                tree_requests.push_back(dflash2::with_truncation(dflash2::make_tree_request((int32_t) seq, dp.id_last,
                        tree.n_nodes, dp.n_max, tree.n_leaves, s.temp, s.seed), s.top_k, s.top_p, s.min_p));
                continue;
            }
            // temperature 0: the greedy chain, as before
            requests.push_back(dflash2::with_truncation(dflash2::make_request((int32_t) seq, dp.id_last, dp.n_max, s.temp,
                    s.seed), s.top_k, s.top_p, s.min_p));
        }
        // trees and chains in one step take two draft decodes (sampling slots beside greedy ones)
        if (!tree_requests.empty()) {
            try {
                engine.draft_tree(tree_requests, trees);
                for (size_t k = 0; k < tree_requests.size(); ++k) {
                    const llama_seq_id seq = tree_requests[k].seq_id;
                    auto & result = *dparams[seq].result;
                    for (const auto & node : trees[k]) {
                        result.push_back(node.token);
                    }
                    sampling[seq].sampled_draft = tree_requests[k].temperature > 0.0f && !trees[k].empty();
                    sampling[seq].n_verified    = -1;
                    tree.set(seq, std::move(trees[k]));
                }
            } catch (const dflash2::error & e) {
                LOG_ERR("%s\n", e.what());
            }
        }
        if (!requests.empty()) {
            try {
                engine.draft(requests, drafts);
                for (size_t k = 0; k < requests.size(); ++k) {
                    const llama_seq_id seq = requests[k].seq_id;
                    dparams[seq].result->assign(drafts[k].begin(), drafts[k].end());
                    sampling[seq].sampled_draft = requests[k].temperature > 0.0f && !drafts[k].empty();
                    sampling[seq].n_verified    = -1;
                }
            } catch (const dflash2::error & e) {
                // no drafts this step: the slots decode their sampled token alone
                LOG_ERR("%s\n", e.what());
            }
        }
        for (auto & dp : dparams) {
            dp.drafting = false;
        }
    }

    void accept(llama_seq_id seq_id, uint16_t n_accepted) override {
        // after a sampled verification the library wants the positions it accepted,
        // also when an end-of-generation token ended the emitted tokens before them
        // (the server's seq_rm then trims the rows after the end)
        int32_t n = n_accepted;
        if (seq_id >= 0 && (size_t) seq_id < sampling.size() && sampling[seq_id].n_verified >= 0) {
            n = sampling[seq_id].n_verified;
            sampling[seq_id].n_verified = -1;
        }
        if (tree.active(seq_id)) {
            accept_tree(seq_id, n);
        } else {
            try {
                engine.accept(seq_id, n);
            } catch (const dflash2::error & e) {
                LOG_ERR("%s\n", e.what());
            }
        }
        dflash2_server_publish_stats(engine.get_stats(), engine.n_max());
    }

    // the verified path of seq's tree into the engine, then into the target's KV cache
    void accept_tree(llama_seq_id seq_id, int32_t n_accepted) {
        auto & st = tree.slots[seq_id];
        // a sampled tree's verification runs to its end (the library wants its whole
        // path) also past an end-of-generation token; the server trims the rest
        const bool whole = sampling[seq_id].sampled_draft && (int32_t) st.path.size() >= n_accepted;
        if (!st.verified || (!whole && (int32_t) st.path.size() != n_accepted)) {
            // cannot happen: the server accepts what sample_and_accept_n verified
            LOG_ERR("dflash2: slot %d accepts %d tokens of a tree whose verified path has %zu\n", seq_id, n_accepted,
                    st.path.size());
            st.path.resize(std::min<size_t>(st.path.size(), (size_t) std::max(n_accepted, 0)));
        }
        try {
            engine.accept_tree(seq_id, st.path);
        } catch (const dflash2::error & e) {
            LOG_ERR("%s\n", e.what());
        }
        tree.commit(seq_id, counters.at(seq_id));
    }

    bool add_draft_rows(llama_seq_id seq_id, llama_token id_last, const llama_tokens & draft, llama_pos pos0,
            const dflash2_server_add_row & add) override {
        if (tree.active(seq_id)) {
            return tree.add_rows(seq_id, id_last, pos0, add);
        }
        return dflash2_server_spec::add_draft_rows(seq_id, id_last, draft, pos0, add);
    }

    bool get_state(llama_seq_id seq_id, std::vector<uint8_t> & data) override {
        state_save(nullptr, seq_id, data);
        return !data.empty();
    }

    void set_state(llama_seq_id seq_id, const std::vector<uint8_t> & data) override { state_load(seq_id, data); }

    void print_stats() const override {
        dflash2_server_log_stats(engine.get_stats(), engine.n_max());
        const dflash2_server_slot_counters sum = dflash2_server_counters_sum(counters);
        const int64_t n_drafting = sum.n_steps_chain + sum.n_steps_tree;
        LOG_INF("dflash2: %s walk, steps with no draft %lld, a chain %lld, a tree %lld; %.2f nodes per verify step\n",
                walk(), (long long) sum.n_steps_none, (long long) sum.n_steps_chain, (long long) sum.n_steps_tree,
                n_drafting > 0 ? (double) sum.n_drafted / n_drafting : 0.0);
        if (tree.on()) {
            LOG_INF("dflash2: trees verified %lld, with a branch %lld, accepted through a branch off the chain %lld\n",
                    (long long) sum.n_tree_steps, (long long) sum.n_tree_branched, (long long) sum.n_tree_side_accepted);
        }
    }

    int32_t n_max() const override { return engine.n_max(); }

    const std::vector<double> & synth_probs() const override {
        static const std::vector<double> none;
        return none;
    }

    // feature rows of any width, images included
    bool takes_embd_batches() const override { return true; }

    void set_sampling(llama_seq_id seq_id, const common_params_sampling & params, const common_sampler * smpl) override {
        slot_sampling & s = sampling.at(seq_id);
        s.temp = 0.0f;
        s.seed = common_sampler_get_seed(smpl);
        s.tree = false;
        const char * blocker = params.temp > 0.0f ? dflash2_server_sampled_verify_blocker(params) : nullptr;
        if (tree.on()) {
            // greedy slots verify trees by sample-and-match, sampling ones by lossless
            // rejection sampling over each node's children; one line per request says
            // why a slot drafts chains instead
            std::string why = params.backend_sampling ? "it samples on the backend, which sees the slot's own rows only"
                            : blocker ? std::string("its sampler needs sample-and-match (") + blocker + "), which "
                                        "verifies greedy trees only"
                            : "";
            s.tree = why.empty();
            if (!s.tree && s.restart) {
                LOG_INF("dflash2: slot %d drafts chains for this request: %s\n", seq_id, why.c_str());
            }
        }
        if (params.temp <= 0.0f) {
            s.mode = s.tree ? "greedy-tree" : "greedy";
        } else if (blocker) {
            s.mode = std::string("sample-and-match: ") + blocker;
        } else {
            s.temp  = params.temp;
            s.top_k = params.top_k;
            s.top_p = params.top_p;
            s.min_p = params.min_p;
            s.mode  = s.tree ? "rejection-sampling-tree" : "rejection-sampling";
            if (s.restart) {
                restart_generators(seq_id);
            }
        }
        s.restart = false;
    }

    // a request with a fixed seed answers the same each time, as a plain server
    // does: the library's generators of a sequence carry on across its drafts
    // while the sequence keeps rows (a prompt cache hit keeps them), and start
    // over from the seed after a state restore, which this round trip is
    void restart_generators(llama_seq_id seq_id) {
        try {
            engine.state_set(seq_id, engine.state_get(seq_id));
        } catch (const dflash2::error & e) {
            LOG_WRN("dflash2: the sampled drafts of sequence %d continue their random streams: %s\n", seq_id,
                    e.message.c_str());
        }
    }

    std::vector<llama_token> sample_and_accept_n(llama_seq_id seq_id, common_sampler * smpl, llama_context * ctx,
            const std::vector<int> & idxs, const llama_tokens & draft, bool is_replay, size_t n_probs_post) override {
        slot_sampling & s = sampling.at(seq_id);
        if (tree.active(seq_id)) {
            auto & st = tree.slots[seq_id];
            st.verified = true;
            if (s.sampled_draft) {
                return dflash2_server_verify_tree_sampled(engine, seq_id, smpl, ctx, idxs, st.nodes, n_probs_post,
                        s.verified, st.path);
            }
            return dflash2_server_verify_tree(smpl, ctx, idxs, st.nodes, n_probs_post, s.verified, st.path);
        }
        if (!s.sampled_draft) {
            return dflash2_server_verify_match(smpl, ctx, idxs, draft, n_probs_post, s.verified);
        }
        if (is_replay) {
            s.n_verified = -1;
            return dflash2_server_verify_replay(smpl, ctx, idxs, draft, n_probs_post, s.verified);
        }
        return dflash2_server_verify_sampled(engine, seq_id, smpl, ctx, idxs, draft, n_probs_post, s.verified,
                s.n_verified);
    }

    int32_t draft_probs_row(llama_seq_id seq_id, common_sampler * smpl, size_t i) override {
        return sampling.at(seq_id).verified.row_for_probs(smpl, i);
    }

    std::string verify_mode(llama_seq_id seq_id) const override { return sampling.at(seq_id).mode; }

    void seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) override {
        // whether committed rows go (a new request, a shift), not only a rejected draft's
        bool cuts_history = p0 < 0 && p1 < 0;
        if (tree.on() && seq_id >= 0 && !cuts_history) {
            try {
                cuts_history = p0 <= engine.get_seq_info(seq_id).last_target_pos;
            } catch (const dflash2::error &) {
                // the engine's seq_rm below says why
            }
        }
        engine.seq_rm(seq_id, p0, p1);
        tree.on_seq_rm(seq_id, p0, p1, cuts_history);
    }

    void seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos delta) override {
        // the library moves the parked cells of trees with the slot's
        engine.seq_shift(seq_id, p0, p1, delta);
    }

    void seq_cp(llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1) override {
        engine.seq_cp(seq_id_src, seq_id_dst, p0, p1);
    }

    size_t state_size(llama_context *, llama_seq_id seq_id) const override {
        try {
            return engine.state_size(seq_id);
        } catch (const dflash2::error &) {
            return 0; // state_save says why
        }
    }

    void state_save(llama_context *, llama_seq_id seq_id, std::vector<uint8_t> & dst) const override {
        try {
            dst = engine.state_get(seq_id);
        } catch (const dflash2::error & e) {
            LOG_WRN("dflash2: not saving the draft state of sequence %d: %s\n", seq_id, e.message.c_str());
            dst.clear();
        }
    }

    bool state_load(llama_seq_id seq_id, const std::vector<uint8_t> & data) override {
        std::string why = "none saved";
        if (!data.empty()) {
            try {
                engine.state_set(seq_id, data);
                return true;
            } catch (const dflash2::error & e) {
                why = e.message;
            }
        }
        // the draft starts over for this sequence; outputs do not depend on it
        LOG_WRN("dflash2: draft state of sequence %d not restored: %s\n", seq_id, why.c_str());
        engine.seq_clear(seq_id);
        return true;
    }

    void slot_file_save(llama_seq_id seq_id, const std::string & path) const override {
        std::vector<uint8_t> blob;
        state_save(nullptr, seq_id, blob);
        if (!dflash2_server_write_file(path, blob)) {
            LOG_WRN("dflash2: cannot write the draft state to %s\n", path.c_str());
        }
    }

    void slot_file_load(llama_seq_id seq_id, const std::string & path) override {
        state_load(seq_id, dflash2_server_read_file(path));
    }
};

} // namespace

dflash2_server_spec * dflash2_server_spec_dflash2(llama_context * ctx_tgt, const std::string & path_draft,
        const dflash2::params & params, int32_t n_parallel) {
    return new spec_dflash2(ctx_tgt, path_draft, params, n_parallel);
}
