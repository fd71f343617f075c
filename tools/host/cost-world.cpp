// The tools' cost worlds. The CPU this runs on is not the machine the numbers are
// for: on a big target on a GPU a verify decode's rows are nearly free up to some
// batch, then cost more by steps. A cost world pads every target decode (sleeping
// the rest) to what it would take there, while the drafter keeps its real cost.
//
// GPU-like (--cost-world gpu-like, the flat upper bound): every target decode padded
// to one floor that covers the largest verify batch of the run, so verify rows cost
// nothing up to that batch. The floor is only a stand-in when it covers every batch:
// a verify batch slower than the floor would charge its rows again. So the largest
// batch is measured first.
//
// A curve world (--cost-world NAME|FILE): a decode of R rows (all sequences of the
// batch together, as llama_decode gets them; prefill too) takes max(its real time,
// base x curve(R)), the curve a measured one (tools/cost-worlds/, docs/cost-worlds.md).
// base is set so that one real draft decode (np 1, one noise block) is --draft-share
// of a one-row target decode, the share a real drafter / target pair has
// (docs/bench.md). Decodes slower than the world's time are counted.
#include "host.h"
#include "stream.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#ifndef DFLASH2_COST_WORLDS_DIR
#define DFLASH2_COST_WORLDS_DIR ""
#endif

namespace {

// the curves shipped in tools/cost-worlds/
const char * const SHIPPED_CURVES[] = { "flat", "cuda-3090", "cuda-4090", "metal-m4pro" };

bool is_curve_file(const std::string & s) {
    return s.find('/') != std::string::npos || (s.size() > 4 && s.compare(s.size() - 4, 4, ".txt") == 0);
}

std::string trim(const std::string & s) {
    const size_t b = s.find_first_not_of(" \t\r");
    const size_t e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string binary_dir() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) {
        return "";
    }
    const std::string path(buf, n);
    return path.substr(0, path.rfind('/'));
}

// the file of a shipped curve's NAME: the source tree's, else one beside the binary
std::string curve_path(const std::string & name) {
    const std::vector<std::string> dirs = { DFLASH2_COST_WORLDS_DIR, binary_dir() + "/cost-worlds" };
    std::string looked;
    for (const auto & dir : dirs) {
        if (dir.empty() || dir == "/cost-worlds") {
            continue;
        }
        const std::string path = dir + "/" + name + ".txt";
        if (std::ifstream(path).good()) {
            return path;
        }
        looked += (looked.empty() ? "" : ", ") + path;
    }
    throw std::runtime_error("no curve file for the cost world " + name + " (looked for " + looked + ")");
}

// the times of `reps` decodes (after an untimed one) of rows_per_seq rows for each of np sequences, sorted
std::vector<double> decode_times(host_target & tgt, const std::vector<llama_token> & prompt, int32_t np,
        int32_t n_seq_ids, int32_t rows_per_seq, int reps) {
    const host_world_off real(tgt);
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
    std::sort(times.begin(), times.end());
    return times;
}

double median(const std::vector<double> & sorted) {
    return sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
}

// the real time of one draft decode: dflash2's greedy chain at np 1 after the first prompt, one
// noise block of n_max tokens per draft (its noise-block decode time), median of 7 after an untimed one
double measure_draft_ms(host_target & tgt, const std::vector<std::vector<llama_token>> & prompts) {
    const host_world_off real(tgt);
    tgt.reset_context(1);
    auto drafter = make_drafter_dflash2(tgt, LLAMA_SPEC_DFLASH2_WALK_GREEDY);
    std::vector<host_stream> streams = host_wave(tgt, prompts, 0, 1);
    host_stats prefill;
    host_prefill(tgt, drafter.get(), streams, prefill);
    const host_stream & s = streams[0];
    std::vector<double> times;
    std::vector<std::vector<llama_token>> out;
    for (int r = 0; r <= 7; ++r) {
        drafter->reset_stats();
        drafter->draft({ { s.seq, s.id_last, s.n_past, tgt.params.n_max, &s.history, s.seed } }, out);
        host_stats st;
        drafter->add_stats(st);
        if (st.n_noise_decodes != 1) {
            throw std::runtime_error("measuring the draft decode: " + std::to_string(st.n_noise_decodes) +
                    " noise-block decodes in one draft call, not 1");
        }
        if (r > 0) {
            times.push_back(st.t_noise_us / 1e3);
        }
        drafter->seq_rm(s.seq, s.n_past, -1); // drops the draft (no verify)
    }
    std::sort(times.begin(), times.end());
    return median(times);
}

