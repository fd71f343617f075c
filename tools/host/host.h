// A host of speculative decoding over libllama, the way llama-server drives it:
// a target model and context, sequences decoded in parallel, one draft call for
// every generating sequence, one target batch verifying all drafts, acceptance,
// rollback of the rejected tail. The drafter is pluggable: none (target only),
// llama.cpp's own draft-dflash (libllama-common), or dflash2.
//
// Temperature 0: greedy target, drafts kept while they match the argmax.
// Temperature T > 0: the target samples from p = the llama.cpp sampler chain
// { temp(T), dist(seed) } (temperature only: no top-k/top-p/min-p/penalties), one
// chain per prompt seeded with seed + prompt index. Target-only samples each
// token from it; upstream drafts greedily and keeps a drafted token while the
// token sampled at its position equals it (llama.cpp's sample-and-match, so its
// output equals target-only's token for token); dflash2 drafts by sampling the
// lattice and verifies losslessly with rejection sampling (verify_sampled_step);
// its tree modes draw sampled trees and verify them node by node with the tree
// form of that rule (verify_tree_sampled_step).
#pragma once

#include "common.h"
#include "devices.h"
#include "dflash2.hpp"
#include "llama.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// a cost world's curve (cost-world.cpp): the relative time of one target decode by its
// total rows (all sequences together), rows 1 = 1.0, read from a curve file
struct host_cost_curve {
    std::string name; // "# name:" of the file, else its stem
    std::string path;
    std::vector<std::pair<int32_t, double>> points; // rows strictly increasing from 1, times non-decreasing

    // linear between points; past the last, along the last segment's slope
    double at(int32_t rows) const;
};

struct host_params {
    std::string path_target;
    std::string path_draft;

    int32_t n_ctx     = 0;   // target KV cells (--ctx-size; 0: host_fit_context, at least 4096)
    int32_t n_batch   = 512;
    int32_t n_ubatch  = 0;   // rows per target decode step (-ub; 0: host_target::n_ubatch()): llama_decode splits larger batches
    int32_t n_threads = 2;
    int32_t n_seq     = 1;   // sequences decoded in parallel
    int32_t n_max     = 7;   // most tokens per draft
    int32_t n_min     = 0;   // shorter drafts (greedy trees: shallower) are dropped
    int32_t n_predict = 128; // tokens generated per sequence (fewer when it ends)
    // --schedule refill: at np > 1 a slot takes the next prompt as soon as its stream finishes
    // (a server's continuous batching); false: waves of np prompts, the next when all finished
    bool refill = false;

    std::string path_mmproj; // multimodal projector (--mmproj), for --image
    std::string path_image;  // an image put before the first prompt's text (--image)
    float   temp      = 0.0f; // target sampling temperature (0: greedy)
    int32_t seed      = 0;    // sampling seed (of the first prompt; prompt i uses seed + i)
    float   draft_temp = -1.0f; // dflash2's sampled draft temperature (-1: the library's; HOST_DRAFT_TEMP_TEMP: temp)
    int32_t adapt_sampled = -1; // dflash2's params.adapt_sampled_drafts (-1: its default, on; 0: off)
    int32_t draft_graph   = -1; // dflash2's params.draft_graph (-1: its default, own; 0 own; 1 libllama)
    int32_t top_k = 0;    // the target sampler's truncation (0 / 1 / 0: off), before the temperature
    float   top_p = 1.0f;
    float   min_p = 0.0f;
    bool    truncate_q = true; // dflash2's sampled drafts cut q like the sampler cuts p
    int32_t target_min_ms = 0; // every target decode takes at least this long (a slow target whose rows are nearly free)
    // a curve world: a target decode of R rows takes at least cost_base_ms x cost_curve->at(R) (NULL: none)
    std::shared_ptr<const host_cost_curve> cost_curve;
    double                                 cost_base_ms = 0.0;
    int32_t ngram_branches = -1; // dflash2's n-gram branches per tree draft (-1: the library's default, 0: none)
    int32_t first_child = -1; // how dflash2's sampled trees choose each first child (-1: the library's default)
    int32_t ngram_size_n = 0; // llama.cpp's n-gram types: lookup size n and draft size m (0: llama.cpp's defaults)
    int32_t ngram_size_m = 0;
    // the target's KV cache types (-ctk / -ctv, as llama.cpp names them; every mode of a run shares them)
    ggml_type cache_type_k = GGML_TYPE_F16;
    ggml_type cache_type_v = GGML_TYPE_F16;

