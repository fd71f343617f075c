#include "dflash2-server.h"
#include "dflash2-batch-rows.h"

#include "log.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace {

struct server_options {
    int32_t walk         = LLAMA_SPEC_DFLASH2_WALK_GREEDY;
    int32_t block_size   = 0;
    int32_t image_rows   = LLAMA_SPEC_DFLASH2_IMAGE_ROWS_INJECT;
    bool    use_upstream = false;
    bool    init_failed  = false;
};

server_options g_options;

// the engine serving each target context, for the hooks that only see contexts
// (slot memory, prompt cache)
std::mutex                                   g_engines_mutex;
std::map<llama_context *, llama_spec_dflash2 *> g_engines;

// statistics copied after every step, for /metrics (rendered on the HTTP thread)
std::mutex               g_stats_mutex;
llama_spec_dflash2_stats g_stats = {};
int32_t                  g_stats_n_max = 0;

llama_spec_dflash2 * engine_for(llama_context * ctx_tgt) {
    std::lock_guard<std::mutex> lock(g_engines_mutex);
    auto it = g_engines.find(ctx_tgt);
    return it == g_engines.end() ? nullptr : it->second;
}

void check(int32_t rc, const char * what) {
    if (rc != LLAMA_SPEC_DFLASH2_OK) {
        throw std::runtime_error(std::string("dflash2 ") + what + ": " + llama_spec_dflash2_status_name(rc) + ": " +
                llama_spec_dflash2_last_error());
    }
}

void snapshot_stats(llama_spec_dflash2 * engine) {
    llama_spec_dflash2_stats s;
    if (llama_spec_dflash2_get_stats(engine, &s) == LLAMA_SPEC_DFLASH2_OK) {
        std::lock_guard<std::mutex> lock(g_stats_mutex);
        g_stats       = s;
        g_stats_n_max = llama_spec_dflash2_n_max(engine);
    }
}

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

} // namespace

bool dflash2_server_take_args(int & argc, char ** argv) {
    int out = 1;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> const char * {
            if (i + 1 >= argc) {
                fprintf(stderr, "error: %s needs a value\n", arg.c_str());
                return nullptr;
            }
            return argv[++i];
        };
        if (arg == "--spec-dflash2-block-size") {
            const char * v = value();
            if (!v) {
                return false;
            }
            char * end = nullptr;
            const long n = std::strtol(v, &end, 10);
            if (*end != '\0' || n < 0 || n == 1 || n > 4096) {
                fprintf(stderr, "error: --spec-dflash2-block-size needs 0 (trained) or a block size >= 2, got '%s'\n", v);
                return false;
            }
            g_options.block_size = (int32_t) n;
        } else if (arg == "--spec-dflash2-image-rows") {
            const char * v = value();
            if (!v) {
                return false;
            }
            if (std::strcmp(v, "inject") == 0) {
                g_options.image_rows = LLAMA_SPEC_DFLASH2_IMAGE_ROWS_INJECT;
            } else if (std::strcmp(v, "skip") == 0) {
                g_options.image_rows = LLAMA_SPEC_DFLASH2_IMAGE_ROWS_SKIP;
            } else {
                fprintf(stderr, "error: --spec-dflash2-image-rows is inject or skip, got '%s'\n", v);
                return false;
            }
        } else if (arg == "--spec-dflash2-walk") {
            const char * v = value();
            if (!v) {
                return false;
            }
            if (std::strcmp(v, "greedy") == 0) {
                g_options.walk = LLAMA_SPEC_DFLASH2_WALK_GREEDY;
            } else if (std::strcmp(v, "adaptive") == 0) {
                g_options.walk = LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE;
            } else {
                fprintf(stderr, "error: --spec-dflash2-walk is greedy or adaptive, got '%s'\n", v);
                return false;
            }
        } else if (arg == "--spec-dflash2-upstream") {
            g_options.use_upstream = true;
        } else {
            argv[out++] = argv[i];
        }
    }
    argc = out;
    argv[argc] = nullptr;
    return true;
}

bool dflash2_server_routes(const common_params & params) {
    return params.speculative.has_dft() && wants_dflash(params) && !g_options.use_upstream;
}

