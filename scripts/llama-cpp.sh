#!/usr/bin/env bash
# Obtains the pinned llama.cpp source (vendor/llama.cpp of the PyPI sdist llama-cpp-python)
# and builds its shared libraries into a cache folder outside the clone, so every clone
# on this machine (and CI) reuses one build.
#
#   scripts/llama-cpp.sh build    fetch + build + install if not cached; prints the prefix
#   scripts/llama-cpp.sh prefix   print the install prefix (whether built or not)
#   scripts/llama-cpp.sh src      print the source tree path (whether fetched or not)
#   scripts/llama-cpp.sh build-dir print the CMake build folder of the pinned build
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
set -euo pipefail

PIN_PACKAGE=llama-cpp-python
PIN_VERSION=0.3.36
PIN_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

# Bump RECIPE when the flags below change: it keys the cached build.
RECIPE=1
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
    -DCMAKE_INSTALL_LIBDIR=lib
)
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
# the cached prefix and build folder are keyed by recipe and variant
SUFFIX="r${RECIPE}${VARIANT:+-$VARIANT}"

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

ensure_tools() {
    local missing=()
    command -v cmake >/dev/null || missing+=(cmake)
    command -v g++   >/dev/null || missing+=(g++)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing missing tools: ${missing[*]}"
        if [ "$(id -u)" = 0 ]; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
        else
            sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
        fi
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
    local generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
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
    echo "llama-cpp-python==$PIN_VERSION recipe=$RECIPE${VARIANT:+ variant=$VARIANT} built_in_s=$(( $(date +%s) - start ))" > "$prefix/.dflash2-built"
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
        # one build at a time per cache and variant, even with several clones running at
        # once (a variant's build does not hold up users of another, already built one)
        if [ ! -f "$(prefix_dir)/.dflash2-built" ]; then
            ensure_tools
            exec 8>"$(pin_root)/.lock-fetch"
            flock 8
            fetch_source
            exec 8>&-
        fi
        exec 9>"$(pin_root)/.lock${VARIANT:+-$VARIANT}"
        flock 9
        if [ ! -f "$(prefix_dir)/.dflash2-built" ]; then
            build_install
        fi
        prefix_dir
        ;;
    *)
        echo "usage: $0 [build|prefix|src|build-dir]" >&2
        exit 2
        ;;
esac
