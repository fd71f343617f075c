// A libllama other than the build dflash2 was built against is refused, at init
// and by llama_spec_dflash2_llama_check, with both builds and the loaded file named.
// Run with a preloaded shim (fake-llama-version.c or fake-llama-params.c):
//   test-llama-mismatch FIXTURE_DIR EXPECTED
// where EXPECTED is text the refusal must contain.
#include "dflash2.h"
#include "check.h"

#include <string.h>

static void quiet_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level;
    (void) text;
    (void) user_data;
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FIXTURE_DIR EXPECTED\n", argv[0]);
        return 2;
    }
    char path_target[4096], path_draft[4096];
    snprintf(path_target, sizeof(path_target), "%s/target.gguf", argv[1]);
    snprintf(path_draft, sizeof(path_draft), "%s/drafter.gguf", argv[1]);

    const struct llama_spec_dflash2_llama_build built = llama_spec_dflash2_llama_built();
    CHECK(strlen(built.llama_version) > 0 && strlen(built.ggml_version) > 0);
    CHECK(strstr(built.summary, built.llama_version) != NULL);

    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    // not llama_model_default_params(): the preloaded one may write more than its slot
    struct llama_model_params mparams;
    memset(&mparams, 0, sizeof(mparams));
    mparams.split_mode = LLAMA_SPLIT_MODE_NONE;
    mparams.load_mode  = LLAMA_LOAD_MODE_NONE;
    struct llama_model * model = llama_model_load_from_file(path_target, mparams);
    CHECK(model != NULL);
    struct llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 256;
    struct llama_context * ctx = llama_init_from_model(model, cparams);
    CHECK(ctx != NULL);

    struct llama_spec_dflash2 * spec = llama_spec_dflash2_init(ctx, path_draft, llama_spec_dflash2_default_params());
    CHECK(spec == NULL);
    CHECK(llama_spec_dflash2_last_status() == LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH);
    const char * error = llama_spec_dflash2_last_error();
    CHECK(strstr(error, "dflash2 was built against llama.cpp ") != NULL);
    CHECK(strstr(error, built.llama_version) != NULL);
    CHECK(strstr(error, built.prefix) != NULL);
    CHECK(strstr(error, "libllama.so") != NULL);
    CHECK(strstr(error, argv[2]) != NULL);
    printf("init refused: %s\n", error);
    char refusal[8192];
    snprintf(refusal, sizeof(refusal), "%s", error);

    // the same answer without an engine
    CHECK(llama_spec_dflash2_llama_check() == LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH);
    CHECK(strcmp(llama_spec_dflash2_last_error(), refusal) == 0);
    CHECK(strcmp(llama_spec_dflash2_status_name(LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH), "llama.cpp mismatch") == 0);

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
