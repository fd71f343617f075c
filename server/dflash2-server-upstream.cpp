// dflash2_server_spec over llama.cpp's own common_speculative: any spec type, or
// draft-dflash with --spec-dflash2-upstream. Everything forwards unchanged; the
// server's own code keeps handling the draft context (ctx_dft).
#include "dflash2-server-impl.h"

namespace {

struct spec_upstream : dflash2_server_spec {
    common_speculative_ptr spec;

    explicit spec_upstream(common_speculative * spec) : spec(spec) {}

    const char * name() const override { return "upstream"; }

    common_speculative_draft_params & draft_params(llama_seq_id seq_id) override {
        return common_speculative_get_draft_params(spec.get(), seq_id);
    }

    void begin(llama_seq_id seq_id, const llama_tokens & prompt) override {
        common_speculative_begin(spec.get(), seq_id, prompt);
    }

    bool process(const common_batch & batch) override { return common_speculative_process(spec.get(), batch); }

    void draft() override { common_speculative_draft(spec.get()); }

    void accept(llama_seq_id seq_id, uint16_t n_accepted) override {
        common_speculative_accept(spec.get(), seq_id, n_accepted);
    }

    bool get_state(llama_seq_id seq_id, std::vector<uint8_t> & data) override {
        return common_speculative_get_state(spec.get(), seq_id, data);
    }

    void set_state(llama_seq_id seq_id, const std::vector<uint8_t> & data) override {
        common_speculative_set_state(spec.get(), seq_id, data);
    }

    void print_stats() const override { common_speculative_print_stats(spec.get()); }

    int32_t n_max() const override { return common_speculative_n_max(spec.get()); }

    const std::vector<double> & synth_probs() const override { return common_speculative_get_synth_probs(spec.get()); }

    // the server refuses embedding batches with upstream's speculative decoding
    bool takes_embd_batches() const override { return false; }

    // llama.cpp's own verification: greedy drafts, sample-and-match
    void set_sampling(llama_seq_id, const common_params_sampling &, const common_sampler *) override {}

    std::vector<llama_token> sample_and_accept_n(llama_seq_id, common_sampler * smpl, llama_context * ctx,
            const std::vector<int> & idxs, const llama_tokens & draft, bool, size_t) override {
        return common_sampler_sample_and_accept_n(smpl, ctx, idxs, draft);
    }

    // as llama.cpp's server: no probabilities on accepted draft tokens
    int32_t draft_probs_row(llama_seq_id, common_sampler *, size_t) override { return -1; }

    std::string verify_mode(llama_seq_id) const override { return "sample-and-match"; }

    // common_memory mirrors these into the draft context
    void seq_rm(llama_seq_id, llama_pos, llama_pos) override {}
    void seq_add(llama_seq_id, llama_pos, llama_pos, llama_pos) override {}
    void seq_cp(llama_seq_id, llama_seq_id, llama_pos, llama_pos) override {}

    size_t state_size(llama_context * ctx_dft, llama_seq_id seq_id) const override {
        return ctx_dft ? llama_state_seq_get_size_ext(ctx_dft, seq_id, LLAMA_STATE_SEQ_FLAGS_NONE) : 0;
    }

    void state_save(llama_context * ctx_dft, llama_seq_id seq_id, std::vector<uint8_t> & dst) const override {
        if (ctx_dft) {
            llama_state_seq_get_data_ext(ctx_dft, dst.data(), dst.size(), seq_id, LLAMA_STATE_SEQ_FLAGS_NONE);
        }
    }

    bool state_load(llama_seq_id, const std::vector<uint8_t> &) override { return false; }

    // as in llama.cpp's server: /slots files hold the target's state only
    void slot_file_save(llama_seq_id, const std::string &) const override {}
    void slot_file_load(llama_seq_id, const std::string &) override {}
};

} // namespace

dflash2_server_spec * dflash2_server_spec_upstream(common_params & params) {
    common_speculative * spec = common_speculative_init(params.speculative, params.n_parallel);
    return spec ? new spec_upstream(spec) : nullptr;
}
