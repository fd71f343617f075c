// The bench's GPU-like cost world: every target decode padded to a floor
// (host_params.target_min_ms) that covers the largest verify batch of the run,
// so that verify rows cost nothing up to that batch, as on a big memory-bound
// target on a GPU, while the drafter keeps its real (CPU) cost. The floor is
// only a stand-in when it covers every batch: a verify batch slower than the
// floor would charge its rows again. So the largest batch is measured first.
#include "host.h"

#include <algorithm>
#include <chrono>
#include <cmath>

double host_measure_verify_ms(host_target & tgt, const std::vector<llama_token> & prompt, int32_t np,
        int32_t n_seq_ids, int32_t rows_per_seq, int reps) {
    const int32_t floor_ms = tgt.params.target_min_ms;
    tgt.params.target_min_ms = 0;
    tgt.reset_context(np, n_seq_ids);
    common_batch batch(tgt.ctx);
    // every sequence holds the prompt, as during a run
    const int32_t n_prompt = std::min<int32_t>((int32_t) prompt.size(), tgt.params.n_batch / std::max(np, 1));
    for (int32_t s = 0; s < np; ++s) {
        batch.clear();
        for (int32_t i = 0; i < n_prompt; ++i) {
            batch.add(prompt[i], i, s, i + 1 == n_prompt);
        }
        tgt.decode(batch);
    }
    // one untimed decode first: a fresh context's first batch of a shape also sets up its graph
    std::vector<double> times;
    for (int r = 0; r <= reps; ++r) {
        batch.clear();
        for (int32_t s = 0; s < np; ++s) {
            for (int32_t j = 0; j < rows_per_seq; ++j) {
                batch.add(prompt[j % prompt.size()], n_prompt + j, s, true);
            }
        }
        const auto t0 = std::chrono::steady_clock::now();
        tgt.decode(batch);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) {
            times.push_back(ms);
        }
        for (int32_t s = 0; s < np; ++s) {
            llama_memory_seq_rm(llama_get_memory(tgt.ctx), s, n_prompt, -1);
        }
    }
    tgt.params.target_min_ms = floor_ms;
    // the second slowest: one decode a busy machine stalled does not set the floor
    std::sort(times.begin(), times.end());
    return times.size() > 1 ? times[times.size() - 2] : times.empty() ? 0.0 : times[0];
}

host_cost_world host_set_cost_world(host_target & tgt, bool gpu_like, const std::vector<llama_token> & prompt,
        int32_t np, int32_t n_seq_ids, int32_t rows_per_seq) {
    host_cost_world w;
    w.requested_ms = tgt.params.target_min_ms;
    w.gpu_like     = gpu_like || w.requested_ms > 0;
    if (!w.gpu_like || prompt.empty()) {
        return w;
    }
    w.np           = np;
    w.rows_per_seq = rows_per_seq;
    w.measured_ms  = host_measure_verify_ms(tgt, prompt, np, n_seq_ids, rows_per_seq, 7);
    // a quarter above: the run's own decodes vary as much
    const int32_t needed = (int32_t) std::ceil(w.measured_ms * 1.25);
    w.floor_ms = std::max(w.requested_ms, std::max(needed, 1));
    tgt.params.target_min_ms = w.floor_ms;
    return w;
}

std::string host_cost_world::describe() const {
    if (!gpu_like) {
        return "cost world: real (this machine's costs)";
    }
    std::string s = string_format("cost world: GPU-like: every target decode takes at least %d ms; the largest verify "
            "batch of this run (%d x %d rows) took %.1f ms here (second slowest of 7), so verify rows cost nothing up to it; the "
            "drafter runs at its real cost", floor_ms, np, rows_per_seq, measured_ms);
    if (requested_ms > 0 && requested_ms < floor_ms) {
        s += string_format(" (--target-min-ms %d did not cover that batch: raised)", requested_ms);
    }
    return s;
}

std::string host_cost_world::json() const {
    if (!gpu_like) {
        return "{\"kind\": \"real\"}";
    }
    return string_format("{\"kind\": \"gpu-like\", \"floor_ms\": %d, \"requested_floor_ms\": %d, "
            "\"largest_verify_batch\": {\"sequences\": %d, \"rows_per_sequence\": %d, \"measured_ms\": %.3f, \"measured_as\": \"second slowest of 7 decodes after a warm-up\"}}",
            floor_ms, requested_ms, np, rows_per_seq, measured_ms);
}
