// Tree drafts in the host (dflash2 only): each step one
// llama_spec_dflash2_draft_tree call for the generating sequences, one target
// batch verifying every tree with the multi-sequence encoding of dflash2.h (one
// path sequence id per leaf in a unified KV cache, a node tagged with the ids of
// the leaves below it), a path accepted, and the target's KV cut to that path.
// The target's KV bookkeeping is the engine's (llama_spec_dflash2_tree_kv_*):
// this host adds the rows it hands out and commits the accepted paths.
// Greedy (--temp 0): the longest path the target agrees with, by
// llama_spec_dflash2_verify_tree_greedy. Sampled (--temp T > 0): sampled trees
// (the request carries T, --draft-temp and the stream's seed), verified
// losslessly node by node down the accepted path with
// llama_spec_dflash2_verify_tree_sampled_step against p = the stream's sampler
// chain (host.h) at each node's row, then llama_spec_dflash2_accept_tree.
//
// Exactness: a tree's rejected cells lie between its kept ones; freed, the next
// rows would reuse them out of position order, and ggml's CPU attention, which
// accumulates in cell order, could then round differently from target-only
// decoding and flip a near-tie argmax. So the engine's commit parks every cell
// of the verify batch under the stream's park id, which no query uses: no cell
// is freed until the wave ends, at the price of 1 + n_nodes cells per step
// instead of 1 + accepted (see llama_spec_dflash2_tree_kv_seq_ids for the ids).
// The parked cells still count where a ubatch has one row (a step whose trees
// are empty, one stream left, or the last row of 64 at ubatch 63): ggml's CPU
// attention then splits the cells across its threads once there are 512 or
// more, and sums the parts, which rounds by where each cell lies; target-only,
// whose sequence alone holds fewer cells, sums them in one pass. Such a batch
// gets a row more from the engine (llama_spec_dflash2_tree_kv_pad), parked as
// it is decoded and never read, that keeps that ubatch on the one-pass kernel.
#include "dflash2-batch-rows.h"
#include "dflash2.hpp"
#include "host.h"
#include "stream.h"

#include <algorithm>
#include <utility>

namespace {

// prefill rows go to the engine as any host's: one sequence per row
struct prefill_drafter : host_drafter {
    dflash2::engine & engine;
    std::vector<dflash2::row> rows;
    std::vector<llama_token> tokens;

    explicit prefill_drafter(dflash2::engine & engine) : engine(engine) {}

    const char * name() const override { return "dflash2-tree"; }

    void process(const common_batch & batch) override {
        dflash2_rows_from_batch(batch, rows, tokens);
        engine.process(rows, tokens);
    }

    void draft(const std::vector<draft_request> &, std::vector<std::vector<llama_token>> &) override {}

    void accept(llama_seq_id, int32_t) override {}

    void seq_rm(llama_seq_id seq, llama_pos p0, llama_pos p1) override { engine.seq_rm(seq, p0, p1); }
};

struct tree_step {
    std::vector<dflash2::tree_node> nodes;
    std::vector<int32_t>            rows; // batch indices: anchor, then node i
};

// lossless verification of a sampled tree: from the anchor down, the children
// of the current node against p at its row (the stream's sampler chain), until
// a token comes from a residual or as the bonus; then accept_tree(path)
void verify_sampled(const host_target & tgt, dflash2::engine & engine, host_stream & s, const tree_step & st,
        std::vector<llama_token> & emitted, std::vector<int32_t> & path) {
    emitted.clear();
    path.clear();
    int32_t node = -1;
    while (true) {
        llama_token token = LLAMA_TOKEN_NULL;
        node = engine.verify_tree_sampled_step(s.seq, node, s.smpl->apply(tgt, st.rows[node + 1]), token);
        emitted.push_back(token);
        if (node < 0) {
            break;
        }
        path.push_back(node);
    }
    engine.accept_tree(s.seq, path);
}

// one wave of streams generated step by step by the tree host
struct tree_wave : host_wave_runner {
    host_target &     tgt;
    dflash2::engine & engine;
    const int32_t     n_nodes;
    const int32_t     n_leaves;
    common_batch      batch;

