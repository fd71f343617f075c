#!/usr/bin/env bash
# Side-by-side benchmark: target-only (ar), llama.cpp's own draft-dflash
# (upstream, libllama-common) and dflash2, in one process, np = 1, 2, 4.
# Prints a table with ratios computed inside the run; writes
# target/bench/bench.json and target/bench/bench.svg.
#
#   scripts/bench.sh                                  SmolLM2-135M + the best drafter found
#   scripts/bench.sh --target T.gguf --draft D.gguf  any pair (a GPU build of llama.cpp via
#                                                     DFLASH2_LLAMA_PREFIX for a big target)
#
# Drafter by default: ../shared/models/smollm2-135m-dflash2.gguf (trained) when present,
# else ../shared/models/smollm2-135m-dflash2-random.gguf, else a generated one.
# Other options (scripts/bench.sh --help lists them, grouped): --np 1,2,4 --reps N
# --n-predict N --n-max N --tree N --prompts FILE --modes ar,upstream,dflash2,... --threads N
# --json PATH --svg PATH --temp T --seed S (T > 0: sampled target; upstream sample-and-match,
# dflash2 sampled drafts with lossless rejection sampling).
# Cost worlds (docs/bench.md#cost-worlds): --cost-world real (default) | flat | cuda-3090 |
# cuda-4090 | metal-m4pro | FILE (a measured curve: a target decode of R rows takes
# max(real, base x curve(R)), base set by --draft-share S, 0.15) | gpu-like (the flat upper
# bound); --oracle adds the fixed plans (chains n_max 1..7, trees of 3..63 nodes) and the best
# of them per np against dflash2-auto:
#   scripts/bench.sh --cost-world cuda-3090 --np 1,4 --modes ar,upstream,dflash2-auto --oracle
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out="$root/target/bench"
mkdir -p "$out"

for a in "$@"; do
    # the options, one screen: the tools are built (quietly) but nothing is fetched or run
    if [ "$a" = "--help" ] || [ "$a" = "-h" ]; then
        tools=$(scripts/build-tools.sh "$out" 2>"$out/build-tools.log") || { cat "$out/build-tools.log" >&2; exit 1; }
        exec "$tools/dflash2-bench" --help
    fi
done
tools=$(scripts/build-tools.sh "$out")

args=("$@")
has() { for a in "${args[@]}"; do [ "$a" = "$1" ] && return 0; done; return 1; }
if ! has --target; then
    args+=(--target "$(scripts/fetch-models.sh smollm2)")
fi
if ! has --draft; then
    shared=$("$root/scripts/shared-models.sh")
    if [ -f "$shared/smollm2-135m-dflash2.gguf" ]; then
        drafter="$shared/smollm2-135m-dflash2.gguf"
    elif [ -f "$shared/smollm2-135m-dflash2-random.gguf" ]; then
        drafter="$shared/smollm2-135m-dflash2-random.gguf"
    else
        drafter="$out/smollm2-dflash2-generated.gguf"
        [ -f "$drafter" ] || cargo run -q --release -p dflash2-fixtures -- \
            drafter-for "$(scripts/fetch-models.sh smollm2)" "$drafter" >&2
    fi
    args+=(--draft "$drafter")
fi
has --np || args+=(--np 1,2,4)
has --json || args+=(--json "$out/bench.json")
has --svg || args+=(--svg "$out/bench.svg")
exec "$tools/dflash2-bench" "${args[@]}"