int32_t dflash2_server_output_n_max(const common_params & params) {
    const int32_t n_max = common_speculative_n_max(&params.speculative);
    if (!dflash2_server_routes(params)) {
        return n_max;
    }
    // size the target's outputs for the draft length dflash2 will use: at most block_size - 1
    llama_spec_dflash2_checkpoint_info info;
    if (llama_spec_dflash2_checkpoint_check(params.speculative.draft.mparams.path.c_str(), nullptr, &info) !=
            LLAMA_SPEC_DFLASH2_OK) {
        return n_max; // init reports the error
    }
    const int32_t block = g_options.block_size > 0 ? std::min<int32_t>(g_options.block_size, info.block_size)
                                                   : (int32_t) info.block_size;
    return std::min(n_max, block - 1);
}

common_init_result_ptr dflash2_server_init_target(common_params & params) {
    if (!dflash2_server_routes(params) || !params.fit_params) {
        return common_init_from_params(params);
    }
    const std::string path_draft = params.speculative.draft.mparams.path;
    llama_spec_dflash2_checkpoint_info info;
    if (llama_spec_dflash2_checkpoint_check(path_draft.c_str(), nullptr, &info) == LLAMA_SPEC_DFLASH2_OK) {
        // weights, plus a draft KV as long as the target's context, plus working buffers
        FILE * f = std::fopen(path_draft.c_str(), "rb");
        size_t bytes = 0;
        if (f) {
            std::fseek(f, 0, SEEK_END);
            bytes = (size_t) std::ftell(f);
            std::fclose(f);
        }
        const size_t n_ctx = params.n_ctx > 0 ? (size_t) params.n_ctx : (size_t) info.n_ctx_train;
        bytes += n_ctx * info.n_layer * 2 * info.n_head_kv * info.head_dim * sizeof(uint16_t);
        bytes += 256u * 1024 * 1024;
        for (auto & margin : params.fit_params_target) {
            margin += bytes;
        }
        LOG_INF("%s: reserving %.1f MiB per device for the dflash2 drafter\n", __func__, bytes / (1024.0 * 1024.0));
    }
    // hide the drafter from upstream's fit pass only
    params.speculative.draft.mparams.path.clear();
    common_init_result_ptr res;
    try {
        res = common_init_from_params(params);
    } catch (...) {
        params.speculative.draft.mparams.path = path_draft;
        throw;
    }
    params.speculative.draft.mparams.path = path_draft;
    return res;
}

dflash2_server_spec::~dflash2_server_spec() {
    if (engine) {
        {
            std::lock_guard<std::mutex> lock(g_engines_mutex);
            g_engines.erase(ctx_tgt);
        }
        llama_spec_dflash2_free(engine);
    }
    common_speculative_free(upstream);
}

dflash2_server_spec * dflash2_server_spec_init(common_params & params, llama_context * ctx_tgt) {
    if (!dflash2_server_routes(params)) {
        common_speculative * upstream = common_speculative_init(params.speculative, params.n_parallel);
        if (!upstream) {
            return nullptr;
        }
        auto * spec = new dflash2_server_spec();
        spec->upstream = upstream;
        spec->ctx_tgt  = ctx_tgt;
        spec->dparams.resize(params.n_parallel);
        spec->counters.resize(params.n_parallel);
        return spec;
    }

    g_options.init_failed = true; // until the engine exists
    llama_spec_dflash2_log_set(log_to_common, nullptr);

    const auto & draft = params.speculative.draft;
    if (params.speculative.has_synth()) {
        throw std::runtime_error("dflash2: synthetic acceptance is not supported; add --spec-dflash2-upstream");
    }

    llama_spec_dflash2_params sp = llama_spec_dflash2_default_params();
    sp.n_seq      = (uint32_t) params.n_parallel;
    sp.n_max      = draft.n_max;
    sp.n_min      = draft.n_min;
    sp.p_min      = draft.p_min;
    sp.block_size = g_options.block_size;
    sp.walk       = g_options.walk;
    sp.image_rows = g_options.image_rows;
    sp.type_k     = (int32_t) draft.cache_type_k;
    sp.type_v     = (int32_t) draft.cache_type_v;
    sp.n_threads       = draft.cpuparams.n_threads > 0 ? draft.cpuparams.n_threads : 0;
    sp.n_threads_batch = draft.cpuparams_batch.n_threads > 0 ? draft.cpuparams_batch.n_threads : 0;
    sp.n_gpu_layers    = draft.n_gpu_layers;
    sp.use_extra_bufts = !params.no_extra_bufts;

    // -devd: the list from llama.cpp's parser is NULL-terminated when non-empty
    std::vector<ggml_backend_dev_t> devices;
    for (ggml_backend_dev_t d : draft.devices) {
        if (d) {
            devices.push_back(d);
        }
    }
    if (!devices.empty()) {
        devices.push_back(nullptr);
        sp.devices = devices.data();
    }

    llama_spec_dflash2 * engine = llama_spec_dflash2_init(ctx_tgt, draft.mparams.path.c_str(), sp);
    if (!engine) {
        throw std::runtime_error(std::string("dflash2 cannot serve the drafter '") + draft.mparams.path + "': " +
                llama_spec_dflash2_last_error());
    }

    auto * spec = new dflash2_server_spec();
    spec->engine  = engine;
    spec->ctx_tgt = ctx_tgt;
    spec->dparams.resize(params.n_parallel);
    spec->counters.resize(params.n_parallel);
    {
        std::lock_guard<std::mutex> lock(g_engines_mutex);
        g_engines[ctx_tgt] = engine;
    }
    g_options.init_failed = false;
    snapshot_stats(engine);

    LOG_INF("%s: dflash2 %s serves the DFlash2 drafter '%s' (n_max %d, block %d)\n", __func__,
            llama_spec_dflash2_version(), draft.mparams.path.c_str(), llama_spec_dflash2_n_max(engine),
            llama_spec_dflash2_block_size(engine));
    return spec;
}

