#include "args.h"

#include <algorithm>
#include <stdexcept>

namespace {

int32_t to_int(const std::string & flag, const std::string & value, int32_t min) {
    size_t used = 0;
    long v = 0;
    try {
        v = std::stol(value, &used);
    } catch (const std::exception &) {
        used = 0;
    }
    if (used != value.size() || v < min || v > 1 << 30) {
        throw std::runtime_error(flag + " needs an integer >= " + std::to_string(min) + ", got '" + value + "'");
    }
    return (int32_t) v;
}

float to_temp(const std::string & flag, const std::string & value) {
    size_t used = 0;
    float v = -1.0f;
    try {
        v = std::stof(value, &used);
    } catch (const std::exception &) {
        used = 0;
    }
    if (used != value.size() || !(v >= 0.0f && v <= 100.0f)) {
        throw std::runtime_error(flag + " needs a number in [0, 100], got '" + value + "'");
    }
    return v;
}

float to_unit(const std::string & flag, const std::string & value) {
    const float v = to_temp(flag, value);
    if (v > 1.0f) {
        throw std::runtime_error(flag + " needs a number in [0, 1], got '" + value + "'");
    }
    return v;
}

// a KV cache type by ggml's name (f16, q8_0, ...), as llama.cpp's -ctk / -ctv take it
ggml_type to_cache_type(const std::string & flag, const std::string & value) {
    static const ggml_type allowed[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0,
        GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_IQ4_NL, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1 };
    std::string names;
    for (ggml_type t : allowed) {
        if (value == ggml_type_name(t)) {
            return t;
        }
        names += std::string(names.empty() ? "" : ", ") + ggml_type_name(t);
    }
    throw std::runtime_error(flag + " takes one of " + names + ", not '" + value + "'");
}

} // namespace

std::vector<int32_t> host_parse_int_list(const std::string & flag, const std::string & list) {
    std::vector<int32_t> out;
    size_t start = 0;
    while (start <= list.size()) {
        const size_t comma = list.find(',', start);
        const size_t end   = comma == std::string::npos ? list.size() : comma;
        out.push_back(to_int(flag, list.substr(start, end - start), 1));
        if (comma == std::string::npos) {
            break;
        }
        start = comma + 1;
    }
    return out;
}

const char * host_args_usage() {
    return "target, drafter, prompts\n"
           "  --target PATH  --draft PATH   the target and the DFlash2 drafter (GGUF)\n"
           "  --prompt TEXT (repeatable)  --prompts FILE (a user message per line)\n"
           "  --image FILE --mmproj FILE    an image before the first prompt's text, and the target's projector\n"
           "generation\n"
           "  --n-predict N  tokens per prompt (128)     --n-max N  most tokens per draft (7)\n"
           "  --n-min N      drafts (greedy trees: their depth) shorter than N are dropped (0; llama.cpp's --draft-min)\n"
           "  --np N[,N..]   sequences in parallel (1)   --threads N (2)   --ctx-size N (what a run's trees park)\n"
           "  --schedule waves|refill  np prompts at a time, the next np when all finished (waves); or each slot\n"
           "                 taking the next prompt as soon as its stream finishes, as a server does (refill)\n"
           "  -ub N          rows per target decode step: llama_decode splits larger batches (default 63 on a CPU\n"
           "                 target with an f16/f32 cache: T = 0 identity, docs/bench.md; else -b)\n"
           "  -ctk, -ctv T   the target's KV cache types (f16; q8_0 attends rows alike in any batch on the CPU)\n"
           "  --target-min-ms D  every target decode takes at least D ms: a big target's nearly free verify rows\n"
           "sampling (default greedy)\n"
           "  --temp T (0)  --seed S (0; prompt i uses S + i)  --top-k N --top-p P --min-p P (off; the server's:\n"
           "                40, 0.95, 0.05)  dflash2's sampled drafts: --draft-temp auto|temp|T (auto)\n"
           "  --truncate-q on|off (on: q cut like p for chains and trees of up to 15 nodes)\n"
           "  --adapt-sampled on|off (on)  --first-child drawn|greedy (greedy in trees of 16+ nodes, else drawn)\n"
           "dflash2's drafter\n"
           "  --draft-graph own|libllama    the library's own forward (default) or libllama's dflash graph\n"
           "  --ngram-branches N            n-gram branches per tree draft (the library's, 2; 0: none)\n"
           "  --draft-device LIST  --draft-ngl N  the drafter's devices (default: the target head's) and layers\n"
           "placement (llama.cpp's flags)\n"
           "  --rpc H:P[,H:P]  RPC servers (devices RPC0, RPC1, ..)  --device LIST (none: the CPU; default: GPUs)\n"
           "  -ngl N (all)  -sm none|layer|row|tensor (layer)  -ts F,F  (tensor split: docs/tensor-parallel.md)\n";
}

