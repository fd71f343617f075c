#!/usr/bin/env bash
# Builds llama-server with dflash2: the pinned llama.cpp tree's tools/server,
# patched by server/patch.py to route DFlash2 drafting through libdflash2,
# compiled in the cached llama.cpp build tree (so it reuses that build's libllama
# and libllama-common objects) and installed into target/server with an rpath to
# the pinned prefix: at run time the server and libdflash2 load the same libllama.
#
#   scripts/server.sh build          build (incremental); prints the llama-server path
#   scripts/server.sh run ARGS...    build, then run llama-server ARGS
#   scripts/server.sh dir            print the install folder (bin/, lib/, prefix/)
#
# DFLASH2_LLAMA_BACKENDS=vulkan,rpc (see scripts/llama-cpp.sh) builds the server of
# the Vulkan build into target/server-vulkan (set CARGO_TARGET_DIR apart as well,
# or cargo rebuilds libdflash2 for each build in turn).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
case ",${DFLASH2_LLAMA_BACKENDS:-}," in
    *,vulkan,*) out="$root/target/server-vulkan" ;;
    *) out="$root/target/server" ;;
esac

ensure_patchelf() {
    command -v patchelf >/dev/null && return
    echo "[server] installing patchelf" >&2
    local sudo_cmd=""
    [ "$(id -u)" = 0 ] || sudo_cmd=sudo
    $sudo_cmd apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq patchelf >&2
}

build() {
    local llama_prefix src build prefix
    ensure_patchelf
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

    rm -rf "$out/bin" "$out/lib"
    mkdir -p "$out/bin" "$out/lib"
    cp -f "$build/bin/llama-server" "$out/bin/llama-server"
    cp -af "$build/bin/"libmtmd.so* "$build/bin/"libllama-server-impl.so* "$out/lib/"
    flock -u 9
    # libllama, libllama-common and ggml come from the pinned prefix (the files
    # libdflash2 links), the server's own libraries from here, libdflash2 from this
    # clone's install
    local rpath="$out/lib:$llama_prefix/lib:$prefix/lib" f
    for f in "$out/bin/llama-server" "$out/lib/"*.so*; do
        [ -L "$f" ] || patchelf --set-rpath "$rpath" "$f"
    done
    echo "$out/bin/llama-server"
}

case "${1:-build}" in
    build)
        build
        ;;
    dir)
        echo "$out"
        ;;
    run)
        shift
        server=$(build)
        exec "$server" "$@"
        ;;
    *)
        echo "usage: $0 build | run ARGS... | dir" >&2
        exit 2
        ;;
esac
