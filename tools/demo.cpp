// The README's main job: one generation with DFlash2 speculative decoding and
// its statistics, next to the same generation by the target alone. At --temp 0
// (the default) the output must equal the target's (exit 1 otherwise); at
// --temp T > 0 the target samples (tools/host/host.h) and dflash2 verifies its
// sampled drafts losslessly: the same distribution, other random draws.
// dflash2 runs as its default: the controller (adaptive walk), which each step
// verifies no draft, a chain or a tree of up to --tree nodes (n-gram branches
// included), whatever pays on this machine; --walk greedy runs the greedy chain
// (llama.cpp's own drafts). Next to it, what the drafter achieves when it drafts
// every step (the greedy chain and a tree of --tree nodes), and the same runs in
// a cost world (--cost-world): by default the GPU-like one (every target decode
// padded to what the largest verify batch costs here: verify rows free, the flat
// upper bound), or a measured GPU's curve (tools/host/cost-world.cpp), so the
// controller's verdict on this machine reads against both.
#include "args.h"
#include "host.h"
#ifdef HOST_WITH_MTMD
#include "vision.h"
#endif

#include <cstdio>
#include <stdexcept>

static void print_row(const char * name, const host_stats & s) {
    printf("  %-12s %8.1f tok/s  %5lld tokens  %8.1f ms", name, s.tokens_per_s(), (long long) s.n_generated,
            s.t_total_us / 1e3);
    if (s.n_seq_steps && s.n_drafted) {
        printf("  tau %.2f  accepted %lld/%lld (%.1f%%)", s.tau(), (long long) s.n_accepted, (long long) s.n_drafted,
                100.0 * s.n_accepted / s.n_drafted);
    }
    printf("\n");
}

// one line: did drafting pay on this machine, and why (what a verify step costs
// against a plain target token, and what it yields)
static void print_verdict(const host_stats & ar, const host_stats & s) {
    if (!ar.n_generated || !s.n_seq_steps || !s.t_total_us) {
        return;
    }
    const double speedup     = s.tokens_per_s() / ar.tokens_per_s();
    const double us_token    = (double) ar.t_total_us / ar.n_generated;            // target only, per token
    const double us_step     = (double) s.t_total_us / s.n_seq_steps;              // speculative, per sequence step
    const double rows        = (double) (s.n_seq_steps + s.n_drafted);             // anchor + drafts
    const double us_row      = s.t_target_us / rows;
    const double us_drafter  = (double) s.t_drafter_us() / s.n_seq_steps;
    const double break_even  = us_step / us_token;
    printf("  verdict: drafting %s on this machine: %.2fx target-only. A step verified %.1f rows at %.2f ms/row "
           "(a target-only token: %.2f ms) plus %.2f ms of drafting, %.2f ms in all = %.2f plain tokens, "
           "and yielded tau %.2f tokens%s\n",
            speedup >= 1.0 ? "paid" : "did not pay", speedup, rows / s.n_seq_steps, us_row / 1e3, us_token / 1e3,
            us_drafter / 1e3, us_step / 1e3, break_even, s.tau(),
            speedup >= 1.0 ? "" : " (it pays where tau exceeds that: a better drafter, or a target whose extra verify rows are nearly free, e.g. a large model on a GPU)");
}

// the runs of one cost world: target-only, dflash2's default and, unless --brief,
// dflash2 drafting every step (the greedy chain unless it is the default, and a tree)
struct demo_runs {
    host_generation ar;
    host_generation spec;
    host_generation chain;
    host_generation tree;
    bool            has_chain = false; // the default is the controller, and not --brief
};

static demo_runs run_world(host_target & tgt, const std::vector<std::vector<llama_token>> & prompts, bool adaptive,
        bool brief, int32_t n_tree, int32_t n_seq_ids, bool with_ar = true) {
    demo_runs r;
    if (with_ar) {
        tgt.reset_context(1, n_seq_ids);
        r.ar = host_generate(tgt, nullptr, prompts);
    }
    tgt.reset_context(1, n_seq_ids);
    if (adaptive) {
        r.spec = host_generate_tree(tgt, n_tree, n_tree, LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE, prompts);
    } else {
        auto d = make_drafter_dflash2(tgt);
        r.spec = host_generate(tgt, d.get(), prompts);
    }
    if (brief) {
        return r;
    }
    if (adaptive) {
        tgt.reset_context(1, n_seq_ids);
        auto d      = make_drafter_dflash2(tgt);
        r.chain     = host_generate(tgt, d.get(), prompts);
        r.has_chain = true;
    }
    tgt.reset_context(1, n_seq_ids);
    r.tree = host_generate_tree(tgt, n_tree, n_tree, LLAMA_SPEC_DFLASH2_WALK_GREEDY, prompts);
    return r;
}

