// llama.cpp's own DFlash2 path: common_speculative with draft-dflash, its draft
// context created the way llama-server creates it.
#include "host.h"
#include "speculative.h"

#include <stdexcept>

namespace {

struct drafter_upstream : host_drafter {
    common_params                      params;
    common_speculative_init_result_ptr init;
    common_speculative               * spec    = nullptr;
    llama_context                    * ctx_dft = nullptr;

    std::vector<std::vector<llama_token>> results;

    explicit drafter_upstream(host_target & tgt) {
        const host_params & hp = tgt.params;
        params.model.path                   = hp.path_target;
        params.n_ctx                        = hp.n_ctx > 0 ? hp.n_ctx : HOST_MIN_CTX;
        params.n_batch                      = hp.n_batch;
        params.n_ubatch                     = hp.n_batch;
        params.n_parallel                   = hp.n_seq;
        params.kv_unified                   = hp.n_seq == 1;
        params.no_extra_bufts               = true;
        params.cpuparams.n_threads          = hp.n_threads;
        params.cpuparams_batch.n_threads    = hp.n_threads;
        params.speculative.types            = { COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH };
        params.speculative.draft.mparams.path = hp.path_draft;
        params.speculative.draft.n_max      = hp.n_max;
        params.speculative.draft.n_min      = hp.n_min;
        params.speculative.draft.p_min      = 0.0f;
        // placement as llama-server's -dev / -ngl / -sm / -devd / -ngld give it
        auto with_null = [](std::vector<ggml_backend_dev_t> d) { d.push_back(nullptr); return d; };
        if (tgt.target_placement.has_devices) {
            params.devices = with_null(tgt.target_placement.devices);
        }
        params.n_gpu_layers = hp.n_gpu_layers < 0 ? -2 : hp.n_gpu_layers;
        params.split_mode   = tgt.target_placement.split_mode;
        if (tgt.draft_placement.has_devices) {
            params.speculative.draft.devices = with_null(tgt.draft_placement.devices);
        }
        params.speculative.draft.n_gpu_layers = hp.draft_ngl < 0 ? -2 : hp.draft_ngl;

        common_params params_dft = common_base_params_to_speculative(params);
        init = common_speculative_init_from_params(params_dft, tgt.model, tgt.ctx);
        ctx_dft = init->context();
        if (!ctx_dft) {
            throw std::runtime_error("upstream: cannot create the draft context");
        }
        params.speculative.draft.ctx_tgt = tgt.ctx;
        params.speculative.draft.ctx_dft = ctx_dft;
        spec = common_speculative_init(params.speculative, (uint32_t) hp.n_seq);
        if (!spec) {
            throw std::runtime_error("upstream: common_speculative_init failed");
        }
        results.resize(hp.n_seq);
    }

    ~drafter_upstream() override {
        common_speculative_free(spec);
    }

    const char * name() const override { return "upstream"; }

    void process(const common_batch & batch) override {
        if (!common_speculative_process(spec, batch)) {
            throw std::runtime_error("upstream: common_speculative_process failed");
        }
    }

    void draft(const std::vector<draft_request> & reqs, std::vector<std::vector<llama_token>> & out) override {
        for (const auto & r : reqs) {
            results[r.seq].clear();
            host_fill_draft_params(common_speculative_get_draft_params(spec, r.seq), r, r.history, &results[r.seq]);
        }
        common_speculative_draft(spec);
        for (size_t k = 0; k < reqs.size(); ++k) {
            // as llama-server: the noise block stays in the draft KV, trim it
            llama_memory_seq_rm(llama_get_memory(ctx_dft), reqs[k].seq, reqs[k].pos, -1);
            out[k] = results[reqs[k].seq];
        }
    }

    void accept(llama_seq_id seq, int32_t n_accepted) override {
        common_speculative_accept(spec, seq, (uint16_t) n_accepted);
    }

    void seq_rm(llama_seq_id seq, llama_pos p0, llama_pos p1) override {
        llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, p0, p1);
    }
};

} // namespace

void host_fill_draft_params(common_speculative_draft_params & dp, const draft_request & r, const llama_tokens * text,
        llama_tokens * result) {
    dp.drafting = true;
    dp.n_max    = r.n_max;
    dp.pos0     = r.pos;
    dp.id_last  = r.id_last;
    dp.prompt   = text;
    dp.result   = result;
}

std::unique_ptr<host_drafter> make_drafter_upstream(host_target & tgt) {
    return std::make_unique<drafter_upstream>(tgt);
}
