#!/usr/bin/env bash
# Runs llama.cpp's own server tests on probabilities (test_n_probs*, test_logprobs*
# of the pinned tree's tools/server/tests) against our patched llama-server, on
# SmolLM2-135M-Instruct instead of their downloaded model: once without a drafter,
# once with a DFlash2 drafter served by dflash2. Both runs must pass.
#
#   scripts/llama-server-tests.sh [DRAFTER.gguf]
#
# The drafter defaults to ../shared/models/smollm2-135m-dflash2.gguf when present,
# else one generated for SmolLM2 (dflash2-fixtures drafter-for). pytest and the
# tests' imports go into a virtual environment under target/llama-server-tests.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out="$root/target/llama-server-tests"
mkdir -p "$out"

server=$(scripts/server.sh build)
src=$(scripts/llama-cpp.sh src)
DFLASH2_SMOLLM2=$(scripts/fetch-models.sh smollm2)
export DFLASH2_SMOLLM2

drafter=${1:-}
if [ -z "$drafter" ]; then
    if [ -f "$root/../shared/models/smollm2-135m-dflash2.gguf" ]; then
        drafter="$root/../shared/models/smollm2-135m-dflash2.gguf"
    else
        drafter="$out/smollm2-dflash2-generated.gguf"
        [ -f "$drafter" ] || cargo run -q --release -p dflash2-fixtures -- drafter-for "$DFLASH2_SMOLLM2" "$drafter" >&2
    fi
fi

venv="$out/venv"
if [ ! -x "$venv/bin/pytest" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "pytest~=8.3.3" "requests~=2.32.3" "openai~=2.14.0" "filelock~=3.16" "wget~=3.2"
fi

export LLAMA_SERVER_BIN_PATH="$server"
export LLAMA_ARG_REPACK=false # ggml's AMX repack path crashes on some CPUs with this Q4_1 target
export PYTHONPATH="$src/tools/server/tests:$root/scripts/llama-server-tests"
export LLAMA_CACHE="$out/cache"
tests=(unit/test_completion.py unit/test_chat_completion.py -k "test_n_probs or test_logprobs")

status=0
for mode in without with; do
    if [ "$mode" = with ]; then
        export DFLASH2_DRAFT="$drafter"
    else
        unset DFLASH2_DRAFT
    fi
    echo "== llama.cpp server tests on probabilities, $mode the DFlash2 drafter"
    (cd "$src/tools/server/tests" && "$venv/bin/pytest" -p dflash2_presets -p no:cacheprovider -q "${tests[@]}") || status=1
done
exit $status