// a curve by NAME or FILE; throws naming the file and line of a fault
std::shared_ptr<const host_cost_curve> load_curve(const std::string & name_or_file) {
    auto curve  = std::make_shared<host_cost_curve>();
    curve->path = is_curve_file(name_or_file) ? name_or_file : curve_path(name_or_file);
    std::ifstream in(curve->path);
    if (!in) {
        throw std::runtime_error("cannot read the cost curve " + curve->path);
    }
    const size_t slash = curve->path.rfind('/');
    curve->name = curve->path.substr(slash == std::string::npos ? 0 : slash + 1);
    if (curve->name.size() > 4 && curve->name.compare(curve->name.size() - 4, 4, ".txt") == 0) {
        curve->name.resize(curve->name.size() - 4);
    }
    std::string line;
    int n_line = 0;
    while (std::getline(in, line)) {
        ++n_line;
        const auto fail = [&](const std::string & why) {
            throw std::runtime_error(curve->path + ":" + std::to_string(n_line) + ": " + why + " (a line is 'rows time': "
                    "integer rows from 1, strictly increasing, time relative to 1 row = 1.0, non-decreasing; '#' comments)");
        };
        const size_t hash = line.find('#');
        if (hash != std::string::npos) {
            const std::string comment = trim(line.substr(hash + 1));
            if (comment.rfind("name:", 0) == 0 && !trim(comment.substr(5)).empty()) {
                curve->name = trim(comment.substr(5));
            }
            line.resize(hash);
        }
        line = trim(line);
        if (line.empty()) {
            continue;
        }
        const char * p   = line.c_str();
        char *       end = nullptr;
        const long   rows = std::strtol(p, &end, 10);
        if (end == p || (*end != ' ' && *end != '\t')) {
            fail("'" + line + "': rows is not an integer");
        }
        p = end;
        const double t = std::strtod(p, &end);
        if (end == p || !trim(end).empty()) {
            fail("'" + line + "': not two numbers");
        }
        if (!std::isfinite(t) || t <= 0.0) {
            fail("time " + trim(p) + " is not positive");
        }
        if (curve->points.empty() && rows != 1) {
            fail("the first rows is " + std::to_string(rows) + ", not 1");
        }
        if (curve->points.empty() && std::fabs(t - 1.0) > 1e-6) {
            fail("rows 1 has time " + trim(p) + ", not 1.0 (times are relative to one row)");
        }
        if (!curve->points.empty() && rows <= curve->points.back().first) {
            fail("rows " + std::to_string(rows) + " after rows " + std::to_string(curve->points.back().first) +
                    ": not increasing");
        }
        if (!curve->points.empty() && t < curve->points.back().second) {
            fail("time " + trim(p) + " below the one before it");
        }
        if (rows > 1 << 20) {
            fail("rows " + std::to_string(rows) + " over 2^20");
        }
        curve->points.push_back({ (int32_t) rows, t });
    }
    if (curve->points.empty()) {
        throw std::runtime_error(curve->path + ": no data lines ('rows time', the first '1 1.0')");
    }
    return curve;
}

} // namespace

double host_cost_curve::at(int32_t rows) const {
    if (points.size() == 1 || rows <= points.front().first) {
        return points.front().second;
    }
    size_t k = 1;
    while (k + 1 < points.size() && points[k].first < rows) {
        ++k;
    }
    // between points k - 1 and k, or past the last along its segment
    const auto [r0, t0] = points[k - 1];
    const auto [r1, t1] = points[k];
    return t0 + (t1 - t0) * (double) (rows - r0) / (double) (r1 - r0);
}

