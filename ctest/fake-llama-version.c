// Preloaded (LD_PRELOAD) before the pinned libllama: a llama_version() that
// reports another llama.cpp, as a newer libllama.so.0 on the library path would.
const char * llama_version(void) {
    return "9.9.9-test";
}
