#include "host.h"

#include <algorithm>
#include <memory>

namespace {

struct stream {
    llama_seq_id             seq;
    size_t                   i_prompt;
    std::vector<llama_token> history; // prompt, then generated
    std::vector<llama_token> out;
    llama_pos                n_past  = 0;
    llama_token              id_last = 0;
    bool                     done    = false;
    uint32_t                 seed    = 0;
    std::unique_ptr<host_sampler> smpl; // the target's sampler when it samples
};

// the target's token at a row: its argmax, or a draw from its sampler chain
llama_token pick(const host_target & tgt, stream & s, int32_t i_batch) {
    return tgt.sampled() ? s.smpl->sample(tgt, i_batch) : tgt.argmax(i_batch);
}

// verifies stream s's draft d (verify rows from row0 on): fills `verdicts` with
// the tokens to emit and returns how many drafted tokens were kept
size_t verify(const host_target & tgt, host_drafter * drafter, stream & s, const std::vector<llama_token> & d,
        int32_t row0, std::vector<llama_token> & verdicts) {
    size_t n_acc = 0;
    if (tgt.sampled() && drafter && drafter->drafts_sampled()) {
        // rejection sampling against the sampled draft's q: lossless at any acceptance
        llama_token token = LLAMA_TOKEN_NULL;
        while (drafter->verify_step(s.seq, (int32_t) n_acc, s.smpl->apply(tgt, row0 + (int32_t) n_acc), token)) {
            verdicts.push_back(token);
            ++n_acc;
        }
        verdicts.push_back(token);
        return n_acc;
    }
    // greedy: keep drafts equal to the argmax; sampled: equal to the token the
    // chain draws at their row (sample-and-match, one draw per emitted token)
    verdicts.push_back(pick(tgt, s, row0));
    while (n_acc < d.size() && d[n_acc] == verdicts.back()) {
        ++n_acc;
        verdicts.push_back(pick(tgt, s, row0 + (int32_t) n_acc));
    }
    return n_acc;
}

// appends `emitted` to the stream, stopping at the end of generation
void emit(const host_target & tgt, stream & s, const std::vector<llama_token> & emitted) {
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

// decodes the prompts of a wave, n_batch rows per decode, each sequence's rows contiguous
void prefill(host_target & tgt, host_drafter * drafter, std::vector<stream> & streams, host_stats & stats) {
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
            streams[i].id_last = pick(tgt, streams[i], row);
        }
        batch.clear();
        last_rows.clear();
    };
    for (size_t i = 0; i < streams.size(); ++i) {
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

void run_wave(host_target & tgt, host_drafter * drafter, std::vector<stream> & streams, host_stats & stats) {
    // not llama_memory_seq_rm(mem, -1, -1, -1): the pinned libllama refuses seq_id -1
    // on recurrent memory (hybrid targets), with an error in the log
    llama_memory_clear(llama_get_memory(tgt.ctx), true);
    if (drafter) {
        drafter->seq_rm(-1, -1, -1);
    }
    prefill(tgt, drafter, streams, stats);
    if (drafter) {
        drafter->reset_stats();
    }

    const int64_t t_start = host_time_us();
    for (auto & s : streams) {
        emit(tgt, s, { s.id_last });
    }

    common_batch batch(tgt.ctx);
    std::vector<std::vector<llama_token>> drafts;
    while (true) {
        std::vector<size_t> active;
        for (size_t i = 0; i < streams.size(); ++i) {
            if (!streams[i].done) {
                active.push_back(i);
            }
        }
        if (active.empty()) {
            break;
        }

        drafts.assign(active.size(), {});
        if (drafter) {
            std::vector<draft_request> reqs;
            for (size_t i : active) {
                const stream & s = streams[i];
                const int32_t left = tgt.params.n_predict - (int32_t) s.out.size();
                reqs.push_back({ s.seq, s.id_last, s.n_past, std::min(tgt.params.n_max, std::max(left, 1)), &s.history,
                        s.seed });
            }
            const int64_t t = host_time_us();
            drafter->draft(reqs, drafts);
            stats.t_draft_us += host_time_us() - t;
        }

        batch.clear();
        std::vector<int32_t> first_row(active.size());
        for (size_t k = 0; k < active.size(); ++k) {
            const stream & s = streams[active[k]];
            first_row[k] = batch.add(s.id_last, s.n_past, s.seq, true);
            for (size_t j = 0; j < drafts[k].size(); ++j) {
                batch.add(drafts[k][j], s.n_past + 1 + (llama_pos) j, s.seq, true);
            }
        }
        int64_t t = host_time_us();
        tgt.decode(batch);
        stats.t_target_us += host_time_us() - t;
        if (drafter) {
            t = host_time_us();
            drafter->process(batch);
            stats.t_process_us += host_time_us() - t;
        }

        for (size_t k = 0; k < active.size(); ++k) {
            stream & s = streams[active[k]];
            const auto & d = drafts[k];
            std::vector<llama_token> verdicts;
            const size_t n_acc = verify(tgt, drafter, s, d, first_row[k], verdicts);
            stats.n_seq_steps += 1;
            stats.n_drafted   += (int64_t) d.size();
            stats.n_accepted  += (int64_t) n_acc;
            for (size_t j = 0; j < d.size() && j < HOST_MAX_DRAFT; ++j) {
                stats.drafted_at[j] += 1;
                stats.accepted_at[j] += j < n_acc;
            }
            const llama_pos keep = s.n_past + (llama_pos) n_acc + 1;
            llama_memory_seq_rm(llama_get_memory(tgt.ctx), s.seq, keep, -1);
            if (drafter) {
                t = host_time_us();
                drafter->accept(s.seq, (int32_t) n_acc);
                drafter->seq_rm(s.seq, keep, -1);
                stats.t_accept_us += host_time_us() - t;
            }
            s.n_past  = keep;
            s.id_last = verdicts.back();
            emit(tgt, s, verdicts);
        }
    }
    stats.t_total_us += host_time_us() - t_start;
    if (drafter) {
        drafter->add_stats(stats);
    }
}

} // namespace

host_generation host_generate(host_target & tgt, host_drafter * drafter, const std::vector<std::vector<llama_token>> & prompts) {
    host_generation gen;
    gen.tokens.resize(prompts.size());
    const size_t n_seq = (size_t) tgt.params.n_seq;
    for (size_t first = 0; first < prompts.size(); first += n_seq) {
        std::vector<stream> streams;
        for (size_t i = first; i < std::min(prompts.size(), first + n_seq); ++i) {
            stream s;
            s.seq      = (llama_seq_id) (i - first);
            s.i_prompt = i;
            s.history  = prompts[i];
            s.seed     = (uint32_t) tgt.params.seed + (uint32_t) i;
            if (tgt.sampled()) {
                s.smpl = std::make_unique<host_sampler>(tgt.params.temp, s.seed);
            }
            streams.push_back(std::move(s));
        }
        run_wave(tgt, drafter, streams, gen.stats);
        for (auto & s : streams) {
            gen.stats.n_generated += (int64_t) s.out.size();
            gen.tokens[s.i_prompt] = std::move(s.out);
        }
    }
    return gen;
}
