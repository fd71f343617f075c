// dflash2 vs llama.cpp's own draft-dflash vs target-only, in one process and one
// run, across parallel sequences. Each step verifies all sequences' drafts in one
// target batch, the way llama-server does. Prints a table with ratios computed
// inside the run, writes JSON and an SVG chart of tokens/s and tau vs np.
// With --temp T > 0 the target samples (host.h says how each mode verifies):
// upstream's output still equals target-only's token for token (same draws);
// dflash2's (chain and tree modes) follows the same distribution with other
// draws, so its "identical" column reads "-".
#include "args.h"
#include "dflash2.hpp"
#include "host.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace {

struct mode_result {
    std::string              mode;
    int32_t                  np = 0;
    std::vector<host_stats>  runs;
    std::vector<bool>        identical; // per prompt, vs target-only at the same np
    size_t                   i_median = 0;
    bool                     comparable = true; // its output is expected to equal target-only's
    std::vector<int32_t>     steps;     // per prompt, of the last repetition: decode steps after the prefill

    const host_stats & median() const { return runs[i_median]; }

    double tps(size_t i) const { return runs[i].tokens_per_s(); }

    double tps_min() const {
        double m = tps(0);
        for (size_t i = 1; i < runs.size(); ++i) {
            m = std::min(m, tps(i));
        }
        return m;
    }

    double tps_max() const {
        double m = tps(0);
        for (size_t i = 1; i < runs.size(); ++i) {
            m = std::max(m, tps(i));
        }
        return m;
    }

    // the median over the runs of tokens per CPU second (the runs' own median, not the wall-time median run's)
    double cpu_median() const {
        std::vector<double> v;
        for (const auto & r : runs) {
            v.push_back(r.tokens_per_cpu_s());
        }
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : v[v.size() / 2];
    }

    int n_identical() const { return (int) std::count(identical.begin(), identical.end(), true); }
};

// the oracle's fixed plans (--oracle): greedy chains of n_max K, mode dflash2@nK, and greedy trees of
// N nodes, mode dflash2-tree@N; the size, or 0 for another mode
int32_t plan_size(const std::string & mode, const std::string & prefix) {
    if (mode.compare(0, prefix.size(), prefix) != 0 || mode.size() == prefix.size() || mode[prefix.size()] == '0') {
        return 0;
    }
    int32_t n = 0;
    for (size_t i = prefix.size(); i < mode.size(); ++i) {
        if (mode[i] < '0' || mode[i] > '9' || n >= HOST_MAX_DRAFT) {
            return 0;
        }
        n = n * 10 + (mode[i] - '0');
    }
    return n < HOST_MAX_DRAFT ? n : 0;
}

int32_t chain_plan(const std::string & mode) {
    return plan_size(mode, "dflash2@n");
}

int32_t tree_plan(const std::string & mode) {
    return plan_size(mode, "dflash2-tree@");
}

// the plans --oracle adds: chains n_max 1..7, trees of 3, 7, 15, 31 and 63 nodes
std::vector<std::string> oracle_plans() {
    std::vector<std::string> plans;
    for (int k = 1; k <= 7; ++k) {
        plans.push_back("dflash2@n" + std::to_string(k));
    }
    for (int n : { 3, 7, 15, 31, 63 }) {
        plans.push_back("dflash2-tree@" + std::to_string(n));
    }
    return plans;
}

std::unique_ptr<host_drafter> make_drafter(const std::string & mode, host_target & tgt) {
    if (mode == "upstream") {
        return make_drafter_upstream(tgt);
    }
    if (mode == "dflash2" || chain_plan(mode) > 0) {
        return make_drafter_dflash2(tgt, LLAMA_SPEC_DFLASH2_WALK_GREEDY);
    }
    if (mode == "dflash2-libllama") {
        return make_drafter_dflash2(tgt, LLAMA_SPEC_DFLASH2_WALK_GREEDY, false, LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_LIBLLAMA);
    }
    if (mode == "dflash2-adaptive") {
        return make_drafter_dflash2(tgt, LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE);
    }
    if (mode == "ar-attached" || mode == "ar-fed") {
        return make_drafter_dflash2(tgt, LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE, /*feed_only*/ true);
    }
    return make_drafter_ngram(tgt, mode);
}

// llama.cpp's n-gram speculative types (no draft model), for comparison with n-gram branches
bool is_ngram(const std::string & mode) {
    const auto & modes = host_ngram_modes();
    return std::any_of(modes.begin(), modes.end(), [&](const auto & m) { return m.first == mode; });
}

// modes whose host verifies trees: dflash2-tree and dflash2-tree@N (whole trees), dflash2-auto (the
// adaptive controller: no draft, a chain or a tree each step)
bool is_tree(const std::string & mode) {
    return mode == "dflash2-tree" || mode == "dflash2-auto" || tree_plan(mode) > 0;
}

// target-only with an engine on the target context, for measuring what the engine costs
// the target's own decoding: ar-attached creates it (its tap-layer capture is on) and
// never calls it; ar-fed also hands it every decoded row (process, seq_rm), never drafting
bool is_diagnostic(const std::string & mode) {
    return mode == "ar-attached" || mode == "ar-fed" || mode == "ar-unified";
}

// target-only on the tree modes' context (a unified cache with their sequence ids): what
// the tree modes' speed is to be compared with when the cache layout itself costs
bool on_tree_context(const std::string & mode) {
    return is_tree(mode) || mode == "ar-unified";
}

// the modes a run takes (--lockstep: all but llama.cpp's n-gram types)
bool is_known(const std::string & mode, bool with_ngram) {
    return mode == "ar" || mode == "upstream" || mode == "dflash2" || mode == "dflash2-libllama" ||
           mode == "dflash2-adaptive" || chain_plan(mode) > 0 || is_tree(mode) || is_diagnostic(mode) ||
           (with_ngram && is_ngram(mode));
}

// leaves (path sequence ids) per tree: np x (leaves + 1) ids within llama.cpp's 256 (255 where
// a refill schedule keeps one for retired cells: host_target::retired_seq)
int32_t tree_leaves(const host_params & params, int32_t np, int32_t n_tree) {
    const int32_t n_ids = params.refill && np > 1 ? 255 : 256;
    return std::max(1, std::min(n_tree, n_ids / std::max(np, 1) - 1));
}

std::vector<std::string> split(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        out.push_back(item);
    }
    return out;
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) {
            return line.substr(line.find(':') + 2);
        }
    }
    return "unknown";
}

