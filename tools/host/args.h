// Command-line options shared by the tools.
#pragma once

#include "host.h"

#include <string>
#include <vector>

struct host_args {
    host_params              params;
    std::vector<std::string> prompts; // user messages (chat template applied)
    std::vector<std::string> rest;    // options the tool handles itself
};

// parses --target --draft --n-max --n-predict --np --threads --ctx-size --prompt --prompts;
// throws std::runtime_error with a message on bad input
host_args host_parse_args(int argc, char ** argv);

const char * host_args_usage();
