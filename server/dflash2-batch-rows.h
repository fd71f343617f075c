// The rows of a common_batch the target just decoded, as dflash2's process() takes
// them: one row per (batch index, sequence), embedding rows flagged. Kept apart from
// dflash2.hpp, which does not depend on llama.cpp's common library; used by the
// llama-server adapter and the host tools.
#pragma once

#include "common.h"
#include "dflash2.hpp"

#include <vector>

// tokens[k] is rows[k]'s token (LLAMA_TOKEN_NULL, negative, for an embedding row): the
// text dflash2's n-gram branches match against
inline void dflash2_rows_from_batch(const common_batch & batch, std::vector<dflash2::row> & rows,
        std::vector<llama_token> & tokens) {
    rows.clear();
    tokens.clear();
    for (int32_t i = 0; i < batch.size(); ++i) {
        const auto & t    = batch.tokens[i];
        const bool   embd = t.id == LLAMA_TOKEN_NULL;
        rows.push_back({ i, t.seq_id, t.pos[0], embd });
        tokens.push_back(t.id);
        for (llama_seq_id extra : t.seq_ids_extra) {
            rows.push_back({ i, extra, t.pos[0], embd });
            tokens.push_back(t.id);
        }
    }
}
