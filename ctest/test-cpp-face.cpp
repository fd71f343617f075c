// dflash2.hpp as a C++ host uses it, built only through find_package(dflash2):
// an engine on the fixture pair drafts a greedy generation for two sequences that
// must equal the target-only output; a bad call throws dflash2::error with the
// call's status; the engine is freed exactly once when its owner goes away, moves
// included.
#include "dflash2.hpp"
#include "check.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// Counts the engines freed: this definition takes the calls dflash2.hpp makes and
// passes them to the library's own.
static int g_n_freed = 0;

extern "C" void llama_spec_dflash2_free(struct llama_spec_dflash2 * spec) {
    using free_fn = void (*)(struct llama_spec_dflash2 *);
    static const free_fn real = (free_fn) dlsym(RTLD_NEXT, "llama_spec_dflash2_free");
    CHECK(real != nullptr);
    g_n_freed += spec != nullptr;
    real(spec);
}

static const int N_SEQ = 2;
static const int N_GEN = 24;
static const int N_MAX = 3;

static const char * prompts[N_SEQ] = { "the draft model is fast", "one two three and a list" };

static void quiet_log(enum ggml_log_level, const char *, void *) {}

static llama_context * new_context(llama_model * model, int n_seq) {
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = 1024;
    cparams.n_batch         = 256;
    cparams.n_ubatch        = 256;
    cparams.n_seq_max       = n_seq;
    cparams.n_threads       = 2;
    cparams.n_threads_batch = 2;
    cparams.kv_unified      = n_seq == 1;
    llama_context * ctx = llama_init_from_model(model, cparams);
    CHECK(ctx != nullptr);
    return ctx;
}

static llama_token argmax(llama_context * ctx, int32_t i) {
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    const float * logits  = llama_get_logits_ith(ctx, i);
    llama_token best = 0;
    for (llama_token t = 1; t < n_vocab; ++t) {
        if (logits[t] > logits[best]) {
            best = t;
        }
    }
    return best;
}

static std::vector<llama_token> tokenize(const llama_model * model, const char * text) {
    std::vector<llama_token> out(128);
    const int n = llama_tokenize(llama_model_get_vocab(model), text, (int32_t) strlen(text), out.data(),
            (int32_t) out.size(), true, false);
    CHECK(n > 0);
    out.resize(n);
    return out;
}

struct batch {
    llama_batch b = llama_batch_init(256, 0, 1);

    ~batch() { llama_batch_free(b); }

    int32_t add(llama_token id, llama_pos pos, llama_seq_id seq, bool logits) {
        const int32_t i = b.n_tokens++;
        b.token[i]     = id;
        b.pos[i]       = pos;
        b.n_seq_id[i]  = 1;
        b.seq_id[i][0] = seq;
        b.logits[i]    = logits;
        return i;
    }
};

// target-only greedy generation of N_GEN tokens
static std::vector<llama_token> reference(llama_model * model, const char * prompt) {
    llama_context * ctx = new_context(model, 1);
    const std::vector<llama_token> toks = tokenize(model, prompt);
    batch b;
    for (size_t i = 0; i < toks.size(); ++i) {
        b.add(toks[i], (llama_pos) i, 0, i + 1 == toks.size());
    }
    CHECK(llama_decode(ctx, b.b) == 0);
    std::vector<llama_token> out = { argmax(ctx, b.b.n_tokens - 1) };
    while ((int) out.size() < N_GEN) {
        b.b.n_tokens = 0;
        b.add(out.back(), (llama_pos) (toks.size() + out.size() - 1), 0, true);
        CHECK(llama_decode(ctx, b.b) == 0);
        out.push_back(argmax(ctx, 0));
    }
    llama_free(ctx);
    return out;
}

// the same generations, speculative: one draft call for both sequences per step
static std::vector<std::vector<llama_token>> speculative(dflash2::engine & eng, llama_context * ctx) {
    const llama_model * model = llama_get_model(ctx);
    std::vector<std::vector<llama_token>> out(N_SEQ);
    std::vector<llama_pos> n_past(N_SEQ);
    batch b;
    std::vector<int32_t> last(N_SEQ);
    for (int s = 0; s < N_SEQ; ++s) {
        const std::vector<llama_token> toks = tokenize(model, prompts[s]);
        for (size_t i = 0; i < toks.size(); ++i) {
            last[s] = b.add(toks[i], (llama_pos) i, s, i + 1 == toks.size());
        }
        n_past[s] = (llama_pos) toks.size();
    }
    CHECK(llama_decode(ctx, b.b) == 0);
    eng.process_batch(b.b);
    for (int s = 0; s < N_SEQ; ++s) {
        out[s].push_back(argmax(ctx, last[s]));
    }

    while ((int) out[0].size() < N_GEN || (int) out[1].size() < N_GEN) {
        std::vector<dflash2::draft_request> requests;
        for (int s = 0; s < N_SEQ; ++s) {
            requests.push_back(dflash2::make_request(s, out[s].back(), N_MAX));
        }
        const std::vector<std::vector<llama_token>> drafts = eng.draft(requests);
        CHECK(drafts.size() == (size_t) N_SEQ);

        b.b.n_tokens = 0;
        std::vector<int32_t> first(N_SEQ);
        for (int s = 0; s < N_SEQ; ++s) {
            CHECK((int) drafts[s].size() <= N_MAX);
            first[s] = b.add(out[s].back(), n_past[s], s, true);
            for (size_t j = 0; j < drafts[s].size(); ++j) {
                b.add(drafts[s][j], n_past[s] + 1 + (llama_pos) j, s, true);
            }
        }
        CHECK(llama_decode(ctx, b.b) == 0);
        eng.process_batch(b.b);

        for (int s = 0; s < N_SEQ; ++s) {
            int32_t n_acc = 0;
            llama_token v = argmax(ctx, first[s]);
            while (n_acc < (int32_t) drafts[s].size() && drafts[s][n_acc] == v) {
                out[s].push_back(v);
                v = argmax(ctx, first[s] + ++n_acc);
            }
            out[s].push_back(v);
            eng.accept(s, n_acc);
            n_past[s] += n_acc + 1;
            CHECK(llama_memory_seq_rm(llama_get_memory(ctx), s, n_past[s], -1));
            eng.seq_rm(s, n_past[s], -1);
        }
    }
    for (auto & o : out) {
        o.resize(N_GEN);
    }
    return out;
}

