// One generating sequence of a host wave and the steps every host loop shares:
// the prompt prefill and the emission of verified tokens.
#pragma once

#include "host.h"

#include <memory>
#include <vector>

struct host_stream {
    llama_seq_id             seq;
    size_t                   i_prompt;
    std::vector<llama_token> history; // prompt, then generated
    std::vector<llama_token> out;
    llama_pos                n_past  = 0;
    llama_token              id_last = 0;
    bool                     done    = false;
    int32_t                  n_emits = 0; // host_emit calls: the prefill's, then one per step
    uint32_t                 seed    = 0;
    std::unique_ptr<host_sampler> smpl; // the target's sampler when it samples
};

// prompt i's stream on sequence seq, seeded with params.seed + i
host_stream host_new_stream(const host_target & tgt, const std::vector<std::vector<llama_token>> & prompts, size_t i,
        llama_seq_id seq);

// the streams of the wave of prompts [first, first + n_seq), sequence ids from 0
std::vector<host_stream> host_wave(const host_target & tgt, const std::vector<std::vector<llama_token>> & prompts,
        size_t first, size_t n_seq);

// the target's token at a row: its argmax, or a draw from the stream's sampler chain
llama_token host_pick(const host_target & tgt, host_stream & s, int32_t i_batch);

// appends `emitted` to the stream, stopping at the end of generation
void host_emit(const host_target & tgt, host_stream & s, const std::vector<llama_token> & emitted);

// decodes the prompts of a wave, n_batch rows per decode, each sequence's rows
// contiguous; the drafter (may be NULL) processes every decode
void host_prefill(host_target & tgt, host_drafter * drafter, std::vector<host_stream> & streams, host_stats & stats);
// slot i refilled (streams[i]: the next prompt's stream, on the finished one's sequence id):
// the finished stream's cells under sequence ids `ids` taken from them (into tgt.retired_seq
// where it has one: a unified cache keeps every cell in position order; else freed), the
// drafter's sequence cleared, the prompt prefilled and the target's first token emitted
void host_refill_slot(host_target & tgt, host_drafter * drafter, std::vector<host_stream> & streams, size_t i,
        const std::vector<llama_seq_id> & ids, host_stats & stats);
