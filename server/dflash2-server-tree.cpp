// Tree verification in llama-server: the start-up plan (which targets and caches
// can branch, the sequence-id budget), and per slot the verify rows of a tree,
// the commit of the accepted path to the target's KV cache and the parked cells
// (see dflash2_server_tree in dflash2-server-impl.h).
#include "dflash2-server-impl.h"

#include "log.h"

#include <algorithm>
#include <limits>

namespace {

// llama.cpp's LLAMA_MAX_SEQ (src/llama-cparams.h, not in its public header):
// a context refuses a larger n_seq_max
constexpr int32_t MAX_SEQ = 256;

// the probe below loads the target's vocabulary only; its loader lines are noise
void log_errors_only(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        LOG_ERR("%s", text);
    }
}

// whether the target's memory can hold several paths in one cache (pure
// attention); recurrent and hybrid targets keep one state per sequence. Read
// before the target context exists, since its n_seq_max depends on it.
bool target_can_branch(const std::string & path) {
    ggml_log_callback cb = nullptr;
    void * ud = nullptr;
    llama_log_get(&cb, &ud);
    llama_log_set(log_errors_only, nullptr);
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(path.c_str(), mp);
    llama_log_set(cb, ud);
    if (!model) {
        return true; // the real load reports it; the spec checks the loaded model again
    }
    const bool branching = !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model);
    llama_model_free(model);
    return branching;
}

const char * RECURRENT = "the target's memory is recurrent or hybrid and cannot branch";
const char * SPLIT     = "the KV cache is not unified (add -kvu)";
// a cache run full frees the parked cells (has_room) and a shift leaves holes:
// cells are then reused out of position order and outputs drift from
// target-only decoding in the last bits; the default budget keeps off that
const char * SHIFT     = "--context-shift runs the KV cache full, where the parked cells of trees would be freed "
                         "and their cells reused out of position order";

// what the log lines call the tree budget: the flag, or the adaptive walk's default
std::string budget_name(int32_t n_nodes) {
    if (dflash2_server_opts().tree_given) {
        return string_format("--spec-dflash2-tree %d", n_nodes);
    }
    return string_format("trees (the adaptive walk's default budget of %d nodes)", n_nodes);
}

// trees asked for with the flag that cannot be had are worth a warning; the
// default budget yields to chains quietly (one informative line)
void log_chains(int32_t n_nodes, const char * why) {
    if (dflash2_server_opts().tree_given) {
        LOG_WRN("dflash2: %s: %s: the slots draft chains\n", budget_name(n_nodes).c_str(), why);
    } else {
        LOG_INF("dflash2: %s: %s: the slots draft chains\n", budget_name(n_nodes).c_str(), why);
    }
}

// the sequence ids of trees of up to n_nodes nodes per slot (opts.tree_nodes set)
int32_t plan_trees(common_params & params, int32_t n_nodes) {
    dflash2_server_options & opts = dflash2_server_opts();
    const int32_t n_slots = params.n_parallel;
    opts.tree_nodes = n_nodes;
    // slot k needs its own id, leaves - 1 path ids and a park id: n_slots x (leaves
    // + 1) sequence ids, within llama.cpp's limit and the context's outputs (a
    // context reserves one output per sequence id: at most n_batch of them)
    const int32_t n_batch   = params.n_ctx > 0 ? std::min(params.n_batch, params.n_ctx) : params.n_batch;
    const int32_t by_seq    = MAX_SEQ / n_slots - 1;
    const int32_t by_batch  = n_batch / n_slots - 1;
    const int32_t n_leaves  = std::min({ n_nodes, by_seq, by_batch });
    if (n_leaves < std::min(n_nodes, 2) && !opts.tree_given) {
        log_chains(n_nodes, "too many slots for the sequence ids or outputs of trees of 2 leaves");
        return n_slots;
    }
    if (n_leaves < std::min(n_nodes, 2)) {
        opts.tree_refusal = by_seq <= by_batch
            ? string_format("--spec-dflash2-tree %d: %d slots x (leaves + 1) sequence ids do not fit llama.cpp's %d "
                    "for trees of 2 leaves or more (at most -np %d with trees)", n_nodes, n_slots, MAX_SEQ, MAX_SEQ / 3)
            : string_format("--spec-dflash2-tree %d: %d slots x (leaves + 1) sequence ids need as many outputs, more "
                    "than the batch holds (-b %d) for trees of 2 leaves or more (at least -b %d)", n_nodes, n_slots,
                    n_batch, 3 * n_slots);
        return n_slots;
    }
    opts.tree_leaves = n_leaves;
    if (n_leaves < n_nodes) {
        LOG_INF("dflash2: %s: at most %d leaves per slot (%d slots x (leaves + 1) sequence ids within llama.cpp's %d "
                "and the batch's %d outputs)\n", budget_name(n_nodes).c_str(), n_leaves, n_slots, MAX_SEQ, n_batch);
    }
    return llama_spec_dflash2_tree_kv_seq_ids(n_slots, n_leaves);
}

} // namespace