static int count_identical(const host_generation & a, const host_generation & b) {
    int n = 0;
    for (size_t i = 0; i < a.tokens.size() && i < b.tokens.size(); ++i) {
        n += a.tokens[i] == b.tokens[i];
    }
    return n;
}

static void print_acceptance(const char * name, const host_stats & s, int32_t n_max) {
    printf("  %s acceptance by draft position:", name);
    for (int j = 0; j < n_max && j < HOST_MAX_DRAFT && s.drafted_at[j]; ++j) {
        printf(" %d:%.0f%%", j + 1, 100.0 * s.accepted_at[j] / s.drafted_at[j]);
    }
    printf("\n");
}

// against target-only in the GPU-like world, where each of its tokens is one decode padded to the floor
static double gpu_like_speedup(int32_t floor_ms, const host_generation & g) {
    return g.stats.tokens_per_s() * floor_ms / 1e3;
}

static const char * usage_demo() {
    return "dflash2-demo: one generation by the target alone and with dflash2 (through its C API), side by side\n"
           "demo\n"
           "  --walk adaptive|greedy  dflash2's default: the controller (adaptive) or the greedy chain\n"
           "  --tree N        most nodes of the controller's trees and of the every-step tree (63, as llama-server's)\n"
           "  --brief         target-only and the default only: no every-step rows, no cost world\n"
           "  --cost-world NAME|FILE  the runs again in a cost world: gpu-like (default: every target decode padded\n"
           "                  to the largest verify's time, the flat upper bound), flat, cuda-3090, cuda-4090,\n"
           "                  metal-m4pro or a curve FILE (max(real, base x curve(rows))), real (none; docs/bench.md)\n"
           "  --draft-share S a curve world's draft decode: S of a one-row target decode (0.15)\n"
           "  --upstream      also run llama.cpp's own draft-dflash\n";
}

