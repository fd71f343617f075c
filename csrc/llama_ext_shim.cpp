// extern "C" wrappers over the llama-ext.h functions dflash2 uses.
//
// llama-ext.h is C++ (it includes <map>) and declares its functions without
// extern "C", so their symbols are mangled. Rust reaches them through these
// wrappers, compiled against the same headers as the libllama we link. Every
// wrapper catches C++ exceptions: none may unwind into Rust.

#include "llama.h"
#include "llama-ext.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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

int32_t dflash2_shim_model_dflash_selector_top_k(const llama_model * model) {
    try {
        return llama_model_dflash_selector_top_k(model);
    } catch (...) {
        return -1;
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

// The device libllama placed the model's output layer on (its head; the CPU
// device when the head stays in host memory), or NULL when this libllama does
// not export llama_model::dev_output. That member is C++-only and not declared
// in any installed header, so it is looked up by its mangled name at run time
// (a non-virtual member function takes `this` as its first argument): a
// libllama without it still works, with the target's devices as the fallback.
ggml_backend_dev_t dflash2_shim_model_dev_output(const llama_model * model) {
    using dev_output_t = ggml_backend_dev_t (*)(const llama_model *);
    static const dev_output_t dev_output = (dev_output_t) dlsym(RTLD_DEFAULT, "_ZNK11llama_model10dev_outputEv");
    if (!dev_output || !model) {
        return nullptr;
    }
    try {
        return dev_output(model);
    } catch (...) {
        return nullptr;
    }
}

// The model's tensor list, llama_internal_get_tensor_map (llama-model.h, not
// installed): looked up by its mangled name at run time, like dev_output above;
// NULL when this libllama does not export it.
using tensor_map_t = const std::vector<std::pair<std::string, ggml_tensor *>> & (*)(const llama_model *);

static tensor_map_t tensor_map_fn() {
    static const tensor_map_t tensor_map =
        (tensor_map_t) dlsym(RTLD_DEFAULT, "_Z29llama_internal_get_tensor_mapB5cxx11PK11llama_model");
    return tensor_map;
}

// The model's tensors named `name`: up to n_out of them into out, in the
// model's order; returns how many there are (more than n_out possible: a tied
// output head is a second "token_embd.weight" on the head's device), or -1
// when this libllama does not export its tensor list.
int32_t dflash2_shim_model_tensors(const llama_model * model, const char * name, ggml_tensor ** out, int32_t n_out) {
    const tensor_map_t tensor_map = tensor_map_fn();
    if (!tensor_map || !model || !name) {
        return -1;
    }
    try {
        int32_t n = 0;
        for (const auto & [tname, tensor] : tensor_map(model)) {
            if (tname == name) {
                if (n < n_out && out) {
                    out[n] = tensor;
                }
                n++;
            }
        }
        return n;
    } catch (...) {
        return -1;
    }
}

// The model's tensor number i in its order, its name into *name; NULL past the
// last one or when this libllama does not export its tensor list.
ggml_tensor * dflash2_shim_model_tensor_at(const llama_model * model, int32_t i, const char ** name) {
    const tensor_map_t tensor_map = tensor_map_fn();
    if (!tensor_map || !model || i < 0) {
        return nullptr;
    }
    try {
        const auto & map = tensor_map(model);
        if ((size_t) i >= map.size()) {
            return nullptr;
        }
        if (name) {
            *name = map[i].first.c_str();
        }
        return map[i].second;
    } catch (...) {
        return nullptr;
    }
}

// Bytes the context holds in the buffer types of device `dev` (NULL: of every
// device): its model's weights, its memory (KV cache) and its compute buffers,
// as llama_get_memory_breakdown reports them. False when libllama throws.
bool dflash2_shim_memory_breakdown(const llama_context * ctx, ggml_backend_dev_t dev, size_t * model, size_t * context,
        size_t * compute) {
    try {
        *model = *context = *compute = 0;
        for (const auto & [buft, mb] : llama_get_memory_breakdown(ctx)) {
            if (dev && ggml_backend_buft_get_device(buft) != dev) {
                continue;
            }
            *model += mb.model;
            *context += mb.context;
            *compute += mb.compute;
        }
        return true;
    } catch (...) {
        return false;
    }
}

} // extern "C"
