// What the server reports about drafting: a slot's counters for /slots, dflash2's
// statistics for /metrics (Prometheus text) and for the log.
#include "dflash2-server-impl.h"

#include "log.h"

#include <atomic>
#include <mutex>

namespace {

// statistics copied after every step, for /metrics (rendered on the HTTP thread)
std::mutex     g_stats_mutex;
dflash2::stats g_stats       = {};
int32_t        g_stats_n_max = 0;

// the slots' step counters summed, for /metrics (same mutex)
dflash2_server_slot_counters g_steps;

} // namespace

dflash2_server_slot_counters dflash2_server_counters_sum(const std::vector<dflash2_server_slot_counters> & counters) {
    dflash2_server_slot_counters sum;
    for (const auto & c : counters) {
        sum.n_drafted            += c.n_drafted;
        sum.n_accepted           += c.n_accepted;
        sum.n_verify_steps       += c.n_verify_steps;
        sum.n_steps_none         += c.n_steps_none;
        sum.n_steps_chain        += c.n_steps_chain;
        sum.n_steps_tree         += c.n_steps_tree;
        sum.n_tree_steps         += c.n_tree_steps;
        sum.n_tree_branched      += c.n_tree_branched;
        sum.n_tree_side_accepted += c.n_tree_side_accepted;
    }
    return sum;
}

static std::atomic<uint64_t> g_pad_rows{0};

void dflash2_server_count_pad_row() {
    g_pad_rows += 1;
}

void dflash2_server_publish_steps(const std::vector<dflash2_server_slot_counters> & counters) {
    const dflash2_server_slot_counters sum = dflash2_server_counters_sum(counters);
    std::lock_guard<std::mutex> lock(g_stats_mutex);
    g_steps = sum;
}

void dflash2_server_publish_stats(const dflash2::stats & stats, int32_t n_max) {
    std::lock_guard<std::mutex> lock(g_stats_mutex);
    g_stats       = stats;
    g_stats_n_max = n_max;
}

