// The tools' target sampling: llama.cpp's own sampler chain, so p is what a
// llama.cpp host with these settings samples from.
#include "host.h"

#include <stdexcept>

host_sampler::host_sampler(const host_params & p, uint32_t seed) {
    chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (p.top_k > 0) {
        llama_sampler_chain_add(chain, llama_sampler_init_top_k(p.top_k));
    }
    if (p.top_p < 1.0f) {
        llama_sampler_chain_add(chain, llama_sampler_init_top_p(p.top_p, 1));
    }
    if (p.min_p > 0.0f) {
        llama_sampler_chain_add(chain, llama_sampler_init_min_p(p.min_p, 1));
    }
    llama_sampler_chain_add(chain, llama_sampler_init_temp(p.temp));
    llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));
}

host_sampler::~host_sampler() {
    llama_sampler_free(chain);
}

const llama_token_data_array & host_sampler::apply(const host_target & tgt, int32_t i_batch) {
    const float * logits = llama_get_logits_ith(tgt.ctx, i_batch);
    if (!logits) {
        throw std::runtime_error("no logits at batch row " + std::to_string(i_batch));
    }
    cur.resize(tgt.n_vocab);
    for (llama_token id = 0; id < tgt.n_vocab; ++id) {
        cur[id] = { id, logits[id], 0.0f };
    }
    cur_p = { cur.data(), cur.size(), -1, false };
    llama_sampler_apply(chain, &cur_p);
    if (cur_p.selected < 0) {
        throw std::runtime_error("the sampler chain selected no token");
    }
    return cur_p;
}

llama_token host_sampler::sample(const host_target & tgt, int32_t i_batch) {
    const llama_token_data_array & p = apply(tgt, i_batch);
    return p.data[p.selected].id;
}

bool host_drafter::verify_step(llama_seq_id, int32_t, const llama_token_data_array &, llama_token &) {
    throw std::runtime_error(std::string(name()) + " drafts no sampled drafts to verify");
}
