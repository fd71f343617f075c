// A full greedy speculative generation through the C API, as a C host writes
// it: two sequences, legacy llama_batch + llama_decode on the target,
// llama_spec_dflash2_process_batch after every decode, one draft call for both
// sequences, one verify batch, accept, rollback. The output must equal the
// target-only greedy output.
#include "dflash2.h"
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SEQ 2
#define N_GEN 32
#define N_MAX 3

static void quiet_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level;
    (void) text;
    (void) user_data;
}

static const char * prompts[N_SEQ] = { "the draft model is fast", "one two three and a list" };

static struct llama_context * new_context(struct llama_model * model, int n_seq) {
    struct llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = 1024;
    cparams.n_batch         = 256;
    cparams.n_ubatch        = 256;
    cparams.n_seq_max       = n_seq;
    cparams.n_threads       = 2;
    cparams.n_threads_batch = 2;
    cparams.kv_unified      = n_seq == 1;
    struct llama_context * ctx = llama_init_from_model(model, cparams);
    CHECK(ctx != NULL);
    return ctx;
}

static llama_token argmax(struct llama_context * ctx, int32_t i, int32_t n_vocab) {
    const float * logits = llama_get_logits_ith(ctx, i);
    llama_token best = 0;
    for (llama_token t = 1; t < n_vocab; ++t) {
        if (logits[t] > logits[best]) {
            best = t;
        }
    }
    return best;
}

static void batch_add(struct llama_batch * b, llama_token id, llama_pos pos, llama_seq_id seq, int8_t logits) {
    const int i = b->n_tokens++;
    b->token[i]     = id;
    b->pos[i]       = pos;
    b->n_seq_id[i]  = 1;
    b->seq_id[i][0] = seq;
    b->logits[i]    = logits;
}

static int tokenize(const struct llama_vocab * vocab, const char * text, llama_token * out, int cap) {
    const int n = llama_tokenize(vocab, text, (int32_t) strlen(text), out, cap, true, false);
    CHECK(n > 0);
    return n;
}

