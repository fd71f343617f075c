// dflash2_server_spec over a dflash2 engine (dflash2.hpp): the drafter loaded once,
// by dflash2, on the server's target context; no draft context in the server.
#include "dflash2-server-impl.h"
#include "dflash2-batch-rows.h"

#include "log.h"

namespace {

struct spec_dflash2 : dflash2_server_spec {
    dflash2::engine engine;

    std::vector<common_speculative_draft_params> dparams; // per sequence, filled by the server

    // scratch of the calls, kept to avoid allocating every step
    std::vector<dflash2::row>             rows;
    std::vector<dflash2::draft_request>   requests;
    std::vector<std::vector<llama_token>> drafts;

    spec_dflash2(llama_context * ctx_tgt, const std::string & path_draft, const dflash2::params & params,
            int32_t n_parallel)
        : engine(ctx_tgt, path_draft, params), dparams(n_parallel) {
        dflash2_server_publish_stats(engine.get_stats(), engine.n_max());
        LOG_INF("%s: dflash2 %s serves the DFlash2 drafter '%s' (n_max %d, block %d)\n", __func__, dflash2::version(),
                path_draft.c_str(), engine.n_max(), engine.block_size());
    }

    const char * name() const override { return "dflash2"; }

    common_speculative_draft_params & draft_params(llama_seq_id seq_id) override { return dparams.at(seq_id); }

    // dflash2 already holds every committed row of the prompt
    void begin(llama_seq_id, const llama_tokens &) override {}

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
            requests.push_back(dflash2::make_request((int32_t) seq, dp.id_last, dp.n_max));
        }
        if (!requests.empty()) {
            try {
                engine.draft(requests, drafts);
                for (size_t k = 0; k < requests.size(); ++k) {
                    dparams[requests[k].seq_id].result->assign(drafts[k].begin(), drafts[k].end());
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
        try {
            engine.accept(seq_id, n_accepted);
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
