// Version, default params and their validation, as a C user sees them.
#include "dflash2.h"
#include "check.h"

#include <string.h>

int main(void) {
    CHECK(llama_spec_dflash2_api_version() == LLAMA_SPEC_DFLASH2_API_VERSION);
    const char * version = llama_spec_dflash2_version();
    CHECK(version != NULL && strlen(version) >= 5);

    struct llama_spec_dflash2_params params = llama_spec_dflash2_default_params();
    CHECK(params.n_seq == 1);
    CHECK(params.n_max == -1);
    CHECK(params.block_size == 0);
    CHECK(params.walk == LLAMA_SPEC_DFLASH2_WALK_GREEDY);
    CHECK(params.image_rows == LLAMA_SPEC_DFLASH2_IMAGE_ROWS_INJECT);
    CHECK(params.devices == NULL);
    CHECK(!params.use_extra_bufts);
    CHECK(params.first_child == -1);
    CHECK(params.adapt_sampled_drafts == -1);
    CHECK(params.draft_graph == -1);
    CHECK(llama_spec_dflash2_params_check(&params) == LLAMA_SPEC_DFLASH2_OK);
    CHECK(strcmp(llama_spec_dflash2_last_error(), "") == 0);

    struct llama_spec_dflash2_params bad = params;
    bad.n_max = 0;
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llama_spec_dflash2_last_error(), "n_max") != NULL);

    bad = params;
    bad.walk = 42;
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llama_spec_dflash2_last_error(), "walk") != NULL);

    bad = params;
    bad.first_child = 2;
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llama_spec_dflash2_last_error(), "first_child") != NULL);
    bad.first_child = LLAMA_SPEC_DFLASH2_FIRST_CHILD_GREEDY;
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_OK);

    bad = params;
    bad.adapt_sampled_drafts = 2;
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llama_spec_dflash2_last_error(), "adapt_sampled_drafts") != NULL);
    bad.adapt_sampled_drafts = 0;
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_OK);

    bad = params;
    bad.draft_graph = 2;
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llama_spec_dflash2_last_error(), "draft_graph") != NULL);
    bad.draft_graph = LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_LIBLLAMA;
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_OK);

    bad = params;
    bad.n_seq = LLAMA_SPEC_DFLASH2_MAX_SEQUENCES + 1;
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);

    CHECK(llama_spec_dflash2_params_check(NULL) == LLAMA_SPEC_DFLASH2_ERR_NULL_ARGUMENT);
    CHECK(llama_spec_dflash2_last_status() == LLAMA_SPEC_DFLASH2_ERR_NULL_ARGUMENT);

    // init returns NULL: the status is the thread's last; a call that succeeds clears it
    bad = params;
    bad.n_gpu_layers = -5;
    CHECK(llama_spec_dflash2_init(NULL, "x.gguf", bad) == NULL);
    CHECK(llama_spec_dflash2_last_status() == LLAMA_SPEC_DFLASH2_ERR_NULL_ARGUMENT);
    CHECK(llama_spec_dflash2_params_check(&bad) == LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llama_spec_dflash2_last_error(), "n_gpu_layers") != NULL);
    CHECK(llama_spec_dflash2_last_status() == LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
    CHECK(llama_spec_dflash2_params_check(&params) == LLAMA_SPEC_DFLASH2_OK);
    CHECK(llama_spec_dflash2_last_status() == LLAMA_SPEC_DFLASH2_OK);

    CHECK(strcmp(llama_spec_dflash2_status_name(LLAMA_SPEC_DFLASH2_OK), "ok") == 0);
    CHECK(strcmp(llama_spec_dflash2_status_name(LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT), "bad checkpoint") == 0);
    CHECK(strcmp(llama_spec_dflash2_status_name(12345), "unknown status") == 0);
    CHECK(strcmp(llama_spec_dflash2_status_name(LLAMA_SPEC_DFLASH2_ERR_OUT_OF_MEMORY), "out of device memory") == 0);

    // the llama.cpp it was built against is the one this program loaded
    const struct llama_spec_dflash2_llama_build built = llama_spec_dflash2_llama_built();
    CHECK(strcmp(built.llama_version, llama_version()) == 0);
    CHECK(strcmp(built.ggml_version, ggml_version()) == 0);
    CHECK(strcmp(built.ggml_commit, ggml_commit()) == 0);
    CHECK(strstr(built.summary, built.prefix) != NULL);
    CHECK(llama_spec_dflash2_llama_check() == LLAMA_SPEC_DFLASH2_OK);
    CHECK(strcmp(llama_spec_dflash2_status_name(LLAMA_SPEC_DFLASH2_ERR_LLAMA_MISMATCH), "llama.cpp mismatch") == 0);

    printf("version %s, api %u, built against %s: ok\n", version, llama_spec_dflash2_api_version(), built.summary);
    return 0;
}
