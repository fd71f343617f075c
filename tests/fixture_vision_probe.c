// Built and run by tests/fixture_vision.rs against the pinned libllama and a
// libmtmd built from the same source tree (scripts/server.sh build).
//
//   fixture_vision_probe TARGET.gguf MMPROJ.gguf IMAGE.png
//
// Loads the text model and the projector, tokenizes a prompt holding one image,
// encodes the image twice (the embeddings must match), evaluates all chunks
// into a llama context with mtmd's helper, then decodes greedily. Prints
// key=value lines for the test to check; exit status 0 only if every step
// succeeded.

#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_GEN 8

static void quiet(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static int fail(const char * what) {
    printf("error=%s\n", what);
    return 1;
}

static int argmax(const float * v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[best]) {
            best = i;
        }
    }
    return best;
}

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s TARGET.gguf MMPROJ.gguf IMAGE.png\n", argv[0]);
        return 2;
    }
    if (!getenv("DFLASH2_TEST_LLAMA_LOG")) {
        llama_log_set(quiet, NULL);
        mtmd_helper_log_set(quiet, NULL);
    }
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        return fail("model");
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct mtmd_context_params mparams = mtmd_context_params_default();
    mparams.use_gpu = false;
    mparams.n_threads = 2;
    mparams.print_timings = false;
    mtmd_context * mctx = mtmd_init_from_file(argv[2], model, mparams);
    if (!mctx) {
        return fail("mtmd_init_from_file");
    }
    printf("vision=%d mrope=%d\n", mtmd_support_vision(mctx), mtmd_decode_use_mrope(mctx));

    struct mtmd_helper_bitmap_wrapper bw =
        mtmd_helper_bitmap_init_from_file(mctx, argv[3], false, mtmd_helper_init_opt_default());
    if (!bw.bitmap) {
        return fail("bitmap");
    }
    printf("image=%ux%u\n", mtmd_bitmap_get_nx(bw.bitmap), mtmd_bitmap_get_ny(bw.bitmap));

    char prompt[256];
    snprintf(prompt, sizeof(prompt), "the model is %s a block and", mtmd_default_marker());
    struct mtmd_input_text text = { prompt, strlen(prompt), true, true };
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    const mtmd_bitmap * bitmaps[1] = { bw.bitmap };
    if (mtmd_tokenize(mctx, chunks, &text, bitmaps, 1) != 0) {
        return fail("tokenize");
    }
    const size_t n_chunks = mtmd_input_chunks_size(chunks);
    printf("chunks=%zu tokens=%zu n_pos=%d\n", n_chunks, mtmd_helper_get_n_tokens(chunks), (int) mtmd_helper_get_n_pos(chunks));

    const int n_embd = llama_model_n_embd_inp(model);
    for (size_t c = 0; c < n_chunks; c++) {
        const mtmd_input_chunk * chunk = mtmd_input_chunks_get(chunks, c);
        const size_t n_tok = mtmd_input_chunk_get_n_tokens(chunk);
        const enum mtmd_input_chunk_type type = mtmd_input_chunk_get_type(chunk);
        printf("chunk=%zu type=%d n_tokens=%zu n_pos=%d\n", c, (int) type, n_tok, (int) mtmd_input_chunk_get_n_pos(chunk));
        if (type != MTMD_INPUT_CHUNK_TYPE_IMAGE) {
            continue;
        }
        const mtmd_image_tokens * img = mtmd_input_chunk_get_tokens_image(chunk);
        const struct mtmd_decoder_pos last = mtmd_image_tokens_get_decoder_pos(img, 0, n_tok - 1);
        printf("image_tokens=%zu last_pos=%u,%u,%u\n", n_tok, last.t, last.y, last.x);

        // encode twice: the projector is deterministic and its output finite
        const size_t n = n_tok * (size_t) n_embd;
        float * first = malloc(n * sizeof(float));
        if (mtmd_encode_chunk(mctx, chunk) != 0) {
            return fail("encode");
        }
        memcpy(first, mtmd_get_output_embd(mctx), n * sizeof(float));
        if (mtmd_encode_chunk(mctx, chunk) != 0) {
            return fail("encode again");
        }
        const float * second = mtmd_get_output_embd(mctx);
        double sum = 0.0, max_abs = 0.0;
        int finite = 1, same = 1;
        for (size_t i = 0; i < n; i++) {
            finite &= isfinite(first[i]) != 0;
            same &= first[i] == second[i];
            sum += first[i];
            max_abs = fmax(max_abs, fabs(first[i]));
        }
        printf("embd_n=%zu embd_finite=%d embd_same=%d embd_sum=%.6f embd_max_abs=%.6f\n", n, finite, same, sum, max_abs);
        free(first);
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 128;
    cp.n_ubatch = 128;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    struct llama_context * lctx = llama_init_from_model(model, cp);
    if (!lctx) {
        return fail("context");
    }
    llama_pos n_past = 0;
    if (mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, (int32_t) cp.n_batch, true, &n_past) != 0) {
        return fail("eval_chunks");
    }
    printf("n_past=%d pos_max=%d\n", (int) n_past, (int) llama_memory_seq_pos_max(llama_get_memory(lctx), 0));

    printf("generated=");
    for (int i = 0; i < N_GEN; i++) {
        const float * logits = llama_get_logits_ith(lctx, -1);
        for (int k = 0; k < n_vocab; k++) {
            if (!isfinite(logits[k])) {
                printf("\n");
                return fail("logits not finite");
            }
        }
        const llama_token next = argmax(logits, n_vocab);
        printf("%s%d", i ? "," : "", next);
        // text after the image continues at mtmd's n_past (M-RoPE: not the row count)
        struct llama_batch b = llama_batch_init(1, 0, 1);
        b.token[0] = next;
        b.pos[0] = n_past++;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = 0;
        b.logits[0] = 1;
        b.n_tokens = 1;
        const int rc = llama_decode(lctx, b);
        llama_batch_free(b);
        if (rc != 0) {
            printf("\n");
            return fail("decode");
        }
    }
    printf("\nok=1\n");

    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bw.bitmap);
    mtmd_free(mctx);
    llama_free(lctx);
    llama_model_free(model);
    return 0;
}
