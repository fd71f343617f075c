#!/usr/bin/env bash
# Obtains the pinned llama.cpp source (vendor/llama.cpp of the PyPI sdist llama-cpp-python)
# and builds its shared libraries into a cache folder outside the clone, so every clone
# on this machine (and CI) reuses one build.
#
#   scripts/llama-cpp.sh build    fetch + build + install if not cached; prints the prefix
#   scripts/llama-cpp.sh prefix   print the install prefix (whether built or not)
#   scripts/llama-cpp.sh src      print the source tree path (whether fetched or not)
#   scripts/llama-cpp.sh build-dir print the CMake build folder of the pinned build
#   ... --backends LIST           (any command) the device backends of the build: `rpc`
#                                 (default: CPU + ggml's RPC backend and its server
#                                 PREFIX/bin/ggml-rpc-server) or `vulkan,rpc` (adds Vulkan;
#                                 its shaders take long to build, see the README)
#
# Environment:
#   DFLASH2_CACHE         cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/dflash2)
#   DFLASH2_LLAMA_PREFIX  use your own llama.cpp install prefix instead (include/llama.h,
#                         lib/libllama.so); this script then only prints it
#   DFLASH2_JOBS          parallel build jobs (default: nproc)
#   DFLASH2_LLAMA_VARIANT unset (the pinned native build) or `portable`: no -march=native,
#                         no AVX-512 / AMX (SSE4.2, AVX2, FMA, F16C, BMI2 only), with debug
#                         info, built and cached beside the native one (prefix-rN-portable,
#                         build-rN-portable). Valgrind runs the C tests against it
#                         (scripts/sanitizers.sh valgrind): it cannot execute AVX-512 or AMX.
#   DFLASH2_LLAMA_BACKENDS the same as --backends (the flag wins); every script that calls
#                         this one (install, server, tools, tests) follows it.
set -euo pipefail
SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

PIN_PACKAGE=llama-cpp-python
PIN_VERSION=0.3.36
PIN_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

# Bump RECIPE when the flags below change: it keys the cached build.
# r2: ggml's RPC backend (GGML_RPC) and its server in every build.
# r3: the tree carries scripts/ggml-fixes.py (meta-zero-fill: -sm tensor's empty
#     slices filled with 0 instead of NaN-keeping scale-by-0).
RECIPE=3
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=ON
    -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=OFF
    -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_OPENSSL=OFF
    -DGGML_NATIVE=ON
    -DGGML_RPC=ON
    -DCMAKE_INSTALL_LIBDIR=lib
)

# --backends LIST, anywhere on the command line (the rest are the command)
BACKENDS=${DFLASH2_LLAMA_BACKENDS:-rpc}
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --backends) BACKENDS=${2:?--backends needs a list}; shift 2 ;;
        --backends=*) BACKENDS=${1#--backends=}; shift ;;
        *) args+=("$1"); shift ;;
    esac
done
set -- ${args[@]+"${args[@]}"}
VULKAN=0
for backend in ${BACKENDS//,/ }; do
    case "$backend" in
        rpc|cpu) ;;
        vulkan) VULKAN=1 ;;
        *)
            echo "[llama-cpp] unknown backend '$backend' in --backends $BACKENDS (known: rpc, vulkan; CPU and RPC are in every build)" >&2
            exit 2
            ;;
    esac
done
# The pinned ggml-vulkan needs Vulkan headers >= 1.3.261 (VK_EXT_layer_settings);
# Debian 12 ships 1.3.239. The headers of Debian 13's libvulkan-dev (pinned by
# checksum) are unpacked into the cache and used with Debian 12's loader.
VK_HEADERS_DEB=pool/main/v/vulkan-loader/libvulkan-dev_1.4.309.0-1_amd64.deb
VK_HEADERS_SHA256=8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a

VARIANT=${DFLASH2_LLAMA_VARIANT:-}
case "$VARIANT" in
    "") ;;
    portable)
        CMAKE_FLAGS+=(
            -DCMAKE_BUILD_TYPE=RelWithDebInfo
            -DGGML_NATIVE=OFF
            -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
            -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
        )
        ;;
    *)
        echo "[llama-cpp] unknown DFLASH2_LLAMA_VARIANT=$VARIANT (known: portable)" >&2
        exit 2
        ;;
esac
# the cached prefix and build folder are keyed by recipe, variant and backends
SUFFIX="r${RECIPE}${VARIANT:+-$VARIANT}"
if [ "$VULKAN" = 1 ]; then
    SUFFIX="$SUFFIX-vulkan"
