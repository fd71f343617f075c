#!/usr/bin/env bash
# Reliability figures of dflash2, re-runnable by anyone: coverage-guided fuzzing
# (cargo-fuzz / libFuzzer, nightly toolchain) of the GGUF reader, the drafter
# check, state blobs and API call sequences against the fixture pair; then the
# soak (tests/soak.rs), the Rust integration tests under AddressSanitizer
# (scripts/sanitizers.sh) and llama-server under load and faults
# (tests/server/load_faults.py).
#
#   scripts/reliability.sh [--quick] [--seconds N] [--skip fuzz,soak,asan,server,server-suite] [TARGET...]
#
# --quick: 60 s per fuzz target, a 500-step soak, a subset of the tests under
# ASan and a 1-minute server load (part of scripts/test.sh); default: 600 s per
# target, 10,000 soak steps, every integration test under ASan, a 5-minute load.
# Prints per target: executions, coverage, crashes; exits non-zero on a crash
# (the reproducer is left in fuzz/artifacts/TARGET/) or any failed part.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

seconds=600
quick=0
skip=","
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) seconds=60; quick=1 ;;
        --skip) skip=",$2,"; shift ;;
        --seconds) seconds=$2; shift ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1") ;;
    esac
    shift
done
[ ${#targets[@]} -gt 0 ] || targets=(gguf_reader checkpoint state_blob api_sequence)

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "[reliability] installing the nightly toolchain (libFuzzer needs it): rustup toolchain install nightly" >&2
    rustup toolchain install nightly --profile minimal >&2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "[reliability] installing cargo-fuzz: cargo +nightly install cargo-fuzz --locked" >&2
    cargo +nightly install cargo-fuzz --locked >&2
fi

DFLASH2_LLAMA_PREFIX=$(scripts/llama-cpp.sh build)
export DFLASH2_LLAMA_PREFIX
corpus="$root/target/fuzz-corpus"
mkdir -p "$corpus"

# seeds: the fixtures' GGUF files for the readers, real blobs for the state fuzzer
fixtures="$corpus/fixtures"
[ -f "$fixtures/drafter.gguf" ] || cargo run -q --release -p dflash2-fixtures -- set "$fixtures" >/dev/null
for t in gguf_reader checkpoint; do
    mkdir -p "$corpus/$t"
    find "$fixtures" -name '*.gguf' -size -256k -exec cp -n {} "$corpus/$t/" \;
done
max_len=$(find "$corpus/checkpoint" -type f -printf '%s\n' | sort -n | tail -1)

cd fuzz
cargo +nightly fuzz build --release 2>&1 | tail -2 >&2
if [ ! -d "$corpus/state_blob" ] || [ -z "$(ls -A "$corpus/state_blob" 2>/dev/null)" ]; then
    DFLASH2_FUZZ_WRITE_SEEDS="$corpus/state_blob" cargo +nightly fuzz run --release state_blob -- -runs=1 >/dev/null 2>&1
fi

status=0
summary=()
[[ $skip == *,fuzz,* ]] && targets=()
for t in "${targets[@]}"; do
    mkdir -p "$corpus/$t"
    log="$root/target/fuzz-$t.log"
    extra=()
    [ "$t" = checkpoint ] || [ "$t" = gguf_reader ] && extra+=(-max_len="$max_len")
    echo "== fuzz $t for ${seconds}s" >&2
    set +e
    cargo +nightly fuzz run --release "$t" "$corpus/$t" -- -max_total_time="$seconds" -print_final_stats=1 \
        "${extra[@]}" >"$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
    crashes=$(ls "artifacts/$t" 2>/dev/null | grep -c '^crash-\|^leak-\|^oom-\|^timeout-' || true)
    line="$t: ${execs:-0} executions, coverage ${cov:-?} edges, corpus $(ls "$corpus/$t" | wc -l) inputs, exit $rc"
    if [ $rc -ne 0 ]; then
        line="$line — FAILED (see $log and fuzz/artifacts/$t)"
        status=1
    fi
    echo "$line" >&2
    summary+=("$line")
done
cd "$root"
export DFLASH2_SMOLLM2=${DFLASH2_SMOLLM2:-$(scripts/fetch-models.sh smollm2)}
# the trained drafter when this machine has it, else the soak generates one
trained="$root/../shared/models/smollm2-135m-dflash2.gguf"
[ -f "$trained" ] || trained=/work/shared/models/smollm2-135m-dflash2.gguf
part() { # name command...: runs one part, records its last line
    local name=$1; shift
    echo "== $name" >&2
    local log="$root/target/reliability-$name.log"
    set +e
    "$@" >"$log" 2>&1
    local rc=$?
    set -e
    local line
    line="$name: $(grep -E "$summary_re" "$log" | tail -1)"
    [ $rc -eq 0 ] || { line="$line — FAILED (exit $rc, see $log)"; status=1; }
    echo "$line" >&2
    summary+=("$line")
}

if [[ $skip != *,soak,* ]]; then
    steps=10000
    [ $quick = 1 ] && steps=500
    summary_re="soak result|panicked"
    [ -f "$trained" ] && export DFLASH2_SOAK_DRAFTER="$trained"
    part soak env DFLASH2_SOAK_STEPS=$steps cargo test -q --release --test soak -- --ignored --nocapture
fi
if [[ $skip != *,asan,* ]]; then
    summary_re="asan:"
    asan_args=()
    [ $quick = 1 ] && asan_args=(--quick)
    part asan scripts/sanitizers.sh "${asan_args[@]}"
fi
if [[ $skip != *,server,* ]]; then
    summary_re="^load:|^PASS|^FAIL"
    load_s=300
    [ $quick = 1 ] && load_s=60
    server=$(scripts/server.sh build)
    drafter="$trained"
    if [ ! -f "$drafter" ]; then
        drafter="$root/target/reliability-drafter.gguf"
        [ -f "$drafter" ] || cargo run -q --release -p dflash2-fixtures -- drafter-for "$DFLASH2_SMOLLM2" "$drafter"
    fi
    part server python3 -u tests/server/load_faults.py --server "$server" --target "$DFLASH2_SMOLLM2" \
        --draft "$drafter" --seconds $load_s --workdir "$root/target/server-load"
fi
# llama.cpp's own server tests without and with the drafter (scripts/llama-server-tests.sh
# --all, over an hour on 2 busy cores: not in --quick; scripts/test.sh runs its probabilities subset)
if [[ $skip != *,server-suite,* ]] && [ $quick = 0 ]; then
    summary_re="^differential:"
    part server-suite scripts/llama-server-tests.sh --all
fi

echo
echo "reliability summary:"
printf '  %s\n' "${summary[@]}"
exit $status
