// How dflash2 verifies a slot's draft in llama-server: sample-and-match for
// greedy drafts (as llama.cpp), lossless rejection sampling for sampled drafts,
// and what the probabilities of the emitted tokens need (the server leaves them
// empty for drafted tokens; dflash2 fills them as a plain step does).
#include "dflash2-server-impl.h"

#include "log.h"

#include <algorithm>

const char * dflash2_server_sampled_verify_blocker(const common_params_sampling & params) {
    if (params.mirostat != 0) {
        return "mirostat updates its state from the token it draws itself";
    }
    if (std::find(params.samplers.begin(), params.samplers.end(), COMMON_SAMPLER_TYPE_ADAPTIVE_P) != params.samplers.end()) {
        return "adaptive-p updates its state from the token it draws itself";
    }
    // backend sampling leaves its distribution on the host (llama_get_sampled_probs_ith,
    // cur_p): its token is drawn on the device, but verification draws its own
    return nullptr;
}

void dflash2_server_verified::keep(int32_t row, const llama_token_data_array & cur_p, llama_token token,
        size_t n_probs_post) {
    rows.push_back(row);
    if (n_probs_post == 0) {
        return;
    }
    // what populate_token_probs reads after sorting cur_p by p: its first n_probs
    // entries, and the emitted token's p wherever it is
    std::vector<llama_token_data> cand(cur_p.data, cur_p.data + cur_p.size);
    const size_t n = std::min(n_probs_post, cand.size());
    std::partial_sort(cand.begin(), cand.begin() + n, cand.end(),
            [](const llama_token_data & a, const llama_token_data & b) { return a.p > b.p; });
    const auto is_token = [token](const llama_token_data & d) { return d.id == token; };
    if (std::find_if(cand.begin(), cand.begin() + n, is_token) == cand.begin() + n) {
        const auto it = std::find_if(cand.begin() + n, cand.end(), is_token);
        if (it != cand.end()) {
            cand[n] = *it; // n < size here
            cand.resize(n + 1);
        } else {
            cand.resize(n);
        }
    } else {
        cand.resize(n);
    }
    top.push_back(std::move(cand));
}

int32_t dflash2_server_verified::row_for_probs(common_sampler * smpl, size_t i) {
    if (i >= rows.size()) {
        return -1;
    }
    if (i < top.size()) {
        // the sampler's candidates are overwritten by its next sampling; until then
        // they show token i's, sorted, for populate_token_probs
        auto & cand = top[i];
        *common_sampler_get_candidates(smpl, false) = { cand.data(), cand.size(), 0, true };
    }
    return rows[i];
}

std::vector<llama_token> dflash2_server_verify_match(common_sampler * smpl, llama_context * ctx,
        const std::vector<int> & idxs, const llama_tokens & draft, size_t n_probs_post, dflash2_server_verified & verified) {
    GGML_ASSERT(idxs.size() == draft.size() + 1 && "idxs.size() must be draft.size() + 1");
    verified.clear();

    std::vector<llama_token> result;
    result.reserve(idxs.size());

    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));

    size_t i = 0;
    for (; i <= draft.size(); i++) {
        const llama_token id = common_sampler_sample(smpl, ctx, idxs[i]);
        verified.keep(idxs[i], *common_sampler_get_candidates(smpl, false), id, n_probs_post);

        common_sampler_accept(smpl, id, true);

        result.push_back(id);

        // as llama.cpp: no draft tokens after an end-of-generation token
        if (i == draft.size() || draft[i] != id || (llama_vocab_is_eog(vocab, id) && i + 1 < draft.size())) {
            break;
        }
    }

    return result;
}

std::vector<llama_token> dflash2_server_verify_sampled(dflash2::engine & engine, llama_seq_id seq_id,
        common_sampler * smpl, llama_context * ctx, const std::vector<int> & idxs, const llama_tokens & draft,
        size_t n_probs_post, dflash2_server_verified & verified, int32_t & n_verified) {
    GGML_ASSERT(idxs.size() == draft.size() + 1 && "idxs.size() must be draft.size() + 1");
    verified.clear();

    std::vector<llama_token> result;
    result.reserve(idxs.size());

    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));

    // the library's verification runs to its end even after an end-of-generation
    // token ended the output: it then sees the draft itself as p (kept), and the
    // server trims the rows after the end as for any rejected tail
    bool ended = false;
    std::vector<llama_token_data> one_hot(1);

    int32_t i = 0;
    for (;; ++i) {
        llama_token_data_array p;
        if (!ended) {
            // one pass of the slot's sampler; the grammar goes first so that p is the
            // distribution the token is meant to follow (the server's lazy order,
            // chain then grammar check, approximates it)
            common_sampler_sample(smpl, ctx, idxs[i], /*grammar_first*/ true);
            p = *common_sampler_get_candidates(smpl, false);
        } else {
            one_hot[0] = { i < (int32_t) draft.size() ? draft[i] : result.back(), 0.0f, 1.0f };
            p          = { one_hot.data(), 1, 0, true };
        }

        llama_token token = LLAMA_TOKEN_NULL;
        bool accepted = false;
        try {
            accepted = engine.verify_sampled_step(seq_id, i, p, token);
        } catch (const dflash2::error & e) {
            // cannot happen with a sampled draft awaiting its verification; the token
            // the slot's chain drew is then what a plain step emits
            LOG_ERR("%s\n", e.what());
            if (ended) {
                break;
            }
            token = p.data[p.selected].id;
            accepted = i < (int32_t) draft.size() && draft[i] == token;
        }

        if (!ended) {
            verified.keep(idxs[i], p, token, n_probs_post);
            common_sampler_accept(smpl, token, true);
            result.push_back(token);
            ended = llama_vocab_is_eog(vocab, token);
        }
        if (!accepted) {
            break;
        }
    }
    n_verified = i;

    return result;
}