const mode_result * find(const std::vector<mode_result> & results, const std::string & mode, int32_t np) {
    for (const auto & r : results) {
        if (r.mode == mode && r.np == np) {
            return &r;
        }
    }
    return nullptr;
}

// a rate of a run: tok/s over the whole run, or while every slot generates (np > 1: a server's steady state)
using rate_of = double (host_stats::*)() const;
constexpr rate_of whole_run = &host_stats::tokens_per_s;
constexpr rate_of all_slots = &host_stats::full_tokens_per_s;

double rate(const mode_result * r, rate_of of) {
    return (r->median().*of)();
}

double ratio(const mode_result * a, const mode_result * b, rate_of of = whole_run) {
    return a && b && rate(b, of) > 0 ? rate(a, of) / rate(b, of) : 0.0;
}

// --oracle at one np: the fastest of the fixed plans, and the modes the controller is held against
struct oracle_row {
    const mode_result * best      = nullptr;
    const mode_result * best_full = nullptr; // the fastest while every slot generates
    const mode_result * aut       = nullptr;
    const mode_result * ar        = nullptr;
    const mode_result * up        = nullptr;
};

oracle_row oracle_of(const std::vector<mode_result> & results, int32_t np) {
    oracle_row o;
    for (const auto & m : oracle_plans()) {
        const mode_result * r = find(results, m, np);
        auto keep_fastest = [r](const mode_result *& best, rate_of of) {
            if (r && (!best || rate(r, of) > rate(best, of))) {
                best = r;
            }
        };
        keep_fastest(o.best, whole_run);
        keep_fastest(o.best_full, all_slots);
    }
    o.aut = find(results, "dflash2-auto", np);
    o.ar  = find(results, "ar", np);
    o.up  = find(results, "upstream", np);
    return o;
}

// a / b's tok/s to 3 decimals, `missing` without either
std::string ratio_or(const mode_result * a, const mode_result * b, const char * missing) {
    return a && b ? string_format("%.3f", ratio(a, b)) : missing;
}

std::string identical_of(const mode_result & r) {
    return r.comparable ? std::to_string(r.n_identical()) + "/" + std::to_string(r.identical.size()) : "-";
}

// per np: every mode of the run with the fixed plans among them (* the best), then the best and
// the controller's share of it
void print_oracle(const std::vector<mode_result> & results, const std::vector<int32_t> & nps, const host_cost_world & world) {
    for (int32_t np : nps) {
        const oracle_row o = oracle_of(results, np);
        printf("\noracle np=%d, cost world %s (* the best fixed plan; rows/step: rows of a verify decode, all sequences)\n",
                np, world.name().c_str());
        printf("  %-17s %9s %6s %10s %9s %20s %12s\n", "plan", "tok/s", "tau", "rows/step", "identical", "decodes over world",
                "full tok/s");
        for (const auto & r : results) {
            if (r.np != np) {
                continue;
            }
            const host_stats & s = r.median();
            char over[48];
            snprintf(over, sizeof(over), "%lld/%lld", (long long) s.n_verify_over, (long long) s.n_verify_decodes);
            printf("  %c%-16s %9.1f %6.2f %10.2f %9s %20s %12.1f\n", &r == o.best ? '*' : ' ', r.mode.c_str(),
                    s.tokens_per_s(), s.tau(), s.verify_rows_per_step(), identical_of(r).c_str(),
                    world.is_real() ? "-" : over, s.full_tokens_per_s());
        }
        printf("  np=%d best fixed plan: %s (%.1f tok/s); dflash2-auto/best %s, dflash2-auto/ar %s, dflash2-auto/upstream %s\n",
                np, o.best ? o.best->mode.c_str() : "-", o.best ? o.best->median().tokens_per_s() : 0.0,
                ratio_or(o.aut, o.best, "-").c_str(), ratio_or(o.aut, o.ar, "-").c_str(), ratio_or(o.aut, o.up, "-").c_str());
        if (np > 1) {
            // a server refills each slot as it frees: its steady state is a wave's steps
            // before any of its streams finished
            printf("  np=%d while all %d slots generate (full tok/s): best fixed plan %s (%.1f tok/s); "
                   "dflash2-auto/best %.3f, dflash2-auto/ar %.3f, dflash2-auto/upstream %.3f\n",
                    np, np, o.best_full ? o.best_full->mode.c_str() : "-",
                    o.best_full ? rate(o.best_full, all_slots) : 0.0, ratio(o.aut, o.best_full, all_slots),
                    ratio(o.aut, o.ar, all_slots), ratio(o.aut, o.up, all_slots));
        }
    }
}

