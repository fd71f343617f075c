// extern "C" wrappers over the llama-ext.h functions dflash2 uses.
//
// llama-ext.h is C++ (it includes <map>) and declares its functions without
// extern "C", so their symbols are mangled. Rust reaches them through these
// wrappers, compiled against the same headers as the libllama we link. Every
// wrapper catches C++ exceptions: none may unwind into Rust.

#include "llama.h"
#include "llama-ext.h"

#include <cstdint>

extern "C" {

void dflash2_shim_set_embeddings_nextn(llama_context * ctx, bool value, bool masked) {
    try {
        llama_set_embeddings_nextn(ctx, value, masked);
    } catch (...) {
    }
}

float * dflash2_shim_get_embeddings_nextn(llama_context * ctx) {
    try {
        return llama_get_embeddings_nextn(ctx);
    } catch (...) {
        return nullptr;
    }
}

float * dflash2_shim_get_embeddings_nextn_ith(llama_context * ctx, int32_t i) {
    try {
        return llama_get_embeddings_nextn_ith(ctx, i);
    } catch (...) {
        return nullptr;
    }
}

void dflash2_shim_set_embeddings_layer_inp(llama_context * ctx, uint32_t lid, bool value) {
    try {
        llama_set_embeddings_layer_inp(ctx, lid, value);
    } catch (...) {
    }
}

float * dflash2_shim_get_embeddings_layer_inp(llama_context * ctx, uint32_t lid) {
    try {
        return llama_get_embeddings_layer_inp(ctx, lid);
    } catch (...) {
        return nullptr;
    }
}

llama_context * dflash2_shim_get_ctx_other(llama_context * ctx) {
    try {
        return llama_get_ctx_other(ctx);
    } catch (...) {
        return nullptr;
    }
}

int32_t dflash2_shim_model_dflash_selector_top_k(const llama_model * model) {
    try {
        return llama_model_dflash_selector_top_k(model);
    } catch (...) {
        return -1;
    }
}

const int32_t * dflash2_shim_model_target_layer_ids(const llama_model * model) {
    try {
        return llama_model_target_layer_ids(model);
    } catch (...) {
        return nullptr;
    }
}

uint32_t dflash2_shim_model_target_layer_ids_n(const llama_model * model) {
    try {
        return llama_model_target_layer_ids_n(model);
    } catch (...) {
        return 0;
    }
}

int32_t dflash2_shim_model_n_devices(const llama_model * model) {
    try {
        return llama_model_n_devices(model);
    } catch (...) {
        return -1;
    }
}

ggml_backend_dev_t dflash2_shim_model_get_device(const llama_model * model, int32_t i) {
    try {
        return llama_model_get_device(model, i);
    } catch (...) {
        return nullptr;
    }
}

} // extern "C"
