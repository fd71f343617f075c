#!/usr/bin/env bash
# Builds dflash2 (release) and installs it into PREFIX:
#   PREFIX/lib/libdflash2.so, libdflash2.a
#   PREFIX/include/dflash2.h, dflash2.hpp (the C++ face)
#   PREFIX/lib/cmake/dflash2/  (find_package(dflash2) -> dflash2::dflash2)
#
#   scripts/install.sh PREFIX
#
# Builds with whatever cargo, RUSTFLAGS, CARGO_TARGET_DIR and CARGO_BUILD_TARGET
# the environment names (scripts/sanitizers.sh installs an ASan build this way).
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${1:?usage: scripts/install.sh PREFIX}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

llama_prefix=$(scripts/llama-cpp.sh build)
export DFLASH2_LLAMA_PREFIX="$llama_prefix"
cargo build --release -p dflash2 >&2

version=$(cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "dflash2"))')
target_dir=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')

# with --target (CARGO_BUILD_TARGET) cargo puts the artifacts under the triple's folder
built="$target_dir/${CARGO_BUILD_TARGET:+$CARGO_BUILD_TARGET/}release"
install -d "$prefix/lib" "$prefix/include"
# -C: a file whose contents did not change keeps its time stamp, so what builds against
# this prefix (the server, the tools) does not compile again
install -C -m 755 "$built/libdflash2.so" "$prefix/lib/libdflash2.so"
install -C -m 644 "$built/libdflash2.a" "$prefix/lib/libdflash2.a"
install -C -m 644 include/dflash2.h "$prefix/include/dflash2.h"
install -C -m 644 include/dflash2.hpp "$prefix/include/dflash2.hpp"
cmake -DPREFIX="$prefix" -DDFLASH2_LLAMA_PREFIX="$llama_prefix" -DVERSION="$version" -P cmake/install.cmake
echo "$prefix"