void print_table(const std::vector<mode_result> & results, const std::vector<int32_t> & nps, int n_max,
        const host_cost_world & world) {
    printf("\n%-3s %-16s %22s %9s %9s %6s %16s %9s %9s  %s\n", "np", "mode", "tok/s median [min..max]", "tok/cpu-s", "tok/s/seq",
            "tau", "accepted/drafted", "identical", "verify ms", "drafter ms: process / draft / accept (inject, noise, walk)");
    for (int32_t np : nps) {
        for (const auto & r : results) {
            if (r.np != np) {
                continue;
            }
            const host_stats & s = r.median();
            char tps[64], acc[32];
            snprintf(tps, sizeof(tps), "%.1f [%.1f..%.1f]", s.tokens_per_s(), r.tps_min(), r.tps_max());
            snprintf(acc, sizeof(acc), "%lld/%lld", (long long) s.n_accepted, (long long) s.n_drafted);
            printf("%-3d %-16s %22s %9.1f %9.1f %6.2f %16s %9s %9.1f", np, r.mode.c_str(), tps, r.cpu_median(), s.tokens_per_s() / np,
                    s.tau(), r.mode == "ar" ? "-" : acc, identical_of(r).c_str(), s.t_target_us / 1e3);
            if (r.mode != "ar") {
                printf("  %.1f / %.1f / %.1f", s.t_process_us / 1e3, s.t_draft_us / 1e3, s.t_accept_us / 1e3);
                if (s.has_split) {
                    printf(" (%.1f, %.1f, %.1f)", s.t_inject_us / 1e3, s.t_noise_us / 1e3, s.t_walk_us / 1e3);
                }
            }
            printf("\n");
        }
        const mode_result * d = find(results, "dflash2", np);
        const mode_result * u = find(results, "upstream", np);
        const mode_result * a = find(results, "ar", np);
        const mode_result * x = find(results, "dflash2-adaptive", np);
        printf("    np=%d ratios: dflash2/upstream %.3f, dflash2/ar %.3f, upstream/ar %.3f", np, ratio(d, u),
                ratio(d, a), ratio(u, a));
        if (x) {
            printf(", dflash2-adaptive/upstream %.3f, dflash2-adaptive/ar %.3f", ratio(x, u), ratio(x, a));
        }
        const mode_result * tr = find(results, "dflash2-tree", np);
        if (tr) {
            printf(", dflash2-tree/dflash2 %.3f (tau %.3f), dflash2-tree/ar %.3f", ratio(tr, d),
                    d && d->median().tau() > 0 ? tr->median().tau() / d->median().tau() : 0.0, ratio(tr, a));
        }
        const mode_result * au = find(results, "dflash2-auto", np);
        if (au) {
            printf(", dflash2-auto/ar %.3f, dflash2-auto/dflash2 %.3f", ratio(au, a), ratio(au, d));
        }
        const mode_result * lg = find(results, "dflash2-libllama", np);
        if (lg && d) {
            // the two draft graphs: speed, and the drafter's own time per step (inject + noise + walk)
            const host_stats & sd = d->median();
            const host_stats & sl = lg->median();
            const double per_d = (sd.t_inject_us + sd.t_noise_us + sd.t_walk_us) / std::max<double>(1, (double) sd.n_seq_steps);
            const double per_l = (sl.t_inject_us + sl.t_noise_us + sl.t_walk_us) / std::max<double>(1, (double) sl.n_seq_steps);
            printf(", dflash2/dflash2-libllama %.3f (drafter time per step %.3f)", ratio(d, lg), per_l > 0 ? per_d / per_l : 0.0);
        }
        printf("\n");
        // every mode against target-only, in wall time and in CPU time (the work: on a loaded
        // machine the steadier of the two; comparable between modes at --threads 1)
        if (a) {
            printf("    np=%d vs ar, wall | cpu:", np);
            for (const auto & r : results) {
                if (r.np == np && r.mode != "ar") {
                    printf(" %s %.3f | %.3f", r.mode.c_str(), ratio(&r, a),
                            a->cpu_median() > 0 ? r.cpu_median() / a->cpu_median() : 0.0);
                }
            }
            printf("\n");
        }
        // np > 1: the same while every slot generates, a wave's tail left out (a server that
        // refills each slot as it frees never has one)
        if (a && np > 1) {
            printf("    np=%d while all %d slots generate, tok/s (vs ar):", np, np);
            for (const auto & r : results) {
                if (r.np == np) {
                    printf(" %s %.1f (%.3f)", r.mode.c_str(), r.median().full_tokens_per_s(), ratio(&r, a, all_slots));
                }
            }
            printf("\n");
        }
        // the decodes the world could not slow to its time (they ran slower here than it models)
        if (!world.is_real()) {
            printf("    np=%d target decodes over the world's time (it did not hold there), verify | prefill:", np);
            for (const auto & r : results) {
                if (r.np == np) {
                    const host_stats & s = r.median();
                    printf(" %s %lld/%lld | %lld/%lld", r.mode.c_str(), (long long) s.n_verify_over,
                            (long long) s.n_verify_decodes, (long long) s.n_prefill_over, (long long) s.n_prefill_decodes);
                }
            }
            printf("\n");
        }
        for (const auto * r : { u, d, x, tr, au }) {
            if (!r) {
                continue;
            }
            printf("    %-8s acceptance by draft position:", r->mode.c_str());
            for (int j = 0; j < n_max && j < HOST_MAX_DRAFT; ++j) {
                const host_stats & s = r->median();
                printf(" %d:%.0f%%", j + 1, s.drafted_at[j] ? 100.0 * s.accepted_at[j] / s.drafted_at[j] : 0.0);
            }
            printf("\n");
            if (r->median().n_head_slices > 1 && r->median().n_noise_decodes > 0) {
                const host_stats & s = r->median();
                const double per = 1.0 / s.n_noise_decodes;
                printf("    %-8s target head read in %lld vocabulary slices: %.0f bytes crossed devices per draft "
                        "decode (a full-logit gather: %.0f; a mirrored head: 0 but %.1f MiB more memory)\n",
                        r->mode.c_str(), (long long) s.n_head_slices, s.head_bytes_moved * per,
                        s.head_bytes_full_gather * per, s.head_bytes_mirrored / 1048576.0);
            }
            if (r->median().n_tuned_drafts > 0) {
                const host_stats & s = r->median();
                printf("    %-8s draft temperature chosen by the library: %.2f x --temp on average over %lld drafts\n",
                        r->mode.c_str(), s.tuned_ratio_sum / s.n_tuned_drafts, (long long) s.n_tuned_drafts);
            }
            if (is_tree(r->mode) && r->median().n_seq_steps > 0) {
                const host_stats & s = r->median();
                printf("    %-8s nodes per step by depth:", r->mode.c_str());
                for (int j = 0; j < HOST_MAX_DRAFT && s.nodes_at[j]; ++j) {
                    printf(" %d:%.2f", j + 1, (double) s.nodes_at[j] / s.n_seq_steps);
                }
                std::vector<std::pair<int64_t, std::string>> shapes;
                for (const auto & [shape, n] : s.shapes) {
                    shapes.push_back({ n, shape });
                }
                std::sort(shapes.begin(), shapes.end(), [](const auto & a, const auto & b) { return a.first > b.first; });
                printf("\n    %-8s tree shapes (nodes per depth), most drafted:", r->mode.c_str());
                for (size_t k = 0; k < shapes.size() && k < 6; ++k) {
                    printf(" [%s] %.0f%%", shapes[k].second.c_str(), 100.0 * shapes[k].first / s.n_seq_steps);
                }
                printf("\n");
                if (s.n_one_pass_rows > 0) {
                    printf("    %-8s %lld one-row verify ubatches over 512+ cells got a row more, parked (ggml's CPU"
                           " attention would split their cells, target-only's not; a curve world does not price it)\n",
                            r->mode.c_str(), (long long) s.n_one_pass_rows);
                }
                if (s.n_unparked > 0) {
                    printf("    %-8s the KV cache filled %lld times with parked cells, freed then (cells of a sequence may"
                           " leave position order: outputs may leave target-only's; --ctx-size keeps them)\n",
                            r->mode.c_str(), (long long) s.n_unparked);
                }
            }
        }
    }
}

