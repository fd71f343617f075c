#!/usr/bin/env bash
# The CUDA top-k kernel (cuda/topk.cu) through `cargo test --features cuda`
# (tests/cuda_topk.rs):
#
#   scripts/cuda-check.sh [--ptx]   NVRTC compiles it to PTX; no GPU needed (in scripts/test.sh)
#   scripts/cuda-check.sh --gpu     also its results against the CPU top-k on a CUDA device
#
# NVRTC comes from PyPI's nvidia-cuda-nvrtc-cu12 (pinned), installed once into the
# cache outside the clone; a CUDA toolkit's own libnvrtc works as well (put it on
# LD_LIBRARY_PATH and set DFLASH2_NVRTC=system).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:---ptx}
case "$mode" in
    --ptx|--gpu) ;;
    *) echo "usage: $0 [--ptx|--gpu]" >&2; exit 2 ;;
esac
NVRTC_VERSION=12.9.86
if [ "${DFLASH2_NVRTC:-pypi}" != system ]; then
    cache="${DFLASH2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dflash2}/nvrtc-cu12-$NVRTC_VERSION"
    lib="$cache/nvidia/cuda_nvrtc/lib"
    if [ ! -f "$lib/libnvrtc.so.12" ]; then
        echo "[cuda] installing nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION into $cache" >&2
        rm -rf "$cache.tmp"
        python3 -m pip install -q --disable-pip-version-check --no-deps --target "$cache.tmp" \
            "nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION" >&2
        mv "$cache.tmp" "$cache"
    fi
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
extra=()
[ "$mode" = --gpu ] && extra=(--include-ignored)
cargo test --release --features cuda --test cuda_topk -- --nocapture ${extra[@]+"${extra[@]}"}
