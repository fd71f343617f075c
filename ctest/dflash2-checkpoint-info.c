// Prints what a DFlash2 drafter declares, optionally checked against a target:
//   dflash2-checkpoint-info DRAFTER.gguf [TARGET.gguf]
// Exits 1 with the library's error when the check fails.
#include "dflash2.h"

#include <stdio.h>

static void quiet_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level;
    (void) text;
    (void) user_data;
}

int main(int argc, char ** argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s DRAFTER.gguf [TARGET.gguf]\n", argv[0]);
        return 2;
    }
    struct llama_model * target = NULL;
    if (argc == 3) {
        llama_log_set(quiet_log, NULL);
        llama_backend_init();
        struct llama_model_params mparams = llama_model_default_params();
        mparams.use_extra_bufts = false;
        target = llama_model_load_from_file(argv[2], mparams);
        if (target == NULL) {
            fprintf(stderr, "error: libllama could not load the target %s\n", argv[2]);
            return 1;
        }
    }

    struct llama_spec_dflash2_checkpoint_info info;
    const int rc = llama_spec_dflash2_checkpoint_check(argv[1], target, &info);
    if (rc != LLAMA_SPEC_DFLASH2_OK) {
        printf("error: %s: %s\n", llama_spec_dflash2_status_name(rc), llama_spec_dflash2_last_error());
        return 1;
    }
    printf("%s: valid DFlash2 drafter%s\n", argv[1], target ? " for this target" : "");
    printf("  n_embd          %u\n", info.n_embd);
    printf("  layers          %u (heads %u, kv heads %u, head dim %u, ff %u)\n", info.n_layer, info.n_head,
           info.n_head_kv, info.head_dim, info.n_ff);
    printf("  vocab           %u (draft head rows %u)\n", info.n_vocab, info.n_vocab_draft);
    printf("  block_size      %u\n", info.block_size);
    printf("  selector        top-k %u, rank %u\n", info.selector_top_k, info.selector_rank);
    printf("  conv            kernel %u, group %u\n", info.conv_kernel_size, info.conv_group_size);
    printf("  target_layers   [");
    for (uint32_t i = 0; i < info.n_target_layers; ++i) {
        printf("%s%d", i ? ", " : "", info.target_layers[i]);
    }
    printf("]\n");
    printf("  mask token      %d\n", info.mask_token);
    printf("  sliding window  %u\n", info.n_swa);
    printf("  attention       %s%s\n", info.causal ? "causal" : "non-causal", info.mrope ? ", M-RoPE" : "");
    printf("  head            %s\n", info.own_head ? "own" : "shared with the target (ctx_other)");
    if (target) {
        llama_model_free(target);
    }
    return 0;
}