void write_json(const std::string & path, const host_args & args, const std::vector<std::string> & prompts,
        const std::vector<mode_result> & results, int reps, const host_cost_world & world, bool oracle) {
    std::ofstream out(path);
    if (!out) {
        throw std::runtime_error("cannot write " + path);
    }
    const host_params & p = args.params;
    out << "{\n  \"machine\": {\"cpu\": " << host_json_str(cpu_model()) << ", \"hardware_threads\": "
        << std::thread::hardware_concurrency() << ", \"threads\": " << p.n_threads << "},\n";
    out << "  \"cache_type_k\": " << host_json_str(ggml_type_name(p.cache_type_k)) << ", \"cache_type_v\": "
        << host_json_str(ggml_type_name(p.cache_type_v)) << ",\n";
    out << "  \"llama_cpp\": " << host_json_str(llama_print_system_info()) << ",\n";
    out << "  \"dflash2\": " << host_json_str(dflash2::version()) << ",\n";
    out << "  \"target\": " << host_json_str(p.path_target) << ",\n  \"draft\": " << host_json_str(p.path_draft) << ",\n";
    out << "  \"schedule\": \"" << (p.refill ? "refill" : "waves") << "\",\n";
    out << "  \"n_predict\": " << p.n_predict << ", \"n_max\": " << p.n_max << ", \"repetitions\": " << reps
        << ", \"target_min_ms\": " << world.floor_ms << ",\n";
    out << "  \"cost_world\": " << world.json() << ",\n";
    out << "  \"temp\": " << p.temp << ", \"seed\": " << p.seed << ", \"sampler_chain\": "
        << host_json_str(p.temp > 0 ? "temp, dist" : "greedy") << ",\n";
    out << "  \"prompts\": [";
    for (size_t i = 0; i < prompts.size(); ++i) {
        out << (i ? ", " : "") << host_json_str(prompts[i]);
    }
    out << "],\n  \"results\": [\n";
    for (size_t k = 0; k < results.size(); ++k) {
        const mode_result & r = results[k];
        const host_stats  & s = r.median();
        out << "    {\"np\": " << r.np << ", \"mode\": " << host_json_str(r.mode) << ", \"tokens_per_s\": {\"median\": "
            << s.tokens_per_s() << ", \"min\": " << r.tps_min() << ", \"max\": " << r.tps_max() << ", \"runs\": [";
        for (size_t i = 0; i < r.runs.size(); ++i) {
            out << (i ? ", " : "") << r.tps(i);
        }
        out << "]}, \"tokens_per_cpu_s\": {\"median\": " << r.cpu_median() << ", \"runs\": [";
        for (size_t i = 0; i < r.runs.size(); ++i) {
            out << (i ? ", " : "") << r.runs[i].tokens_per_cpu_s();
        }
        out << "]}, \"full_tokens_per_s\": " << s.full_tokens_per_s() << ", \"full_tokens\": " << s.n_full_tokens
            << ", \"tokens_per_s_per_seq\": " << s.tokens_per_s() / r.np << ", \"generated\": " << s.n_generated
            << ", \"decode_ms\": " << s.t_total_us / 1e3 << ", \"seq_steps\": " << s.n_seq_steps
            << ", \"drafted\": " << s.n_drafted << ", \"accepted\": " << s.n_accepted << ", \"tau\": " << s.tau()
            << ", \"verify_decodes\": " << s.n_verify_decodes << ", \"verify_rows\": " << s.n_verify_rows
            << ", \"verify_rows_priced\": " << s.n_verify_priced
            << ", \"verify_rows_per_step\": " << s.verify_rows_per_step() << ", \"decodes_over_world\": {\"verify\": "
            << s.n_verify_over << ", \"prefill\": " << s.n_prefill_over << ", \"prefill_decodes\": " << s.n_prefill_decodes << "}"
            << ", \"refills\": " << s.n_refills
            << ", \"acceptance_by_position\": [";
        for (int j = 0; j < p.n_max && j < HOST_MAX_DRAFT; ++j) {
            out << (j ? ", " : "") << (s.drafted_at[j] ? (double) s.accepted_at[j] / s.drafted_at[j] : 0.0);
        }
        out << "]";
        if (is_tree(r.mode)) {
            out << ", \"tree_nodes_per_step_by_depth\": [";
            for (int j = 0; j < HOST_MAX_DRAFT && s.nodes_at[j]; ++j) {
                out << (j ? ", " : "") << (s.n_seq_steps ? (double) s.nodes_at[j] / s.n_seq_steps : 0.0);
            }
            out << "], \"tree_shapes\": {";
            bool first = true;
            for (const auto & [shape, n] : s.shapes) {
                out << (first ? "" : ", ") << host_json_str(shape) << ": " << n;
                first = false;
            }
            out << "}, \"one_pass_rows\": " << s.n_one_pass_rows << ", \"unparked\": " << s.n_unparked;
        }
        out << ", \"time_ms\": {\"target_verify\": " << s.t_target_us / 1e3 << ", \"drafter_process\": "
            << s.t_process_us / 1e3 << ", \"drafter_draft\": " << s.t_draft_us / 1e3 << ", \"drafter_accept\": "
            << s.t_accept_us / 1e3 << ", \"other\": " << (s.t_total_us - s.t_target_us - s.t_drafter_us()) / 1e3;
        if (s.has_split) {
            out << ", \"inject\": " << s.t_inject_us / 1e3 << ", \"draft_decode\": " << s.t_noise_us / 1e3
                << ", \"walk\": " << s.t_walk_us / 1e3 << ", \"feature_copy\": " << s.t_copy_us / 1e3;
        }
        out << "}";
        if (s.has_split) {
            out << ", \"head\": {\"slices\": " << s.n_head_slices << ", \"noise_decodes\": " << s.n_noise_decodes
                << ", \"bytes_moved\": " << s.head_bytes_moved << ", \"bytes_full_gather\": "
                << s.head_bytes_full_gather << ", \"bytes_mirrored\": " << s.head_bytes_mirrored << "}";
        }
        out << ", \"steps_per_prompt\": [";
        for (size_t i = 0; i < r.steps.size(); ++i) {
            out << (i ? ", " : "") << r.steps[i];
        }
        out << "]";
        out << ", \"identical_to_ar\": ";
        if (r.comparable) {
            out << "[";
            for (size_t i = 0; i < r.identical.size(); ++i) {
                out << (i ? ", " : "") << (r.identical[i] ? "true" : "false");
            }
            out << "]";
        } else {
            out << "null"; // sampled drafts: the same distribution, other draws
        }
        out << "}" << (k + 1 < results.size() ? "," : "") << "\n";
    }
    out << "  ],\n  \"ratios\": [\n";
    std::vector<int32_t> nps;
    for (const auto & r : results) {
        if (std::find(nps.begin(), nps.end(), r.np) == nps.end()) {
            nps.push_back(r.np);
        }
    }
    for (size_t k = 0; k < nps.size(); ++k) {
        const int32_t np = nps[k];
        out << "    {\"np\": " << np << ", \"dflash2_over_upstream\": "
            << ratio(find(results, "dflash2", np), find(results, "upstream", np)) << ", \"dflash2_over_ar\": "
            << ratio(find(results, "dflash2", np), find(results, "ar", np)) << ", \"upstream_over_ar\": "
            << ratio(find(results, "upstream", np), find(results, "ar", np)) << ", \"dflash2_adaptive_over_upstream\": "
            << ratio(find(results, "dflash2-adaptive", np), find(results, "upstream", np))
            << ", \"dflash2_adaptive_over_ar\": " << ratio(find(results, "dflash2-adaptive", np), find(results, "ar", np))
            << ", \"dflash2_tree_over_dflash2\": " << ratio(find(results, "dflash2-tree", np), find(results, "dflash2", np))
            << ", \"dflash2_tree_over_ar\": " << ratio(find(results, "dflash2-tree", np), find(results, "ar", np))
            << ", \"dflash2_auto_over_ar\": " << ratio(find(results, "dflash2-auto", np), find(results, "ar", np))
            << "}" << (k + 1 < nps.size() ? "," : "") << "\n";
    }
    out << "  ],\n  \"oracle\": ";
    if (!oracle) {
        out << "null\n}\n";
        return;
    }
    out << "[\n";
    for (size_t k = 0; k < nps.size(); ++k) {
        const oracle_row o = oracle_of(results, nps[k]);
        out << "    {\"np\": " << nps[k] << ", \"best\": " << host_json_str(o.best ? o.best->mode : "")
            << ", \"best_tokens_per_s\": " << (o.best ? o.best->median().tokens_per_s() : 0.0)
            << ", \"dflash2_auto_over_best\": " << ratio_or(o.aut, o.best, "null") << ", \"dflash2_auto_over_ar\": "
            << ratio_or(o.aut, o.ar, "null") << ", \"dflash2_auto_over_upstream\": " << ratio_or(o.aut, o.up, "null")
            << ", \"best_full\": " << host_json_str(o.best_full ? o.best_full->mode : "")
            << ", \"dflash2_auto_over_best_full\": " << ratio(o.aut, o.best_full, all_slots)
            << ", \"dflash2_auto_over_ar_full\": " << ratio(o.aut, o.ar, all_slots) << ", \"plans\": [";
        bool first = true;
        for (const auto & r : results) {
            if (r.np != nps[k]) {
                continue;
            }
            const host_stats & s = r.median();
            out << (first ? "" : ", ") << "{\"mode\": " << host_json_str(r.mode) << ", \"tokens_per_s\": "
                << s.tokens_per_s() << ", \"full_tokens_per_s\": " << s.full_tokens_per_s() << ", \"tau\": "
                << s.tau() << ", \"verify_rows_per_step\": "
                << s.verify_rows_per_step() << ", \"identical\": " << (r.comparable ? r.n_identical() : -1)
                << ", \"prompts\": " << r.identical.size() << ", \"decodes_over_world\": " << s.n_verify_over << "}";
            first = false;
        }
        out << "]}" << (k + 1 < nps.size() ? "," : "") << "\n";
    }
    out << "  ]\n}\n";
}