fi

cache_root() {
    echo "${DFLASH2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dflash2}"
}

pin_root() {
    echo "$(cache_root)/llama.cpp-${PIN_VERSION}"
}

src_dir() {
    echo "$(pin_root)/src"
}

prefix_dir() {
    if [ -n "${DFLASH2_LLAMA_PREFIX:-}" ]; then
        echo "$DFLASH2_LLAMA_PREFIX"
    else
        echo "$(pin_root)/prefix-${SUFFIX}"
    fi
}

log() {
    echo "[llama-cpp] $*" >&2
}

apt_install() { # [apt-get options] packages...
    local sudo_cmd=()
    [ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "$@" >&2
}

ensure_tools() {
    local missing=()
    command -v cmake >/dev/null || missing+=(cmake)
    command -v g++   >/dev/null || missing+=(g++)
    if [ "$VULKAN" = 1 ]; then
        # the Vulkan loader and headers, the shader compiler
        command -v glslc >/dev/null || missing+=(glslc)
        [ -f /usr/include/vulkan/vulkan.h ] || missing+=(libvulkan-dev)
        ls /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake >/dev/null 2>&1 || missing+=(spirv-headers)
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing missing tools: ${missing[*]}"
        apt_install "${missing[@]}"
    fi
}

# Mesa's llvmpipe: a Vulkan device (type CPU) on machines without a GPU. Mesa 22.3
# (Debian 12) corrupts its heap in processes that hold two Vulkan contexts (a
# target and a drafter: 4 crashes in 6 llama-server runs of llama.cpp's own
# draft-dflash, 1 in 6 with dflash2); Mesa 25.0 (bookworm-backports) ran 15 of 15.
ensure_llvmpipe() {
    local version
    version=$(dpkg-query -W -f '${Version}' mesa-vulkan-drivers 2>/dev/null || true)
    if [ -n "$version" ] && dpkg --compare-versions "$version" ge 25; then
        return
    fi
    if grep -q '^12' /etc/debian_version 2>/dev/null; then
        log "installing Mesa's Vulkan drivers from bookworm-backports (llvmpipe of Mesa >= 25)"
        if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
            local list=/etc/apt/sources.list.d/dflash2-bookworm-backports.list
            local line="deb http://deb.debian.org/debian bookworm-backports main"
            if [ "$(id -u)" = 0 ]; then echo "$line" > "$list"; else echo "$line" | sudo tee "$list" >/dev/null; fi
        fi
        apt_install -t bookworm-backports mesa-vulkan-drivers
    else
        log "installing Mesa's Vulkan drivers"
        apt_install mesa-vulkan-drivers
    fi
}

fetch_source() {
    local root src tarball
    root=$(pin_root)
    src=$(src_dir)
    if [ -f "$src/.dflash2-fetched" ]; then
        return
    fi
    mkdir -p "$root/download"
    tarball="$root/download/${PIN_PACKAGE//-/_}-${PIN_VERSION}.tar.gz"
    if [ ! -f "$tarball" ] || ! echo "$PIN_SHA256  $tarball" | sha256sum -c --status; then
        log "downloading $PIN_PACKAGE==$PIN_VERSION sdist from PyPI"
        # pip prepares the sdist's metadata, which needs scikit-build-core and cmake
        python3 -m pip install -q scikit-build-core >&2
        python3 -m pip download --no-deps --no-binary :all: --no-build-isolation \
            "$PIN_PACKAGE==$PIN_VERSION" -d "$root/download" >&2
    fi
    if ! echo "$PIN_SHA256  $tarball" | sha256sum -c --status; then
        log "checksum mismatch for $tarball (expected $PIN_SHA256)"
        exit 1
    fi
    log "unpacking vendor/llama.cpp"
    rm -rf "$src" "$root/unpack"
    mkdir -p "$root/unpack"
    tar -xzf "$tarball" -C "$root/unpack" "${PIN_PACKAGE//-/_}-${PIN_VERSION}/vendor/llama.cpp"
    mv "$root/unpack/${PIN_PACKAGE//-/_}-${PIN_VERSION}/vendor/llama.cpp" "$src"
    rm -rf "$root/unpack"
    touch "$src/.dflash2-fetched"
}

vulkan_headers_dir() {
    echo "$(pin_root)/vulkan-headers-1.4.309"
}

fetch_vulkan_headers() {
    local dir deb
    dir=$(vulkan_headers_dir)
    [ -f "$dir/usr/include/vulkan/vulkan.hpp" ] && return
    deb="$(pin_root)/download/$(basename "$VK_HEADERS_DEB")"
    mkdir -p "$(pin_root)/download"
    if [ ! -f "$deb" ] || ! echo "$VK_HEADERS_SHA256  $deb" | sha256sum -c --status; then
        log "downloading Vulkan headers ($VK_HEADERS_DEB from deb.debian.org)"
        curl -fsSL "http://deb.debian.org/debian/$VK_HEADERS_DEB" -o "$deb"
    fi
    if ! echo "$VK_HEADERS_SHA256  $deb" | sha256sum -c --status; then
        log "checksum mismatch for $deb (expected $VK_HEADERS_SHA256)"
        exit 1
    fi
    rm -rf "$dir"
    dpkg-deb -x "$deb" "$dir"
}

build_dir() {
    echo "$(pin_root)/build-${SUFFIX}"
}

build_install() {
    local src prefix build jobs start
    src=$(src_dir)
    prefix=$(prefix_dir)
    build=$(build_dir)
    jobs=${DFLASH2_JOBS:-$(nproc)}
    start=$(date +%s)
    log "building llama.cpp $PIN_VERSION into $prefix ($jobs jobs)"
    rm -rf "$build" "$prefix"
    python3 "$SCRIPTS_DIR/ggml-fixes.py" "$src"
    local generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    if [ "$VULKAN" = 1 ]; then
        fetch_vulkan_headers
        CMAKE_FLAGS+=(-DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR="$(vulkan_headers_dir)/usr/include")
    fi
    cmake -S "$src" -B "$build" "${generator[@]}" "${CMAKE_FLAGS[@]}" \
        -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_RPATH="$prefix/lib" >&2
    cmake --build "$build" -j "$jobs" >&2
    cmake --install "$build" >&2
    # Headers the shared build does not install but dflash2 needs: the C++ staging API
    # (layer-input capture, nextn, ctx_other), and libllama-common's headers, used only
    # by the side-by-side comparison with upstream's own DFlash2 path.
    cp "$src/src/llama-ext.h" "$prefix/include/"
    mkdir -p "$prefix/include/llama-common"
    cp "$src/common/"*.h "$prefix/include/llama-common/"
    # ggml's RPC server (a remote device for --rpc), built against the installed ggml
    # without configuring llama.cpp's tools
    mkdir -p "$prefix/bin"
    g++ -O2 -std=c++17 "$src/tools/rpc/rpc-server.cpp" -I"$prefix/include" -L"$prefix/lib" \
        -lggml -lggml-base -Wl,-rpath,"$prefix/lib" -pthread -o "$prefix/bin/ggml-rpc-server" >&2
    echo "llama-cpp-python==$PIN_VERSION recipe=$RECIPE fixes=meta-zero-fill${VARIANT:+ variant=$VARIANT} backends=cpu,rpc$([ "$VULKAN" = 1 ] && echo ,vulkan) built_in_s=$(( $(date +%s) - start ))" > "$prefix/.dflash2-built"
    log "built in $(( $(date +%s) - start ))s"
}

cmd=${1:-build}
case "$cmd" in
    prefix)
        prefix_dir
        ;;
    src)
        src_dir
        ;;
    build-dir)
        build_dir
        ;;
    build)
        if [ -n "${DFLASH2_LLAMA_PREFIX:-}" ]; then
            if [ ! -f "$DFLASH2_LLAMA_PREFIX/include/llama.h" ]; then
                log "DFLASH2_LLAMA_PREFIX=$DFLASH2_LLAMA_PREFIX has no include/llama.h"
                exit 1
            fi
            prefix_dir
            exit 0
        fi
        mkdir -p "$(pin_root)"
        # a run-time need, checked on every call (a cached build on a fresh machine)
        if [ "$VULKAN" = 1 ]; then
            ensure_llvmpipe
        fi
        # one build at a time per cache and variant, even with several clones running at
        # once (a variant's build does not hold up users of another, already built one)
        if [ ! -f "$(prefix_dir)/.dflash2-built" ]; then
            ensure_tools
            exec 8>"$(pin_root)/.lock-fetch"
            flock 8
            fetch_source
            exec 8>&-
        fi
        exec 9>"$(pin_root)/.lock-$SUFFIX"
        flock 9
        if [ ! -f "$(prefix_dir)/.dflash2-built" ]; then
            build_install
        fi
        prefix_dir
        ;;
    *)
        echo "usage: $0 [build|prefix|src|build-dir] [--backends rpc|vulkan,rpc]" >&2
        exit 2
        ;;
esac