host_args host_parse_args(int argc, char ** argv, const std::vector<std::string> & value_flags) {
    host_args a;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--help" || flag == "-h") {
            a.help = true;
            continue;
        }
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                throw std::runtime_error(flag + " needs a value");
            }
            return argv[++i];
        };
        if (flag == "--target") {
            a.params.path_target = value();
        } else if (flag == "--draft") {
            a.params.path_draft = value();
        } else if (flag == "--n-max") {
            a.params.n_max = to_int(flag, value(), 1);
        } else if (flag == "--n-min") {
            a.params.n_min = to_int(flag, value(), 0);
        } else if (flag == "--n-predict") {
            a.params.n_predict = to_int(flag, value(), 1);
        } else if (flag == "--np") {
            a.np_list = host_parse_int_list(flag, value());
        } else if (flag == "--schedule") {
            const std::string v = value();
            if (v != "waves" && v != "refill") {
                throw std::runtime_error(flag + " takes waves or refill, not '" + v + "'");
            }
            a.params.refill = v == "refill";
        } else if (flag == "--threads") {
            a.params.n_threads = to_int(flag, value(), 1);
        } else if (flag == "--ctx-size") {
            a.params.n_ctx = to_int(flag, value(), 256);
        } else if (flag == "-ub" || flag == "--ubatch-size") {
            a.params.n_ubatch = to_int(flag, value(), 1);
        } else if (flag == "--mmproj") {
            a.params.path_mmproj = value();
        } else if (flag == "--image") {
            a.params.path_image = value();
        } else if (flag == "--temp") {
            a.params.temp = to_temp(flag, value());
        } else if (flag == "--seed") {
            a.params.seed = to_int(flag, value(), 0);
        } else if (flag == "--target-min-ms") {
            a.params.target_min_ms = to_int(flag, value(), 0);
        } else if (flag == "--ngram-branches") {
            a.params.ngram_branches = to_int(flag, value(), 0);
        } else if (flag == "--first-child") {
            const std::string v = value();
            if (v != "greedy" && v != "drawn") {
                throw std::runtime_error(flag + " takes greedy or drawn, not '" + v + "'");
            }
            a.params.first_child = v == "greedy" ? LLAMA_SPEC_DFLASH2_FIRST_CHILD_GREEDY : LLAMA_SPEC_DFLASH2_FIRST_CHILD_DRAWN;
        } else if (flag == "--draft-temp") {
            const std::string v = value();
            a.params.draft_temp = v == "auto" ? -1.0f : v == "temp" ? HOST_DRAFT_TEMP_TEMP : to_temp(flag, v);
        } else if (flag == "--top-k") {
            a.params.top_k = to_int(flag, value(), 0);
        } else if (flag == "--top-p") {
            a.params.top_p = to_unit(flag, value());
        } else if (flag == "--min-p") {
            a.params.min_p = to_unit(flag, value());
        } else if (flag == "--truncate-q") {
            const std::string v = value();
            if (v != "on" && v != "off") {
                throw std::runtime_error(flag + " takes on or off, not '" + v + "'");
            }
            a.params.truncate_q = v == "on";
        } else if (flag == "--adapt-sampled") {
            const std::string v = value();
            if (v != "on" && v != "off") {
                throw std::runtime_error(flag + " takes on or off, not '" + v + "'");
            }
            a.params.adapt_sampled = v == "on" ? 1 : 0;
        } else if (flag == "--draft-graph") {
            const std::string v = value();
            if (v != "own" && v != "libllama") {
                throw std::runtime_error(flag + " takes own or libllama, not '" + v + "'");
            }
            a.params.draft_graph = v == "own" ? LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_OWN : LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_LIBLLAMA;
        } else if (flag == "-ctk" || flag == "--cache-type-k") {
            a.params.cache_type_k = to_cache_type(flag, value());
        } else if (flag == "-ctv" || flag == "--cache-type-v") {
            a.params.cache_type_v = to_cache_type(flag, value());
        } else if (flag == "--rpc") {
            a.params.rpc = value();
        } else if (flag == "--device" || flag == "-dev") {
            a.params.devices = value();
        } else if (flag == "-ngl" || flag == "--n-gpu-layers") {
            a.params.n_gpu_layers = to_int(flag, value(), 0);
        } else if (flag == "-sm" || flag == "--split-mode") {
            a.params.split_mode = value();
            host_parse_split_mode(a.params.split_mode);
        } else if (flag == "-ts" || flag == "--tensor-split") {
            a.params.tensor_split = value();
            host_parse_tensor_split(a.params.tensor_split);
        } else if (flag == "--draft-device" || flag == "-devd") {
            a.params.draft_devices = value();
        } else if (flag == "--draft-ngl" || flag == "-ngld") {
            a.params.draft_ngl = to_int(flag, value(), 0);
        } else if (flag == "--prompt") {
            a.prompts.push_back(value());
        } else if (flag == "--prompts") {
            for (auto & p : host_read_prompts(value())) {
                a.prompts.push_back(p);
            }
        } else if (std::find(value_flags.begin(), value_flags.end(), flag) != value_flags.end()) {
            a.values[flag] = value();
        } else {
            a.flags.push_back(flag);
        }
    }
    if (a.np_list.empty()) {
        a.np_list = { 1 };
    }
    a.params.n_seq = *std::max_element(a.np_list.begin(), a.np_list.end());
    if (a.help) {
        return a;
    }
    if (a.params.path_target.empty() || a.params.path_draft.empty()) {
        throw std::runtime_error("--target and --draft are required");
    }
    if (a.params.path_image.empty() != a.params.path_mmproj.empty()) {
        throw std::runtime_error("--image and --mmproj go together");
    }
    return a;
}
