// llama.cpp's own draft-dflash (libllama-common) and dflash2 side by side in one
// process, on the same target, drafter and prompts:
// - the first draft after each prompt must be token-identical;
// - whole greedy generations must equal the target-only output, for both;
// - acceptance of both is reported.
// Exits non-zero on any difference.
#include "args.h"
#include "host.h"

#include <cstdio>
#include <stdexcept>

// prefills one prompt and drafts once
static std::vector<llama_token> first_draft(host_target & tgt, host_drafter & d, const std::vector<llama_token> & prompt) {
    llama_memory_seq_rm(llama_get_memory(tgt.ctx), -1, -1, -1);
    d.seq_rm(-1, -1, -1);
    common_batch batch(tgt.ctx);
    for (size_t i = 0; i < prompt.size(); ++i) {
        batch.add(prompt[i], (llama_pos) i, 0, i + 1 == prompt.size());
    }
    tgt.decode(batch);
    d.process(batch);
    const llama_token id_last = tgt.argmax(batch.size() - 1);
    std::vector<std::vector<llama_token>> out(1);
    d.draft({ { 0, id_last, (llama_pos) prompt.size(), tgt.params.n_max, &prompt, 0 } }, out);
    return out[0];
}

static std::string join(const std::vector<llama_token> & v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
        s += (i ? " " : "") + std::to_string(v[i]);
    }
    return s + "]";
}

int main(int argc, char ** argv) {
    try {
        host_args args = host_parse_args(argc, argv);
        if (!args.flags.empty()) {
            throw std::runtime_error("unknown option " + args.flags[0]);
        }
        if (args.prompts.empty()) {
            args.prompts = host_builtin_prompts();
        }
        host_init_backend();
        host_target tgt(args.params);
        const auto prompts = host_tokenize_chats(tgt, args.prompts);

        int failures = 0;

        // first drafts, one prompt at a time, with a fresh context and drafter per mode
        for (size_t i = 0; i < prompts.size(); ++i) {
            std::vector<llama_token> up, ours;
            {
                tgt.reset_context();
                auto d = make_drafter_upstream(tgt);
                up = first_draft(tgt, *d, prompts[i]);
            }
            {
                tgt.reset_context();
                auto d = make_drafter_dflash2(tgt);
                ours = first_draft(tgt, *d, prompts[i]);
            }
            const bool same = up == ours;
            failures += !same;
            printf("first draft %zu: upstream %s dflash2 %s %s\n", i, join(up).c_str(), join(ours).c_str(),
                    same ? "identical" : "DIFFERENT");
        }

        // whole generations
        tgt.reset_context();
        const host_generation ar = host_generate(tgt, nullptr, prompts);
        host_generation gens[2];
        const char * names[2] = { "upstream", "dflash2" };
        for (int m = 0; m < 2; ++m) {
            tgt.reset_context();
            auto d = m == 0 ? make_drafter_upstream(tgt) : make_drafter_dflash2(tgt);
            gens[m] = host_generate(tgt, d.get(), prompts);
            int identical = 0;
            for (size_t i = 0; i < prompts.size(); ++i) {
                identical += gens[m].tokens[i] == ar.tokens[i];
            }
            failures += identical != (int) prompts.size();
            const host_stats & s = gens[m].stats;
            printf("%-8s: identical to target-only %d/%zu, accepted/drafted %lld/%lld, tau %.3f\n", names[m],
                    identical, prompts.size(), (long long) s.n_accepted, (long long) s.n_drafted, s.tau());
        }
        printf("acceptance dflash2 - upstream: %+lld tokens (tau %.3f vs %.3f)\n",
                (long long) (gens[1].stats.n_accepted - gens[0].stats.n_accepted), gens[1].stats.tau(),
                gens[0].stats.tau());
        printf("%s\n", failures == 0 ? "PARITY OK" : "PARITY FAILED");
        return failures == 0 ? 0 : 1;
    } catch (const std::exception & e) {
        fprintf(stderr, "dflash2-parity: %s\n%s", e.what(), host_args_usage());
        return 2;
    }
}
