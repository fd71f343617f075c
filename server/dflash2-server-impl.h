// What the files of the llama-server adapter share among themselves (the patched
// server sources see only dflash2-server.h).
#pragma once

#include "dflash2-server.h"
#include "dflash2.hpp"

#include <cstdint>
#include <string>
#include <vector>

// our command-line options (dflash2-server-args.cpp)
struct dflash2_server_options {
    int32_t walk         = LLAMA_SPEC_DFLASH2_WALK_GREEDY;
    int32_t block_size   = 0;
    int32_t image_rows   = LLAMA_SPEC_DFLASH2_IMAGE_ROWS_INJECT;
    bool    use_upstream = false;
    bool    init_failed  = false; // dflash2 was asked for and no engine could be created
};

dflash2_server_options & dflash2_server_opts();

// the two implementations of dflash2_server_spec:
// llama.cpp's common_speculative; NULL when there is nothing to speculate with
dflash2_server_spec * dflash2_server_spec_upstream(common_params & params);
// a dflash2 engine on ctx_tgt; throws dflash2::error when it cannot be created
dflash2_server_spec * dflash2_server_spec_dflash2(llama_context * ctx_tgt, const std::string & path_draft,
        const dflash2::params & params, int32_t n_parallel);

// the spec serving a target context, for the hooks that only see contexts (slot
// memory, prompt cache); NULL when none does
dflash2_server_spec * dflash2_server_spec_for(llama_context * ctx_tgt);

// dflash2's statistics after a step, kept for /metrics (rendered on the HTTP thread)
void dflash2_server_publish_stats(const dflash2::stats & stats, int32_t n_max);
// dflash2's statistics as log lines
void dflash2_server_log_stats(const dflash2::stats & stats, int32_t n_max);

// what the last verification of a sequence's draft keeps for the probabilities
// of the tokens it emitted (dflash2_server_draft_probs_row)
struct dflash2_server_verified {
    std::vector<int32_t>                       rows; // per emitted token: the batch row it was sampled from
    std::vector<std::vector<llama_token_data>> top;  // per emitted token, when post-sampling probs are asked:
                                                     // the n_probs most probable candidates, then the token itself

    void clear() {
        rows.clear();
        top.clear();
    }

    // emitted token `token` was sampled from batch row `row`, the sampler's candidates being cur_p
    void keep(int32_t row, const llama_token_data_array & cur_p, llama_token token, size_t n_probs_post);

    // see dflash2_server_draft_probs_row
    int32_t row_for_probs(common_sampler * smpl, size_t i);
};

// the three verifications of dflash2_server_sample_and_accept_n; each clears
// `verified` and keeps what the emitted tokens' probabilities need
// sample-and-match: llama.cpp's common_sampler_sample_and_accept_n, step for step
std::vector<llama_token> dflash2_server_verify_match(common_sampler * smpl, llama_context * ctx,
        const std::vector<int> & idxs, const llama_tokens & draft, size_t n_probs_post, dflash2_server_verified & verified);
// lossless rejection sampling of a sampled draft; `n_verified` receives the
// positions the library accepted (what accept() must pass it: more than the
// emitted tokens when an end-of-generation token ends them early)
std::vector<llama_token> dflash2_server_verify_sampled(dflash2::engine & engine, llama_seq_id seq_id,
        common_sampler * smpl, llama_context * ctx, const std::vector<int> & idxs, const llama_tokens & draft,
        size_t n_probs_post, dflash2_server_verified & verified, int32_t & n_verified);
// a replay of a sampled draft verified before a checkpoint restore: its tokens as
// they are, then the target's token after them
std::vector<llama_token> dflash2_server_verify_replay(common_sampler * smpl, llama_context * ctx,
        const std::vector<int> & idxs, const llama_tokens & draft, size_t n_probs_post, dflash2_server_verified & verified);

// a draft state file, whole; read gives an empty blob when the file is missing
bool                 dflash2_server_write_file(const std::string & path, const std::vector<uint8_t> & data);
std::vector<uint8_t> dflash2_server_read_file(const std::string & path);
