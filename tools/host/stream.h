// One generating sequence of a host wave and the steps every host loop shares:
// the prompt prefill and the emission of verified tokens.
#pragma once

#include "host.h"

#include <vector>

struct host_stream {
    llama_seq_id             seq;
    size_t                   i_prompt;
    std::vector<llama_token> history; // prompt, then generated
    std::vector<llama_token> out;
    llama_pos                n_past  = 0;
    llama_token              id_last = 0;
    bool                     done    = false;
};

// the streams of the wave of prompts [first, first + n_seq), sequence ids from 0
std::vector<host_stream> host_wave(const std::vector<std::vector<llama_token>> & prompts, size_t first, size_t n_seq);

// appends `emitted` to the stream, stopping at the end of generation
void host_emit(const host_target & tgt, host_stream & s, const std::vector<llama_token> & emitted);

// decodes the prompts of a wave, n_batch rows per decode, each sequence's rows
// contiguous; the drafter (may be NULL) processes every decode
void host_prefill(host_target & tgt, host_drafter * drafter, std::vector<host_stream> & streams, host_stats & stats);