bool dflash2_server_init_failed(const common_params & params) {
    return dflash2_server_routes(params) && g_options.init_failed;
}

common_speculative_draft_params & common_speculative_get_draft_params(dflash2_server_spec * spec, llama_seq_id seq_id) {
    if (spec->upstream) {
        return common_speculative_get_draft_params(spec->upstream, seq_id);
    }
    return spec->dparams.at(seq_id);
}

void common_speculative_begin(dflash2_server_spec * spec, llama_seq_id seq_id, const llama_tokens & prompt) {
    if (!spec) {
        return;
    }
    if (spec->upstream) {
        common_speculative_begin(spec->upstream, seq_id, prompt);
    }
    // dflash2 already holds every committed row of the prompt
}

bool common_speculative_process(dflash2_server_spec * spec, const common_batch & batch) {
    if (!spec) {
        return true;
    }
    if (spec->upstream) {
        return common_speculative_process(spec->upstream, batch);
    }
    auto & rows = spec->rows;
    dflash2_rows_from_batch(batch, rows);
    const int32_t rc = llama_spec_dflash2_process(spec->engine, rows.data(), (int32_t) rows.size());
    if (rc != LLAMA_SPEC_DFLASH2_OK) {
        LOG_ERR("dflash2 process: %s: %s\n", llama_spec_dflash2_status_name(rc), llama_spec_dflash2_last_error());
        return false;
    }
    return true;
}

// drafted tokens of every sequence that drafted this step
static void count_drafts(dflash2_server_spec * spec, const std::vector<llama_tokens *> & results) {
    for (size_t seq = 0; seq < results.size() && seq < spec->counters.size(); ++seq) {
        if (results[seq]) {
            spec->counters[seq].n_drafted += (int64_t) results[seq]->size();
        }
    }
}

void common_speculative_draft(dflash2_server_spec * spec) {
    if (!spec) {
        return;
    }
    if (spec->upstream) {
        std::vector<llama_tokens *> results(spec->counters.size(), nullptr);
        for (size_t seq = 0; seq < results.size(); ++seq) {
            const auto & dp = common_speculative_get_draft_params(spec->upstream, (llama_seq_id) seq);
            results[seq] = dp.drafting ? dp.result : nullptr;
        }
        common_speculative_draft(spec->upstream);
        count_drafts(spec, results);
        return;
    }
    auto & requests = spec->requests;
    requests.clear();
    int32_t capacity = 0;
    for (size_t seq = 0; seq < spec->dparams.size(); ++seq) {
        auto & dp = spec->dparams[seq];
        if (!dp.drafting || dp.n_max <= 0 || !dp.result) {
            continue;
        }
        dp.result->clear();
        requests.push_back({ (int32_t) seq, dp.id_last, dp.n_max });
        capacity += dp.n_max;
    }
    if (!requests.empty()) {
        spec->tokens.resize(capacity);
        spec->n_drafted.resize(requests.size());
        const int32_t rc = llama_spec_dflash2_draft(spec->engine, requests.data(), (int32_t) requests.size(),
                spec->tokens.data(), capacity, spec->n_drafted.data());
        if (rc != LLAMA_SPEC_DFLASH2_OK) {
            // no drafts this step: the slots decode their sampled token alone
            LOG_ERR("dflash2 draft: %s: %s\n", llama_spec_dflash2_status_name(rc), llama_spec_dflash2_last_error());
        } else {
            size_t at = 0;
            for (size_t k = 0; k < requests.size(); ++k) {
                auto & dp = spec->dparams[requests[k].seq_id];
                dp.result->assign(spec->tokens.begin() + at, spec->tokens.begin() + at + spec->n_drafted[k]);
                at += spec->n_drafted[k];
            }
        }
    }
    std::vector<llama_tokens *> results(spec->counters.size(), nullptr);
    for (const auto & r : requests) {
        results[r.seq_id] = spec->dparams[r.seq_id].result;
    }
    count_drafts(spec, results);
    for (auto & dp : spec->dparams) {
        dp.drafting = false;
    }
}

