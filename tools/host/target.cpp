#include "dflash2.hpp"
#include "host.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <thread>
#include <cstdio>
#include <fstream>
#include <stdexcept>

int64_t host_time_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t host_cpu_time_us() {
    timespec ts = {};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void host_log_errors_only(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

void host_init_backend() {
    host_exit_on_backend_abort();
    llama_log_set(host_log_errors_only, nullptr);
    llama_spec_dflash2_log_set(host_log_errors_only, nullptr);
    llama_backend_init();
}

std::string host_json_str(const std::string & s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else if ((unsigned char) c < 0x20) {
            char buf[8];
            snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

std::vector<std::vector<llama_token>> host_tokenize_chats(const host_target & tgt, const std::vector<std::string> & msgs) {
    std::vector<std::vector<llama_token>> out;
    for (const auto & m : msgs) {
        out.push_back(tgt.tokenize_chat(m));
    }
    return out;
}

host_target::host_target(const host_params & params) : params(params) {
    host_add_rpc_servers(params.rpc);
    target_placement.has_devices  = !params.devices.empty();
    target_placement.devices      = host_parse_devices("--device", params.devices.empty() ? "none" : params.devices);
    target_placement.n_gpu_layers = params.n_gpu_layers;
    target_placement.split_mode   = host_parse_split_mode(params.split_mode);
    target_placement.tensor_split = host_parse_tensor_split(params.tensor_split);
    draft_placement.has_devices  = !params.draft_devices.empty();
    draft_placement.devices      = host_parse_devices("--draft-device", params.draft_devices.empty() ? "none" : params.draft_devices);
    draft_placement.n_gpu_layers = params.draft_ngl;

    llama_model_params mparams = llama_model_default_params();
    target_placement.apply(mparams);
    // ggml's AMX repack path segfaults on some CPUs with this Q4_1 target
    mparams.use_extra_bufts = false;
    model = llama_model_load_from_file(params.path_target.c_str(), mparams);
    if (!model) {
        throw std::runtime_error("cannot load the target " + params.path_target);
    }
    vocab   = llama_model_get_vocab(model);
    n_vocab = llama_vocab_n_tokens(vocab);
    reset_context();
}

host_target::host_target(const host_target & other, int) : params(other.params) {
    target_placement = other.target_placement;
    draft_placement  = other.draft_placement;
    model      = other.model;
    vocab      = other.vocab;
    n_vocab    = other.n_vocab;
    owns_model = false;
    reset_context();
}

host_target::~host_target() {
    llama_free(ctx);
    if (owns_model) {
        llama_model_free(model);
    }
}

void host_fit_context(host_target & tgt, const std::vector<std::vector<llama_token>> & prompts, int32_t np,
        int32_t rows_per_step) {
    if (tgt.params.n_ctx > 0) {
        return;
    }
    size_t longest = 0;
    for (const auto & p : prompts) {
        longest = std::max(longest, p.size());
    }
    int64_t cells = (int64_t) std::max(np, 1) * ((int64_t) longest + (int64_t) tgt.params.n_predict * rows_per_step);
    if (tgt.params.refill && np > 1) {
        // a refilled slot's cells stay until the run ends (host_refill_slot): every prompt's
        cells = 0;
        for (const auto & p : prompts) {
            cells += (int64_t) p.size() + (int64_t) tgt.params.n_predict * rows_per_step;
        }
    }
    tgt.params.n_ctx = (int32_t) std::min<int64_t>(std::max<int64_t>(HOST_MIN_CTX, (cells + 255) / 256 * 256), 1 << 20);
}

int32_t host_target::n_ubatch() const {
    if (params.n_ubatch > 0) {
        return std::min(params.n_ubatch, params.n_batch);
    }
    // T = 0 identity: verify batches on the kernels of one-token decoding (see
    // LLAMA_SPEC_DFLASH2_CPU_IDENTICAL_N_UBATCH)
    if (cpu_attention_by_rows()) {
        return std::min((int32_t) LLAMA_SPEC_DFLASH2_CPU_IDENTICAL_N_UBATCH, params.n_batch);
    }
    return params.n_batch;
}

bool host_target::cpu_attention_by_rows() const {
    // q8_0/q4_0 caches take neither the tiled nor the split kernel
    const auto f16_or_f32 = [](ggml_type t) { return t == GGML_TYPE_F16 || t == GGML_TYPE_F32; };
    return target_placement.cpu_only() && f16_or_f32(params.cache_type_k) && params.cache_type_k == params.cache_type_v;
}

void host_target::reset_context(int32_t n_seq, int32_t n_seq_ids) {
    if (n_seq > 0) {
        params.n_seq = n_seq;
    }
    llama_free(ctx);
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = params.n_ctx > 0 ? params.n_ctx : HOST_MIN_CTX;
    cparams.n_batch         = params.n_batch;
    cparams.n_ubatch        = n_ubatch();
    // a unified cache under a refill schedule keeps a finished stream's cells under one id more:
    // freed, they would be reused below other sequences' cells, out of their position order
    // (ggml's CPU attention accumulates in cell order: target-only's rounding)
    retired_seq             = n_seq_ids > 0 && refills() ? n_seq_ids : -1;
    cparams.n_seq_max       = n_seq_ids > 0 ? n_seq_ids + (retired_seq >= 0 ? 1 : 0) : params.n_seq;
    cparams.n_threads       = params.n_threads;
    cparams.n_threads_batch = params.n_threads;
    cparams.kv_unified      = params.n_seq == 1 || n_seq_ids > 0;
    cparams.no_perf         = false;
    cparams.type_k          = params.cache_type_k;
    cparams.type_v          = params.cache_type_v;
    // a recurrent or hybrid target (qwen35, ...) rolls the rejected drafts of a
    // verify batch back through this many state snapshots; drafts never exceed n_max
    if (llama_model_is_recurrent(model) || llama_model_is_hybrid(model)) {
        cparams.n_rs_seq = (uint32_t) params.n_max;
    }
    ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        throw std::runtime_error("cannot create the target context");
    }
}

std::string host_target::chat_text(const std::string & user_message) const {
    std::string text = user_message;
    const char * tmpl = llama_model_chat_template(model, nullptr);
    if (tmpl) {
        llama_chat_message msg = { "user", user_message.c_str() };
        std::vector<char> buf(user_message.size() * 2 + 1024);
        int32_t n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), (int32_t) buf.size());
        if (n > (int32_t) buf.size()) {
            buf.resize(n);
            n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), (int32_t) buf.size());
        }
        if (n > 0) {
            text.assign(buf.data(), n);
        }
    }
    return text;
}