    // placement, as llama.cpp's options name it: --rpc HOST:PORT,... registers
    // remote devices; the target's --device / -ngl / -sm / -ts; the drafter's
    // --draft-device / --draft-ngl (names resolved once the RPC servers are added)
    std::string rpc;
    std::string devices;          // "" libllama's default, "none" the CPU only
    int32_t     n_gpu_layers = -1; // < 0: all
    std::string split_mode   = "layer";
    std::string tensor_split;
    std::string draft_devices;     // "" the library's default (with the target's head)
    int32_t     draft_ngl    = -1;
};

constexpr int HOST_MAX_DRAFT = 64;
// the target's KV cells at least (host_fit_context)
constexpr int32_t HOST_MIN_CTX = 4096;
// the controller's tree budget per sequence and step when none is asked for, as
// llama-server's (a tree and its anchor: 64 rows)
constexpr int32_t HOST_DEFAULT_TREE_BUDGET = 63;

// --draft-temp temp: the draft temperature is the target's (set explicitly, never the library's choice)
constexpr float HOST_DRAFT_TEMP_TEMP = -2.0f;

// the draft temperature dflash2's requests carry (-1: unset, the library's choice)
inline float host_draft_temp(const host_params & p) {
    return p.draft_temp == HOST_DRAFT_TEMP_TEMP ? p.temp : p.draft_temp;
}

// a dflash2 request with q cut like the target sampler's p (--truncate-q on, the default)
template <typename request> inline request host_truncated(const host_params & p, request r) {
    return p.truncate_q ? dflash2::with_truncation(r, p.top_k, p.top_p, p.min_p) : r;
}

struct host_stats {
    int64_t n_generated  = 0;
    int64_t n_seq_steps  = 0; // verify steps summed over sequences
    int64_t n_drafted    = 0;
    int64_t n_accepted   = 0;
    int64_t drafted_at [HOST_MAX_DRAFT] = {};
    int64_t accepted_at[HOST_MAX_DRAFT] = {};
    // tree modes: nodes drafted at depth j + 1 (summed over steps), and how
    // often each tree shape (nodes per depth, e.g. "3,2,1,1") was drafted
    int64_t nodes_at[HOST_MAX_DRAFT] = {};
    std::map<std::string, int64_t> shapes;
    // tree modes: verify decodes that found the cache full of parked cells (freed, decoded again)
    int64_t n_unparked = 0;
    // tree modes: verify batches whose last ubatch had one row, given a row more (parked) to
    // stay on the one-pass attention kernel of target-only decoding (generate-tree.cpp)
    int64_t n_one_pass_rows = 0;
    // the target's decodes of the generation (verify: every sequence's rows in one batch) and of the
    // prefill, with their rows, and those that took longer than the cost world models (it did not hold)
    int64_t n_verify_decodes  = 0;
    int64_t n_verify_rows     = 0;
    int64_t n_verify_priced   = 0; // the rows a curve world priced (the one-pass rows are not)
    int64_t n_verify_over     = 0;
    int64_t n_prefill_decodes = 0;
    int64_t n_prefill_over    = 0;
    // slots that took the next prompt as their stream finished (--schedule refill)
    int64_t n_refills = 0;

    // the steps in which every stream of a wave of np streams was generating: the tokens they
    // emitted and their wall time (a server whose queue refills each slot as it frees runs in
    // that state; a wave's tail, where finished streams leave rows unused, is left out)
    int64_t n_full_tokens = 0;
    int64_t t_full_us     = 0;

