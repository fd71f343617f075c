// The checkpoint check on the fixture set: the good drafters pass with their
// declared layout, every broken file in broken/manifest.tsv is refused with the
// status and reason it names, and truncated copies never crash.
#include "dflash2.h"
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level;
    (void) text;
    (void) user_data;
}

static int status_from_name(const char * name) {
    static const struct {
        const char * name;
        int          status;
    } names[] = {
        { "BAD_CHECKPOINT", LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT },
        { "INCOMPATIBLE",   LLAMA_SPEC_DFLASH2_ERR_INCOMPATIBLE   },
        { "UNSUPPORTED",    LLAMA_SPEC_DFLASH2_ERR_UNSUPPORTED    },
        { "IO",             LLAMA_SPEC_DFLASH2_ERR_IO             },
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
        if (strcmp(names[i].name, name) == 0) {
            return names[i].status;
        }
    }
    fprintf(stderr, "unknown status name '%s' in manifest\n", name);
    exit(1);
}

static char * read_file(const char * path, size_t * size) {
    FILE * f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char * data = malloc((size_t) n);
    CHECK(data != NULL && fread(data, 1, (size_t) n, f) == (size_t) n);
    fclose(f);
    *size = (size_t) n;
    return data;
}

static void test_good(const char * dir, const struct llama_model * target) {
    char path[4096];
    struct llama_spec_dflash2_checkpoint_info info;
    snprintf(path, sizeof(path), "%s/drafter.gguf", dir);
    CHECK(llama_spec_dflash2_checkpoint_check(path, target, &info) == LLAMA_SPEC_DFLASH2_OK);
    CHECK(info.n_embd == 64 && info.block_size == 4 && info.selector_top_k == 4);
    CHECK(info.n_target_layers == 2 && info.target_layers[0] == 1 && info.target_layers[1] == 3);
    CHECK(info.mask_token == 3 && !info.own_head);
    CHECK(llama_spec_dflash2_is_dflash2(path));

    snprintf(path, sizeof(path), "%s/drafter-swa.gguf", dir);
    CHECK(llama_spec_dflash2_checkpoint_check(path, target, &info) == LLAMA_SPEC_DFLASH2_OK);
    CHECK(info.n_swa == 8);

    // info is optional
    CHECK(llama_spec_dflash2_checkpoint_check(path, NULL, NULL) == LLAMA_SPEC_DFLASH2_OK);
}

static int test_manifest(const char * dir, const struct llama_model * target) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/broken/manifest.tsv", dir);
    FILE * f = fopen(path, "r");
    CHECK(f != NULL);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        char file[256], status[64], needle[512];
        int with_target = 0;
        line[strcspn(line, "\n")] = 0;
        CHECK(sscanf(line, "%255[^\t]\t%63[^\t]\t%d\t%511[^\n]", file, status, &with_target, needle) == 4);
        snprintf(path, sizeof(path), "%s/broken/%s", dir, file);
        struct llama_spec_dflash2_checkpoint_info info;
        memset(&info, 0x5a, sizeof(info));
        const int rc = llama_spec_dflash2_checkpoint_check(path, with_target ? target : NULL, &info);
        if (rc != status_from_name(status) || strstr(llama_spec_dflash2_last_error(), needle) == NULL) {
            fprintf(stderr, "%s: got %d '%s', want %s containing '%s'\n", file, rc,
                    llama_spec_dflash2_last_error(), status, needle);
            exit(1);
        }
        CHECK(info.n_embd == 0x5a5a5a5a); // not written on failure
        n++;
    }
    fclose(f);
    return n;
}

static int test_truncations(const char * dir) {
    char path[4096], cut_path[4096];
    snprintf(path, sizeof(path), "%s/drafter.gguf", dir);
    snprintf(cut_path, sizeof(cut_path), "%s/broken/cut.tmp.gguf", dir);
    size_t size = 0;
    char * data = read_file(path, &size);
    int n = 0;
    for (size_t cut = 0; cut < size; cut += (cut < 8192 ? 13 : size / 61)) {
        FILE * f = fopen(cut_path, "wb");
        CHECK(f != NULL && fwrite(data, 1, cut, f) == cut);
        fclose(f);
        const int rc = llama_spec_dflash2_checkpoint_check(cut_path, NULL, NULL);
        if (rc != LLAMA_SPEC_DFLASH2_ERR_BAD_CHECKPOINT) {
            fprintf(stderr, "cut at %zu: got %d '%s'\n", cut, rc, llama_spec_dflash2_last_error());
            exit(1);
        }
        n++;
    }
    remove(cut_path);
    free(data);
    return n;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    const char * dir = argv[1];

    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mparams = llama_model_default_params();
    mparams.use_extra_bufts = false;
    char path[4096];
    snprintf(path, sizeof(path), "%s/target.gguf", dir);
    struct llama_model * target = llama_model_load_from_file(path, mparams);
    CHECK(target != NULL);

    test_good(dir, target);
    const int n_broken = test_manifest(dir, target);
    CHECK(n_broken >= 15);
    const int n_cuts = test_truncations(dir);

    CHECK(llama_spec_dflash2_checkpoint_check(NULL, NULL, NULL) == LLAMA_SPEC_DFLASH2_ERR_NULL_ARGUMENT);
    CHECK(llama_spec_dflash2_checkpoint_check("/nonexistent.gguf", NULL, NULL) == LLAMA_SPEC_DFLASH2_ERR_IO);
    CHECK(!llama_spec_dflash2_is_dflash2(NULL));

    llama_model_free(target);
    printf("good drafters ok, %d broken files refused, %d truncated copies refused\n", n_broken, n_cuts);
    return 0;
}