void common_speculative_accept(dflash2_server_spec * spec, llama_seq_id seq_id, uint16_t n_accepted) {
    if (!spec) {
        return;
    }
    if (seq_id >= 0 && (size_t) seq_id < spec->counters.size()) {
        auto & c = spec->counters[seq_id];
        c.n_accepted     += n_accepted;
        c.n_verify_steps += 1;
        if (c.accepted_at.size() < n_accepted) {
            c.accepted_at.resize(n_accepted, 0);
        }
        for (uint16_t i = 0; i < n_accepted; ++i) {
            c.accepted_at[i] += 1;
        }
    }
    if (spec->upstream) {
        common_speculative_accept(spec->upstream, seq_id, n_accepted);
        return;
    }
    const int32_t rc = llama_spec_dflash2_accept(spec->engine, seq_id, n_accepted);
    if (rc != LLAMA_SPEC_DFLASH2_OK) {
        LOG_ERR("dflash2 accept: %s: %s\n", llama_spec_dflash2_status_name(rc), llama_spec_dflash2_last_error());
    }
    snapshot_stats(spec->engine);
}

bool common_speculative_get_state(dflash2_server_spec * spec, llama_seq_id seq_id, std::vector<uint8_t> & data) {
    if (!spec) {
        return false;
    }
    if (spec->upstream) {
        return common_speculative_get_state(spec->upstream, seq_id, data);
    }
    data.clear();
    dflash2_server_state_save(spec, nullptr, seq_id, data);
    return !data.empty();
}

void common_speculative_set_state(dflash2_server_spec * spec, llama_seq_id seq_id, const std::vector<uint8_t> & data) {
    if (!spec) {
        return;
    }
    if (spec->upstream) {
        common_speculative_set_state(spec->upstream, seq_id, data);
        return;
    }
    dflash2_server_state_load(spec->ctx_tgt, seq_id, data);
}

void common_speculative_print_stats(const dflash2_server_spec * spec) {
    if (!spec) {
        return;
    }
    if (spec->upstream) {
        common_speculative_print_stats(spec->upstream);
        return;
    }
    llama_spec_dflash2_stats s;
    if (llama_spec_dflash2_get_stats(spec->engine, &s) != LLAMA_SPEC_DFLASH2_OK) {
        return;
    }
    std::string per_pos;
    const int32_t n_max = llama_spec_dflash2_n_max(spec->engine);
    for (int32_t i = 0; i < n_max && i < LLAMA_SPEC_DFLASH2_MAX_DRAFT && s.drafted_at[i] > 0; ++i) {
        per_pos += string_format("%s%.3f", i ? ", " : "", (double) s.accepted_at[i] / s.drafted_at[i]);
    }
    LOG_INF("dflash2: drafts %llu, drafted %llu, accepted %llu (%.1f%%), acceptance by position (%s)\n",
            (unsigned long long) s.n_drafts, (unsigned long long) s.n_drafted, (unsigned long long) s.n_accepted,
            s.n_drafted ? 100.0 * s.n_accepted / s.n_drafted : 0.0, per_pos.c_str());
    LOG_INF("dflash2: injected %llu rows in %llu decodes (%.1f ms), draft decodes %.1f ms, walks %.1f ms, "
            "rejected rows kept out %llu\n",
            (unsigned long long) s.n_injected, (unsigned long long) s.n_inject_decodes, s.t_inject_us / 1e3,
            s.t_draft_us / 1e3, s.t_walk_us / 1e3, (unsigned long long) s.n_rejected_rows);
}