std::vector<llama_token> host_target::tokenize_chat(const std::string & user_message) const {
    const std::string text = chat_text(user_message);
    const char * tmpl = llama_model_chat_template(model, nullptr);
    std::vector<llama_token> tokens(text.size() + 16);
    const int32_t n = llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), tokens.data(), (int32_t) tokens.size(),
            /*add_special*/ tmpl == nullptr, /*parse_special*/ true);
    if (n < 0) {
        throw std::runtime_error("tokenization failed");
    }
    tokens.resize(n);
    return tokens;
}

std::string host_target::detokenize(const std::vector<llama_token> & tokens) const {
    std::string out;
    char buf[256];
    for (llama_token id : tokens) {
        const int32_t n = llama_token_to_piece(vocab, id, buf, sizeof(buf), 0, false);
        if (n > 0) {
            out.append(buf, n);
        }
    }
    return out;
}

void host_target::decode(common_batch & batch, int32_t n_unpriced) {
    if (!try_decode(batch, n_unpriced)) {
        throw std::runtime_error("target decode failed: 1 (no KV cells for the batch: raise --ctx-size)");
    }
}

bool host_target::try_decode(common_batch & batch, int32_t n_unpriced) {
    const auto start = std::chrono::steady_clock::now();
    const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    if (rc == 1) {
        return false;
    }
    if (rc != 0) {
        throw std::runtime_error("target decode failed: " + std::to_string(rc));
    }
    // a device backend returns before the decode is done: wait here, so the time
    // counts as the target's and not as whatever reads its results first
    llama_synchronize(ctx);
    // the cost world: the floor (GPU-like), or a curve's time for the batch's rows less those only
    // this CPU decodes; a decode that took longer is counted (the world did not hold there), the
    // rest of a shorter one slept
    const int32_t n_rows   = batch.size();
    const int32_t n_priced = std::max(1, n_rows - n_unpriced);
    double world_ms = params.target_min_ms;
    if (params.cost_curve) {
        world_ms = std::max(world_ms, params.cost_base_ms * params.cost_curve->at(n_priced));
    }
    counts.decodes += 1;
    counts.rows    += n_rows;
    counts.priced  += n_priced;
    if (world_ms > 0.0) {
        const auto until = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                std::chrono::duration<double, std::milli>(world_ms));
        if (std::chrono::steady_clock::now() > until) {
            counts.over += 1;
        } else {
            std::this_thread::sleep_until(until);
        }
    }
    return true;
}

llama_token host_target::argmax(int32_t i_batch) const {
    const float * logits = llama_get_logits_ith(ctx, i_batch);
    llama_token best = 0;
    for (llama_token i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

const std::vector<std::string> & host_builtin_prompts() {
    static const std::vector<std::string> prompts = {
        "Write a Python function that checks whether a string is a palindrome.",
        "What is 48 multiplied by 12? Show the steps.",
        "Write a short paragraph about the history of the bicycle.",
        "List five fruits that are rich in vitamin C.",
        "Return a JSON object describing a book with title, author and year.",
        "Explain what a hash table is in two sentences.",
        "Write a C function that returns the maximum of an integer array.",
        "Give three tips for writing clear emails.",
    };
    return prompts;
}

std::vector<std::string> host_read_prompts(const std::string & path) {
    std::ifstream in(path);
    if (!in) {
        throw std::runtime_error("cannot read prompts from " + path);
    }
    std::vector<std::string> prompts;
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty()) {
            prompts.push_back(line);
        }
    }
    return prompts;
}
