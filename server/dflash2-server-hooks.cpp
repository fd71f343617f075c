// The server's speculative hooks and slot memory, for dflash2_server_spec: each
// forwards to the spec; draft and accept also count for /slots.
#include "dflash2-server-impl.h"

common_speculative_draft_params & common_speculative_get_draft_params(dflash2_server_spec * spec, llama_seq_id seq_id) {
    return spec->draft_params(seq_id);
}

void common_speculative_begin(dflash2_server_spec * spec, llama_seq_id seq_id, const llama_tokens & prompt) {
    if (spec) {
        spec->begin(seq_id, prompt);
    }
}

bool common_speculative_process(dflash2_server_spec * spec, const common_batch & batch) {
    return spec ? spec->process(batch) : true;
}

void common_speculative_draft(dflash2_server_spec * spec) {
    if (!spec) {
        return;
    }
    // the results of the sequences asked to draft (the flags are reset by the draft)
    std::vector<const llama_tokens *> results(spec->counters.size(), nullptr);
    for (size_t seq = 0; seq < results.size(); ++seq) {
        const auto & dp = spec->draft_params((llama_seq_id) seq);
        results[seq] = dp.drafting ? dp.result : nullptr;
    }
    spec->draft();
    for (size_t seq = 0; seq < results.size(); ++seq) {
        if (!results[seq]) {
            continue;
        }
        auto & c = spec->counters[seq];
        const int64_t n = (int64_t) results[seq]->size();
        c.n_drafted    += n;
        c.n_nodes_last  = n;
        if (n == 0) {
            c.n_steps_none += 1;
        } else if (spec->drafted_branch((llama_seq_id) seq)) {
            c.n_steps_tree += 1;
        } else {
            c.n_steps_chain += 1;
        }
    }
    dflash2_server_publish_steps(spec->counters);
}

void common_speculative_accept(dflash2_server_spec * spec, llama_seq_id seq_id, uint16_t n_accepted) {
    if (!spec) {
        return;
    }
    if (seq_id >= 0 && (size_t) seq_id < spec->counters.size()) {
        auto & c = spec->counters[seq_id];
        c.n_accepted     += n_accepted;
        c.n_verify_steps += 1;
        if (c.accepted_at.size() < n_accepted) {
            c.accepted_at.resize(n_accepted, 0);
        }
        for (uint16_t i = 0; i < n_accepted; ++i) {
            c.accepted_at[i] += 1;
        }
    }
    spec->accept(seq_id, n_accepted);
}

bool common_speculative_get_state(dflash2_server_spec * spec, llama_seq_id seq_id, std::vector<uint8_t> & data) {
    return spec && spec->get_state(seq_id, data);
}

void common_speculative_set_state(dflash2_server_spec * spec, llama_seq_id seq_id, const std::vector<uint8_t> & data) {
    if (spec) {
        spec->set_state(seq_id, data);
    }
}

void common_speculative_print_stats(const dflash2_server_spec * spec) {
    if (spec) {
        spec->print_stats();
    }
}

int32_t common_speculative_n_max(const dflash2_server_spec * spec) {
    return spec ? spec->n_max() : 0;
}

const std::vector<double> & common_speculative_get_synth_probs(const dflash2_server_spec * spec) {
    static const std::vector<double> none;
    return spec ? spec->synth_probs() : none;
}

void dflash2_server_memory::seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) const {
    common_memory::seq_rm(seq_id, p0, p1);
    if (dflash2_server_spec * spec = dflash2_server_spec_for(ctx_tgt)) {
        spec->seq_rm(seq_id, p0, p1);
    }
}

void dflash2_server_memory::seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos delta) const {
    common_memory::seq_add(seq_id, p0, p1, delta);
    if (dflash2_server_spec * spec = dflash2_server_spec_for(ctx_tgt)) {
        spec->seq_add(seq_id, p0, p1, delta);
    }
}

void dflash2_server_memory::seq_cp(llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1) const {
    common_memory::seq_cp(seq_id_src, seq_id_dst, p0, p1);
    if (dflash2_server_spec * spec = dflash2_server_spec_for(ctx_tgt)) {
        spec->seq_cp(seq_id_src, seq_id_dst, p0, p1);
    }
}

void dflash2_server_set_sampling(dflash2_server_spec * spec, llama_seq_id seq_id, const common_params_sampling & params,
        const common_sampler * smpl) {
    if (spec && smpl) {
        spec->set_sampling(seq_id, params, smpl);
    }
}

std::vector<llama_token> dflash2_server_sample_and_accept_n(dflash2_server_spec * spec, llama_seq_id seq_id,
        common_sampler * smpl, llama_context * ctx, const std::vector<int> & idxs, const llama_tokens & draft,
        bool is_replay, size_t n_probs_post) {
    if (!spec) {
        return common_sampler_sample_and_accept_n(smpl, ctx, idxs, draft);
    }
    return spec->sample_and_accept_n(seq_id, smpl, ctx, idxs, draft, is_replay, n_probs_post);
}

int32_t dflash2_server_draft_probs_row(dflash2_server_spec * spec, common_sampler * smpl, llama_seq_id seq_id, size_t i) {
    return spec ? spec->draft_probs_row(seq_id, smpl, i) : -1;
}

bool dflash2_server_spec::add_draft_rows(llama_seq_id, llama_token id_last, const llama_tokens & draft, llama_pos pos0,
        const dflash2_server_add_row & add) {
    static const std::vector<llama_seq_id> own; // the slot's id alone
    bool ok = add(id_last, pos0, own);
    for (size_t i = 0; i < draft.size() && ok; ++i) {
        ok = add(draft[i], pos0 + 1 + (llama_pos) i, own);
    }
    return ok;
}

void dflash2_server_pad_batch(dflash2_server_spec * spec, int32_t n_rows, int32_t n_rows_max, llama_seq_id seq_last,
        const dflash2_server_add_row & add) {
    if (spec) {
        spec->pad_batch(n_rows, n_rows_max, seq_last, add);
    }
}

bool dflash2_server_add_draft_rows(dflash2_server_spec * spec, llama_seq_id seq_id, llama_token id_last,
        const llama_tokens & draft, llama_pos pos0, const dflash2_server_add_row & add) {
    return spec->add_draft_rows(seq_id, id_last, draft, pos0, add);
}