void write_svg(const std::string & path, const std::vector<mode_result> & results, const std::vector<int32_t> & nps,
        const std::vector<std::string> & modes) {
    std::ofstream out(path);
    if (!out) {
        throw std::runtime_error("cannot write " + path);
    }
    const int W = 1010, H = 400, panel_w = 420, panel_h = 280, top = 60, left0 = 70, gap = 60;
    const char * colors[] = { "#7f7f7f", "#1f77b4", "#d62728", "#2ca02c" };
    out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
        << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    for (int panel = 0; panel < 2; ++panel) {
        const int x0 = left0 + panel * (panel_w + gap);
        double y_max = 0;
        for (const auto & r : results) {
            y_max = std::max(y_max, panel == 0 ? r.tps_max() : r.median().tau());
        }
        y_max = y_max > 0 ? y_max * 1.15 : 1.0;
        auto px = [&](size_t i) { return x0 + (nps.size() == 1 ? panel_w / 2.0 : 20 + i * (panel_w - 40.0) / (nps.size() - 1)); };
        auto py = [&](double v) { return top + panel_h - v / y_max * panel_h; };
        out << "<text x=\"" << x0 + panel_w / 2 << "\" y=\"" << top - 25 << "\" text-anchor=\"middle\" font-size=\"14\">"
            << (panel == 0 ? "tokens/s (aggregate, median, min..max)" : "tau (accepted + 1 per verify)") << "</text>\n";
        out << "<rect x=\"" << x0 << "\" y=\"" << top << "\" width=\"" << panel_w << "\" height=\"" << panel_h
            << "\" fill=\"none\" stroke=\"#333\"/>\n";
        for (int t = 0; t <= 4; ++t) {
            const double v = y_max * t / 4;
            out << "<line x1=\"" << x0 << "\" x2=\"" << x0 + panel_w << "\" y1=\"" << py(v) << "\" y2=\"" << py(v)
                << "\" stroke=\"#ddd\"/><text x=\"" << x0 - 6 << "\" y=\"" << py(v) + 4 << "\" text-anchor=\"end\">"
                << (panel == 0 ? (int) v : (int) (v * 100) / 100.0) << "</text>\n";
        }
        for (size_t i = 0; i < nps.size(); ++i) {
            out << "<text x=\"" << px(i) << "\" y=\"" << top + panel_h + 18 << "\" text-anchor=\"middle\">np="
                << nps[i] << "</text>\n";
        }
        for (size_t m = 0; m < modes.size(); ++m) {
            const char * color = colors[m % 4];
            std::string points;
            for (size_t i = 0; i < nps.size(); ++i) {
                const mode_result * r = find(results, modes[m], nps[i]);
                if (!r) {
                    continue;
                }
                const double v = panel == 0 ? r->median().tokens_per_s() : r->median().tau();
                points += std::to_string(px(i)) + "," + std::to_string(py(v)) + " ";
                out << "<circle cx=\"" << px(i) << "\" cy=\"" << py(v) << "\" r=\"4\" fill=\"" << color << "\"/>\n";
                if (panel == 0) {
                    out << "<line x1=\"" << px(i) << "\" x2=\"" << px(i) << "\" y1=\"" << py(r->tps_min()) << "\" y2=\""
                        << py(r->tps_max()) << "\" stroke=\"" << color << "\"/>\n";
                }
            }
            // upstream dashed and wider: it often lies exactly under dflash2's line
            const bool dashed = modes[m] == "upstream";
            out << "<polyline points=\"" << points << "\" fill=\"none\" stroke=\"" << color << "\" stroke-width=\""
                << (dashed ? 5 : 2) << "\"" << (dashed ? " stroke-dasharray=\"8 5\"" : "") << "/>\n";
            if (panel == 0) {
                out << "<rect x=\"" << left0 + m * 140 << "\" y=\"" << H - 30 << "\" width=\"12\" height=\"12\" fill=\""
                    << color << "\"/><text x=\"" << left0 + m * 140 + 18 << "\" y=\"" << H - 20 << "\">" << modes[m]
                    << "</text>\n";
            }
        }
    }
    out << "</svg>\n";
}

