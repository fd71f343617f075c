#!/usr/bin/env bash
# Builds the pinned llama.cpp (cached), installs dflash2 into OUT/prefix and builds
# the host tools (dflash2-demo, dflash2-bench, dflash2-parity) into OUT/tools.
#
#   scripts/build-tools.sh OUT     prints the tools folder
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/build-tools.sh OUT}
mkdir -p "$out"

DFLASH2_LLAMA_PREFIX=$(scripts/llama-cpp.sh build)
export DFLASH2_LLAMA_PREFIX
prefix=$(scripts/install.sh "$out/prefix")
# image prompts when libmtmd was built (scripts/server.sh build)
cmake -S tools -B "$out/tools" -Ddflash2_DIR="$prefix/lib/cmake/dflash2" -DCMAKE_BUILD_TYPE=Release \
    -DDFLASH2_MTMD_LIB_DIR="$(scripts/server.sh dir)/lib" -DDFLASH2_LLAMA_SRC="$(scripts/llama-cpp.sh src)" >&2
cmake --build "$out/tools" -j 2 >&2
echo "$out/tools"
