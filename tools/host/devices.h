// Device placement for the tools: llama.cpp's --device / -ngl / -sm / -ts / --rpc
// for the target and --draft-device / --draft-ngl for the drafter.
#pragma once

#include "llama.h"

#include <string>
#include <vector>

// registers the RPC servers of a comma-separated HOST:PORT list (once per
// endpoint), their devices named RPC0, RPC1, ... in order
void host_add_rpc_servers(const std::string & list);

// "Vulkan0,RPC0" -> those devices; "none" -> none (the CPU only); throws on an
// unknown name, listing the devices there are
std::vector<ggml_backend_dev_t> host_parse_devices(const std::string & flag, const std::string & list);

llama_split_mode   host_parse_split_mode(const std::string & mode);
std::vector<float> host_parse_tensor_split(const std::string & list);

// where a model goes, as llama_model_params takes it
struct host_placement {
    bool                            has_devices  = false; // false: libllama's default (every GPU)
    std::vector<ggml_backend_dev_t> devices;              // empty with has_devices: the CPU only
    int32_t                         n_gpu_layers = -1;    // < 0: all
    llama_split_mode                split_mode   = LLAMA_SPLIT_MODE_LAYER;
    std::vector<float>              tensor_split;         // empty: by free memory

    // sets mparams' devices, n_gpu_layers, split_mode and tensor_split; the
    // pointers stay valid while this placement lives
    void        apply(llama_model_params & mparams);
    // NULL-terminated devices, or NULL without has_devices (valid while this lives)
    ggml_backend_dev_t * list();
    std::string describe() const;
    // no layer goes to an accelerator: the target runs on ggml's CPU backend
    bool        cpu_only() const;

  private:
    std::vector<ggml_backend_dev_t> devices_nt;
    std::vector<float>              split_nt;
};

// a ggml abort from the RPC backend (a server that went away or never answered)
// ends the process with a message and exit code 1 instead of SIGABRT: the pinned
// ggml-rpc aborts in its dispatcher thread, where nothing can catch it. Also
// ignores SIGPIPE, which a write to a lost RPC server raises first.
void host_exit_on_backend_abort();