void dflash2_server_log_stats(const dflash2::stats & s, int32_t n_max) {
    std::string per_pos;
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

std::string dflash2_server_slot_json(const dflash2_server_spec * spec, llama_seq_id seq_id) {
    if (!spec || seq_id < 0 || (size_t) seq_id >= spec->counters.size()) {
        return "{}";
    }
    const auto & c = spec->counters[seq_id];
    std::string per_pos;
    for (size_t i = 0; i < c.accepted_at.size(); ++i) {
        per_pos += string_format("%s%lld", i ? ", " : "", (long long) c.accepted_at[i]);
    }
    // the budgets the steps got: a drafting step is verified, so the mean is per verify step
    const int64_t n_drafting = c.n_steps_chain + c.n_steps_tree;
    const std::string steps = string_format("{\"n_none\": %lld, \"n_chain\": %lld, \"n_tree\": %lld, "
            "\"last_nodes\": %lld, \"mean_nodes\": %.3f}", (long long) c.n_steps_none, (long long) c.n_steps_chain,
            (long long) c.n_steps_tree, (long long) c.n_nodes_last,
            n_drafting > 0 ? (double) c.n_drafted / n_drafting : 0.0);
    // the verification mode: greedy, rejection-sampling, or "sample-and-match: why"
    // (its reasons have no quotes or backslashes)
    return string_format("{\"engine\": \"%s\", \"draft_graph\": \"%s\", \"walk\": \"%s\", \"tree_budget\": %d, \"verify\": \"%s\", "
            "\"n_drafted\": %lld, \"n_accepted\": %lld, \"n_verify_steps\": %lld, \"accepted_at\": [%s], "
            "\"steps\": %s, \"tree\": {\"n_steps\": %lld, \"n_branched\": %lld, \"n_side_accepted\": %lld}}",
            spec->name(), spec->draft_graph(), spec->walk(), spec->tree_budget(), spec->verify_mode(seq_id).c_str(),
            (long long) c.n_drafted, (long long) c.n_accepted, (long long) c.n_verify_steps, per_pos.c_str(),
            steps.c_str(), (long long) c.n_tree_steps, (long long) c.n_tree_branched,
            (long long) c.n_tree_side_accepted);
}

// a JSON string literal of text (quotes, backslashes and control characters escaped)
static std::string json_string(const char * text) {
    std::string out = "\"";
    for (const char * c = text; *c; ++c) {
        if (*c == '"' || *c == '\\') {
            out += '\\';
            out += *c;
        } else if ((unsigned char) *c < 0x20) {
            out += string_format("\\u%04x", (unsigned) (unsigned char) *c);
        } else {
            out += *c;
        }
    }
    return out + "\"";
}

std::string dflash2_server_props_json() {
    const llama_spec_dflash2_llama_build built = llama_spec_dflash2_llama_built();
    const bool same = llama_spec_dflash2_llama_check() == LLAMA_SPEC_DFLASH2_OK;
    return string_format("{\"version\": %s, \"api_version\": %u, \"llama_build\": {\"llama_version\": %s, "
            "\"ggml_version\": %s, \"ggml_commit\": %s, \"origin\": %s, \"prefix\": %s}, \"llama_check\": %s}",
            json_string(llama_spec_dflash2_version()).c_str(), llama_spec_dflash2_api_version(),
            json_string(built.llama_version).c_str(), json_string(built.ggml_version).c_str(),
            json_string(built.ggml_commit).c_str(), json_string(built.origin).c_str(),
            json_string(built.prefix).c_str(), json_string(same ? "ok" : llama_spec_dflash2_last_error()).c_str());
}

std::string dflash2_server_metrics() {
    dflash2::stats s;
    int32_t n_max = 0;
    dflash2_server_slot_counters steps;
    {
        std::lock_guard<std::mutex> lock(g_stats_mutex);
        s     = g_stats;
        n_max = g_stats_n_max;
        steps = g_steps;
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
    counter("dflash2_ngram_nodes_total", "tree nodes an n-gram branch proposed", (double) s.n_ngram_nodes);
    counter("dflash2_ngram_accepted_total", "tree nodes an n-gram branch proposed that the target accepted",
            (double) s.n_ngram_accepted);
    counter("dflash2_tuned_drafts_total", "sampled drafts whose draft temperature dflash2 chose", (double) s.n_tuned_drafts);
    out += string_format("# HELP llamacpp:dflash2_draft_temperature_ratio mean draft temperature of those drafts, as a "
                         "multiple of the slot's\n# TYPE llamacpp:dflash2_draft_temperature_ratio gauge\n"
                         "llamacpp:dflash2_draft_temperature_ratio %g\n",
            s.mean_draft_temperature_ratio);
    // the budgets the steps got (the adaptive walk's choices): the mean nodes per
    // verify step is dflash2_verified_nodes_total / (steps of kind chain + tree)
    out += "# HELP llamacpp:dflash2_steps_total slot steps that asked for a draft, by the draft they got "
           "(none, chain, tree: one with a branch)\n"
           "# TYPE llamacpp:dflash2_steps_total counter\n";
    out += string_format("llamacpp:dflash2_steps_total{kind=\"none\"} %lld\n", (long long) steps.n_steps_none);
    out += string_format("llamacpp:dflash2_steps_total{kind=\"chain\"} %lld\n", (long long) steps.n_steps_chain);
    out += string_format("llamacpp:dflash2_steps_total{kind=\"tree\"} %lld\n", (long long) steps.n_steps_tree);
    counter("dflash2_verified_nodes_total", "drafted chain tokens and tree nodes the target verified",
            (double) steps.n_drafted);
    counter("dflash2_pad_rows_total", "rows added to verify batches whose last ubatch would be one row over the "
            "parked cells of trees (CPU attention)", (double) g_pad_rows.load());
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
