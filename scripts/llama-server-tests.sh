#!/usr/bin/env bash
# Runs llama.cpp's own server tests (the pinned tree's tools/server/tests) against
# our patched llama-server, on SmolLM2-135M-Instruct instead of their downloaded
# models, differentially: once without a drafter, once with a DFlash2 drafter
# served by dflash2 on every server start (scripts/llama-server-tests/dflash2_presets.py).
#
#   scripts/llama-server-tests.sh [--all [-k EXPR] [--timeout S]] [--walk W] [DRAFTER.gguf]
#
# The run with the drafter serves it with the server's defaults (the adaptive walk,
# trees of up to 32 nodes), or with --walk W (adaptive | greedy, the server's
# --spec-dflash2-walk, through LLAMA_ARG_SPEC_DFLASH2_WALK).
# Default: the tests on probabilities (test_n_probs*, test_logprobs*); both runs
# must pass. --all: the whole tools/server/tests/unit suite (-k: the tests that
# match pytest's EXPR), S seconds per test at most (default 300); tests that need
# other models or downloads fail in both runs and are listed. The figures, the
# difference set (passes without the drafter and fails with it, and the reverse)
# and every test failing in both runs with its reason go to
# target/llama-server-tests/all/summary.{txt,json} (with -k: .../k/);
# the run fails when a test passes without the drafter and fails with it, unless
# it is a known difference (scripts/llama-server-tests/known-differences.txt).
#
# The drafter defaults to ../shared/models/smollm2-135m-dflash2.gguf when present,
# else one generated for SmolLM2 (dflash2-fixtures drafter-for). pytest and the
# tests' imports go into a virtual environment under target/llama-server-tests; the
# tests run there from a copy of their folder (they write into ./tmp) in a tree of
# links to the pinned one (they read its templates and media by relative paths).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out="$root/target/llama-server-tests"
mkdir -p "$out"

all=0
timeout=300
select=()
drafter=
walk=
while [ $# -gt 0 ]; do
    case "$1" in
        --all) all=1 ;;
        --timeout) timeout=$2; shift ;;
        --walk) walk=$2; shift ;;
        -k) select=(-k "$2"); shift ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) drafter=$1 ;;
    esac
    shift
done

server=$(scripts/server.sh build)
src=$(scripts/llama-cpp.sh src)
DFLASH2_SMOLLM2=$(scripts/fetch-models.sh smollm2)
export DFLASH2_SMOLLM2

if [ -z "$drafter" ]; then
    shared=$("$root/scripts/shared-models.sh")
    if [ -f "$shared/smollm2-135m-dflash2.gguf" ]; then
        drafter="$shared/smollm2-135m-dflash2.gguf"
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
if [ $all = 1 ] && ! "$venv/bin/python" -c "import pytest_timeout, aiohttp, numpy, prometheus_client" 2>/dev/null; then
    # the whole suite imports these; a hung test fails after --timeout instead of stalling the run
    "$venv/bin/pip" install -q -r "$src/tools/server/tests/requirements.txt" "pytest-timeout~=2.3"
fi

# the tests reach the tree by relative paths (../../../models/templates, the media
# and project folders): per run, a tree of links to the pinned one with a copy of
# the tests (they write into ./tmp), so that the two runs can go side by side
make_tree() { # TREE: links the pinned tree's entries into TREE, the tests copied
    local tree=$1
    rm -rf "$tree"
    link_all_but() { # DIR KEEP: links DIR's entries of the pinned tree, all but KEEP
        mkdir -p "$tree/$1"
        for e in "$src/$1"/*; do
            [ "${e##*/}" = "$2" ] || ln -s "$e" "$tree/$1/"
        done
    }
    link_all_but . tools
    link_all_but tools server
    link_all_but tools/server tests
    cp -r "$src/tools/server/tests" "$tree/tools/server/tests"
    mkdir -p "$tree/tools/server/tests/tmp"
}
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

export LLAMA_SERVER_BIN_PATH="$server"
export LLAMA_ARG_REPACK=false # ggml's AMX repack path crashes on some CPUs with this Q4_1 target
export LLAMA_ARG_THREADS=${LLAMA_ARG_THREADS:-1} # the tests' servers do not set threads; spinning ggml threads on a busy machine crawl
export LLAMA_CACHE="$out/cache"
if [ $all = 1 ]; then
    tests=(unit ${select[@]+"${select[@]}"} --timeout="$timeout" --tb=no -rfE -o junit_logging=system-out -o junit_log_passing_tests=false)
    what="llama.cpp server tests (tools/server/tests/unit)"
else
    tests=(unit/test_completion.py unit/test_chat_completion.py -k "test_n_probs or test_logprobs")
    what="llama.cpp server tests on probabilities"
fi

results="$out/probs"
[ $all = 0 ] || results="$out/all"
[ ${#select[@]} = 0 ] || results="$out/k"
mkdir -p "$results"

run_mode() { # without|with: one run of the tests, its own tree and port; log in $results/MODE.log
    local mode=$1 suite="$out/tree-$1/tools/server/tests" t0=$SECONDS rc=0
    make_tree "$out/tree-$mode"
    (
        # the tests' servers listen on $PORT (8080 by default), here one that is free
        export PORT
        PORT=$(free_port)
        export PYTHONPATH="$suite:$root/scripts/llama-server-tests"
        if [ "$mode" = with ]; then export DFLASH2_DRAFT="$drafter"; else unset DFLASH2_DRAFT; fi
        if [ "$mode" = with ] && [ -n "$walk" ]; then export LLAMA_ARG_SPEC_DFLASH2_WALK="$walk"; fi
        cd "$suite"
        exec "$venv/bin/pytest" -p dflash2_presets -p no:cacheprovider -q --junitxml="$results/$mode.xml" "${tests[@]}"
    ) >"$results/$mode.log" 2>&1 || rc=$?
    echo "$((SECONDS - t0))" >"$results/$mode.seconds"
    return $rc
}

# the two runs side by side (each server on one thread): the whole suite takes
# 52 minutes without the drafter, well over an hour with it, side by side on two busy cores (2026-11-29)
status=0
echo "== $what, without and with the DFlash2 drafter $drafter (walk: ${walk:-the server default}; logs: $results/{without,with}.log)"
run_mode without & without_pid=$!
run_mode with & with_pid=$!
wait $without_pid || status=1
wait $with_pid || status=1
for mode in without with; do
    echo "== $mode the drafter: $(cat "$results/$mode.seconds") s"
    tail -n 15 "$results/$mode.log"
done
[ $all = 1 ] || exit $status
python3 "$root/scripts/llama-server-tests/compare.py" --dir "$results" --drafter "$drafter" \
    --known "$root/scripts/llama-server-tests/known-differences.txt"