    int64_t t_prefill_us = 0; // prompt decodes and the drafter's processing of them
    int64_t t_total_us   = 0; // generation wall time (prompt excluded)
    int64_t t_cpu_us     = 0; // process CPU time over the same span (all threads; spin-waits included)
    int64_t t_target_us  = 0; // target decodes of the generation (verify)
    int64_t t_process_us = 0; // drafter process() calls after verify decodes
    int64_t t_draft_us   = 0; // drafter draft() calls
    int64_t t_accept_us  = 0; // drafter accept() and seq_rm() calls

    // dflash2 only, generation phase: its own split of the drafter time
    bool    has_split    = false;
    int32_t draft_graph  = -1; // LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_* of the engine (-1: not dflash2)
    int64_t t_inject_us  = 0; // injection decodes
    int64_t t_noise_us   = 0; // noise-block decodes
    int64_t t_walk_us    = 0; // lattice walks
    int64_t t_copy_us    = 0; // copying tap features out of the target
    // dflash2 only: sampled drafts whose draft temperature the library chose, and the sum of
    // their draft temperature / target temperature
    int64_t n_tuned_drafts    = 0;
    double  tuned_ratio_sum   = 0.0;
    // dflash2 only: how its draft graph reads the target's head (1 whole, N slices under -sm
    // tensor, 0 its own head) and the bytes that crossed devices for it (the library's stats)
    int64_t n_noise_decodes        = 0;
    int64_t n_head_slices          = 0;
    int64_t head_bytes_moved       = 0;
    int64_t head_bytes_full_gather = 0;
    int64_t head_bytes_mirrored    = 0;

    int64_t t_drafter_us() const { return t_process_us + t_draft_us + t_accept_us; }

    double tau() const { return n_seq_steps ? (double) (n_accepted + n_seq_steps) / n_seq_steps : 0.0; }
    // rows of a verify decode, all sequences together
    double verify_rows_per_step() const { return n_verify_decodes ? (double) n_verify_rows / n_verify_decodes : 0.0; }
    double tokens_per_s() const { return t_total_us ? 1e6 * n_generated / t_total_us : 0.0; }
    // tokens per second while every slot generates (n_full_tokens)
    double full_tokens_per_s() const { return t_full_us ? 1e6 * n_full_tokens / t_full_us : 0.0; }
    // tokens per CPU second: the work done, much less sensitive than wall time to other
    // processes on the machine (comparable between modes at --threads 1)
    double tokens_per_cpu_s() const { return t_cpu_us ? 1e6 * n_generated / t_cpu_us : 0.0; }
};

// the target model and one context on it
struct host_drafter;

// decodes a prompt the host cannot decode as plain tokens (one with an image):
// its rows go to the target and, after each decode, to the drafter
struct host_prompt_decoder {
    virtual ~host_prompt_decoder() = default;

    // false: prompt i_prompt is plain tokens. true: decoded for sequence seq;
    // n_past receives the position after it, id_last the target's first token
    virtual bool decode(struct host_target & tgt, host_drafter * drafter, size_t i_prompt, llama_seq_id seq,
            llama_pos & n_past, llama_token & id_last) = 0;
};

struct host_target {
    llama_model       * model = nullptr;
    llama_context     * ctx   = nullptr;
    const llama_vocab * vocab = nullptr;
    int32_t             n_vocab = 0;
    host_params         params;

    host_prompt_decoder * prompt_decoder = nullptr; // not owned; NULL: every prompt is plain tokens

    host_placement target_placement;
    host_placement draft_placement; // has_devices false: the drafter's default

    explicit host_target(const host_params & params);
    // another context on `other`'s model (not owned: `other` must outlive it)
    explicit host_target(const host_target & other, int);
    ~host_target();
    host_target(const host_target &) = delete;
    host_target & operator=(const host_target &) = delete;

    bool owns_model = true;

    // every successful decode: its rows, and whether it took longer than the cost world models
    // (the --target-min-ms floor, or a curve world's time): host_generate_waves splits them
    struct decode_counts {
        int64_t decodes = 0;
        int64_t rows    = 0;
        int64_t over    = 0;
        int64_t priced  = 0; // rows a curve world prices: rows less the unpriced ones
    } counts;