// runs f, which must throw dflash2::error with this status
template <typename F>
static void expect_error(int32_t status, const char * what_prefix, F f) {
    try {
        f();
    } catch (const dflash2::error & e) {
        if (e.status != status || std::strncmp(e.what(), what_prefix, std::strlen(what_prefix)) != 0 ||
                e.message.empty()) {
            fprintf(stderr, "expected status %d ('%s...'), got %d: %s\n", status, what_prefix, e.status, e.what());
            exit(1);
        }
        return;
    }
    fprintf(stderr, "expected dflash2::error '%s...', nothing thrown\n", what_prefix);
    exit(1);
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    const std::string dir         = argv[1];
    const std::string path_target = dir + "/target.gguf";
    const std::string path_draft  = dir + "/drafter.gguf";
    const std::string path_broken = dir + "/broken/truncated.gguf";

    llama_log_set(quiet_log, nullptr);
    llama_spec_dflash2_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(path_target.c_str(), mparams);
    CHECK(model != nullptr);

    std::vector<std::vector<llama_token>> want;
    for (const char * p : prompts) {
        want.push_back(reference(model, p));
    }

    dflash2::params params = dflash2::default_params();
    params.n_seq = N_SEQ;
    params.n_max = N_MAX;

    CHECK(dflash2::checkpoint_check(path_draft, model).block_size == 4);
    CHECK(dflash2::estimate_memory(nullptr, path_draft, params, 512) > 0);
    expect_error(LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT, "dflash2 checkpoint_check: bad checkpoint: ",
            [&] { dflash2::checkpoint_check(path_broken); });
    expect_error(LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT, "dflash2 estimate_memory: bad checkpoint: ",
            [&] { dflash2::estimate_memory(nullptr, path_broken, params, 512); });

    llama_context * ctx = new_context(model, N_SEQ);
    {
        // a drafter the library refuses: the constructor throws, nothing to free
        expect_error(LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT, "dflash2 init: bad checkpoint: ",
                [&] { dflash2::engine broken(ctx, path_broken, params); });
        CHECK(g_n_freed == 0);

        dflash2::engine first(ctx, path_draft, params);
        dflash2::engine eng = std::move(first);
        CHECK(first.get() == nullptr && eng.get() != nullptr);
        CHECK(eng.n_max() == N_MAX);
        CHECK(eng.block_size() == 4);

        const std::vector<std::vector<llama_token>> got = speculative(eng, ctx);
        for (int s = 0; s < N_SEQ; ++s) {
            for (int g = 0; g < N_GEN; ++g) {
                if (got[s][g] != want[s][g]) {
                    fprintf(stderr, "sequence %d differs from target-only at token %d: %d vs %d\n", s, g, got[s][g],
                            want[s][g]);
                    return 1;
                }
            }
        }
        const dflash2::stats stats = eng.get_stats();
        CHECK(stats.n_drafted > 0 && stats.n_accept_calls > 0);

        // bad calls throw with the status of the C call
        expect_error(LLAMA_SPEC_DFLASH2_ERR_INVALID_STATE, "dflash2 accept: ", [&] { eng.accept(0, 0); });
        expect_error(LLAMA_SPEC_DFLASH2_ERR_UNKNOWN_SEQUENCE, "dflash2 seq_rm: ", [&] { eng.seq_rm(N_SEQ, 0, -1); });
        expect_error(LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT, "dflash2 draft: ",
                [&] { eng.draft({ dflash2::make_request(0, want[0][0], 0) }); });

        // a sequence's state travels to another sequence through its blob
        const std::vector<uint8_t> blob = eng.state_get(0);
        CHECK(!blob.empty() && blob.size() == eng.state_size(0));
        eng.seq_clear(1);
        CHECK(eng.get_seq_info(1).n_in_kv == 0);
        eng.state_set(1, blob);
        CHECK(eng.get_seq_info(1).n_in_kv == eng.get_seq_info(0).n_in_kv);

        CHECK(g_n_freed == 0);
    }
    CHECK(g_n_freed == 1); // the moved-to engine, once

    llama_free(ctx);
    llama_model_free(model);
    printf("dflash2.hpp: %d sequences x %d tokens identical to target-only; errors thrown with their status; "
           "engine freed once\n", N_SEQ, N_GEN);
    return 0;
}
