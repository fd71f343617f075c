// What the tap-layer capture costs a target decode: two contexts on the same
// target model, one plain, one with a dflash2 engine attached (the engine turns
// on the capture of its drafter's tap layers and is otherwise never called),
// decode the same tokens at the same positions, alternately (the order flips
// every iteration), so that the machine's load falls on both alike. Prints per
// batch size the median and spread of the decode times, and the bytes copied
// out per decode.
//
//   dflash2-capture-cost --target T.gguf --draft D.gguf [--threads N] [--n-predict ITERS] [--rows 1,8]
#include "args.h"
#include "dflash2.hpp"
#include "host.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>

namespace {

struct spread {
    double p10, median, p90;
};

spread percentiles(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    auto at = [&](double q) { return v[(size_t) (q * (double) (v.size() - 1))]; };
    return { at(0.1), at(0.5), at(0.9) };
}

llama_context * make_context(llama_model * model, const host_params & p) {
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = p.n_ctx;
    cparams.n_batch         = p.n_batch;
    cparams.n_ubatch        = p.n_batch;
    cparams.n_seq_max       = 1;
    cparams.n_threads       = p.n_threads;
    cparams.n_threads_batch = p.n_threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        throw std::runtime_error("cannot create a target context");
    }
    return ctx;
}

// decodes rows tokens at n_past.. of sequence 0, all with logits; microseconds
double timed_decode(llama_context * ctx, const std::vector<llama_token> & tokens, llama_pos n_past) {
    common_batch batch(ctx);
    for (size_t i = 0; i < tokens.size(); ++i) {
        batch.add(tokens[i], n_past + (llama_pos) i, 0, true);
    }
    const int64_t t = host_time_us();
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get()) != 0) {
        throw std::runtime_error("decode failed");
    }
    llama_synchronize(ctx);
    return (double) (host_time_us() - t);
}

} // namespace

int main(int argc, char ** argv) {
    try {
        host_args args = host_parse_args(argc, argv, { "--rows" });
        const std::vector<int32_t> rows_list =
                host_parse_int_list("--rows", args.values.count("--rows") ? args.values["--rows"] : "1,8");
        const int iters = args.params.n_predict;
        host_init_backend();
        host_target tgt(args.params); // owns the model (its own context stays idle)
        llama_context * plain   = make_context(tgt.model, args.params);
        llama_context * capture = make_context(tgt.model, args.params);
        dflash2::params dp = dflash2::default_params();
        dp.n_threads = dp.n_threads_batch = args.params.n_threads;
        auto engine = std::make_unique<dflash2::engine>(capture, args.params.path_draft, dp);

        const std::vector<llama_token> prompt = tgt.tokenize_chat(
                args.prompts.empty() ? "Describe how a hash table works to a beginner programmer." : args.prompts[0]);
        const int32_t n_embd = llama_model_n_embd(tgt.model);
        llama_spec_dflash2_checkpoint_info info = {};
        if (llama_spec_dflash2_checkpoint_check(args.params.path_draft.c_str(), tgt.model, &info) != 0) {
            throw std::runtime_error(llama_spec_dflash2_last_error());
        }
        const int n_taps = (int) info.n_target_layers;
        printf("target %s, %d threads, %d iterations per row count, prompt %zu tokens, n_embd %d\n",
                args.params.path_target.c_str(), args.params.n_threads, iters, prompt.size(), n_embd);
        for (int32_t rows : rows_list) {
            for (llama_context * ctx : { plain, capture }) {
                llama_memory_clear(llama_get_memory(ctx), true);
                timed_decode(ctx, prompt, 0);
            }
            std::vector<double> t_plain, t_capture, t_diff;
            llama_pos n_past = (llama_pos) prompt.size();
            std::vector<llama_token> tokens(rows, prompt.back());
            for (int it = 0; it < iters; ++it) {
                // a window of 256 positions after the prompt: the KV length stays comparable
                if (n_past + rows > (llama_pos) prompt.size() + 256) {
                    n_past = (llama_pos) prompt.size();
                    for (llama_context * ctx : { plain, capture }) {
                        llama_memory_seq_rm(llama_get_memory(ctx), 0, n_past, -1);
                    }
                }
                double a, b;
                if (it % 2 == 0) {
                    a = timed_decode(plain, tokens, n_past);
                    b = timed_decode(capture, tokens, n_past);
                } else {
                    b = timed_decode(capture, tokens, n_past);
                    a = timed_decode(plain, tokens, n_past);
                }
                t_plain.push_back(a);
                t_capture.push_back(b);
                t_diff.push_back(b - a);
                tokens.assign(rows, prompt[(size_t) it % prompt.size()]);
                n_past += rows;
            }
            const spread p = percentiles(t_plain), c = percentiles(t_capture), d = percentiles(t_diff);
            printf("rows %2d: plain   %8.0f us median [p10 %.0f, p90 %.0f]\n", rows, p.median, p.p10, p.p90);
            printf("         capture %8.0f us median [p10 %.0f, p90 %.0f]\n", c.median, c.p10, c.p90);
            printf("         paired difference capture - plain: median %+.0f us (%+.1f%%) [p10 %+.0f, p90 %+.0f]; "
                   "%d tap layers, %zu bytes copied out per decode\n",
                    d.median, 100.0 * d.median / p.median, d.p10, d.p90, n_taps,
                    (size_t) n_taps * n_embd * rows * sizeof(float));
        }
        llama_free(plain);
        // the engine turns its capture off on the context it was created on: free it first
        engine.reset();
        llama_free(capture);
        return 0;
    } catch (const std::exception & e) {
        fprintf(stderr, "dflash2-capture-cost: %s\n%s  --rows LIST       tokens per decode (default 1,8)\n", e.what(),
                host_args_usage());
        return 2;
    }
}
