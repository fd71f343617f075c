#!/usr/bin/env bash
# Builds llama-server with dflash2: the pinned llama.cpp tree's tools/server,
# patched by server/patch.py to route DFlash2 drafting through libdflash2,
# compiled in the cached llama.cpp build tree (so it reuses that build's libllama
# and libllama-common objects) and installed into target/server with an rpath to
# the pinned prefix: at run time the server and libdflash2 load the same libllama.
#
#   scripts/server.sh build          build (incremental); prints the llama-server path
#   scripts/server.sh run ARGS...    build, then run llama-server ARGS
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out="$root/target/server"

build() {
    local llama_prefix src build prefix
    llama_prefix=$(scripts/llama-cpp.sh build)
    export DFLASH2_LLAMA_PREFIX="$llama_prefix"
    src=$(scripts/llama-cpp.sh src)
    build=$(scripts/llama-cpp.sh build-dir)
    prefix=$(scripts/install.sh "$out/prefix")

    # the cached tree and build folder are shared by every clone on the machine
    exec 9>"$(dirname "$src")/.lock"
    flock 9
    if [ ! -d "$src/tools/server.pristine" ]; then
        cp -a "$src/tools/server" "$src/tools/server.pristine.tmp"
        mv "$src/tools/server.pristine.tmp" "$src/tools/server.pristine"
    fi
    python3 server/patch.py "$src/tools/server.pristine" "$src/tools/server" >&2
    cmake -S "$src" -B "$build" \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DDFLASH2_SERVER_DIR="$root/server" -DDFLASH2_INCLUDE_DIR="$prefix/include" \
        -DDFLASH2_LIBRARY="$prefix/lib/libdflash2.so" >&2
    cmake --build "$build" --target llama-server -j "${DFLASH2_JOBS:-$(nproc)}" >&2

    mkdir -p "$out/bin" "$out/lib"
    cp -f "$build/bin/llama-server" "$out/bin/llama-server"
    cp -af "$build/bin/"libmtmd.so* "$out/lib/"
    flock -u 9
    # load libllama, libllama-common and ggml from the pinned prefix (the files
    # libdflash2 links), libmtmd from here, libdflash2 from this clone's install
    cmake -DSERVER="$out/bin/llama-server" -DMTMD="$(readlink -f "$out/lib/libmtmd.so")" \
        -DRPATH="$out/lib:$llama_prefix/lib:$prefix/lib" -DMTMD_RPATH="$llama_prefix/lib" \
        -P server/set-rpath.cmake
    echo "$out/bin/llama-server"
}

case "${1:-build}" in
    build)
        build
        ;;
    run)
        shift
        server=$(build)
        exec "$server" "$@"
        ;;
    *)
        echo "usage: $0 build | run ARGS..." >&2
        exit 2
        ;;
esac