host_world_choice host_world_choice_of(const std::map<std::string, std::string> & values, const std::string & dflt) {
    host_world_choice c;
    const auto w = values.find("--cost-world");
    c.name = w != values.end() ? w->second : dflt;
    const auto s = values.find("--draft-share");
    if (s != values.end()) {
        char * end = nullptr;
        const double v = std::strtod(s->second.c_str(), &end);
        if (end == s->second.c_str() || *end != '\0' || !(v > 0.0 && v <= 1.0)) {
            throw std::runtime_error("--draft-share needs a number in (0, 1], got '" + s->second + "'");
        }
        c.draft_share = (float) v;
    }
    if (c.name != "real" && c.name != "gpu-like" && !is_curve_file(c.name) &&
            std::find(std::begin(SHIPPED_CURVES), std::end(SHIPPED_CURVES), c.name) == std::end(SHIPPED_CURVES)) {
        std::string names;
        for (const char * n : SHIPPED_CURVES) {
            names += std::string(", ") + n;
        }
        throw std::runtime_error("--cost-world takes real, gpu-like" + names + " or a curve FILE (a path with '/' or "
                "ending in .txt), not '" + c.name + "'");
    }
    if (c.name != "real" && c.name != "gpu-like") {
        c.curve = load_curve(c.name);
    }
    return c;
}

