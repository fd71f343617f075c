// Which path serves the drafter, and the life of the spec that serves it: the
// routing decision, the target's output sizing and memory budget, creation of the
// upstream or dflash2 implementation, and the lookup of a spec by target context.
#include "dflash2-server-impl.h"

#include "log.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>

namespace {

// the spec serving each target context, for the hooks that only see contexts
std::mutex                                       g_specs_mutex;
std::map<llama_context *, dflash2_server_spec *> g_specs;

// dflash2's log lines go through llama.cpp's logger, like the rest of the server's
void log_to_common(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        LOG_ERR("%s", text);
    } else if (level == GGML_LOG_LEVEL_WARN) {
        LOG_WRN("%s", text);
    } else {
        LOG_INF("%s", text);
    }
}

bool wants_dflash(const common_params & params) {
    const auto & types = params.speculative.types;
    return std::find(types.begin(), types.end(), COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) != types.end();
}

// the engine's configuration from the server's: draft options, our flags, -devd
// (devices receives the NULL-terminated list params.devices points into)
dflash2::params engine_params(const common_params & params, std::vector<ggml_backend_dev_t> & devices) {
    const dflash2_server_options & opts  = dflash2_server_opts();
    const auto                   & draft = params.speculative.draft;

    dflash2::params p = dflash2::default_params();
    p.n_seq           = (uint32_t) params.n_parallel;
    p.n_max           = draft.n_max;
    p.n_min           = draft.n_min;
    p.p_min           = draft.p_min;
    p.block_size      = opts.block_size;
    p.ngram_branches  = opts.ngram_branches;
    p.adapt_sampled_drafts = opts.adapt_sampled;
    p.draft_graph          = opts.draft_graph;
    p.walk            = opts.walk;
    p.image_rows      = opts.image_rows;
    p.type_k          = (int32_t) draft.cache_type_k;
    p.type_v          = (int32_t) draft.cache_type_v;
    p.n_threads       = draft.cpuparams.n_threads > 0 ? draft.cpuparams.n_threads : 0;
    p.n_threads_batch = draft.cpuparams_batch.n_threads > 0 ? draft.cpuparams_batch.n_threads : 0;
    p.n_gpu_layers    = draft.n_gpu_layers < 0 ? -1 : draft.n_gpu_layers; // auto (-1) and all (-2): all
    p.use_extra_bufts = !params.no_extra_bufts;

    // -devd: llama.cpp's parser gives a NULL-terminated list, just { NULL } for
    // `-devd none` (the drafter on the CPU); without -devd the engine places the
    // drafter with the target's output head
    devices.clear();
    if (!draft.devices.empty()) {
        for (ggml_backend_dev_t d : draft.devices) {
            if (d) {
                devices.push_back(d);
            }
        }
        devices.push_back(nullptr);
        p.devices = devices.data();
    }
    return p;
}

// the target's context per sequence, as llama_context will size it; before the
// target is loaded its training context is unknown, the drafter's stands in for n_ctx 0
uint32_t target_n_ctx_seq(const common_params & params, const std::string & path_draft) {
    const uint32_t n_ctx = params.n_ctx > 0 ? (uint32_t) params.n_ctx : dflash2::checkpoint_check(path_draft).n_ctx_train;
    if (params.kv_unified || params.n_parallel <= 1) {
        return n_ctx;
    }
    return GGML_PAD(n_ctx / (uint32_t) params.n_parallel, 256);
}

dflash2_server_spec * init_dflash2(common_params & params, llama_context * ctx_tgt) {
    dflash2_server_options & opts = dflash2_server_opts();
    opts.init_failed = true; // until the engine exists
    llama_spec_dflash2_log_set(log_to_common, nullptr);
    LOG_INF("%s: dflash2 %s (C API %u), built against %s\n", __func__, llama_spec_dflash2_version(),
            llama_spec_dflash2_api_version(), llama_spec_dflash2_llama_built().summary);

    if (params.speculative.has_synth()) {
        throw std::runtime_error("dflash2: synthetic acceptance is not supported; add --spec-dflash2-upstream");
    }
    if (!opts.tree_refusal.empty()) {
        throw std::runtime_error("dflash2: " + opts.tree_refusal);
    }
    const std::string & path_draft = params.speculative.draft.mparams.path;
    std::vector<ggml_backend_dev_t> devices;
    dflash2_server_spec * spec = nullptr;
    try {
        spec = dflash2_server_spec_dflash2(ctx_tgt, path_draft, engine_params(params, devices), params.n_parallel);
    } catch (const dflash2::error & e) {
        throw std::runtime_error("dflash2 cannot serve the drafter '" + path_draft + "': " + e.message);
    }
    opts.init_failed = false;
    return spec;
}

} // namespace

bool dflash2_server_routes(const common_params & params) {
    return params.speculative.has_dft() && wants_dflash(params) && !dflash2_server_opts().use_upstream;
}