int main(int argc, char ** argv) {
    try {
        host_args args = host_parse_args(argc, argv, { "--walk", "--tree", "--cost-world", "--draft-share" });
        if (args.help) {
            printf("%s%s", usage_demo(), host_args_usage());
            return 0;
        }
        const std::string walk = args.values.count("--walk") ? args.values["--walk"] : "adaptive";
        if (walk != "adaptive" && walk != "greedy") {
            throw std::runtime_error("--walk is adaptive or greedy, got " + walk);
        }
        const int32_t n_tree = args.values.count("--tree") ? host_parse_int_list("--tree", args.values["--tree"])[0]
                                                            : HOST_DEFAULT_TREE_BUDGET;
        if (n_tree < 1 || n_tree > HOST_MAX_DRAFT) {
            throw std::runtime_error("--tree needs 1 to " + std::to_string(HOST_MAX_DRAFT) + " nodes");
        }
        const host_world_choice world_choice = host_world_choice_of(args.values, "gpu-like");
        const bool adaptive      = walk == "adaptive";
        bool       with_upstream = false;
        bool       brief         = false;
        for (const auto & r : args.flags) {
            if (r == "--upstream") {
                with_upstream = true;
            } else if (r == "--brief") {
                brief = true;
            } else {
                throw std::runtime_error("unknown option " + r);
            }
        }
        if (args.prompts.empty()) {
            args.prompts = { host_builtin_prompts()[0] };
        }
        host_init_backend();
        host_target tgt(args.params);
        const auto prompts = host_tokenize_chats(tgt, args.prompts);
#ifdef HOST_WITH_MTMD
        std::unique_ptr<host_image_prompt_decoder> image;
#endif
        if (!args.params.path_image.empty()) {
            if (with_upstream) {
                throw std::runtime_error("--image with --upstream: llama.cpp's draft-dflash takes no image rows");
            }
#ifdef HOST_WITH_MTMD
            image = make_image_prompt_decoder(tgt, args.prompts[0]);
            tgt.prompt_decoder = image.get();
            printf("image   %s (projector %s) before prompt 0\n", args.params.path_image.c_str(),
                    args.params.path_mmproj.c_str());
#else
            throw std::runtime_error("--image: these tools were built without libmtmd "
                                     "(scripts/server.sh build, then rebuild them)");
#endif
        }

        printf("target  %s\ndrafter %s\nn_max %d, %zu prompt(s), %d token(s) each, %d thread(s)\n",
                args.params.path_target.c_str(), args.params.path_draft.c_str(), args.params.n_max, prompts.size(),
                args.params.n_predict, args.params.n_threads);
        if (adaptive) {
            printf("dflash2: the controller (each step no draft, a chain or a tree of up to %d nodes, whatever pays "
                   "here; --walk greedy: the greedy chain)\n", n_tree);
        } else {
            printf("dflash2: the greedy chain (--walk greedy)\n");
        }
        if (tgt.sampled()) {
            printf("sampled: temp %.2f, seed %d (chain: temp, dist)\n", args.params.temp, args.params.seed);
        }
        printf("\n");

        // the controller and the every-step tree verify trees, in a unified KV cache with a sequence id per leaf
        const int32_t n_ids = adaptive || !brief ? host_tree_seq_ids(1, n_tree) : 0;
        host_fit_context(tgt, prompts, 1, n_ids > 0 ? 1 + std::max(args.params.n_max, n_tree) : 1);
        const demo_runs real = run_world(tgt, prompts, adaptive, brief, n_tree, n_ids);
        const host_generation & ar   = real.ar;
        const host_generation & spec = real.spec;
        host_generation up;
        if (with_upstream) {
            tgt.reset_context();
            auto d = make_drafter_upstream(tgt);
            up = host_generate(tgt, d.get(), prompts);
        }

        for (size_t i = 0; i < prompts.size(); ++i) {
            printf("--- prompt %zu: %s\n%s\n\n", i, args.prompts[i].c_str(), tgt.detokenize(spec.tokens[i]).c_str());
        }
        const int identical    = count_identical(ar, spec);
        const int identical_up = with_upstream ? count_identical(ar, up) : 0;
        const std::string tree_name = "tree " + std::to_string(n_tree);

        const host_stats & s = spec.stats;
        printf("results\n");
        print_row("target only", ar.stats);
        print_row("dflash2", s);
        if (with_upstream) {
            print_row("upstream", up.stats);
        }
        if (!brief) {
            printf("  dflash2 drafting every step (what the drafter achieves; the controller picks among such drafts):\n");
            if (real.has_chain) {
                print_row("chain", real.chain.stats);
            }
            print_row(tree_name.c_str(), real.tree.stats);
        }
        if (tgt.sampled()) {
            printf("  dflash2 output identical to target-only: n/a (sampled: same distribution, other draws)\n");
            if (with_upstream) {
                // sample-and-match draws one number per emitted token, as target-only does
                printf("  upstream output identical to target-only: %d/%zu\n", identical_up, prompts.size());
            }
        } else {
            printf("  dflash2 output identical to target-only: %d/%zu\n", identical, prompts.size());
            if (!brief) {
                printf("  every-step output identical to target-only:");
                if (real.has_chain) {
                    printf(" chain %d/%zu,", count_identical(ar, real.chain), prompts.size());
                }
                printf(" %s %d/%zu\n", tree_name.c_str(), count_identical(ar, real.tree), prompts.size());
            }
        }
        print_acceptance("dflash2", s, args.params.n_max);
        if (real.has_chain) {
            print_acceptance("chain", real.chain.stats, args.params.n_max);
        }
        if (!brief) {
            print_acceptance(tree_name.c_str(), real.tree.stats, n_tree);
        }
        printf("  dflash2 time: target verify %.1f ms, drafter %.1f ms (inject %.1f, noise block %.1f, walk %.1f)\n",
                s.t_target_us / 1e3, s.t_drafter_us() / 1e3, s.t_inject_us / 1e3, s.t_noise_us / 1e3, s.t_walk_us / 1e3);
        printf("  dflash2 draft graph: %s\n", s.draft_graph == LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_LIBLLAMA
                ? "libllama's dflash graph (--draft-graph libllama)"
                : "the library's own (its weights, draft KV cache and graph on the linked ggml; --draft-graph libllama: libllama's)");
        if (s.n_head_slices > 1 && s.n_noise_decodes > 0) {
            printf("  dflash2 target head: read in %lld vocabulary slices where -sm tensor keeps them; %.0f bytes crossed "
                    "devices per draft decode (gathering the logits: %.0f; a head on every device: %.1f MiB more)\n",
                    (long long) s.n_head_slices, (double) s.head_bytes_moved / s.n_noise_decodes,
                    (double) s.head_bytes_full_gather / s.n_noise_decodes, s.head_bytes_mirrored / 1048576.0);
        }
        print_verdict(ar.stats, s);
        // outputs of the every-step runs that differ from target-only's (at T = 0)
        int differing = 0;
        auto compare = [&](const host_generation & g) { differing += (int) prompts.size() - count_identical(ar, g); };
        if (!brief) {
            // the real runs decide the exit code; those of the cost world are a cost projection whose
            // outputs are reported (the controller there picks other trees as the timing falls)
            compare(real.tree);
            if (real.has_chain) {
                compare(real.chain);
            }
        }
        if (!brief && world_choice.name != "real") {
            // gpu-like: the floor covers the largest verify batch, the every-step tree's or the chain's
            const host_cost_world world = host_set_world(tgt, world_choice, prompts, 1, n_ids,
                    1 + std::max(args.params.n_max, n_tree));
            // target-only in the GPU-like world is one token per padded decode: not run again
            const bool      curve = world.curve != nullptr;
            const demo_runs w     = run_world(tgt, prompts, adaptive, brief, n_tree, n_ids, /*with_ar*/ curve);
            tgt.params.target_min_ms = 0;
            tgt.params.cost_curve    = nullptr;
            const auto speedup = [&](const host_generation & g) {
                return curve ? g.stats.tokens_per_s() / w.ar.stats.tokens_per_s() : gpu_like_speedup(world.floor_ms, g);
            };
            if (curve) {
                printf("  %s\n  there (%s world: a target decode of R rows takes max(its real time, %.1f ms x curve(R)); "
                       "the drafter at its real cost, a draft decode %.2f of a one-row target decode): target-only %.1f tok/s, ",
                        world.describe().c_str(), world.name().c_str(), world.base_ms, world.effective_share(),
                        w.ar.stats.tokens_per_s());
            } else {
                printf("  where a verify row is nearly free, as for a large model on a GPU (the flat world, an upper "
                       "bound: every target decode padded to %d ms, what a %d-row verify takes here, target-only one "
                       "token per decode; the drafter at its real cost): ", world.floor_ms, world.rows_per_seq);
            }
            printf("dflash2 %.2fx target-only (tau %.2f)", speedup(w.spec), w.spec.stats.tau());
            if (w.has_chain) {
                printf(", chain %.2fx (tau %.2f)", speedup(w.chain), w.chain.stats.tau());
            }
            printf(", %s %.2fx (tau %.2f)\n", tree_name.c_str(), speedup(w.tree), w.tree.stats.tau());
            // the decodes the world could not slow to its time
            printf("  there, target decodes over the world's time (it did not hold there): dflash2 %lld/%lld",
                    (long long) w.spec.stats.n_verify_over, (long long) w.spec.stats.n_verify_decodes);
            if (w.has_chain) {
                printf(", chain %lld/%lld", (long long) w.chain.stats.n_verify_over, (long long) w.chain.stats.n_verify_decodes);
            }
            printf(", %s %lld/%lld\n", tree_name.c_str(), (long long) w.tree.stats.n_verify_over,
                    (long long) w.tree.stats.n_verify_decodes);
            if (!tgt.sampled()) {
                printf("  there, output identical to target-only: dflash2 %d/%zu", count_identical(ar, w.spec),
                        prompts.size());
                if (w.has_chain) {
                    printf(", chain %d/%zu", count_identical(ar, w.chain), prompts.size());
                }
                printf(", %s %d/%zu\n", tree_name.c_str(), count_identical(ar, w.tree), prompts.size());
            }
        }
#ifdef HOST_WITH_MTMD
        if (image) {
            printf("  image: %zu image(s) decoded, %zu image rows each before prompt 0's text; every draft above "
                   "came after them\n", image->n_images, image->n_images ? image->n_image_rows / image->n_images : 0);
        }
#endif
        if (tgt.sampled()) {
            return !with_upstream || identical_up == (int) prompts.size() ? 0 : 1;
        }
        return identical == (int) prompts.size() && differing == 0 ? 0 : 1;
    } catch (const std::exception & e) {
        fprintf(stderr, "dflash2-demo: %s (--help: the options)\n", e.what());
        return 2;
    }
}