// the trees' sizes of a run: --tree for dflash2-tree, --auto-tree for dflash2-auto, N for
// dflash2-tree@N, and the sequence ids of the largest on every tree context, so that all share them
struct tree_sizes {
    int32_t n_tree;
    int32_t n_auto;
    int32_t n_largest = 0; // the largest dflash2-tree@N of the run

    int32_t nodes(const std::string & mode) const {
        return tree_plan(mode) > 0 ? tree_plan(mode) : mode == "dflash2-auto" ? n_auto : n_tree;
    }
    int32_t n_ids() const { return std::max({ n_tree, n_auto, n_largest }); }
};

// a mode's host on tgt for np sequences, its context reset for the mode (the tree
// modes and ar-unified on a unified cache with the trees' sequence ids)
// (dflash2@nK: the run's n_max is K while it lives)
struct mode_host {
    std::unique_ptr<host_drafter>   drafter;
    std::unique_ptr<host_tree_host> tree;
    host_wave_factory               waves;
    host_target &                   tgt;
    int32_t                         n_max;

    mode_host(const std::string & mode, host_target & tgt, int32_t np, const tree_sizes & sizes)
        : tgt(tgt), n_max(tgt.params.n_max) {
        if (chain_plan(mode) > 0) {
            tgt.params.n_max = chain_plan(mode);
        }
        if (on_tree_context(mode)) {
            tgt.reset_context(np, host_tree_seq_ids(np, tree_leaves(tgt.params, np, sizes.n_ids())));
        } else {
            tgt.reset_context(np);
        }
        if (is_tree(mode)) {
            const int32_t n = sizes.nodes(mode);
            tree  = std::make_unique<host_tree_host>(tgt, n, tree_leaves(tgt.params, np, n),
                    mode == "dflash2-auto" ? LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE : LLAMA_SPEC_DFLASH2_WALK_GREEDY);
            waves = tree->waves();
            return;
        }
        if (mode != "ar" && mode != "ar-unified") {
            drafter = make_drafter(mode, tgt);
        }
        waves = host_chain_waves(mode == "ar-attached" ? nullptr : drafter.get());
    }
    ~mode_host() { tgt.params.n_max = n_max; }
    mode_host(const mode_host &) = delete;
    mode_host & operator=(const mode_host &) = delete;
};

// --lockstep A,B: the two modes generate in rounds of 16 steps (host_generate_lockstep),
// each rep on fresh contexts; prints each rep's tokens/s of both and B/A, in wall and
// CPU time, then the medians. The machine's load falls on both alike.
int run_lockstep(host_args & args, host_target & tgt, const std::vector<std::vector<llama_token>> & prompts,
        const std::string & spec, int reps, const tree_sizes & sizes) {
    const std::vector<std::string> ab = split(spec);
    if (ab.size() != 2) {
        throw std::runtime_error("--lockstep takes two modes: A,B");
    }
    for (const auto & m : ab) {
        if (!is_known(m, false)) {
            throw std::runtime_error("--lockstep runs ar, upstream, dflash2, dflash2-libllama, dflash2-adaptive, dflash2-tree, dflash2-auto, "
                    "dflash2@nK, dflash2-tree@N, ar-attached, ar-fed or ar-unified, not " + m);
        }
    }
    host_target tgt_b(tgt, 0); // a second context on the same model (the weights are read from one place)
    printf("lockstep %s (A) vs %s (B), rounds of 16 steps, %d repetitions\n", ab[0].c_str(), ab[1].c_str(), reps);
    if (on_tree_context(ab[0]) != on_tree_context(ab[1])) {
        printf("(at np > 1 a tree mode's unified cache rounds unlike the split cache of %s: outputs may differ at "
               "near-ties; ar-unified is target-only on the tree modes' context)\n",
                on_tree_context(ab[0]) ? ab[1].c_str() : ab[0].c_str());
    }
    for (int32_t np : args.np_list) {
        std::vector<double> wall, cpu;
        host_stats sum[2];
        for (int rep = 0; rep < reps; ++rep) {
            mode_host sa(ab[0], tgt, np, sizes);
            mode_host sb(ab[1], tgt_b, np, sizes);
            auto [a, b] = host_generate_lockstep(tgt, sa.waves, tgt_b, sb.waves, prompts);
            for (int k = 0; k < 2; ++k) {
                const host_stats & s = k == 0 ? a.stats : b.stats;
                sum[k].n_verify_decodes += s.n_verify_decodes;
                sum[k].n_verify_rows += s.n_verify_rows;
                sum[k].t_total_us += s.t_total_us;
                sum[k].t_target_us += s.t_target_us;
                sum[k].t_draft_us += s.t_draft_us;
                sum[k].t_process_us += s.t_process_us;
                sum[k].t_accept_us += s.t_accept_us;
            }
            const bool same = a.tokens == b.tokens;
            wall.push_back(b.stats.tokens_per_s() / a.stats.tokens_per_s());
            cpu.push_back(b.stats.tokens_per_cpu_s() / a.stats.tokens_per_cpu_s());
            printf("np=%d rep %d: A %.1f tok/s (%.1f tok/cpu-s), B %.1f tok/s (%.1f tok/cpu-s), drafted %lld accepted %lld; "
                   "B/A %.3f wall, %.3f cpu; slots refilled %lld | %lld; outputs %s\n",
                    np, rep, a.stats.tokens_per_s(), a.stats.tokens_per_cpu_s(), b.stats.tokens_per_s(),
                    b.stats.tokens_per_cpu_s(), (long long) b.stats.n_drafted, (long long) b.stats.n_accepted,
                    wall.back(), cpu.back(), (long long) a.stats.n_refills, (long long) b.stats.n_refills,
                    same ? "identical" : "DIFFER");
            fflush(stdout);
        }
        // where each mode's generation time went, per verify decode over all repetitions: an
        // A/B that differs in host work shows it here, not only in the ratio
        for (int k = 0; k < 2; ++k) {
            const host_stats & s = sum[k];
            const double n = (double) std::max<int64_t>(1, s.n_verify_decodes);
            const double known = (double) (s.t_target_us + s.t_draft_us + s.t_process_us + s.t_accept_us);
            printf("np=%d %s: %lld verify decodes, %.2f rows each; us per decode: total %.0f = target %.0f + draft "
                   "%.0f + process %.0f + accept %.0f + host %.0f\n",
                    np, ab[k].c_str(), (long long) s.n_verify_decodes, (double) s.n_verify_rows / n, s.t_total_us / n,
                    s.t_target_us / n, s.t_draft_us / n, s.t_process_us / n, s.t_accept_us / n,
                    ((double) s.t_total_us - known) / n);
        }
        std::sort(wall.begin(), wall.end());
        std::sort(cpu.begin(), cpu.end());
        printf("np=%d lockstep %s/%s: median %.3f [%.3f..%.3f] wall, median %.3f [%.3f..%.3f] cpu\n", np,
                ab[1].c_str(), ab[0].c_str(), wall[wall.size() / 2], wall.front(), wall.back(), cpu[cpu.size() / 2],
                cpu.front(), cpu.back());
    }
    return 0;
}

} // namespace

