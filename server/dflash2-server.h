// dflash2 inside llama-server.
//
// The server drives speculative decoding through a handful of hooks: the
// common_speculative_* functions and common_memory. This header gives the server
// one type, dflash2_server_spec, that holds either llama.cpp's own
// common_speculative (any spec type, or draft-dflash with --spec-dflash2-upstream)
// or a dflash2 engine, plus overloads of every hook for that type. The patch
// changes the type of the server's `spec` and slot `mem` members; the call sites
// stay as they are and resolve to these overloads.
#pragma once

#include "common.h"
#include "dflash2.h"
#include "speculative.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// our command-line options, parsed and removed from argv before llama.cpp parses it:
//   --spec-dflash2-block-size N   noise block below the drafter's trained one (0 = trained)
//   --spec-dflash2-image-rows M   inject | skip: what the drafter does with image rows
//   --spec-dflash2-walk W         greedy (as upstream) | adaptive (draft what pays for its verification)
//   --spec-dflash2-upstream       serve draft-dflash with llama.cpp's own path (for comparison)
// returns false with a message on stderr for a bad value
bool dflash2_server_take_args(int & argc, char ** argv);

// true when this configuration drafts through dflash2: a DFlash2 drafter with the
// draft-dflash spec type (explicit or inferred from the GGUF), unless --spec-dflash2-upstream
bool dflash2_server_routes(const common_params & params);

// the draft length the target's outputs are sized for (1 + n_max per sequence)
int32_t dflash2_server_output_n_max(const common_params & params);

// draft counters of one slot over its lifetime, for /slots
struct dflash2_server_slot_counters {
    int64_t n_drafted      = 0;
    int64_t n_accepted     = 0;
    int64_t n_verify_steps = 0;
    std::vector<int64_t> accepted_at; // by draft position
};

struct dflash2_server_spec {
    common_speculative * upstream = nullptr; // llama.cpp's own path
    llama_spec_dflash2 * engine   = nullptr; // or dflash2's
    llama_context      * ctx_tgt  = nullptr;

    std::vector<dflash2_server_slot_counters> counters; // per sequence, both paths

    std::vector<common_speculative_draft_params> dparams; // per sequence, filled by the server

    // scratch of the calls, kept to avoid allocating every step
    std::vector<llama_spec_dflash2_row>           rows;
    std::vector<llama_spec_dflash2_draft_request> requests;
    std::vector<llama_token>                      tokens;
    std::vector<int32_t>                          n_drafted;

    ~dflash2_server_spec();

    bool is_upstream() const { return upstream != nullptr; }
};

using dflash2_server_spec_ptr = std::unique_ptr<dflash2_server_spec>;

// replaces common_init_from_params(params) for the target: when dflash2 serves, the
// drafter's memory is budgeted into the fit margins (as the server does for a
// multimodal projector) and upstream's fit pass does not try to build a draft
// context it cannot measure (a drafter sharing the target's head needs ctx_other)
common_init_result_ptr dflash2_server_init_target(common_params & params);

// replaces common_speculative_init(params.speculative, n_parallel); returns NULL when
// there is nothing to speculate with, throws std::runtime_error when dflash2 should
// serve but cannot (bad drafter, drafter for another target, ...)
dflash2_server_spec * dflash2_server_spec_init(common_params & params, llama_context * ctx_tgt);

// true when dflash2 was asked for and failed: the server must not start
bool dflash2_server_init_failed(const common_params & params);

// the hooks, for dflash2_server_spec
common_speculative_draft_params & common_speculative_get_draft_params(dflash2_server_spec * spec, llama_seq_id seq_id);

void common_speculative_begin  (dflash2_server_spec * spec, llama_seq_id seq_id, const llama_tokens & prompt);
bool common_speculative_process(dflash2_server_spec * spec, const common_batch & batch);
void common_speculative_draft  (dflash2_server_spec * spec);
void common_speculative_accept (dflash2_server_spec * spec, llama_seq_id seq_id, uint16_t n_accepted);

bool common_speculative_get_state(dflash2_server_spec * spec, llama_seq_id seq_id, std::vector<uint8_t> & data);
void common_speculative_set_state(dflash2_server_spec * spec, llama_seq_id seq_id, const std::vector<uint8_t> & data);

void    common_speculative_print_stats(const dflash2_server_spec * spec);
int32_t common_speculative_n_max(const dflash2_server_spec * spec);

const std::vector<double> & common_speculative_get_synth_probs(const dflash2_server_spec * spec);

// a slot's memory: the target's, and the same operation on the dflash2 engine of that
// target context (which maps target positions to its own dense draft positions)
struct dflash2_server_memory : common_memory {
    void seq_rm (llama_seq_id seq_id, llama_pos p0, llama_pos p1) const;
    void seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos delta) const;
    void seq_cp (llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1) const;
};

// the prompt cache: the draft part of a saved slot state (upstream: the draft
// context's sequence state; dflash2: its state blob)
size_t dflash2_server_state_size(const dflash2_server_spec * spec, llama_context * ctx_dft, llama_seq_id seq_id);
void   dflash2_server_state_save(const dflash2_server_spec * spec, llama_context * ctx_dft, llama_seq_id seq_id,
                                 std::vector<uint8_t> & dst);
// restores the draft part for the engine of ctx_tgt; false when no engine serves ctx_tgt
bool   dflash2_server_state_load(llama_context * ctx_tgt, llama_seq_id seq_id, const std::vector<uint8_t> & data);

// /slots save and restore: the sequence's draft state travels in PATH.dflash2 beside
// the target's file; a restore without it starts the draft of that sequence over
void dflash2_server_slot_file_save(const dflash2_server_spec * spec, llama_seq_id seq_id, const std::string & path);
void dflash2_server_slot_file_load(llama_context * ctx_tgt, llama_seq_id seq_id, const std::string & path);

// draft statistics of a slot for /slots (JSON text)
std::string dflash2_server_slot_json(const dflash2_server_spec * spec, llama_seq_id seq_id);

// dflash2's counters for /metrics (prometheus text, empty when no engine serves)
std::string dflash2_server_metrics();