    // a fresh context for n_seq parallel sequences (0: keep params.n_seq);
    // drafters attach to it, so each mode gets its own. n_seq_ids > 0: a unified
    // KV cache with that many sequence ids (tree verification), and one more, retired_seq,
    // where a refill schedule runs np > 1 sequences
    void reset_context(int32_t n_seq = 0, int32_t n_seq_ids = 0);
    // the id that holds a finished stream's cells in a unified cache under a refill schedule
    // (host_refill_slot; -1: none, the cells are freed)
    llama_seq_id retired_seq = -1;
    // whether the run refills slots (params.refill at np > 1)
    bool refills() const { return params.refill && params.n_seq > 1; }
    // the target's rows per ubatch: -ub, else LLAMA_SPEC_DFLASH2_CPU_IDENTICAL_N_UBATCH
    // on a CPU target whose f16/f32 cache ggml's attention would tile, else n_batch; at most n_batch
    int32_t n_ubatch() const;
    // a CPU target with an f16/f32 cache: ggml's flash attention picks its kernel by a batch's rows
    // (query rows tiled from 64 on; one row's cells split across the threads from 512 cells on)
    bool cpu_attention_by_rows() const;

    std::string              chat_text(const std::string & user_message) const; // the chat template applied
    std::vector<llama_token> tokenize_chat(const std::string & user_message) const;
    std::string              detokenize(const std::vector<llama_token> & tokens) const;

    // n_unpriced: rows a curve world does not price (a pad row that only this CPU's attention needs,
    // which a device backend would not decode: see keep_one_pass in generate-tree.cpp)
    void        decode(common_batch & batch, int32_t n_unpriced = 0); // throws std::runtime_error
    bool        try_decode(common_batch & batch, int32_t n_unpriced = 0); // false: no KV cells for the batch (nothing decoded); else as decode
    llama_token argmax(int32_t i_batch) const;
    bool        sampled() const { return params.temp > 0.0f; }
    bool        is_eog(llama_token id) const { return llama_vocab_is_eog(vocab, id); }
};

struct draft_request {
    llama_seq_id                     seq;
    llama_token                      id_last;
    llama_pos                        pos;     // target position of id_last
    int32_t                          n_max;
    const std::vector<llama_token> * history; // prompt + generated so far
    uint32_t                         seed;    // the sequence's sampling seed (used when sampled)
};

// p of one target row through the host's sampler chain (temp, dist), see above
struct host_sampler {
    llama_sampler *               chain = nullptr;
    std::vector<llama_token_data> cur;
    llama_token_data_array        cur_p = {};

    // llama.cpp's chain in its default order: top-k, top-p, min-p (each where
    // set in `p`), the temperature, the draw
    host_sampler(const host_params & p, uint32_t seed);
    ~host_sampler();
    host_sampler(const host_sampler &) = delete;
    host_sampler & operator=(const host_sampler &) = delete;

    // applies the chain to the logits of row i_batch: cur_p holds p (softmax
    // after the temperature) and the token the chain drew (cur_p.selected)
    const llama_token_data_array & apply(const host_target & tgt, int32_t i_batch);
    // the token the chain draws from row i_batch
    llama_token sample(const host_target & tgt, int32_t i_batch);
};

struct host_drafter {
    virtual ~host_drafter() = default;

    virtual const char * name() const = 0;

    // after every target decode, with the batch just decoded
    virtual void process(const common_batch & batch) = 0;
    virtual void draft(const std::vector<draft_request> & reqs, std::vector<std::vector<llama_token>> & out) = 0;
    virtual void accept(llama_seq_id seq, int32_t n_accepted) = 0;

    // true when the last draft of seq was sampled (it is then verified with
    // verify_step, not by matching the target's samples)
    virtual bool drafts_sampled() const { return false; }
    // lossless verification of drafted position i against the target's p there;
    // `token` receives what the host emits, true while the drafted token is kept
    virtual bool verify_step(llama_seq_id seq, int32_t i, const llama_token_data_array & p, llama_token & token);
    // mirrors a target llama_memory_seq_rm
    virtual void seq_rm(llama_seq_id seq, llama_pos p0, llama_pos p1) = 0;