int32_t common_speculative_n_max(const dflash2_server_spec * spec) {
    if (!spec) {
        return 0;
    }
    if (spec->upstream) {
        return common_speculative_n_max(spec->upstream);
    }
    return llama_spec_dflash2_n_max(spec->engine);
}

const std::vector<double> & common_speculative_get_synth_probs(const dflash2_server_spec * spec) {
    static const std::vector<double> none;
    return spec && spec->upstream ? common_speculative_get_synth_probs(spec->upstream) : none;
}

void dflash2_server_memory::seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) const {
    common_memory::seq_rm(seq_id, p0, p1);
    if (llama_spec_dflash2 * engine = engine_for(ctx_tgt)) {
        check(llama_spec_dflash2_seq_rm(engine, seq_id, p0, p1), "seq_rm");
    }
}

void dflash2_server_memory::seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos delta) const {
    common_memory::seq_add(seq_id, p0, p1, delta);
    if (llama_spec_dflash2 * engine = engine_for(ctx_tgt)) {
        check(llama_spec_dflash2_seq_shift(engine, seq_id, p0, p1, delta), "seq_shift");
    }
}

void dflash2_server_memory::seq_cp(llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1) const {
    common_memory::seq_cp(seq_id_src, seq_id_dst, p0, p1);
    if (llama_spec_dflash2 * engine = engine_for(ctx_tgt)) {
        check(llama_spec_dflash2_seq_cp(engine, seq_id_src, seq_id_dst, p0, p1), "seq_cp");
    }
}

size_t dflash2_server_state_size(const dflash2_server_spec * spec, llama_context * ctx_dft, llama_seq_id seq_id) {
    if (spec && spec->engine) {
        size_t size = 0;
        return llama_spec_dflash2_state_size(spec->engine, seq_id, &size) == LLAMA_SPEC_DFLASH2_OK ? size : 0;
    }
    return ctx_dft ? llama_state_seq_get_size_ext(ctx_dft, seq_id, LLAMA_STATE_SEQ_FLAGS_NONE) : 0;
}

void dflash2_server_state_save(const dflash2_server_spec * spec, llama_context * ctx_dft, llama_seq_id seq_id,
        std::vector<uint8_t> & dst) {
    if (spec && spec->engine) {
        size_t size = 0;
        if (llama_spec_dflash2_state_size(spec->engine, seq_id, &size) != LLAMA_SPEC_DFLASH2_OK) {
            LOG_WRN("dflash2: not saving the draft state of sequence %d: %s\n", seq_id, llama_spec_dflash2_last_error());
            dst.clear();
            return;
        }
        dst.resize(size);
        size_t written = 0;
        if (llama_spec_dflash2_state_get(spec->engine, seq_id, dst.data(), dst.size(), &written) !=
                LLAMA_SPEC_DFLASH2_OK) {
            LOG_WRN("dflash2: not saving the draft state of sequence %d: %s\n", seq_id, llama_spec_dflash2_last_error());
            dst.clear();
            return;
        }
        dst.resize(written);
        return;
    }
    if (ctx_dft) {
        llama_state_seq_get_data_ext(ctx_dft, dst.data(), dst.size(), seq_id, LLAMA_STATE_SEQ_FLAGS_NONE);
    }
}

bool dflash2_server_state_load(llama_context * ctx_tgt, llama_seq_id seq_id, const std::vector<uint8_t> & data) {
    llama_spec_dflash2 * engine = engine_for(ctx_tgt);
    if (!engine) {
        return false;
    }
    if (data.empty() || llama_spec_dflash2_state_set(engine, seq_id, data.data(), data.size()) != LLAMA_SPEC_DFLASH2_OK) {
        // the draft starts over for this sequence; outputs do not depend on it
        LOG_WRN("dflash2: draft state of sequence %d not restored: %s\n", seq_id,
                data.empty() ? "none saved" : llama_spec_dflash2_last_error());
        llama_spec_dflash2_seq_clear(engine, seq_id);
    }
    return true;
}