int32_t dflash2_server_tree_plan(common_params & params) {
    dflash2_server_options & opts = dflash2_server_opts();
    opts.tree_leaves = 0;
    opts.tree_refusal.clear();
    const int32_t n_slots = params.n_parallel;
    const int32_t n_nodes = opts.tree_nodes;
    if (n_nodes <= 0 || n_slots <= 0) {
        return n_slots;
    }
    const char * why = nullptr;
    if (!params.kv_unified && n_slots > 1) {
        why = SPLIT;
    } else if (!opts.tree_given && params.ctx_shift) {
        why = SHIFT;
    } else if (!target_can_branch(params.model.path)) {
        why = RECURRENT;
    } else if (!params.kv_unified) {
        // one slot: a unified cache holds the same cells in the same order
        params.kv_unified = true;
        LOG_INF("dflash2: %s: one slot, unified KV cache for its path sequence ids\n", budget_name(n_nodes).c_str());
    }
    if (why) {
        log_chains(n_nodes, why);
        return n_slots;
    }
    // T = 0 identity: every slot's tree and anchor in one verify batch of at most
    // identical_rows rows (see identical_verify_rows); a budget asked for keeps
    // its size, with a warning
    const int32_t fit_identical = opts.identical_rows > 0 ? opts.identical_rows / n_slots - 1 : n_nodes;
    if (fit_identical < n_nodes && opts.tree_given) {
        LOG_WRN("dflash2: %s: %d slots x (1 + %d) rows may take ggml's tiled attention on this CPU target, whose "
                "near-ties round otherwise than target-only decoding (-ub %d keeps T = 0 outputs identical)\n",
                budget_name(n_nodes).c_str(), n_slots, n_nodes, opts.identical_rows);
    } else if (fit_identical < n_nodes) {
        if (fit_identical < 1) {
            log_chains(n_nodes, "trees for this many slots would take ggml's tiled attention on this CPU target");
            return n_slots;
        }
        LOG_INF("dflash2: %s: trees of up to %d nodes: %d slots x (1 + %d) rows stay below ggml's tiled attention "
                "on this CPU target (T = 0 outputs identical to target-only; -ub %d lifts this)\n",
                budget_name(n_nodes).c_str(), fit_identical, n_slots, fit_identical, opts.identical_rows);
        return plan_trees(params, fit_identical);
    }
    return plan_trees(params, n_nodes);
}