double host_measure_verify_ms(host_target & tgt, const std::vector<llama_token> & prompt, int32_t np,
        int32_t n_seq_ids, int32_t rows_per_seq, int reps) {
    const std::vector<double> times = decode_times(tgt, prompt, np, n_seq_ids, rows_per_seq, reps);
    // the second slowest: one decode a busy machine stalled does not set the floor
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

host_cost_world host_set_curve_world(host_target & tgt, const host_world_choice & choice,
        const std::vector<std::vector<llama_token>> & prompts, int32_t np, int32_t n_seq_ids, int32_t rows_per_seq) {
    if (tgt.params.target_min_ms > 0) {
        throw std::runtime_error("--target-min-ms is the gpu-like world's floor: not with --cost-world " + choice.name);
    }
    host_cost_world w;
    w.curve       = choice.curve;
    w.draft_share = choice.draft_share;
    w.draft_n_max = tgt.params.n_max;
    w.one_row_ms  = median(decode_times(tgt, prompts[0], 1, 0, 1, 7));
    w.draft_ms    = measure_draft_ms(tgt, prompts);
    // the world holds only where the real decode is within it: a CPU's verify rows cost far more
    // against its one-row decode than a GPU's, so the run's largest batch (measured as the
    // gpu-like world measures its floor, a quarter above) may need a larger base than the
    // share gives; then the drafter is cheaper against the target than the share (said)
    // (up to HOST_COVER_ROWS rows in all: past the range the curves were measured in with most
    // points, a decode may run at this machine's cost, counted per mode as over the world)
    w.np           = np;
    w.rows_per_seq = std::min(rows_per_seq, std::max(1, HOST_COVER_ROWS / std::max(np, 1)));
    w.measured_ms  = np > 0 && rows_per_seq > 0 ? host_measure_verify_ms(tgt, prompts[0], np, n_seq_ids, w.rows_per_seq, 7) : 0.0;
    w.cover_ms     = 1.25 * w.measured_ms / w.curve->at(np * w.rows_per_seq);
    w.base_ms      = std::max(w.draft_ms / w.draft_share, w.cover_ms);
    tgt.params.cost_curve   = w.curve;
    tgt.params.cost_base_ms = w.base_ms;
    return w;
}

host_cost_world host_set_world(host_target & tgt, const host_world_choice & choice,
        const std::vector<std::vector<llama_token>> & prompts, int32_t np, int32_t n_seq_ids, int32_t rows_per_seq) {
    if (!choice.curve) {
        return host_set_cost_world(tgt, choice.name == "gpu-like", prompts[0], np, n_seq_ids, rows_per_seq);
    }
    return host_set_curve_world(tgt, choice, prompts, np, n_seq_ids, rows_per_seq);
}

std::string host_cost_world::describe() const {
    if (curve) {
        std::string s = string_format("cost world: %s (%s): a target decode of R rows (all sequences) takes max(its real "
                "time, base x curve(R)); base %.2f ms = a real draft decode (np 1, n_max %d: %.2f ms, median of 7) / "
                "--draft-share %.2f; curve(1, 8, 16, 64) = %.2f, %.2f, %.2f, %.2f; a real one-row target decode: %.2f ms; "
                "the drafter at its real cost", curve->name.c_str(), curve->path.c_str(), draft_ms / draft_share, draft_n_max, draft_ms,
                draft_share, curve->at(1), curve->at(8), curve->at(16), curve->at(64), one_row_ms);
        if (cover_ms > draft_ms / draft_share) {
            s += string_format("\ncost world: base raised to %.2f ms: the run's largest verify batch up to %d rows (%d x %d) took %.1f ms "
                    "here (second slowest of 7), more than base x curve(%d) = %.1f ms; at this base the world holds up to "
                    "that batch and a draft decode is %.3f of a one-row target decode (not %.2f)", base_ms, HOST_COVER_ROWS, np, rows_per_seq,
                    measured_ms, np * rows_per_seq, draft_ms / draft_share * curve->at(np * rows_per_seq),
                    effective_share(), draft_share);
        }
        if (!holds_at_one_row()) {
            s += string_format("\nWARNING: THE WORLD DOES NOT HOLD AT ONE ROW: base x curve(1) = %.2f ms is below the "
                    "real one-row target decode (%.2f ms): one-row decodes run at their real cost, above the world's, so "
                    "neither the draft share nor the curve's shape holds (a smaller --draft-share raises base)",
                    base_ms * curve->at(1), one_row_ms);
        }
        return s;
    }
    if (!gpu_like) {
        return "cost world: real (this machine's costs)";
    }
    std::string s = string_format("cost world: GPU-like: every target decode takes at least %d ms; the largest verify "
            "batch of this run (%d x %d rows) took %.1f ms here (second slowest of 7), so verify rows cost nothing up to it; the "
            "drafter runs at its real cost (the flat world: an upper bound, no real backend is this flat)", floor_ms, np,
            rows_per_seq, measured_ms);
    if (requested_ms > 0 && requested_ms < floor_ms) {
        s += string_format(" (--target-min-ms %d did not cover that batch: raised)", requested_ms);
    }
    return s;
}

std::string host_cost_world::json() const {
    if (curve) {
        std::string pts;
        for (const auto & [r, t] : curve->points) {
            pts += string_format("%s[%d, %.6g]", pts.empty() ? "" : ", ", r, t);
        }
        return string_format("{\"kind\": \"curve\", \"name\": %s, \"file\": %s, \"draft_share\": %.4g, "
                "\"draft_decode_ms\": %.4f, \"draft_decode_n_max\": %d, \"base_ms\": %.4f, \"real_one_row_ms\": %.4f, "
                "\"cover_ms\": %.4f, \"effective_draft_share\": %.4g, \"largest_verify_batch\": {\"sequences\": %d, \"rows_per_sequence\": %d, \"measured_ms\": %.3f}, "
                "\"holds_at_one_row\": %s, \"measured_as\": \"median of 7 after an untimed one\", \"curve\": [%s]}",
                host_json_str(curve->name).c_str(), host_json_str(curve->path).c_str(), draft_share, draft_ms, draft_n_max, base_ms, one_row_ms,
                cover_ms, effective_share(), np, rows_per_seq, measured_ms, holds_at_one_row() ? "true" : "false", pts.c_str());
    }
    if (!gpu_like) {
        return "{\"kind\": \"real\"}";
    }
    return string_format("{\"kind\": \"gpu-like\", \"upper_bound\": true, \"floor_ms\": %d, \"requested_floor_ms\": %d, "
            "\"largest_verify_batch\": {\"sequences\": %d, \"rows_per_sequence\": %d, \"measured_ms\": %.3f, \"measured_as\": \"second slowest of 7 decodes after a warm-up\"}}",
            floor_ms, requested_ms, np, rows_per_seq, measured_ms);
}
