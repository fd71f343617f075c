#include "stream.h"

#include <algorithm>

host_stream host_new_stream(const host_target & tgt, const std::vector<std::vector<llama_token>> & prompts, size_t i,
        llama_seq_id seq) {
    host_stream s;
    s.seq      = seq;
    s.i_prompt = i;
    s.history  = prompts[i];
    s.seed     = (uint32_t) tgt.params.seed + (uint32_t) i;
    if (tgt.sampled()) {
        s.smpl = std::make_unique<host_sampler>(tgt.params, s.seed);
    }
    return s;
}

std::vector<host_stream> host_wave(const host_target & tgt, const std::vector<std::vector<llama_token>> & prompts,
        size_t first, size_t n_seq) {
    std::vector<host_stream> streams;
    for (size_t i = first; i < std::min(prompts.size(), first + n_seq); ++i) {
        streams.push_back(host_new_stream(tgt, prompts, i, (llama_seq_id) (i - first)));
    }
    return streams;
}

llama_token host_pick(const host_target & tgt, host_stream & s, int32_t i_batch) {
    return tgt.sampled() ? s.smpl->sample(tgt, i_batch) : tgt.argmax(i_batch);
}

void host_emit(const host_target & tgt, host_stream & s, const std::vector<llama_token> & emitted) {
    if (!s.done) {
        s.n_emits += 1;
    }
    for (llama_token id : emitted) {
        if (s.done) {
            break;
        }
        s.out.push_back(id);
        s.history.push_back(id);
        if (tgt.is_eog(id) || (int32_t) s.out.size() >= tgt.params.n_predict) {
            s.done = true;
        }
    }
}

namespace {

void prefill(host_target & tgt, host_drafter * drafter, std::vector<host_stream> & streams, size_t i0, size_t i1,
        host_stats & stats) {
    common_batch batch(tgt.ctx);
    std::vector<std::pair<size_t, int32_t>> last_rows; // stream, batch index of its last prompt row
    const int64_t t_start = host_time_us();
    auto flush = [&]() {
        if (batch.size() == 0) {
            return;
        }
        tgt.decode(batch);
        if (drafter) {
            drafter->process(batch);
        }
        for (auto [i, row] : last_rows) {
            streams[i].id_last = host_pick(tgt, streams[i], row);
        }
        batch.clear();
        last_rows.clear();
    };
    for (size_t i = i0; i < i1; ++i) {
        if (tgt.prompt_decoder) {
            flush(); // rows in the order of the prompts
            auto & s = streams[i];
            if (tgt.prompt_decoder->decode(tgt, drafter, s.i_prompt, s.seq, s.n_past, s.id_last)) {
                continue;
            }
        }
        const auto & prompt = streams[i].history;
        for (size_t p = 0; p < prompt.size(); ++p) {
            if (batch.size() == tgt.params.n_batch) {
                flush();
            }
            const bool last = p + 1 == prompt.size();
            const int32_t idx = batch.add(prompt[p], (llama_pos) p, streams[i].seq, last);
            if (last) {
                last_rows.push_back({ i, idx });
            }
        }
        streams[i].n_past = (llama_pos) prompt.size();
    }
    flush();
    stats.t_prefill_us += host_time_us() - t_start;
}

} // namespace

void host_prefill(host_target & tgt, host_drafter * drafter, std::vector<host_stream> & streams, host_stats & stats) {
    prefill(tgt, drafter, streams, 0, streams.size(), stats);
}

void host_refill_slot(host_target & tgt, host_drafter * drafter, std::vector<host_stream> & streams, size_t i,
        const std::vector<llama_seq_id> & ids, host_stats & stats) {
    llama_memory_t mem = llama_get_memory(tgt.ctx);
    for (llama_seq_id id : ids) {
        if (tgt.retired_seq >= 0) {
            // a unified cache: the cells take the retired id too, so removing id frees none
            llama_memory_seq_cp(mem, id, tgt.retired_seq, -1, -1);
        }
        llama_memory_seq_rm(mem, id, -1, -1);
    }
    host_stream & s = streams[i];
    if (drafter) {
        drafter->seq_rm(s.seq, -1, -1);
    }
    prefill(tgt, drafter, streams, i, i + 1, stats);
    host_emit(tgt, s, { s.id_last });
}