static const char * usage_bench() {
    return "dflash2-bench: target-only, llama.cpp's draft-dflash and dflash2 side by side, ratios of the same run\n"
           "bench\n"
           "  --modes LIST    ar,upstream,dflash2,dflash2-adaptive (default); also dflash2-tree, dflash2-auto (the\n"
           "                  controller), dflash2-libllama (the chain on libllama's graph), llama.cpp's n-gram types\n"
           "                  ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache; diagnostics ar-attached,\n"
           "                  ar-fed, ar-unified\n"
           "  --tree N        nodes per tree of dflash2-tree (--n-max)   --auto-tree N  the controller's largest (63)\n"
           "  --reps N (3)    --lockstep A,B  two modes in turns of 16 steps (an A/B under the same load)\n"
           "  --cost-world NAME|FILE  real (default); flat, cuda-3090, cuda-4090, metal-m4pro or a curve FILE: a\n"
           "                  target decode of R rows takes max(real, base x curve(R)); gpu-like: every target decode\n"
           "                  padded to the run's largest verify batch (the flat upper bound; docs/bench.md)\n"
           "  --draft-share S a real draft decode is S of a one-row target decode there (0.15; sets base)\n"
           "  --oracle        also the fixed plans dflash2@n1..7 (chains) and dflash2-tree@3,7,15,31,63, and\n"
           "                  per np the best of them against dflash2-auto, ar and upstream\n"
           "  --ngram-size-n N --ngram-size-m M  llama.cpp's n-gram types' sizes   --json PATH --svg PATH\n";
}