std::vector<llama_token> dflash2_server_verify_replay(common_sampler * smpl, llama_context * ctx,
        const std::vector<int> & idxs, const llama_tokens & draft, size_t n_probs_post, dflash2_server_verified & verified) {
    GGML_ASSERT(idxs.size() == draft.size() + 1 && "idxs.size() must be draft.size() + 1");
    verified.clear();

    std::vector<llama_token> result;
    for (size_t i = 0; i <= draft.size(); ++i) {
        // the sampler's pass gives the candidates (and the bonus token at the end)
        const llama_token id = common_sampler_sample(smpl, ctx, idxs[i], /*grammar_first*/ true);
        const llama_token token = i < draft.size() ? draft[i] : id;
        verified.keep(idxs[i], *common_sampler_get_candidates(smpl, false), token, n_probs_post);
        common_sampler_accept(smpl, token, true);
        result.push_back(token);
    }
    return result;
}

std::vector<llama_token> dflash2_server_verify_tree(common_sampler * smpl, llama_context * ctx,
        const std::vector<int> & idxs, const std::vector<dflash2::tree_node> & nodes, size_t n_probs_post,
        dflash2_server_verified & verified, std::vector<int32_t> & path) {
    GGML_ASSERT(idxs.size() == nodes.size() + 1 && "a tree verifies in one row per node and the anchor's");
    verified.clear();
    path.clear();

    std::vector<llama_token> result;
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));

    int32_t cur = -1; // the anchor
    while (true) {
        const int32_t row = idxs[cur + 1];
        const llama_token id = common_sampler_sample(smpl, ctx, row);
        verified.keep(row, *common_sampler_get_candidates(smpl, false), id, n_probs_post);
        common_sampler_accept(smpl, id, true);
        result.push_back(id);
        // no drafted token after an end-of-generation token: the server stops there
        if (llama_vocab_is_eog(vocab, id)) {
            break;
        }
        int32_t next = -1;
        for (size_t i = 0; i < nodes.size(); ++i) {
            if (nodes[i].parent == cur && nodes[i].token == id) {
                next = (int32_t) i;
                break;
            }
        }
        if (next < 0) {
            break;
        }
        path.push_back(next);
        cur = next;
    }
    return result;
}

std::vector<llama_token> dflash2_server_verify_tree_sampled(dflash2::engine & engine, llama_seq_id seq_id,
        common_sampler * smpl, llama_context * ctx, const std::vector<int> & idxs,
        const std::vector<dflash2::tree_node> & nodes, size_t n_probs_post, dflash2_server_verified & verified,
        std::vector<int32_t> & path) {
    GGML_ASSERT(idxs.size() == nodes.size() + 1 && "a tree verifies in one row per node and the anchor's");
    verified.clear();
    path.clear();

    std::vector<llama_token> result;
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));

    const auto first_child = [&](int32_t node, llama_token token) {
        for (size_t i = 0; i < nodes.size(); ++i) {
            if (nodes[i].parent == node && (token == LLAMA_TOKEN_NULL || nodes[i].token == token)) {
                return (int32_t) i;
            }
        }
        return (int32_t) -1;
    };

    // as dflash2_server_verify_sampled: the library's verification runs to its end
    // even after an end-of-generation token ended the output; it then sees the
    // node's first child as p (kept: the child was drawn, its q is > 0), and the
    // server trims the rows after the end
    bool ended = false;
    std::vector<llama_token_data> one_hot(1);

    int32_t node = -1; // the anchor
    while (true) {
        llama_token_data_array p;
        if (!ended) {
            // one pass of the slot's sampler at the node's row (the grammar first, as for chains)
            common_sampler_sample(smpl, ctx, idxs[node + 1], /*grammar_first*/ true);
            p = *common_sampler_get_candidates(smpl, false);
        } else {
            const int32_t c = first_child(node, LLAMA_TOKEN_NULL);
            one_hot[0] = { c >= 0 ? nodes[c].token : result.back(), 0.0f, 1.0f };
            p          = { one_hot.data(), 1, 0, true };
        }

        llama_token token = LLAMA_TOKEN_NULL;
        int32_t child = -1;
        try {
            child = engine.verify_tree_sampled_step(seq_id, node, p, token);
        } catch (const dflash2::error & e) {
            // cannot happen with a sampled tree awaiting its verification; the token
            // the slot's chain drew is then what a plain step emits
            LOG_ERR("%s\n", e.what());
            if (ended) {
                break;
            }
            token = p.data[p.selected].id;
            child = first_child(node, token);
        }

        if (!ended) {
            verified.keep(idxs[node + 1], p, token, n_probs_post);
            common_sampler_accept(smpl, token, true);
            result.push_back(token);
            ended = llama_vocab_is_eog(vocab, token);
        }
        if (child < 0) {
            break;
        }
        path.push_back(child);
        node = child;
    }
    return result;
}
