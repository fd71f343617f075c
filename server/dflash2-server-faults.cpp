// What the server does when a device backend fails under it. The pinned
// ggml-rpc ends the process with GGML_ABORT when an RPC server does not answer
// at start-up ("Failed to connect to HOST:PORT") or goes away while serving
// ("Remote RPC server crashed or returned malformed response"), from its
// dispatcher thread, where nothing can catch it, and the model's weights on
// that server are gone with it: serving cannot go on. The server then exits
// with status 1 and says why, instead of dying of SIGABRT. Every other ggml
// abort stays an abort (a bug should leave a core), with its message printed.
#include "dflash2-server.h"

#include "ggml.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

void on_ggml_abort(const char * message) {
    // with a callback set ggml prints nothing itself, and abort()s when it returns
    fprintf(stderr, "%s\n", message);
    if (strstr(message, "ggml-rpc") != nullptr) {
        fprintf(stderr,
                "llama-server: fatal: an RPC server of this model did not answer or went away (the message above); "
                "its part of the model is lost with it, exiting with status 1\n");
        fflush(stderr);
        _Exit(1);
    }
    fflush(stderr);
}

} // namespace

void dflash2_server_exit_on_backend_abort() {
    ggml_set_abort_callback(on_ggml_abort);
}