int32_t dflash2_server_output_n_max(const common_params & params) {
    const int32_t n_max = common_speculative_n_max(&params.speculative);
    if (!dflash2_server_routes(params)) {
        return n_max;
    }
    // size the target's outputs for the draft length dflash2 will use: at most block_size - 1
    try {
        const dflash2::checkpoint_info info = dflash2::checkpoint_check(params.speculative.draft.mparams.path);
        const int32_t block_size = dflash2_server_opts().block_size;
        const int32_t block = block_size > 0 ? std::min<int32_t>(block_size, info.block_size) : (int32_t) info.block_size;
        // a tree's rows (the tree budget) may outnumber the chain's
        return std::max(std::min(n_max, block - 1), dflash2_server_opts().tree_nodes);
    } catch (const dflash2::error &) {
        // init reports the error; until then the context is created with the
        // tree plan's sequence ids, one output each
        return std::max(n_max, dflash2_server_opts().tree_nodes);
    }
}

// the target runs on ggml's CPU backend: no layer offloaded, -dev none, or no
// accelerator registered (an RPC server's device counts as one)
static bool target_cpu_only(const common_params & params) {
    if (params.n_gpu_layers == 0) {
        return true;
    }
    if (!params.devices.empty()) {
        return std::all_of(params.devices.begin(), params.devices.end(), [](ggml_backend_dev_t d) {
            return d == nullptr || ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_CPU;
        });
    }
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        const enum ggml_backend_dev_type type = ggml_backend_dev_type(ggml_backend_dev_get(i));
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            return false;
        }
    }
    return true;
}

// the most rows a verify batch may have for T = 0 outputs identical to target-
// only decoding (0: no bound): on a CPU target whose f16/f32 cache ggml's flash
// attention tiles at 64+ query rows in one ubatch, a bigger batch leaves the
// kernel that decodes one token (LLAMA_SPEC_DFLASH2_CPU_IDENTICAL_N_UBATCH);
// ubatches below that (-ub 63) lift the bound, and the prompt's ubatches stay
// llama.cpp's, as a server without the drafter decodes them
static int32_t identical_verify_rows(const common_params & params) {
    const auto tiles = [](ggml_type t) { return t == GGML_TYPE_F16 || t == GGML_TYPE_F32; };
    if (!tiles(params.cache_type_k) || params.cache_type_k != params.cache_type_v || !target_cpu_only(params) ||
            params.n_ubatch <= (int32_t) LLAMA_SPEC_DFLASH2_CPU_IDENTICAL_N_UBATCH) {
        return 0;
    }
    return LLAMA_SPEC_DFLASH2_CPU_IDENTICAL_N_UBATCH;
}

common_init_result_ptr dflash2_server_init_target(common_params & params) {
    if (!dflash2_server_routes(params)) {
        return common_init_from_params(params);
    }
    dflash2_server_opts().identical_rows = identical_verify_rows(params);
    const std::string path_draft = params.speculative.draft.mparams.path;
    if (params.fit_params) {
        try {
            std::vector<ggml_backend_dev_t> devices;
            const size_t bytes = dflash2::estimate_memory(nullptr, path_draft, engine_params(params, devices),
                    target_n_ctx_seq(params, path_draft));
            for (auto & margin : params.fit_params_target) {
                margin += bytes;
            }
            LOG_INF("%s: reserving %.1f MiB per device for the dflash2 drafter\n", __func__, bytes / (1024.0 * 1024.0));
        } catch (const dflash2::error &) {
            // nothing reserved: the engine's creation refuses this drafter with the reason
        }
    }
    // trees need path sequence ids beyond the slots' own: llama.cpp sizes the
    // context's n_seq_max from n_parallel, which is the slot count everywhere else
    const int32_t n_parallel = params.n_parallel;
    const int32_t n_seq_max  = dflash2_server_tree_plan(params);
    // hide the drafter from upstream's fit pass
    params.speculative.draft.mparams.path.clear();
    params.n_parallel = n_seq_max;
    auto restore = [&]() {
        params.speculative.draft.mparams.path = path_draft;
        params.n_parallel = n_parallel;
    };
    common_init_result_ptr res;
    try {
        res = common_init_from_params(params);
    } catch (...) {
        restore();
        throw;
    }
    restore();
    return res;
}

dflash2_server_spec * dflash2_server_spec_init(common_params & params, llama_context * ctx_tgt) {
    dflash2_server_spec * spec = dflash2_server_routes(params) ? init_dflash2(params, ctx_tgt)
                                                               : dflash2_server_spec_upstream(params);
    if (!spec) {
        return nullptr;
    }
    spec->counters.resize(params.n_parallel);
    std::lock_guard<std::mutex> lock(g_specs_mutex);
    g_specs[ctx_tgt] = spec;
    return spec;
}

bool dflash2_server_init_failed(const common_params & params) {
    return dflash2_server_routes(params) && dflash2_server_opts().init_failed;
}

dflash2_server_spec * dflash2_server_spec_for(llama_context * ctx_tgt) {
    std::lock_guard<std::mutex> lock(g_specs_mutex);
    auto it = g_specs.find(ctx_tgt);
    return it == g_specs.end() ? nullptr : it->second;
}

void dflash2_server_spec_deleter::operator()(dflash2_server_spec * spec) const {
    {
        std::lock_guard<std::mutex> lock(g_specs_mutex);
        for (auto it = g_specs.begin(); it != g_specs.end(); ++it) {
            if (it->second == spec) {
                g_specs.erase(it);
                break;
            }
        }
    }
    delete spec;
}