// target-only greedy generation of N_GEN tokens for one prompt
static void reference(struct llama_model * model, const char * prompt, llama_token * out) {
    struct llama_context * ctx   = new_context(model, 1);
    const struct llama_vocab * v = llama_model_get_vocab(model);
    const int32_t n_vocab        = llama_vocab_n_tokens(v);
    llama_token toks[128];
    const int n = tokenize(v, prompt, toks, 128);
    struct llama_batch b = llama_batch_init(128, 0, 1);
    for (int i = 0; i < n; ++i) {
        batch_add(&b, toks[i], i, 0, i == n - 1);
    }
    CHECK(llama_decode(ctx, b) == 0);
    out[0] = argmax(ctx, n - 1, n_vocab);
    for (int g = 1; g < N_GEN; ++g) {
        b.n_tokens = 0;
        batch_add(&b, out[g - 1], n + g - 1, 0, 1);
        CHECK(llama_decode(ctx, b) == 0);
        out[g] = argmax(ctx, 0, n_vocab);
    }
    llama_batch_free(b);
    llama_free(ctx);
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    char path_target[4096], path_draft[4096];
    snprintf(path_target, sizeof(path_target), "%s/target.gguf", argv[1]);
    snprintf(path_draft, sizeof(path_draft), "%s/drafter.gguf", argv[1]);

    llama_log_set(quiet_log, NULL);
    llama_spec_dflash2_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mparams = llama_model_default_params();
    mparams.use_extra_bufts = false;
    struct llama_model * model = llama_model_load_from_file(path_target, mparams);
    CHECK(model != NULL);
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);

    llama_token want[N_SEQ][N_GEN];
    for (int s = 0; s < N_SEQ; ++s) {
        reference(model, prompts[s], want[s]);
    }

    struct llama_context * ctx = new_context(model, N_SEQ);
    struct llama_spec_dflash2_params params = llama_spec_dflash2_default_params();
    params.n_seq = N_SEQ;
    params.n_max = N_MAX;
    struct llama_spec_dflash2 * spec = llama_spec_dflash2_init(ctx, path_draft, params);
    CHECK(spec != NULL);
    CHECK(llama_spec_dflash2_n_max(spec) == N_MAX);

    // both prompts in one batch
    struct llama_batch batch = llama_batch_init(256, 0, 1);
    llama_token out[N_SEQ][N_GEN + N_MAX + 1];
    int         n_out[N_SEQ];
    llama_pos   n_past[N_SEQ];
    int         last_row[N_SEQ];
    for (int s = 0; s < N_SEQ; ++s) {
        llama_token toks[128];
        const int n = tokenize(vocab, prompts[s], toks, 128);
        for (int i = 0; i < n; ++i) {
            batch_add(&batch, toks[i], i, s, i == n - 1);
        }
        last_row[s] = batch.n_tokens - 1;
        n_past[s]   = n;
    }
    CHECK(llama_decode(ctx, batch) == 0);
    CHECK(llama_spec_dflash2_process_batch(spec, batch) == LLAMA_SPEC_DFLASH2_OK);
    for (int s = 0; s < N_SEQ; ++s) {
        out[s][0] = argmax(ctx, last_row[s], n_vocab);
        n_out[s]  = 1;
    }

    int steps = 0;
    while (n_out[0] < N_GEN || n_out[1] < N_GEN) {
        struct llama_spec_dflash2_draft_request reqs[N_SEQ];
        for (int s = 0; s < N_SEQ; ++s) {
            reqs[s] = (struct llama_spec_dflash2_draft_request) { .seq_id = s, .id_last = out[s][n_out[s] - 1], .n_max = N_MAX };
        }
        llama_token drafted[N_SEQ * N_MAX];
        int32_t     n_drafted[N_SEQ];
        CHECK(llama_spec_dflash2_draft(spec, reqs, N_SEQ, drafted, N_SEQ * N_MAX, n_drafted) == LLAMA_SPEC_DFLASH2_OK);

        batch.n_tokens = 0;
        int first[N_SEQ];
        int at = 0;
        for (int s = 0; s < N_SEQ; ++s) {
            first[s] = batch.n_tokens;
            batch_add(&batch, reqs[s].id_last, n_past[s], s, 1);
            for (int j = 0; j < n_drafted[s]; ++j) {
                batch_add(&batch, drafted[at + j], n_past[s] + 1 + j, s, 1);
            }
            at += n_drafted[s];
        }
        CHECK(llama_decode(ctx, batch) == 0);
        CHECK(llama_spec_dflash2_process_batch(spec, batch) == LLAMA_SPEC_DFLASH2_OK);

        at = 0;
        for (int s = 0; s < N_SEQ; ++s) {
            int n_acc = 0;
            llama_token v = argmax(ctx, first[s], n_vocab);
            while (n_acc < n_drafted[s] && drafted[at + n_acc] == v) {
                out[s][n_out[s]++] = v;
                n_acc++;
                v = argmax(ctx, first[s] + n_acc, n_vocab);
            }
            out[s][n_out[s]++] = v;
            at += n_drafted[s];
            CHECK(llama_spec_dflash2_accept(spec, s, n_acc) == LLAMA_SPEC_DFLASH2_OK);
            n_past[s] += n_acc + 1;
            CHECK(llama_memory_seq_rm(llama_get_memory(ctx), s, n_past[s], -1));
            CHECK(llama_spec_dflash2_seq_rm(spec, s, n_past[s], -1) == LLAMA_SPEC_DFLASH2_OK);
        }
        steps++;
    }

    for (int s = 0; s < N_SEQ; ++s) {
        for (int g = 0; g < N_GEN; ++g) {
            if (out[s][g] != want[s][g]) {
                fprintf(stderr, "sequence %d differs from target-only at token %d: %d vs %d\n", s, g, out[s][g],
                        want[s][g]);
                return 1;
            }
        }
    }
    struct llama_spec_dflash2_stats stats;
    CHECK(llama_spec_dflash2_get_stats(spec, &stats) == LLAMA_SPEC_DFLASH2_OK);
    CHECK(stats.n_drafted > 0);
    printf("%d sequences x %d tokens identical to target-only in %d steps; drafted %llu, accepted %llu\n", N_SEQ,
           N_GEN, steps, (unsigned long long) stats.n_drafted, (unsigned long long) stats.n_accepted);

    llama_spec_dflash2_free(spec);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
