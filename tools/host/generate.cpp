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

    void refill(size_t i) override { host_refill_slot(tgt, drafter, streams, i, { streams[i].seq }, stats); }

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

host_target::decode_counts operator-(const host_target::decode_counts & a, const host_target::decode_counts & b) {
    return { a.decodes - b.decodes, a.rows - b.rows, a.over - b.over, a.priced - b.priced };
}

host_target::decode_counts operator+(const host_target::decode_counts & a, const host_target::decode_counts & b) {
    return { a.decodes + b.decodes, a.rows + b.rows, a.over + b.over, a.priced + b.priced };
}

// a run's prompts fed to one host: in waves of n_seq, or (tgt.refills()) each slot taking the
// next prompt as soon as its stream finishes, as a server's continuous batching does
class prompt_schedule {
  public:
    prompt_schedule(host_target & tgt, const host_wave_factory & waves, const std::vector<std::vector<llama_token>> & prompts)
        : tgt(tgt), waves(waves), prompts(prompts) {
        gen.tokens.resize(prompts.size());
        gen.steps.resize(prompts.size());
        start_wave();
    }

    // one step of every active stream, finished ones refilled (or the next wave started); false
    // once every prompt finished
    bool step() {
        if (!wave) {
            return false;
        }
        if (wave->step()) {
            if (tgt.refills()) {
                refill_finished();
            }
            return true;
        }
        end_wave();
        start_wave();
        return wave != nullptr;
    }

    host_generation & generation() { return gen; }

  private:
    void start_wave() {
        if (next >= prompts.size()) {
            return;
        }
        streams = host_wave(tgt, prompts, next, (size_t) tgt.params.n_seq);
        next += streams.size();
        c_start = tgt.counts;
        wave    = waves(tgt, streams, gen.stats);
        prefill = tgt.counts - c_start;
    }

    void refill_finished() {
        for (size_t i = 0; i < streams.size() && next < prompts.size(); ++i) {
            if (!streams[i].done) {
                continue;
            }
            collect(streams[i]);
            streams[i] = host_new_stream(tgt, prompts, next++, streams[i].seq);
            const host_target::decode_counts c0 = tgt.counts;
            wave->refill(i);
            prefill = prefill + (tgt.counts - c0);
            gen.stats.n_refills += 1;
        }
    }

    // the target's decodes of the wave: its prefills' and its steps' (one verify decode each)
    void end_wave() {
        wave->finish();
        const host_target::decode_counts verify = tgt.counts - c_start - prefill;
        host_stats & stats = gen.stats;
        stats.n_prefill_decodes += prefill.decodes;
        stats.n_prefill_over    += prefill.over;
        stats.n_verify_decodes  += verify.decodes;
        stats.n_verify_rows     += verify.rows;
        stats.n_verify_priced   += verify.priced;
        stats.n_verify_over     += verify.over;
        for (auto & s : streams) {
            collect(s);
        }
        wave.reset();
    }

    void collect(host_stream & s) {
        gen.stats.n_generated += (int64_t) s.out.size();
        gen.tokens[s.i_prompt] = std::move(s.out);
        gen.steps[s.i_prompt]  = std::max(s.n_emits - 1, 0);
    }

    host_target &                                 tgt;
    const host_wave_factory &                     waves;
    const std::vector<std::vector<llama_token>> & prompts;
    host_generation                               gen;
    std::vector<host_stream>                      streams;
    std::unique_ptr<host_wave_runner>             wave;
    size_t                                        next = 0; // the next prompt to start
    host_target::decode_counts                    c_start;  // at the wave's start
    host_target::decode_counts                    prefill;  // the wave's prefills' decodes
};

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
    prompt_schedule schedule(tgt, waves, prompts);
    while (schedule.step()) {
    }
    return std::move(schedule.generation());
}

host_generation host_generate(host_target & tgt, host_drafter * drafter, const std::vector<std::vector<llama_token>> & prompts) {
    return host_generate_waves(tgt, host_chain_waves(drafter), prompts);
}

std::pair<host_generation, host_generation> host_generate_lockstep(host_target & tgt_a, const host_wave_factory & waves_a,
        host_target & tgt_b, const host_wave_factory & waves_b, const std::vector<std::vector<llama_token>> & prompts) {
    prompt_schedule a(tgt_a, waves_a, prompts);
    prompt_schedule b(tgt_b, waves_b, prompts);
    // stride steps of one, then of the other, the order flipping every round. Not
    // one step each: an engine's controller times its steps from one draft call to
    // the next, and would count the other host's step in each of its own (it then
    // drafts where drafting does not pay); a round of the other host is one step
    // it does not measure (a stall), under nearly the same load.
    const int stride  = 16;
    bool      a_first = true;
    bool      more_a = true, more_b = true;
    while (more_a || more_b) {
        for (int k = 0; k < 2; ++k) {
            const bool a_now = (k == 0) == a_first;
            for (int i = 0; i < stride; ++i) {
                bool & more = a_now ? more_a : more_b;
                more        = more && (a_now ? a.step() : b.step());
            }
        }
        a_first = !a_first;
    }
    return { std::move(a.generation()), std::move(b.generation()) };
}
