// Command-line options shared by the tools.
#pragma once

#include "host.h"

#include <map>
#include <string>
#include <vector>

struct host_args {
    host_params                        params;
    std::vector<int32_t>               np_list; // --np 1,2,4 (params.n_seq = the largest)
    std::vector<std::string>           prompts; // user messages (chat template applied)
    std::vector<std::string>           flags;   // value-less options the tool handles itself
    std::map<std::string, std::string> values;  // the tool's own options with a value
    bool                               help = false; // --help or -h: print the options, run nothing
};

// parses --target --draft --n-max --n-predict --np --threads --ctx-size --temp --seed --prompt --prompts,
// and the tool's `value_flags` (each takes a value); throws std::runtime_error on bad input
host_args host_parse_args(int argc, char ** argv, const std::vector<std::string> & value_flags = {});

// "1,2,4" -> {1, 2, 4}; each >= 1
std::vector<int32_t> host_parse_int_list(const std::string & flag, const std::string & list);

// the shared options, grouped, one screen with a tool's own group
const char * host_args_usage();
