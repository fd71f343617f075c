// Where the tools put the target and the drafter: llama.cpp's device options
// (--device, -ngl, -sm, -ts, --rpc; -devd, -ngld for the drafter) resolved into
// ggml devices, the way llama-server's parser does it.
#include "devices.h"

#include "ggml-backend.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>

namespace {

std::vector<std::string> split_list(const std::string & list) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= list.size()) {
        const size_t comma = list.find(',', start);
        const size_t end   = comma == std::string::npos ? list.size() : comma;
        out.push_back(list.substr(start, end - start));
        if (comma == std::string::npos) {
            break;
        }
        start = comma + 1;
    }
    return out;
}

std::string known_devices() {
    std::string names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        names += (names.empty() ? "" : ", ") + std::string(ggml_backend_dev_name(ggml_backend_dev_get(i)));
    }
    return names;
}

} // namespace

void host_add_rpc_servers(const std::string & list) {
    static std::set<std::string> added;
    if (list.empty()) {
        return;
    }
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (!reg) {
        throw std::runtime_error("--rpc: this llama.cpp build has no RPC backend (build it with GGML_RPC=ON)");
    }
    using add_server_t = ggml_backend_reg_t (*)(const char * endpoint);
    auto add_server = (add_server_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server");
    if (!add_server) {
        throw std::runtime_error("--rpc: the RPC backend has no ggml_backend_rpc_add_server");
    }
    for (const std::string & endpoint : split_list(list)) {
        if (!added.insert(endpoint).second) {
            continue;
        }
        // registers the server's devices (RPC0, RPC1, ... in order); an endpoint
        // that does not answer ends the process in ggml-rpc (see host_exit_on_backend_abort)
        ggml_backend_reg_t server = add_server(endpoint.c_str());
        if (!server) {
            throw std::runtime_error("--rpc: cannot add the RPC server " + endpoint);
        }
        ggml_backend_register(server);
    }
}

std::vector<ggml_backend_dev_t> host_parse_devices(const std::string & flag, const std::string & list) {
    std::vector<ggml_backend_dev_t> devices;
    if (list == "none") {
        return devices;
    }
    for (const std::string & name : split_list(list)) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (!dev) {
            throw std::runtime_error(flag + ": no device '" + name + "' (devices: " + known_devices() + ")");
        }
        devices.push_back(dev);
    }
    return devices;
}

llama_split_mode host_parse_split_mode(const std::string & mode) {
    if (mode == "none") {
        return LLAMA_SPLIT_MODE_NONE;
    }
    if (mode == "layer") {
        return LLAMA_SPLIT_MODE_LAYER;
    }
    if (mode == "row") {
        return LLAMA_SPLIT_MODE_ROW;
    }
    if (mode == "tensor") {
        return LLAMA_SPLIT_MODE_TENSOR;
    }
    throw std::runtime_error("--split-mode needs none, layer, row or tensor, got '" + mode + "'");
}

std::vector<float> host_parse_tensor_split(const std::string & list) {
    std::vector<float> out;
    if (list.empty()) {
        return out;
    }
    for (const std::string & v : split_list(list)) {
        size_t used = 0;
        float  f    = -1.0f;
        try {
            f = std::stof(v, &used);
        } catch (const std::exception &) {
            used = 0;
        }
        if (used != v.size() || !(f >= 0.0f)) {
            throw std::runtime_error("--tensor-split needs numbers >= 0, got '" + list + "'");
        }
        out.push_back(f);
    }
    if (out.size() > llama_max_devices()) {
        throw std::runtime_error("--tensor-split: more than " + std::to_string(llama_max_devices()) + " values");
    }
    return out;
}

ggml_backend_dev_t * host_placement::list() {
    devices_nt = devices;
    devices_nt.push_back(nullptr);
    return has_devices ? devices_nt.data() : nullptr;
}

void host_placement::apply(llama_model_params & mparams) {
    if (ggml_backend_dev_t * l = list()) {
        mparams.devices = l;
    }
    mparams.n_gpu_layers = n_gpu_layers;
    mparams.split_mode   = split_mode;
    if (!tensor_split.empty()) {
        split_nt.assign(llama_max_devices(), 0.0f);
        std::copy(tensor_split.begin(), tensor_split.end(), split_nt.begin());
        mparams.tensor_split = split_nt.data();
    }
}

bool host_placement::cpu_only() const {
    if (n_gpu_layers == 0 || (has_devices && devices.empty())) {
        return true;
    }
    if (has_devices) {
        return false;
    }
    // libllama's default: every GPU (an RPC server's device counts as one)
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        const enum ggml_backend_dev_type type = ggml_backend_dev_type(ggml_backend_dev_get(i));
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            return false;
        }
    }
    return true;
}

std::string host_placement::describe() const {
    std::string out;
    if (!has_devices) {
        out = "default devices";
    } else if (devices.empty()) {
        out = "CPU";
    } else {
        for (ggml_backend_dev_t d : devices) {
            out += (out.empty() ? "" : "+") + std::string(ggml_backend_dev_name(d));
        }
    }
    if (n_gpu_layers >= 0) {
        out += " ngl " + std::to_string(n_gpu_layers);
    }
    static const char * modes[] = { "none", "layer", "row", "tensor" };
    if (split_mode != LLAMA_SPLIT_MODE_LAYER && (int) split_mode >= 0 && (int) split_mode < 4) {
        out += std::string(" sm ") + modes[split_mode];
    }
    return out;
}

namespace {

void exit_on_backend_abort(const char * message) {
    // ggml prints nothing of its own when a callback is set, and calls abort()
    // after it returns: other aborts stay aborts (a bug should leave a core)
    fprintf(stderr, "%s\n", message);
    if (strstr(message, "ggml-rpc") != nullptr) {
        fprintf(stderr, "fatal: an RPC server did not answer or went away; exiting with status 1\n");
        fflush(stderr);
        _Exit(1);
    }
    fflush(stderr);
}

} // namespace

void host_exit_on_backend_abort() {
    ggml_set_abort_callback(exit_on_backend_abort);
    // ggml-rpc writes to its sockets without MSG_NOSIGNAL: a write to a server that
    // went away would end the tool by SIGPIPE before ggml-rpc sees the error
    // (llama-server ignores SIGPIPE too)
    signal(SIGPIPE, SIG_IGN);
}
