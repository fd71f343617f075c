// dflash2 over its C API.
#include "dflash2-batch-rows.h"
#include "dflash2.h"
#include "host.h"

#include <stdexcept>
#include <string>

namespace {

void check(int32_t rc, const char * what) {
    if (rc != LLAMA_SPEC_DFLASH2_OK) {
        throw std::runtime_error(std::string("dflash2 ") + what + ": " + llama_spec_dflash2_status_name(rc) + ": " +
                llama_spec_dflash2_last_error());
    }
}

struct drafter_dflash2 : host_drafter {
    llama_spec_dflash2 * spec = nullptr;

    std::vector<llama_spec_dflash2_row>           rows;
    std::vector<llama_spec_dflash2_draft_request> requests;
    std::vector<llama_token>                      tokens;
    std::vector<int32_t>                          n_drafted;

    drafter_dflash2(host_target & tgt, int32_t walk) {
        const host_params & hp = tgt.params;
        llama_spec_dflash2_params params = llama_spec_dflash2_default_params();
        params.n_seq           = (uint32_t) hp.n_seq;
        params.n_max           = hp.n_max;
        params.n_threads       = hp.n_threads;
        params.n_threads_batch = hp.n_threads;
        params.walk            = walk;
        spec = llama_spec_dflash2_init(tgt.ctx, hp.path_draft.c_str(), params);
        if (!spec) {
            throw std::runtime_error(std::string("dflash2 init: ") + llama_spec_dflash2_last_error());
        }
    }

    ~drafter_dflash2() override {
        llama_spec_dflash2_free(spec);
    }

    const char * name() const override { return "dflash2"; }

    void process(const common_batch & batch) override {
        dflash2_rows_from_batch(batch, rows);
        check(llama_spec_dflash2_process(spec, rows.data(), (int32_t) rows.size()), "process");
    }

    void draft(const std::vector<draft_request> & reqs, std::vector<std::vector<llama_token>> & out) override {
        requests.clear();
        int32_t capacity = 0;
        for (const auto & r : reqs) {
            requests.push_back({ r.seq, r.id_last, r.n_max });
            capacity += r.n_max;
        }
        tokens.resize(capacity);
        n_drafted.resize(reqs.size());
        check(llama_spec_dflash2_draft(spec, requests.data(), (int32_t) requests.size(), tokens.data(), capacity,
                n_drafted.data()), "draft");
        size_t at = 0;
        for (size_t k = 0; k < reqs.size(); ++k) {
            out[k].assign(tokens.begin() + at, tokens.begin() + at + n_drafted[k]);
            at += n_drafted[k];
        }
    }

    void accept(llama_seq_id seq, int32_t n_accepted) override {
        check(llama_spec_dflash2_accept(spec, seq, n_accepted), "accept");
    }

    void seq_rm(llama_seq_id seq, llama_pos p0, llama_pos p1) override {
        check(llama_spec_dflash2_seq_rm(spec, seq, p0, p1), "seq_rm");
    }

    void reset_stats() override {
        check(llama_spec_dflash2_reset_stats(spec), "reset_stats");
    }

    void add_stats(host_stats & stats) const override {
        llama_spec_dflash2_stats s;
        check(llama_spec_dflash2_get_stats(spec, &s), "get_stats");
        stats.has_split = true;
        stats.t_inject_us += (int64_t) s.t_inject_us;
        stats.t_noise_us  += (int64_t) s.t_draft_us;
        stats.t_walk_us   += (int64_t) s.t_walk_us;
        stats.t_copy_us   += (int64_t) s.t_process_us;
    }
};

} // namespace

std::unique_ptr<host_drafter> make_drafter_dflash2(host_target & tgt, int32_t walk) {
    return std::make_unique<drafter_dflash2>(tgt, walk);
}