void dflash2_server_tree::init(llama_context * ctx, dflash2::engine & engine_, int32_t n_slots_, int32_t n_nodes_,
        int32_t n_leaves_) {
    ctx_tgt  = ctx;
    engine   = &engine_;
    n_slots  = n_slots_;
    n_nodes  = 0;
    n_leaves = 0;
    slots.assign(n_slots_, {});
    if (n_nodes_ <= 0 || n_leaves_ <= 0) {
        return;
    }
    // the plan decided before the context existed; the context has the last word
    const llama_model * model = llama_get_model(ctx);
    const char * why = nullptr;
    if (llama_model_is_recurrent(model) || llama_model_is_hybrid(model)) {
        why = RECURRENT;
    } else if (llama_n_seq_max(ctx) > 1 && llama_n_ctx_seq(ctx) < llama_n_ctx(ctx)) {
        why = SPLIT;
    } else if ((int32_t) llama_n_seq_max(ctx) < n_slots_ * (n_leaves_ + 1)) {
        why = "the target context has too few sequence ids";
    }
    if (why) {
        log_chains(n_nodes_, why);
        return;
    }
    // every slot's tree in one verify batch (the server verifies within one sub-batch)
    const int32_t fit = (int32_t) llama_n_batch(ctx) / n_slots_ - 1;
    int32_t nodes = n_nodes_;
    if (fit < nodes) {
        LOG_WRN("dflash2: %s: the batch (-b %u) holds %d slots x (1 + %d) rows: trees of %d nodes\n",
                budget_name(n_nodes_).c_str(), llama_n_batch(ctx), n_slots_, std::max(fit, 0), std::max(fit, 0));
        nodes = fit;
    }
    // a step wants free cells for up to 2 x slots trees (has_room) and parks the
    // cells off the accepted path: the default budget keeps that reserve within a
    // quarter of the cache, so that small contexts are not short of cells for
    // trees (and their parked cells freed) request after request
    const int32_t fit_ctx = (int32_t) llama_n_ctx(ctx) / (4 * 2 * n_slots_) - 1;
    if (!dflash2_server_opts().tree_given && fit_ctx < nodes) {
        LOG_INF("dflash2: %s: a context of %u cells keeps trees of up to %d nodes\n", budget_name(n_nodes_).c_str(),
                llama_n_ctx(ctx), std::max(fit_ctx, 0));
        nodes = fit_ctx;
    }
    if (nodes < 1) {
        log_chains(n_nodes_, "no tree fits the batch or the cache");
        return;
    }
    // the target's KV bookkeeping of trees is the library's
    try {
        engine->tree_kv_init(std::min(n_leaves_, nodes));
    } catch (const dflash2::error & e) {
        log_chains(n_nodes_, e.message.c_str());
        return;
    }
    n_nodes  = nodes;
    n_leaves = std::min(n_leaves_, nodes);
    LOG_INF("dflash2: tree verification: up to %d nodes and %d leaves per slot and step, %d slots, n_seq_max %u, "
            "unified KV cache\n", n_nodes, n_leaves, n_slots, llama_n_seq_max(ctx));
}

bool dflash2_server_tree::has_room(llama_seq_id seq, int32_t n_trees) {
    if (slots.at(seq).chains_only) {
        return false;
    }
    const int64_t n_parked = engine->tree_kv_parked().first;
    if (engine->tree_kv_room(n_trees, n_nodes)) {
        return true;
    }
    // short: the library freed the parked cells (the server must not run out of cells
    // for them), and the slots draft chains until their history is next cut (a new request)
    for (auto & st : slots) {
        st.chains_only = true;
    }
    LOG_WRN("dflash2: the KV cache is short of cells for trees (%lld of %u cells parked): the parked cells are freed "
            "and the slots draft chains until their next request; freed cells are reused out of position order, so "
            "outputs may differ from target-only decoding in the last bits\n", (long long) n_parked,
            llama_n_ctx(ctx_tgt));
    return false;
}

void dflash2_server_tree::set(llama_seq_id seq, std::vector<dflash2::tree_node> && nodes) {
    slot_tree & st = slots.at(seq);
    st.nodes    = std::move(nodes);
    st.active   = !st.nodes.empty();
    st.verified = false;
    st.path.clear();
    std::vector<bool> has_child(st.nodes.size(), false);
    int32_t n_roots = 0; // the anchor's children
    st.branched = false;
    for (const auto & n : st.nodes) {
        if (n.parent < 0) {
            st.branched |= ++n_roots > 1;
        } else {
            st.branched |= has_child[n.parent];
            has_child[n.parent] = true;
        }
    }
}

