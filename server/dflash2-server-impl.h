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

// a draft state file, whole; read gives an empty blob when the file is missing
bool                 dflash2_server_write_file(const std::string & path, const std::vector<uint8_t> & data);
std::vector<uint8_t> dflash2_server_read_file(const std::string & path);
