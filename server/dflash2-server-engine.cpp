// dflash2_server_spec over a dflash2 engine (dflash2.hpp): the drafter loaded once,
// by dflash2, on the server's target context; no draft context in the server.
#include "dflash2-server-impl.h"
#include "dflash2-batch-rows.h"

#include "log.h"

namespace {

// how one slot samples, set before each draft
struct slot_sampling {
    float       temp = 0.0f;      // > 0: sampled drafts, verified by rejection sampling
    uint32_t    seed = 0;         // the slot's sampler seed: the library's generators'
    std::string mode = "greedy";  // for /slots

    bool    restart       = true;  // a new generation began: the library's generators start over
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
    std::vector<dflash2::draft_request>   requests;
    std::vector<std::vector<llama_token>> drafts;

    spec_dflash2(llama_context * ctx_tgt, const std::string & path_draft, const dflash2::params & params,
            int32_t n_parallel)
        : engine(ctx_tgt, path_draft, params), dparams(n_parallel), sampling(n_parallel) {
        dflash2_server_publish_stats(engine.get_stats(), engine.n_max());
        LOG_INF("%s: dflash2 %s serves the DFlash2 drafter '%s' (n_max %d, block %d)\n", __func__, dflash2::version(),
                path_draft.c_str(), engine.n_max(), engine.block_size());
    }

    const char * name() const override { return "dflash2"; }

    common_speculative_draft_params & draft_params(llama_seq_id seq_id) override { return dparams.at(seq_id); }

    // dflash2 already holds every committed row of the prompt
    void begin(llama_seq_id seq_id, const llama_tokens &) override { sampling.at(seq_id).restart = true; }

    bool process(const common_batch & batch) override {
        dflash2_rows_from_batch(batch, rows);
        try {
            engine.process(rows);
        } catch (const dflash2::error & e) {
            LOG_ERR("%s\n", e.what());
            return false;
        }
        return true;
    }

    void draft() override {
        requests.clear();
        for (size_t seq = 0; seq < dparams.size(); ++seq) {
            auto & dp = dparams[seq];
            if (!dp.drafting || dp.n_max <= 0 || !dp.result) {
                continue;
            }
            dp.result->clear();
            const slot_sampling & s = sampling[seq];
            // temperature 0: the greedy chain, as before
            requests.push_back(dflash2::make_request((int32_t) seq, dp.id_last, dp.n_max, s.temp, s.seed));
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
        try {
            engine.accept(seq_id, n);
        } catch (const dflash2::error & e) {
            LOG_ERR("%s\n", e.what());
        }
        dflash2_server_publish_stats(engine.get_stats(), engine.n_max());
    }

    bool get_state(llama_seq_id seq_id, std::vector<uint8_t> & data) override {
        state_save(nullptr, seq_id, data);
        return !data.empty();
    }

    void set_state(llama_seq_id seq_id, const std::vector<uint8_t> & data) override { state_load(seq_id, data); }

    void print_stats() const override { dflash2_server_log_stats(engine.get_stats(), engine.n_max()); }

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
        if (params.temp <= 0.0f) {
            s.mode = "greedy";
        } else if (const char * why = dflash2_server_sampled_verify_blocker(params)) {
            s.mode = std::string("sample-and-match: ") + why;
        } else {
            s.temp = params.temp;
            s.mode = "rejection-sampling";
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

    void seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) override { engine.seq_rm(seq_id, p0, p1); }

    void seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos delta) override {
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