    // the drafter's own counters: zeroed after each prompt, added up after each wave
    virtual void reset_stats() {}
    virtual void add_stats(host_stats & stats) const { (void) stats; }
};

std::unique_ptr<host_drafter> make_drafter_upstream(host_target & tgt);
// fills common_speculative's per-sequence draft params from a host draft request, with
// `text` as the sequence's tokens and `result` to receive the draft (both outlive the draft call)
struct common_speculative_draft_params;
void host_fill_draft_params(common_speculative_draft_params & dp, const draft_request & r, const llama_tokens * text,
        llama_tokens * result);

// llama.cpp's n-gram speculative types by bench mode name (ngram-simple, ngram-map-k, ...);
// NULL for another name (drafter-ngram.cpp)
std::unique_ptr<host_drafter> make_drafter_ngram(host_target & tgt, const std::string & mode);
const std::vector<std::pair<std::string, int>> & host_ngram_modes();
// walk: an enum llama_spec_dflash2_walk value (0 greedy, as upstream; 1 adaptive).
// feed_only: the engine gets every decoded row (process, seq_rm) but never drafts
// (a measurement of what feeding the drafter costs target-only decoding)
// draft_graph: params.draft_graph (-1: the run's --draft-graph)
std::unique_ptr<host_drafter> make_drafter_dflash2(host_target & tgt, int32_t walk = 0, bool feed_only = false,
        int32_t draft_graph = -1);

// dflash2's engine parameters for tgt's placement, --n-max, threads and --ngram-branches
dflash2::params host_engine_params(host_target & tgt, int32_t walk, int32_t draft_graph = -1);
// adds an engine's time split (inject, draft decode, walk, feature copy) and its
// draft-temperature tuning counts to stats
void host_add_engine_stats(host_stats & stats, const dflash2::engine & engine);

struct host_generation {
    std::vector<std::vector<llama_token>> tokens; // generated tokens per prompt
    std::vector<int32_t>                  steps;  // decode steps per prompt after its prefill
    host_stats                            stats;
};

// generates for every prompt, n_seq prompts at a time in parallel; drafter NULL = target only
host_generation host_generate(host_target & tgt, host_drafter * drafter, const std::vector<std::vector<llama_token>> & prompts);

// one wave of prompts generated step by step by one host, which prefilled them
// (so that two hosts can run in lockstep): the chain host (host_chain_waves) and
// the tree host (host_tree_host)
struct host_stream;
struct host_wave_runner {
    virtual ~host_wave_runner() = default;
    // one step of every active stream, its wall and CPU time added to the stats;
    // false when none is left
    bool step();
    // the drafter's own counters added to the stats, after the last step
    virtual void finish() = 0;
    // slot i's finished stream replaced (streams[i]: the next prompt's, on its sequence id): the
    // old one's cells retired (host_refill_slot), the drafter's sequence cleared, the prompt prefilled
    // and the target's first token emitted
    virtual void refill(size_t i) = 0;

  protected:
    // streams: the wave's, n_slots: the streams a full wave has (params.n_seq)
    host_wave_runner(host_stats & stats, std::vector<host_stream> & streams, int32_t n_slots) :
        stats(stats), streams(streams), n_slots((size_t) n_slots) {}
    // one step, untimed
    virtual bool step_once() = 0;

    host_stats &               stats;
    std::vector<host_stream> & streams;

  private:
    // whether every slot has a stream generating, and the tokens the wave's streams emitted
    bool    full() const;
    int64_t emitted() const;

    size_t n_slots;
};
using host_wave_factory = std::function<std::unique_ptr<host_wave_runner>(host_target &, std::vector<host_stream> &,
        host_stats &)>;

// the chain host's waves: drafter (NULL = target only) drafts, the target verifies
host_wave_factory host_chain_waves(host_drafter * drafter);