    std::vector<dflash2::tree_request>           reqs;
    std::vector<std::vector<dflash2::tree_node>> trees;
    std::vector<tree_step>                       steps;
    std::vector<dflash2::row>                    rows;
    std::vector<llama_spec_dflash2_tree_row>     verify_rows;
    std::vector<llama_seq_id>                    verify_ids;
    std::vector<llama_seq_id>                    row_ids;
    std::vector<llama_token>                     emitted;
    std::vector<int32_t>                         path;

    tree_wave(host_target & tgt, dflash2::engine & engine, int32_t n_nodes, int32_t n_leaves,
            std::vector<host_stream> & streams, host_stats & stats)
        : host_wave_runner(stats, streams, tgt.params.n_seq), tgt(tgt), engine(engine), n_nodes(n_nodes),
          n_leaves(n_leaves), batch(tgt.ctx) {
        llama_memory_clear(llama_get_memory(tgt.ctx), true);
        engine.seq_rm(-1, -1, -1);
        prefill_drafter prefill(engine);
        host_prefill(tgt, &prefill, streams, stats);
        engine.reset_stats();
        for (auto & s : streams) {
            host_emit(tgt, s, { s.id_last });
        }
    }

    void finish() override { host_add_engine_stats(stats, engine); }

    void refill(size_t i) override {
        // every id of the stream's bookkeeping (its own, its paths', its park id), taken from
        // its cells before the engine clears them (prefill_drafter::seq_rm), so that none is freed
        std::vector<llama_seq_id> ids;
        const llama_seq_id n_ids = (llama_seq_id) llama_n_seq_max(tgt.ctx) - (tgt.retired_seq >= 0 ? 1 : 0);
        for (llama_seq_id id = 0; id < n_ids; ++id) {
            if (engine.tree_kv_owner(id) == streams[i].seq) {
                ids.push_back(id);
            }
        }
        prefill_drafter prefill(engine);
        host_refill_slot(tgt, &prefill, streams, i, ids, stats);
    }

  private:
    // a ubatch of one row (a one-row batch, or the last row of one: 64 rows at ubatch 63)
    // over parked cells gets a row more from the engine where ggml's CPU attention (an
    // f16/f32 cache: a quantized one never splits) would split its cells and target-only's
    // would not; its cell is parked as it is decoded. Returns the rows added: a curve world does
    // not price them, since the device backend it stands for decodes without them
    int32_t keep_one_pass(llama_seq_id seq_last) {
        llama_spec_dflash2_tree_row pad = {};
        llama_seq_id pad_id = -1;
        if (tgt.cpu_attention_by_rows() &&
                engine.tree_kv_pad(batch.size(), (int32_t) llama_n_batch(tgt.ctx), seq_last, pad, pad_id)) {
            batch.add(pad.token, pad.pos, std::vector<llama_seq_id>{ pad_id }, false);
            stats.n_one_pass_rows += 1;
            return 1;
        }
        return 0;
    }

