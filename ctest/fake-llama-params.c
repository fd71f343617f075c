// Preloaded (LD_PRELOAD) before the pinned libllama: a llama_model_default_params()
// whose struct grew by 16 bytes, as the next llama.cpp's may, at the same version.
// A caller with the pinned struct's 80-byte slot would get 96 bytes written into it.
#define _GNU_SOURCE
#define llama_model_default_params llama_model_default_params_pinned
#include "llama.h"
#undef llama_model_default_params

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

struct grown_model_params {
    struct llama_model_params pinned;
    int64_t                   added[2];
};

struct grown_model_params llama_model_default_params(void);

struct grown_model_params llama_model_default_params(void) {
    struct llama_model_params (*pinned)(void) =
        (struct llama_model_params (*)(void)) dlsym(RTLD_NEXT, "llama_model_default_params");
    struct grown_model_params result;
    memset(&result, 0x11, sizeof(result));
    if (pinned) {
        result.pinned = pinned();
    }
    return result;
}