// generates for every prompt, n_seq prompts at a time in parallel, by waves' host: in waves
// (the next n_seq prompts once all of a wave's finished) or, tgt.refills(), each slot taking the
// next prompt as soon as its stream finishes
host_generation host_generate_waves(host_target & tgt, const host_wave_factory & waves,
        const std::vector<std::vector<llama_token>> & prompts);

// host_generate on two targets (two contexts, one model) at once, 16 steps of
// one, then 16 of the other (the order flipping every round): an A/B of two hosts under
// nearly the same machine load. Each generation's times count its own steps only.
std::pair<host_generation, host_generation> host_generate_lockstep(host_target & tgt_a, const host_wave_factory & waves_a,
        host_target & tgt_b, const host_wave_factory & waves_b, const std::vector<std::vector<llama_token>> & prompts);

// dflash2 tree drafts of at most n_nodes nodes and n_leaves leaves per step,
// verified in one target batch per step (generate-tree.cpp; greedy at --temp 0,
// sampled trees verified losslessly above it); the target context
// needs reset_context(np, host_tree_seq_ids(np, n_leaves)). walk: an enum
// llama_spec_dflash2_walk value (adaptive: the controller picks no draft, a
// chain or a tree each step)
host_generation host_generate_tree(host_target & tgt, int32_t n_nodes, int32_t n_leaves, int32_t walk,
        const std::vector<std::vector<llama_token>> & prompts);

// the tree host of host_generate_tree: its engine on tgt's context, and its waves
struct host_tree_host {
    dflash2::engine engine;
    int32_t         n_nodes;
    int32_t         n_leaves;

    host_tree_host(host_target & tgt, int32_t n_nodes, int32_t n_leaves, int32_t walk);
    host_wave_factory waves();
};
int32_t         host_tree_seq_ids(int32_t np, int32_t n_leaves);

// mixed instruction prompts (code, math, prose, lists, JSON)
const std::vector<std::string> & host_builtin_prompts();
std::vector<std::string>         host_read_prompts(const std::string & path);

// the tools' cost world (cost-world.cpp): real; GPU-like (every target decode padded to a floor
// that covers the run's largest verify batch, measured first: the flat upper bound); or a curve
// world (--cost-world NAME|FILE: a decode of R rows takes max(its real time, base x curve(R)),
// base chosen so that one real draft decode is --draft-share of a one-row target decode)
constexpr float HOST_DEFAULT_DRAFT_SHARE = 0.15f;

// a curve world's base covers the run's largest verify batch up to this many rows in all
constexpr int32_t HOST_COVER_ROWS = 64;

struct host_cost_world {
    bool    gpu_like     = false;
    int32_t requested_ms = 0; // --target-min-ms as given
    int32_t floor_ms     = 0; // what every target decode takes at least
    int32_t np           = 0; // the largest verify batch: np sequences x rows_per_seq rows
    int32_t rows_per_seq = 0;
    double  measured_ms  = 0.0; // its second slowest decode of seven on this machine, unpadded

    std::shared_ptr<const host_cost_curve> curve; // a curve world (NULL: real or GPU-like)
    float   draft_share = HOST_DEFAULT_DRAFT_SHARE;
    int32_t draft_n_max = 0;   // the draft decode measured: one noise block of np 1 at this n_max
    double  draft_ms    = 0.0; // its real time (median of 7 after an untimed one)
    double  base_ms     = 0.0; // a one-row target decode in the world: draft_ms / draft_share, or cover_ms if larger
    double  one_row_ms  = 0.0; // a real one-row target decode (median of 7 after an untimed one)
    double  cover_ms    = 0.0; // the base at which the run's largest verify batch (np x rows_per_seq) holds

    double effective_share() const { return base_ms > 0.0 ? draft_ms / base_ms : 0.0; }

    bool holds_at_one_row() const { return !curve || base_ms * curve->at(1) >= one_row_ms; }
    bool is_real() const { return !curve && !gpu_like; }
    std::string name() const { return curve ? curve->name : gpu_like ? "gpu-like" : "real"; }
    std::string describe() const; // one line for the output (two when the world fails at one row)
    std::string json() const;
};

