// dflash2 through its C++ face (dflash2.hpp).
#include "dflash2-batch-rows.h"
#include "dflash2.hpp"
#include "host.h"

dflash2::params host_engine_params(host_target & tgt, int32_t walk, int32_t draft_graph) {
    const host_params & hp = tgt.params;
    dflash2::params params = dflash2::default_params();
    params.devices         = tgt.draft_placement.list();
    params.n_gpu_layers    = hp.draft_ngl;
    params.n_seq           = (uint32_t) hp.n_seq;
    params.n_max           = hp.n_max;
    params.n_min           = hp.n_min;
    params.n_threads       = hp.n_threads;
    params.n_threads_batch = hp.n_threads;
    params.walk            = walk;
    params.ngram_branches  = hp.ngram_branches;
    params.first_child     = hp.first_child;
    params.adapt_sampled_drafts = hp.adapt_sampled;
    params.draft_graph          = draft_graph >= 0 ? draft_graph : hp.draft_graph;
    return params;
}

void host_add_engine_stats(host_stats & stats, const dflash2::engine & engine) {
    const dflash2::stats s = engine.get_stats();
    stats.has_split   = true;
    stats.draft_graph = engine.draft_graph();
    stats.t_inject_us += (int64_t) s.t_inject_us;
    stats.t_noise_us  += (int64_t) s.t_draft_us;
    stats.t_walk_us   += (int64_t) s.t_walk_us;
    stats.t_copy_us   += (int64_t) s.t_process_us;
    stats.n_tuned_drafts  += (int64_t) s.n_tuned_drafts;
    stats.tuned_ratio_sum += s.mean_draft_temperature_ratio * (double) s.n_tuned_drafts;
    stats.n_noise_decodes        += (int64_t) s.n_noise_decodes;
    stats.n_head_slices           = (int64_t) s.n_head_slices;
    stats.head_bytes_moved       += (int64_t) s.head_bytes_moved;
    stats.head_bytes_full_gather += (int64_t) s.head_bytes_full_gather;
    stats.head_bytes_mirrored     = (int64_t) s.head_bytes_mirrored;
}

namespace {

struct drafter_dflash2 : host_drafter {
    dflash2::engine engine;

    std::vector<dflash2::row>           rows;
    std::vector<llama_token>            tokens;
    std::vector<dflash2::draft_request> requests;

    const host_params & hp; // the target's sampling (temperature, truncation): the drafts' too
    float temp;
    float draft_temp; // the draft temperature requests carry (< 0: the library chooses)

    bool feed_only; // process() and seq_rm() only: drafts nothing, never calls draft() or accept()

    drafter_dflash2(host_target & tgt, int32_t walk, bool feed_only, int32_t draft_graph)
        : engine(tgt.ctx, tgt.params.path_draft, host_engine_params(tgt, walk, draft_graph)), hp(tgt.params), temp(tgt.params.temp),
          draft_temp(host_draft_temp(tgt.params)), feed_only(feed_only) {}

    const char * name() const override { return "dflash2"; }

    void process(const common_batch & batch) override {
        dflash2_rows_from_batch(batch, rows, tokens);
        engine.process(rows, tokens);
    }

    void draft(const std::vector<draft_request> & reqs, std::vector<std::vector<llama_token>> & out) override {
        if (feed_only) {
            out.assign(reqs.size(), {});
            return;
        }
        requests.clear();
        for (const auto & r : reqs) {
            // temperature 0: the greedy chain, as before; > 0: a sampled draft with its q
            requests.push_back(
                    host_truncated(hp, dflash2::make_request(r.seq, r.id_last, r.n_max, temp, r.seed, draft_temp)));
        }
        engine.draft(requests, out);
    }

    bool drafts_sampled() const override { return temp > 0.0f; }

    bool verify_step(llama_seq_id seq, int32_t i, const llama_token_data_array & p, llama_token & token) override {
        return engine.verify_sampled_step(seq, i, p, token);
    }

    void accept(llama_seq_id seq, int32_t n_accepted) override {
        if (!feed_only) {
            engine.accept(seq, n_accepted);
        }
    }

    void seq_rm(llama_seq_id seq, llama_pos p0, llama_pos p1) override { engine.seq_rm(seq, p0, p1); }

    void reset_stats() override { engine.reset_stats(); }

    void add_stats(host_stats & stats) const override { host_add_engine_stats(stats, engine); }
};

} // namespace

std::unique_ptr<host_drafter> make_drafter_dflash2(host_target & tgt, int32_t walk, bool feed_only, int32_t draft_graph) {
    return std::make_unique<drafter_dflash2>(tgt, walk, feed_only, draft_graph);
}
