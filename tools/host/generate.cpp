#include "host.h"
#include "stream.h"

#include <algorithm>
#include <memory>

namespace {

// verifies stream s's draft d (verify rows from row0 on): fills `verdicts` with
// the tokens to emit and returns how many drafted tokens were kept
size_t verify(const host_target & tgt, host_drafter * drafter, host_stream & s, const std::vector<llama_token> & d,
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
    verdicts.push_back(host_pick(tgt, s, row0));
    while (n_acc < d.size() && d[n_acc] == verdicts.back()) {
        ++n_acc;
        verdicts.push_back(host_pick(tgt, s, row0 + (int32_t) n_acc));
    }
    return n_acc;
}

// one wave of streams generated step by step by the chain host
struct chain_wave : host_wave_runner {
    host_target &  tgt;
    host_drafter * drafter;
    common_batch   batch;

    std::vector<std::vector<llama_token>> drafts;

    chain_wave(host_target & tgt, host_drafter * drafter, std::vector<host_stream> & streams, host_stats & stats)
        : host_wave_runner(stats, streams, tgt.params.n_seq), tgt(tgt), drafter(drafter), batch(tgt.ctx) {
        // not llama_memory_seq_rm(mem, -1, -1, -1): the pinned libllama refuses seq_id -1
        // on recurrent memory (hybrid targets), with an error in the log
        llama_memory_clear(llama_get_memory(tgt.ctx), true);
        if (drafter) {
            drafter->seq_rm(-1, -1, -1);
        }
        host_prefill(tgt, drafter, streams, stats);
        if (drafter) {
            drafter->reset_stats();
        }
        for (auto & s : streams) {
            host_emit(tgt, s, { s.id_last });
        }
    }

    void finish() override {
        if (drafter) {
            drafter->add_stats(stats);
        }
    }