void dflash2_server_slot_file_save(const dflash2_server_spec * spec, llama_seq_id seq_id, const std::string & path) {
    if (!spec || !spec->engine) {
        return;
    }
    std::vector<uint8_t> blob;
    dflash2_server_state_save(spec, nullptr, seq_id, blob);
    const std::string path_draft = path + ".dflash2";
    FILE * f = std::fopen(path_draft.c_str(), "wb");
    if (!f || std::fwrite(blob.data(), 1, blob.size(), f) != blob.size()) {
        LOG_WRN("dflash2: cannot write the draft state to %s\n", path_draft.c_str());
    }
    if (f) {
        std::fclose(f);
    }
}

void dflash2_server_slot_file_load(llama_context * ctx_tgt, llama_seq_id seq_id, const std::string & path) {
    if (!engine_for(ctx_tgt)) {
        return;
    }
    std::vector<uint8_t> blob;
    const std::string path_draft = path + ".dflash2";
    if (FILE * f = std::fopen(path_draft.c_str(), "rb")) {
        uint8_t buf[1 << 16];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
            blob.insert(blob.end(), buf, buf + n);
        }
        std::fclose(f);
    }
    dflash2_server_state_load(ctx_tgt, seq_id, blob);
}

std::string dflash2_server_slot_json(const dflash2_server_spec * spec, llama_seq_id seq_id) {
    if (!spec || seq_id < 0 || (size_t) seq_id >= spec->counters.size()) {
        return "{}";
    }
    const auto & c = spec->counters[seq_id];
    std::string per_pos;
    for (size_t i = 0; i < c.accepted_at.size(); ++i) {
        per_pos += string_format("%s%lld", i ? ", " : "", (long long) c.accepted_at[i]);
    }
    return string_format("{\"engine\": \"%s\", \"n_drafted\": %lld, \"n_accepted\": %lld, \"n_verify_steps\": %lld, "
            "\"accepted_at\": [%s]}", spec->engine ? "dflash2" : "upstream", (long long) c.n_drafted,
            (long long) c.n_accepted, (long long) c.n_verify_steps, per_pos.c_str());
}

std::string dflash2_server_metrics() {
    llama_spec_dflash2_stats s;
    int32_t n_max = 0;
    {
        std::lock_guard<std::mutex> lock(g_stats_mutex);
        s     = g_stats;
        n_max = g_stats_n_max;
    }
    if (n_max <= 0) {
        return "";
    }
    std::string out;
    auto counter = [&](const char * name, const char * help, double value) {
        out += string_format("# HELP llamacpp:%s %s\n# TYPE llamacpp:%s counter\nllamacpp:%s %g\n", name, help, name,
                name, value);
    };
    counter("dflash2_drafts_total", "dflash2 drafts that proposed at least one token", (double) s.n_drafts);
    counter("dflash2_drafted_tokens_total", "dflash2 drafted tokens", (double) s.n_drafted);
    counter("dflash2_accepted_tokens_total", "dflash2 drafted tokens the target accepted", (double) s.n_accepted);
    counter("dflash2_injected_rows_total", "target rows injected into the draft KV", (double) s.n_injected);
    counter("dflash2_rejected_rows_total", "verify rows kept out of the draft KV", (double) s.n_rejected_rows);
    counter("dflash2_draft_decode_seconds_total", "time in noise-block decodes", s.t_draft_us / 1e6);
    counter("dflash2_inject_seconds_total", "time in injection decodes", s.t_inject_us / 1e6);
    out += "# HELP llamacpp:dflash2_drafted_at drafts that proposed a token at draft position pos\n"
           "# TYPE llamacpp:dflash2_drafted_at counter\n";
    for (int32_t i = 0; i < n_max && i < LLAMA_SPEC_DFLASH2_MAX_DRAFT; ++i) {
        out += string_format("llamacpp:dflash2_drafted_at{pos=\"%d\"} %llu\n", i + 1, (unsigned long long) s.drafted_at[i]);
    }
    out += "# HELP llamacpp:dflash2_accepted_at drafts whose token at draft position pos was accepted\n"
           "# TYPE llamacpp:dflash2_accepted_at counter\n";
    for (int32_t i = 0; i < n_max && i < LLAMA_SPEC_DFLASH2_MAX_DRAFT; ++i) {
        out += string_format("llamacpp:dflash2_accepted_at{pos=\"%d\"} %llu\n", i + 1, (unsigned long long) s.accepted_at[i]);
    }
    return out;
}