    // one tree draft + verify step of every active stream
    bool step_once() override {
        std::vector<size_t> active;
        for (size_t i = 0; i < streams.size(); ++i) {
            if (!streams[i].done) {
                active.push_back(i);
            }
        }
        if (active.empty()) {
            return false;
        }

        reqs.clear();
        for (size_t i : active) {
            const host_stream & s = streams[i];
            const int32_t left = tgt.params.n_predict - (int32_t) s.out.size();
            dflash2::tree_request r = {};
            r.seq_id     = s.seq;
            r.id_last    = s.id_last;
            r.n_nodes    = n_nodes;
            // n-gram branches may go deeper than the lattice's n_max: as deep as the budget
            r.max_depth  = std::min(std::max(tgt.params.n_max, n_nodes), std::max(left, 1));
            r.max_leaves = n_leaves;
            if (tgt.sampled()) {
                r.temperature       = tgt.params.temp;
                r.draft_temperature = host_draft_temp(tgt.params);
                r.seed              = s.seed;
            }
            reqs.push_back(host_truncated(tgt.params, r));
        }
        int64_t t = host_time_us();
        engine.draft_tree(reqs, trees);
        stats.t_draft_us += host_time_us() - t;

        batch.clear();
        rows.clear();
        steps.assign(active.size(), {});
        for (size_t k = 0; k < active.size(); ++k) {
            const host_stream & s = streams[active[k]];
            tree_step & st = steps[k];
            st.nodes = std::move(trees[k]);
            // the rows and their path ids, tagged with the prefix by the engine
            engine.tree_kv_rows(s.seq, s.id_last, s.n_past, (int32_t) st.nodes.size(), verify_rows, verify_ids);
            for (const auto & r : verify_rows) {
                row_ids.assign(verify_ids.begin() + r.seq_id_first, verify_ids.begin() + r.seq_id_first + r.n_seq_id);
                st.rows.push_back(batch.add(r.token, r.pos, row_ids, true));
            }
            for (size_t r = 0; r < st.rows.size(); ++r) {
                rows.push_back({ st.rows[r], s.seq, verify_rows[r].pos, false });
            }
        }
        const int32_t n_pad = keep_one_pass(streams[active.back()].seq);
        t = host_time_us();
        if (!tgt.try_decode(batch, n_pad)) {
            // the parked cells of earlier steps filled the cache: they only keep each sequence's
            // cells in position order (as target-only lays them out); free them and decode again
            engine.tree_kv_unpark();
            stats.n_unparked += 1;
            tgt.decode(batch, n_pad);
        }
        stats.t_target_us += host_time_us() - t;
        t = host_time_us();
        engine.process(rows);
        stats.t_process_us += host_time_us() - t;

        for (size_t k = 0; k < active.size(); ++k) {
            host_stream & s = streams[active[k]];
            const tree_step & st = steps[k];
            t = host_time_us();
            if (tgt.sampled()) {
                verify_sampled(tgt, engine, s, st, emitted, path);
            } else {
                engine.verify_tree_greedy(s.seq, st.rows, emitted, path);
            }
            stats.t_accept_us += host_time_us() - t;

            const int32_t d = (int32_t) path.size();
            int32_t depth = 0;
            for (const auto & n : st.nodes) {
                depth = std::max(depth, n.depth);
            }
            stats.n_seq_steps += 1;
            stats.n_drafted   += (int64_t) st.nodes.size();
            stats.n_accepted  += d;
            for (int32_t j = 0; j < depth && j < HOST_MAX_DRAFT; ++j) {
                stats.drafted_at[j] += 1;
                stats.accepted_at[j] += j < d;
            }
            std::vector<int32_t> per_depth(depth, 0);
            for (const auto & n : st.nodes) {
                per_depth[n.depth - 1] += 1;
                stats.nodes_at[std::min(n.depth, HOST_MAX_DRAFT) - 1] += 1;
            }
            std::string shape;
            for (int32_t c : per_depth) {
                shape += (shape.empty() ? "" : ",") + std::to_string(c);
            }
            stats.shapes[shape.empty() ? "-" : shape] += 1;

            // the step's cells parked, the prefix, the anchor and the path kept in seq
            engine.tree_kv_commit(s.seq, path);
            const llama_pos end = s.n_past + 1 + d;
            s.n_past  = end;
            s.id_last = emitted.back();
            host_emit(tgt, s, emitted);
        }
        return true;
    }
};

} // namespace

int32_t host_tree_seq_ids(int32_t np, int32_t n_leaves) {
    return llama_spec_dflash2_tree_kv_seq_ids(np, n_leaves);
}

host_tree_host::host_tree_host(host_target & tgt, int32_t n_nodes, int32_t n_leaves, int32_t walk)
    : engine(tgt.ctx, tgt.params.path_draft, host_engine_params(tgt, walk)), n_nodes(n_nodes), n_leaves(n_leaves) {
    engine.tree_kv_init(n_leaves);
}

host_wave_factory host_tree_host::waves() {
    return [this](host_target & tgt, std::vector<host_stream> & streams, host_stats & stats) {
        return std::unique_ptr<host_wave_runner>(new tree_wave(tgt, engine, n_nodes, n_leaves, streams, stats));
    };
}

host_generation host_generate_tree(host_target & tgt, int32_t n_nodes, int32_t n_leaves, int32_t walk,
        const std::vector<std::vector<llama_token>> & prompts) {
    host_tree_host host(tgt, n_nodes, n_leaves, walk);
    return host_generate_waves(tgt, host.waves(), prompts);
}