  private:
    // one draft + verify step of every active stream
    bool step_once() override {
        std::vector<size_t> active;
        for (size_t i = 0; i < streams.size(); ++i) {
            if (!streams[i].done) {
                active.push_back(i);
            }
        }
        if (active.empty()) {
            return false;
        }

        drafts.assign(active.size(), {});
        if (drafter) {
            std::vector<draft_request> reqs;
            for (size_t i : active) {
                const host_stream & s = streams[i];
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
            const host_stream & s = streams[active[k]];
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
            host_stream & s = streams[active[k]];
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
            host_emit(tgt, s, verdicts);
        }
        return true;
    }
};

// the target's decodes of a wave: the prefill's (from c0 to c1, while the wave was made) and
// the steps' (from c1 to c2), each step one verify decode
void add_decodes(host_stats & stats, const host_target::decode_counts & c0, const host_target::decode_counts & c1,
        const host_target::decode_counts & c2) {
    stats.n_prefill_decodes += c1.decodes - c0.decodes;
    stats.n_prefill_over    += c1.over - c0.over;
    stats.n_verify_decodes  += c2.decodes - c1.decodes;
    stats.n_verify_rows     += c2.rows - c1.rows;
    stats.n_verify_over     += c2.over - c1.over;
}

void collect(std::vector<host_stream> & streams, host_generation & gen) {
    for (auto & s : streams) {
        gen.stats.n_generated += (int64_t) s.out.size();
        gen.tokens[s.i_prompt] = std::move(s.out);
        gen.steps[s.i_prompt]  = std::max(s.n_emits - 1, 0);
    }
}

} // namespace

bool host_wave_runner::full() const {
    return streams.size() == n_slots &&
           std::none_of(streams.begin(), streams.end(), [](const host_stream & s) { return s.done; });
}

int64_t host_wave_runner::emitted() const {
    int64_t n = 0;
    for (const auto & s : streams) {
        n += (int64_t) s.out.size();
    }
    return n;
}

bool host_wave_runner::step() {
    const bool    was_full    = full();
    const int64_t n_before    = was_full ? emitted() : 0;
    const int64_t t_start     = host_time_us();
    const int64_t t_cpu_start = host_cpu_time_us();
    const bool    more        = step_once();
    const int64_t t_step      = host_time_us() - t_start;
    stats.t_total_us += t_step;
    stats.t_cpu_us   += host_cpu_time_us() - t_cpu_start;
    if (was_full) {
        stats.t_full_us += t_step;
        stats.n_full_tokens += emitted() - n_before;
    }
    return more;
}

host_wave_factory host_chain_waves(host_drafter * drafter) {
    return [drafter](host_target & tgt, std::vector<host_stream> & streams, host_stats & stats) {
        return std::unique_ptr<host_wave_runner>(new chain_wave(tgt, drafter, streams, stats));
    };
}

host_generation host_generate_waves(host_target & tgt, const host_wave_factory & waves,
        const std::vector<std::vector<llama_token>> & prompts) {
    host_generation gen;
    gen.tokens.resize(prompts.size());
    gen.steps.resize(prompts.size());
    const size_t n_seq = (size_t) tgt.params.n_seq;
    for (size_t first = 0; first < prompts.size(); first += n_seq) {
        std::vector<host_stream> streams = host_wave(tgt, prompts, first, n_seq);
        const auto c0 = tgt.counts;
        std::unique_ptr<host_wave_runner> wave = waves(tgt, streams, gen.stats);
        const auto c1 = tgt.counts;
        while (wave->step()) {
        }
        wave->finish();
        add_decodes(gen.stats, c0, c1, tgt.counts);
        collect(streams, gen);
    }
    return gen;
}

host_generation host_generate(host_target & tgt, host_drafter * drafter, const std::vector<std::vector<llama_token>> & prompts) {
    return host_generate_waves(tgt, host_chain_waves(drafter), prompts);
}

std::pair<host_generation, host_generation> host_generate_lockstep(host_target & tgt_a, const host_wave_factory & waves_a,
        host_target & tgt_b, const host_wave_factory & waves_b, const std::vector<std::vector<llama_token>> & prompts) {
    host_generation a, b;
    a.tokens.resize(prompts.size());
    b.tokens.resize(prompts.size());
    a.steps.resize(prompts.size());
    b.steps.resize(prompts.size());
    const size_t n_seq = (size_t) tgt_a.params.n_seq;
    bool a_first = true;
    for (size_t first = 0; first < prompts.size(); first += n_seq) {
        std::vector<host_stream> streams_a = host_wave(tgt_a, prompts, first, n_seq);
        std::vector<host_stream> streams_b = host_wave(tgt_b, prompts, first, n_seq);
        const auto a0 = tgt_a.counts;
        const auto b0 = tgt_b.counts;
        std::unique_ptr<host_wave_runner> wave_a = waves_a(tgt_a, streams_a, a.stats);
        std::unique_ptr<host_wave_runner> wave_b = waves_b(tgt_b, streams_b, b.stats);
        const auto a1 = tgt_a.counts;
        const auto b1 = tgt_b.counts;
        // stride steps of one, then of the other, the order flipping every round. Not
        // one step each: an engine's controller times its steps from one draft call to
        // the next, and would count the other host's step in each of its own (it then
        // drafts where drafting does not pay); a round of the other host is one step
        // it does not measure (a stall), under nearly the same load.
        const int stride = 16;
        bool      more_a = true, more_b = true;
        while (more_a || more_b) {
            for (int k = 0; k < 2; ++k) {
                const bool a_now = (k == 0) == a_first;
                for (int i = 0; i < stride; ++i) {
                    bool & more = a_now ? more_a : more_b;
                    more        = more && (a_now ? wave_a->step() : wave_b->step());
                }
            }
            a_first = !a_first;
        }
        wave_a->finish();
        wave_b->finish();
        add_decodes(a.stats, a0, a1, tgt_a.counts);
        add_decodes(b.stats, b0, b1, tgt_b.counts);
        collect(streams_a, a);
        collect(streams_b, b);
    }
    return { std::move(a), std::move(b) };
}
