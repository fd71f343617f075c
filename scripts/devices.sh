#!/usr/bin/env bash
# dflash2 on real device backends: placements of the target and the drafter over
# llama.cpp RPC servers on loopback and, without --quick, the Vulkan device of a
# Vulkan build of the pinned llama.cpp (Mesa's llvmpipe: a real Vulkan device of
# type CPU), each through the C API (dflash2-bench) and llama-server, compared
# with target-only on the same placement; faults (an RPC server killed, one that
# does not answer), -sm row / tensor, and the library's device tests. Prints one
# table (placement x library|server: identical, tau, tok/s, log errors) and writes
# target/devices/devices.json.
#
#   scripts/devices.sh --quick    the RPC placements and faults (minutes; in scripts/test.sh)
#   scripts/devices.sh            + the Vulkan build, its placements and the library's
#                                 Vulkan tests (scripts/reliability.sh)
#   ... --only TEXT               only the steps whose name contains TEXT (with --quick)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
quick=0
only=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --only) only=(--only "$2"); shift ;;
        *) echo "usage: $0 [--quick] [--only TEXT]" >&2; exit 2 ;;
    esac
    shift
done
out="$root/target/devices"
mkdir -p "$out"
start=$(date +%s)

prefix=$(scripts/llama-cpp.sh build)
server=$(scripts/server.sh build)  # first: the tools take libmtmd from it (image prompts)
tools=$(scripts/build-tools.sh "$out/cpu")
target=$(scripts/fetch-models.sh smollm2)
cargo run -q --release -p dflash2-fixtures -- set "$out/fixtures"
# the trained drafter when the machine has it (its drafts get accepted), else a generated one
draft="$("$root/scripts/shared-models.sh")/smollm2-135m-dflash2.gguf"
if [ ! -f "$draft" ]; then
    draft="$out/smollm2-dflash2-generated.gguf"
    [ -f "$draft" ] || cargo run -q --release -p dflash2-fixtures -- drafter-for "$target" "$draft"
fi

args=(--tools "$tools" --server "$server" --rpc-server "$prefix/bin/ggml-rpc-server" --target "$target"
      --draft "$draft" --fixtures "$out/fixtures" --workdir "$out/logs" --json "$out/devices.json" ${only[@]+"${only[@]}"})
if [ "$quick" = 1 ]; then
    args+=(--quick)
else
    # the Vulkan build: its own llama.cpp prefix, libdflash2 (cargo target folder),
    # tools and server; GGML_VK_VISIBLE_DEVICES=0 names llvmpipe, which ggml-vulkan
    # skips otherwise (a CPU-type device)
    t0=$(date +%s)
    vk_server=$(DFLASH2_LLAMA_BACKENDS=vulkan,rpc CARGO_TARGET_DIR="$root/target/vulkan" scripts/server.sh build)
    vk_tools=$(DFLASH2_LLAMA_BACKENDS=vulkan,rpc CARGO_TARGET_DIR="$root/target/vulkan" scripts/build-tools.sh "$out/vulkan")
    echo "[devices] Vulkan build ready in $(( $(date +%s) - t0 ))s: $(cat "$(scripts/llama-cpp.sh prefix --backends vulkan,rpc)/.dflash2-built")"
    args+=(--vulkan-tools "$vk_tools" --vulkan-server "$vk_server")
    echo "[devices] the library's Vulkan tests (tests/engine_devices.rs, --ignored)"
    DFLASH2_LLAMA_PREFIX=$(scripts/llama-cpp.sh prefix --backends vulkan,rpc) CARGO_TARGET_DIR="$root/target/vulkan" \
        DFLASH2_SMOLLM2="$target" GGML_VK_VISIBLE_DEVICES=0 \
        cargo test --release --test engine_devices -- --ignored --test-threads 1 --nocapture 2>&1 | tee "$out/vulkan-tests.log"
fi
python3 scripts/devices.py "${args[@]}"
echo "[devices] done in $(( $(date +%s) - start ))s"