// --cost-world and --draft-share as a tool's options give them (host_args.values)
struct host_world_choice {
    std::string name = "real"; // real, gpu-like, a curve's NAME or FILE
    float       draft_share = HOST_DEFAULT_DRAFT_SHARE;
    std::shared_ptr<const host_cost_curve> curve; // a curve world's, read from its file
};
// dflt without --cost-world; a curve file by NAME (tools/cost-worlds/NAME.txt, in the source tree or
// beside the binary) or FILE (a name with '/' or ending in .txt) is read here: throws std::runtime_error
// naming the file and line of a fault
host_world_choice host_world_choice_of(const std::map<std::string, std::string> & values, const std::string & dflt);

// measures the largest verify batch and sets tgt.params.target_min_ms to cover it
// (gpu_like, or a --target-min-ms given); the real world otherwise
host_cost_world host_set_cost_world(host_target & tgt, bool gpu_like, const std::vector<llama_token> & prompt,
        int32_t np, int32_t n_seq_ids, int32_t rows_per_seq);

// a curve world on tgt: measures a one-row target decode and one draft decode (dflash2's greedy
// chain, np 1, the first prompt), sets tgt.params.cost_curve and cost_base_ms
host_cost_world host_set_curve_world(host_target & tgt, const host_world_choice & choice,
        const std::vector<std::vector<llama_token>> & prompts, int32_t np, int32_t n_seq_ids, int32_t rows_per_seq);

// the world chosen: real, GPU-like (n_seq_ids, rows_per_seq: the run's largest verify batch at np) or a curve
host_cost_world host_set_world(host_target & tgt, const host_world_choice & choice,
        const std::vector<std::vector<llama_token>> & prompts, int32_t np, int32_t n_seq_ids, int32_t rows_per_seq);

// while it lives, tgt decodes at its real cost (no floor, no curve); restored after
struct host_world_off {
    host_target &                          tgt;
    int32_t                                floor_ms;
    std::shared_ptr<const host_cost_curve> curve;

    explicit host_world_off(host_target & tgt)
        : tgt(tgt), floor_ms(tgt.params.target_min_ms), curve(std::move(tgt.params.cost_curve)) {
        tgt.params.target_min_ms = 0;
        tgt.params.cost_curve    = nullptr;
    }
    ~host_world_off() {
        tgt.params.target_min_ms = floor_ms;
        tgt.params.cost_curve    = curve;
    }
    host_world_off(const host_world_off &) = delete;
    host_world_off & operator=(const host_world_off &) = delete;
};

// the second slowest of `reps` target decodes (after an untimed one) of rows_per_seq rows for each of np sequences
// (after a prompt each), on a fresh context of n_seq_ids ids (0: np), at the real cost (no floor, no curve):
// what the --target-min-ms floor must cover (cost-world.cpp)
double host_measure_verify_ms(host_target & tgt, const std::vector<llama_token> & prompt, int32_t np,
        int32_t n_seq_ids, int32_t rows_per_seq, int reps);

int64_t host_time_us();
int64_t host_cpu_time_us(); // CPU time of the whole process

// a log callback that passes errors to stderr and drops the rest (for llama_log_set)
void host_log_errors_only(enum ggml_log_level level, const char * text, void * user_data);

// s as a JSON string, quoted and escaped
std::string host_json_str(const std::string & s);

// quiet logs of libllama and dflash2, backend initialized
void host_init_backend();

// every user message through the target's chat template
std::vector<std::vector<llama_token>> host_tokenize_chats(const host_target & tgt, const std::vector<std::string> & msgs);

// without --ctx-size: the target's cells for a run of np sequences at a time whose
// steps verify up to rows_per_step rows each: the tree host parks every verified
// cell until its wave of prompts ends (position order kept: target-only's
// rounding), so a wave needs np x (prompt + n_predict x rows_per_step) cells at
// most; at least 4096. Call before the contexts the run decodes in
void host_fit_context(host_target & tgt, const std::vector<std::vector<llama_token>> & prompts, int32_t np,
        int32_t rows_per_step);