bool dflash2_server_tree::add_rows(llama_seq_id seq, llama_token id_last, llama_pos pos0,
        const dflash2_server_add_row & add) {
    slot_tree & st = slots.at(seq);
    st.anchor = pos0;
    // the library tags the path ids with the slot's cells and gives the rows
    try {
        engine->tree_kv_rows(seq, id_last, pos0, (int32_t) st.nodes.size(), verify_rows, verify_ids);
    } catch (const dflash2::error & e) {
        LOG_ERR("%s\n", e.what());
        return false;
    }
    bool ok = true;
    for (size_t r = 0; r < verify_rows.size() && ok; ++r) {
        const auto & row = verify_rows[r];
        row_ids.assign(verify_ids.begin() + row.seq_id_first, verify_ids.begin() + row.seq_id_first + row.n_seq_id);
        ok = add(row.token, row.pos, row_ids);
    }
    return ok;
}

void dflash2_server_tree::commit(llama_seq_id seq, dflash2_server_slot_counters & counters) {
    slot_tree & st = slots.at(seq);
    // the library parks the step's cells and keeps the prefix, the anchor and the path in seq
    try {
        engine->tree_kv_commit(seq, st.path);
    } catch (const dflash2::error & e) {
        LOG_ERR("%s\n", e.what());
    }
    bool side = false;
    // a path node that is not its parent's first child: a token the chain (the
    // first children) would not have drafted
    for (int32_t i : st.path) {
        const int32_t parent = st.nodes[i].parent;
        for (int32_t j = 0; j < i; ++j) {
            if (st.nodes[j].parent == parent) {
                side = true;
                break;
            }
        }
    }
    counters.n_tree_steps += 1;
    counters.n_tree_branched += st.branched;
    counters.n_tree_side_accepted += side;

    st.active = false;
    st.verified = false;
    st.nodes.clear();
    st.path.clear();
}

void dflash2_server_tree::on_seq_rm(llama_seq_id seq, llama_pos p0, llama_pos /* p1 */, bool cuts_history) {
    if (!on()) {
        return;
    }
    // the target's path and park ids are the library's (its seq_rm mirror); the
    // slots' own state goes here
    for (int32_t k = 0; k < n_slots; ++k) {
        if (seq >= 0 && k != seq) {
            continue;
        }
        slot_tree & st = slots[k];
        // a tree whose rows are cut goes with them (the engine drops it too)
        if (st.active && (p0 < 0 || p0 <= st.anchor)) {
            st.active = false;
            st.nodes.clear();
            st.path.clear();
        }
        if (cuts_history) {
            st.chains_only = false; // a new request may draft trees again
        }
    }
}

void dflash2_server_tree::pad(int32_t n_rows, int32_t n_rows_max, llama_seq_id seq_last,
        const dflash2_server_add_row & add) {
    pad_id = -1;
    if (!on()) {
        return;
    }
    llama_spec_dflash2_tree_row row = {};
    llama_seq_id id = -1;
    try {
        if (!engine->tree_kv_pad(n_rows, n_rows_max, seq_last, row, id)) {
            return;
        }
    } catch (const dflash2::error & e) {
        LOG_ERR("%s\n", e.what());
        return;
    }
    // a batch with no room decodes without it (the library forgets a pad never decoded)
    if (add(row.token, row.pos, std::vector<llama_seq_id>{ id })) {
        pad_id = id;
        dflash2_server_count_pad_row();
    }
}

void dflash2_server_tree::rows_from_batch(const common_batch & batch, std::vector<dflash2::row> & rows,
        std::vector<llama_token> & tokens) {
    rows.clear();
    tokens.clear();
    std::vector<llama_seq_id> seen;
    for (int32_t i = 0; i < batch.size(); ++i) {
        const auto & t    = batch.tokens[i];
        if (pad_id >= 0 && i + 1 == batch.size() && t.seq_id == pad_id && t.seq_ids_extra.empty()) {
            pad_id = -1; // the pad row: its output is never read, its cell the library parks
            continue;
        }
        const bool   embd = t.id == LLAMA_TOKEN_NULL;
        seen.clear();
        auto push = [&](llama_seq_id id) {
            const llama_seq_id k = engine->tree_kv_owner(id);
            if (std::find(seen.begin(), seen.end(), k) == seen.end()) {
                seen.push_back(k);
                rows.push_back({ i, k, t.pos[0], embd });
                tokens.push_back(t.id);
            }
        };
        push(t.seq_id);
        for (llama_seq_id extra : t.seq_ids_extra) {
            push(extra);
        }
    }
}
