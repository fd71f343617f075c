// Our command-line options, taken out of argv before llama.cpp parses it. As
// llama.cpp's own options, each value option may also come from an environment
// variable (LLAMA_ARG_SPEC_DFLASH2_*); the command line wins over it.
#include "dflash2-server-impl.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// one value option: its flag, its environment variable and how its value is read
// (false with a message on stderr for a bad value)
struct value_option {
    const char * flag;
    const char * env;
    bool (*set)(dflash2_server_options & opts, const char * v);
};

// a whole decimal number in [lo, hi]
bool parse_int(const char * v, long lo, long hi, long & n) {
    char * end = nullptr;
    n = std::strtol(v, &end, 10);
    return *v != '\0' && *end == '\0' && n >= lo && n <= hi;
}

bool set_block_size(dflash2_server_options & opts, const char * v) {
    long n = 0;
    if (!parse_int(v, 0, 4096, n) || n == 1) {
        fprintf(stderr, "error: --spec-dflash2-block-size needs 0 (trained) or a block size >= 2, got '%s'\n", v);
        return false;
    }
    opts.block_size = (int32_t) n;
    return true;
}

bool set_image_rows(dflash2_server_options & opts, const char * v) {
    if (std::strcmp(v, "inject") == 0) {
        opts.image_rows = LLAMA_SPEC_DFLASH2_IMAGE_ROWS_INJECT;
    } else if (std::strcmp(v, "skip") == 0) {
        opts.image_rows = LLAMA_SPEC_DFLASH2_IMAGE_ROWS_SKIP;
    } else {
        fprintf(stderr, "error: --spec-dflash2-image-rows is inject or skip, got '%s'\n", v);
        return false;
    }
    return true;
}

bool set_walk(dflash2_server_options & opts, const char * v) {
    if (std::strcmp(v, "greedy") == 0) {
        opts.walk = LLAMA_SPEC_DFLASH2_WALK_GREEDY;
    } else if (std::strcmp(v, "adaptive") == 0) {
        opts.walk = LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE;
    } else {
        fprintf(stderr, "error: --spec-dflash2-walk is adaptive or greedy, got '%s'\n", v);
        return false;
    }
    return true;
}

bool set_tree(dflash2_server_options & opts, const char * v) {
    long n = 0;
    if (!parse_int(v, 0, DFLASH2_SERVER_TREE_MAX_NODES, n)) {
        fprintf(stderr, "error: --spec-dflash2-tree needs 0 (chains) or the nodes of a slot's tree, 1 to %d, got '%s'\n",
                DFLASH2_SERVER_TREE_MAX_NODES, v);
        return false;
    }
    opts.tree_nodes = (int32_t) n;
    opts.tree_given = true;
    return true;
}

bool set_ngram(dflash2_server_options & opts, const char * v) {
    long n = 0;
    if (!parse_int(v, 0, LLAMA_SPEC_DFLASH2_MAX_NGRAM_BRANCHES, n)) {
        fprintf(stderr, "error: --spec-dflash2-ngram needs 0 (none) to %d n-gram branches per tree, got '%s'\n",
                LLAMA_SPEC_DFLASH2_MAX_NGRAM_BRANCHES, v);
        return false;
    }
    opts.ngram_branches = (int32_t) n;
    return true;
}

bool set_adapt_sampled(dflash2_server_options & opts, const char * v) {
    if (std::strcmp(v, "on") == 0) {
        opts.adapt_sampled = 1;
    } else if (std::strcmp(v, "off") == 0) {
        opts.adapt_sampled = 0;
    } else {
        fprintf(stderr, "error: --spec-dflash2-adapt-sampled is on or off, got '%s'\n", v);
        return false;
    }
    return true;
}

bool set_draft_graph(dflash2_server_options & opts, const char * v) {
    if (std::strcmp(v, "own") == 0) {
        opts.draft_graph = LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_OWN;
    } else if (std::strcmp(v, "libllama") == 0) {
        opts.draft_graph = LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_LIBLLAMA;
    } else {
        fprintf(stderr, "error: --spec-dflash2-draft-graph is own or libllama, got '%s'\n", v);
        return false;
    }
    return true;
}

const value_option VALUE_OPTIONS[] = {
    { "--spec-dflash2-block-size", "LLAMA_ARG_SPEC_DFLASH2_BLOCK_SIZE", set_block_size },
    { "--spec-dflash2-image-rows", "LLAMA_ARG_SPEC_DFLASH2_IMAGE_ROWS", set_image_rows },
    { "--spec-dflash2-walk",       "LLAMA_ARG_SPEC_DFLASH2_WALK",       set_walk       },
    { "--spec-dflash2-tree",       "LLAMA_ARG_SPEC_DFLASH2_TREE",       set_tree       },
    { "--spec-dflash2-ngram",      "LLAMA_ARG_SPEC_DFLASH2_NGRAM",      set_ngram      },
    { "--spec-dflash2-adapt-sampled", "LLAMA_ARG_SPEC_DFLASH2_ADAPT_SAMPLED", set_adapt_sampled },
    { "--spec-dflash2-draft-graph", "LLAMA_ARG_SPEC_DFLASH2_DRAFT_GRAPH", set_draft_graph },
};

} // namespace

dflash2_server_options & dflash2_server_opts() {
    static dflash2_server_options options;
    return options;
}

bool dflash2_server_take_args(int & argc, char ** argv) {
    dflash2_server_exit_on_backend_abort();
    dflash2_server_options & opts = dflash2_server_opts();
    for (const value_option & o : VALUE_OPTIONS) {
        const char * v = std::getenv(o.env);
        if (v && !o.set(opts, v)) {
            fprintf(stderr, "error: (from the environment variable %s)\n", o.env);
            return false;
        }
    }
    int out = 1;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const value_option * option = nullptr;
        for (const value_option & o : VALUE_OPTIONS) {
            if (arg == o.flag) {
                option = &o;
            }
        }
        if (option) {
            if (i + 1 >= argc) {
                fprintf(stderr, "error: %s needs a value\n", arg.c_str());
                return false;
            }
            if (!option->set(opts, argv[++i])) {
                return false;
            }
        } else if (arg == "--spec-dflash2-upstream") {
            opts.use_upstream = true;
        } else {
            argv[out++] = argv[i];
        }
    }
    argc = out;
    argv[argc] = nullptr;
    // the adaptive walk's controller sizes each step's draft (none, a chain or a
    // tree of up to the budget), so it gets trees by default; the greedy walk
    // always grows a tree to its request, so it drafts chains unless asked
    if (!opts.tree_given) {
        opts.tree_nodes = opts.walk == LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE ? DFLASH2_SERVER_TREE_DEFAULT_NODES : 0;
    }
    return true;
}