int main(int argc, char ** argv) {
    try {
        host_args args = host_parse_args(argc, argv, { "--modes", "--reps", "--json", "--svg", "--tree", "--lockstep",
                "--cost-world", "--ngram-size-n", "--ngram-size-m", "--auto-tree", "--draft-share" });
        if (args.help) {
            printf("%s%s", usage_bench(), host_args_usage());
            return 0;
        }
        const bool oracle = std::count(args.flags.begin(), args.flags.end(), "--oracle") > 0;
        for (const auto & f : args.flags) {
            if (f != "--oracle") {
                throw std::runtime_error("unknown option " + f);
            }
        }
        // the modes asked (the chart's), then the oracle's plans not among them
        const std::vector<std::string> asked = split(args.values.count("--modes") ? args.values["--modes"] : "ar,upstream,dflash2,dflash2-adaptive");
        std::vector<std::string> modes = asked;
        for (const auto & m : oracle ? oracle_plans() : std::vector<std::string>()) {
            if (std::find(modes.begin(), modes.end(), m) == modes.end()) {
                modes.push_back(m);
            }
        }
        for (const auto & m : modes) {
            if (!is_known(m, true)) {
                throw std::runtime_error("unknown mode " + m + " (ar, upstream, dflash2, dflash2-libllama, dflash2-adaptive, dflash2-tree, dflash2-auto, "
                        "dflash2@nK, dflash2-tree@N, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache, ar-attached, ar-fed)");
            }
        }
        const host_world_choice world_choice = host_world_choice_of(args.values, "real");
        // tree nodes per step (verify rows beyond the anchor): as many as the chain's by default
        const int32_t n_tree = args.values.count("--tree") ? host_parse_int_list("--tree", args.values["--tree"])[0]
                                                           : args.params.n_max;
        // the controller's largest tree (dflash2-auto): --auto-tree, else llama-server's default budget
        const int32_t n_auto = args.values.count("--auto-tree")
                ? host_parse_int_list("--auto-tree", args.values["--auto-tree"])[0] : HOST_DEFAULT_TREE_BUDGET;
        // the run's modes, and those of --lockstep; the controller's budget sizes the trees'
        // context, its cells and the GPU-like floor only in a run that has it
        const std::vector<std::string> lockstep = split(args.values.count("--lockstep") ? args.values["--lockstep"] : "");
        const auto has_mode = [&](const char * m) {
            return std::count(modes.begin(), modes.end(), m) + std::count(lockstep.begin(), lockstep.end(), m) > 0;
        };
        tree_sizes sizes = { n_tree, has_mode("dflash2-auto") ? n_auto : 0 };
        for (const auto & m : modes) {
            sizes.n_largest = std::max(sizes.n_largest, tree_plan(m));
        }
        for (const auto & m : lockstep) {
            sizes.n_largest = std::max(sizes.n_largest, tree_plan(m));
        }
        const int32_t    n_tree_ids = sizes.n_ids();
        const int reps = args.values.count("--reps") ? host_parse_int_list("--reps", args.values["--reps"])[0] : 3;
        for (auto [flag, field] : { std::pair<const char *, int32_t *>{ "--ngram-size-n", &args.params.ngram_size_n },
                                    { "--ngram-size-m", &args.params.ngram_size_m } }) {
            if (args.values.count(flag)) {
                *field = host_parse_int_list(flag, args.values[flag])[0];
            }
        }
        const std::string path_json = args.values.count("--json") ? args.values["--json"] : "bench.json";
        const std::string path_svg  = args.values.count("--svg") ? args.values["--svg"] : "bench.svg";
        if (args.prompts.empty()) {
            args.prompts = host_builtin_prompts();
        }

        host_init_backend();
        host_target tgt(args.params);
        const auto prompts = host_tokenize_chats(tgt, args.prompts);
        printf("target  %s\ndrafter %s\n%zu prompts x %d tokens, n_max %d, %d threads, %d repetitions, schedule %s\n",
                args.params.path_target.c_str(), args.params.path_draft.c_str(), prompts.size(), args.params.n_predict,
                args.params.n_max, args.params.n_threads, reps,
                args.params.refill ? "refill (at np > 1 a slot takes the next prompt as its stream finishes)"
                                   : "waves (np prompts at a time)");
        printf("target KV cache: K %s, V %s; %d rows per target ubatch\n", ggml_type_name(args.params.cache_type_k),
                ggml_type_name(args.params.cache_type_v), tgt.n_ubatch());
        if (tgt.sampled()) {
            printf("sampled: temp %.2f (chain: temp, dist), seed %d; upstream: greedy drafts, sample-and-match; "
                   "dflash2: sampled drafts, lossless rejection sampling\n", args.params.temp, args.params.seed);
        }

        // the tree modes park every verified cell until a wave of prompts ends
        const bool    any_tree = std::any_of(modes.begin(), modes.end(), is_tree) ||
                                 std::any_of(lockstep.begin(), lockstep.end(), is_tree);
        const int32_t np_max   = *std::max_element(args.np_list.begin(), args.np_list.end());
        host_fit_context(tgt, prompts, np_max, any_tree ? 1 + std::max(args.params.n_max, n_tree_ids) : 1);
        printf("target context: %d cells%s\n", tgt.params.n_ctx,
                args.params.n_ctx > 0 ? "" : " (what the run's trees park at most; --ctx-size sets it)");

        // every mode of the run (--lockstep's too) in the one world
        const host_cost_world world = host_set_world(tgt, world_choice, prompts, np_max,
                any_tree ? host_tree_seq_ids(np_max, tree_leaves(tgt.params, np_max, n_tree_ids)) : 0,
                1 + std::max(args.params.n_max, any_tree ? n_tree_ids : 0));
        printf("%s\n", world.describe().c_str());
        if (args.values.count("--lockstep")) {
            return run_lockstep(args, tgt, prompts, args.values["--lockstep"], reps, sizes);
        }

        std::vector<mode_result> results;
        for (int32_t np : args.np_list) {
            std::vector<mode_result> at_np;
            for (const auto & m : modes) {
                // sampled dflash2 drafts are verified with other random draws than target-only's
                at_np.push_back({ m, np, {}, {}, 0, !tgt.sampled() || m == "ar" || m == "upstream", {} });
            }
            // the target-only output every run is compared with; the references are outputs, not
            // timings: at the real cost (a cost world would pad them too)
            std::unique_ptr<host_world_off> real = std::make_unique<host_world_off>(tgt);
            tgt.reset_context(np);
            const std::vector<std::vector<llama_token>> reference = host_generate(tgt, nullptr, prompts).tokens;
            // trees verify in a unified KV cache, which at np > 1 rounds differently from the split
            // cache of the other modes: their outputs are compared with target-only on a context like theirs
            std::vector<std::vector<llama_token>> reference_tree;
            if (std::any_of(modes.begin(), modes.end(), on_tree_context)) {
                tgt.reset_context(np, host_tree_seq_ids(np, tree_leaves(tgt.params, np, n_tree_ids)));
                reference_tree = host_generate(tgt, nullptr, prompts).tokens;
            }
            real.reset();
            for (auto & r : at_np) {
                r.identical.assign(prompts.size(), true);
            }
            for (int rep = 0; rep < reps; ++rep) {
                // rotate the order so that no mode always runs first
                for (size_t k = 0; k < modes.size(); ++k) {
                    mode_result & r = at_np[(k + rep) % modes.size()];
                    const mode_host       host(r.mode, tgt, np, sizes);
                    const host_generation gen = host_generate_waves(tgt, host.waves, prompts);
                    r.runs.push_back(gen.stats);
                    r.steps = gen.steps;
                    for (size_t i = 0; i < prompts.size(); ++i) {
                        const auto & want = on_tree_context(r.mode) ? reference_tree[i] : reference[i];
                        r.identical[i] = r.identical[i] && gen.tokens[i] == want;
                    }
                    fprintf(stderr, "np=%d rep %d %-8s %.1f tok/s\n", np, rep, r.mode.c_str(), gen.stats.tokens_per_s());
                }
            }
            for (auto & r : at_np) {
                std::vector<size_t> order(r.runs.size());
                for (size_t i = 0; i < order.size(); ++i) {
                    order[i] = i;
                }
                std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.tps(a) < r.tps(b); });
                r.i_median = order[order.size() / 2];
                results.push_back(r);
            }
        }

        print_table(results, args.np_list, args.params.n_max, world);
        if (oracle) {
            print_oracle(results, args.np_list, world);
        }
        write_json(path_json, args, args.prompts, results, reps, world, oracle);
        write_svg(path_svg, results, args.np_list, asked);
        printf("\nwrote %s and %s\n", path_json.c_str(), path_svg.c_str());
        return 0;
    } catch (const std::exception & e) {
        fprintf(stderr, "dflash2-bench: %s (--help: the options)\n", e.what());
        return 2;
    }
}
