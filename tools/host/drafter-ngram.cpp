// llama.cpp's own n-gram speculative types (common_speculative without a draft
// model, drafting from the sequence's own tokens), for the bench's comparison
// with dflash2's n-gram branches on the same prompts.
#include "host.h"
#include "speculative.h"

#include <stdexcept>

namespace {

struct drafter_ngram : host_drafter {
    std::string          mode;
    common_params        params;
    common_speculative * spec = nullptr;

    std::vector<std::vector<llama_token>> results;
    std::vector<llama_pos>                last_pos; // per sequence: where its last draft was; -1 none
    std::vector<llama_tokens>             decoded;  // per sequence: its tokens before id_last

    drafter_ngram(host_target & tgt, const std::string & mode, common_speculative_type type) : mode(mode) {
        const host_params & hp = tgt.params;
        params.speculative.types       = { type };
        params.speculative.draft.n_max = hp.n_max;
        params.speculative.draft.n_min = hp.n_min;
        params.speculative.draft.ctx_tgt = tgt.ctx;
        for (auto * m : { &params.speculative.ngram_simple, &params.speculative.ngram_map_k, &params.speculative.ngram_map_k4v }) {
            if (hp.ngram_size_n > 0) {
                m->size_n = (uint16_t) hp.ngram_size_n;
            }
            if (hp.ngram_size_m > 0) {
                m->size_m = (uint16_t) hp.ngram_size_m;
            }
        }
        if (hp.ngram_size_n > 0) {
            params.speculative.ngram_mod.n_match = hp.ngram_size_n;
        }
        spec = common_speculative_init(params.speculative, (uint32_t) hp.n_seq);
        if (!spec) {
            throw std::runtime_error(mode + ": common_speculative_init failed");
        }
        results.resize(hp.n_seq);
        last_pos.assign(hp.n_seq, -1);
        decoded.resize(hp.n_seq);
    }

    ~drafter_ngram() override { common_speculative_free(spec); }

    const char * name() const override { return mode.c_str(); }

    void process(const common_batch & batch) override {
        if (!common_speculative_process(spec, batch)) {
            throw std::runtime_error(mode + ": common_speculative_process failed");
        }
    }

    void draft(const std::vector<draft_request> & reqs, std::vector<std::vector<llama_token>> & out) override {
        for (const auto & r : reqs) {
            // as llama-server: the text decoded so far, without the sampled id_last (the
            // host's history ends with it)
            llama_tokens & text = decoded[r.seq];
            text.assign(r.history->begin(), r.history->end());
            if (!text.empty() && text.back() == r.id_last) {
                text.pop_back();
            }
            // a sequence that went back (a new prompt in its slot) begins again, as llama-server does
            if (r.pos <= last_pos[r.seq] || last_pos[r.seq] < 0) {
                common_speculative_begin(spec, r.seq, text);
            }
            last_pos[r.seq] = r.pos;
            results[r.seq].clear();
            host_fill_draft_params(common_speculative_get_draft_params(spec, r.seq), r, &text, &results[r.seq]);
        }
        common_speculative_draft(spec);
        for (size_t k = 0; k < reqs.size(); ++k) {
            out[k] = results[reqs[k].seq];
        }
    }

    void accept(llama_seq_id seq, int32_t n_accepted) override {
        common_speculative_accept(spec, seq, (uint16_t) n_accepted);
    }

    void seq_rm(llama_seq_id, llama_pos, llama_pos) override {}
};

} // namespace

const std::vector<std::pair<std::string, int>> & host_ngram_modes() {
    static const std::vector<std::pair<std::string, int>> modes = {
        { "ngram-simple", COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE },
        { "ngram-map-k", COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K },
        { "ngram-map-k4v", COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K4V },
        { "ngram-mod", COMMON_SPECULATIVE_TYPE_NGRAM_MOD },
        { "ngram-cache", COMMON_SPECULATIVE_TYPE_NGRAM_CACHE },
    };
    return modes;
}

std::unique_ptr<host_drafter> make_drafter_ngram(host_target & tgt, const std::string & mode) {
    for (const auto & [name, type] : host_ngram_modes()) {
        if (name == mode) {
            return std::make_unique<drafter_ngram>(tgt, mode, (common_speculative_type) type);
        }
    }
    return nullptr;
}
