#!/usr/bin/env bash
# Reliability figures of dflash2, re-runnable by anyone: coverage-guided fuzzing
# (cargo-fuzz / libFuzzer, nightly toolchain) of the GGUF reader, the drafter
# check, the drafter loader (engine creation on the own draft graph), state
# blobs and API call sequences against the fixture pair; then the
# soak (tests/soak.rs), the Rust and C tests under AddressSanitizer, under
# UBSan (C) and Rust's overflow / debug-assertion checks, the C tests under
# valgrind memcheck (scripts/sanitizers.sh asan / ubsan / valgrind),
# llama-server under load and faults (tests/server/load_faults.py), and (not in
# --quick) the device placements of scripts/devices.sh with the Vulkan build.
#
#   scripts/reliability.sh [--quick] [--seconds N] [--skip fuzz,soak,asan,ubsan,valgrind,server,statistics,devices,server-suite] [TARGET...]
#
# --quick (scripts/test.sh runs its soak and asan parts, with --skip fuzz,server): 30 s per fuzz
# target, a 200-step soak, the API-surface Rust tests and the C tests but the
# SmolLM2 parity and benchmark smokes under ASan (the C ones also under UBSan),
# and a 1-minute server load. Not the 500-step soak: 250 steps took 412 s on a
# loaded 2-core machine, so 500 would make --quick alone longer than the rest
# of scripts/test.sh; 200 still passes the warm-up (50 steps) that the RSS check
# measures from, and does ~25 random memory operations. Not the ubsan part (a
# third full build of every test: the C tests already run under UBSan in the
# asan part) nor valgrind (it needs the portable llama.cpp build, ~50 min on
# such a machine). Default: 600 s per target, 10,000 soak steps, every test
# under each tool, a 5-minute load.
# Prints per target: executions, coverage, crashes (and, for the engine-level
# targets, how many clean generations checked the engine); one line per other
# part; exits non-zero on a crash (the reproducer is left in
# fuzz/artifacts/TARGET/) or any failed part.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

seconds=600
quick=0
skip=","
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) seconds=30; quick=1 ;;
        --skip) skip=",$2,"; shift ;;
        --seconds) seconds=$2; shift ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1") ;;
    esac
    shift
done
[ ${#targets[@]} -gt 0 ] || targets=(gguf_reader checkpoint drafter_load state_blob api_sequence)

[[ $skip == *,fuzz,* ]] && targets=()

DFLASH2_LLAMA_PREFIX=$(scripts/llama-cpp.sh build)
export DFLASH2_LLAMA_PREFIX
status=0
summary=()
# the fuzzers (none when --skip fuzz: then neither cargo-fuzz nor their build)
fuzz() {
    if ! rustup toolchain list | grep -q '^nightly'; then
        echo "[reliability] installing the nightly toolchain (libFuzzer needs it): rustup toolchain install nightly" >&2
        rustup toolchain install nightly --profile minimal >&2
    fi
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        echo "[reliability] installing cargo-fuzz: cargo +nightly install cargo-fuzz --locked" >&2
        cargo +nightly install cargo-fuzz --locked >&2
    fi
    corpus="$root/target/fuzz-corpus"
    mkdir -p "$corpus"

    # seeds: the fixtures' GGUF files for the readers, real blobs for the state fuzzer
    fixtures="$corpus/fixtures"
    [ -f "$fixtures/drafter.gguf" ] || cargo run -q --release -p dflash2-fixtures -- set "$fixtures" >/dev/null
    for t in gguf_reader checkpoint; do
        mkdir -p "$corpus/$t"
        find "$fixtures" -name '*.gguf' -size -256k -exec cp -n {} "$corpus/$t/" \;
    done
    # the drafter loader: the fixture target's own drafters (they load on it)
    mkdir -p "$corpus/drafter_load"
    find "$fixtures" -maxdepth 1 -name 'drafter*.gguf' -size -256k -exec cp -n {} "$corpus/drafter_load/" \;
    max_len=$(find "$corpus/checkpoint" -type f -printf '%s\n' | sort -n | tail -1)

    cd fuzz
    cargo +nightly fuzz build --release 2>&1 | tail -2 >&2
    if [ ! -d "$corpus/state_blob" ] || [ -z "$(ls -A "$corpus/state_blob" 2>/dev/null)" ]; then
        DFLASH2_FUZZ_WRITE_SEEDS="$corpus/state_blob" cargo +nightly fuzz run --release state_blob -- -runs=1 >/dev/null 2>&1
    fi

    for t in "${targets[@]}"; do
        mkdir -p "$corpus/$t"
        log="$root/target/fuzz-$t.log"
        extra=()
        [ "$t" = checkpoint ] || [ "$t" = gguf_reader ] && extra+=(-max_len="$max_len")
        echo "== fuzz $t for ${seconds}s" >&2
        t0=$SECONDS
        set +e
        # the inputs that once found a defect first, each run once (fuzz/regressions/README.md)
        regressions=0
        if [ -d "regressions/$t" ]; then
            regressions=$(find "regressions/$t" -type f | wc -l)
            if ! cargo +nightly fuzz run --release "$t" $(find "regressions/$t" -type f | sort) >"$log.regressions" 2>&1; then
                line="$t: regression inputs FAILED (see $log.regressions)"
                echo "$line" >&2
                summary+=("$line")
                status=1
                set -e
                continue
            fi
        fi
        cargo +nightly fuzz run --release "$t" "$corpus/$t" -- -max_total_time="$seconds" -print_final_stats=1 \
            "${extra[@]}" >"$log" 2>&1
        rc=$?
        set -e
        execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
        crashes=$(ls "artifacts/$t" 2>/dev/null | grep -c '^crash-\|^leak-\|^oom-\|^timeout-' || true)
        line="$t: ${execs:-0} executions, coverage ${cov:-?} edges, corpus $(ls "$corpus/$t" | wc -l) inputs, exit $rc"
        [ "$regressions" -gt 0 ] && line="$line; $regressions regression inputs passed"
        # the engine-level targets say how often a clean generation checked the engine (fuzz/src/lib.rs: Checks)
        checks=$(sed -n 's/^dflash2-fuzz: [0-9]* inputs, every one cleared and checked empty; \(.*\)/\1/p' "$log" | tail -1)
        [ -n "$checks" ] && line="$line; $checks"
        line="$line [$((SECONDS - t0)) s]"
        if [ $rc -ne 0 ]; then
            line="$line — FAILED (see $log and fuzz/artifacts/$t)"
            status=1
        fi
        echo "$line" >&2
        summary+=("$line")
    done
    cd "$root"
}
# (in an if, not after ||: set -e holds inside the function then)
if [ ${#targets[@]} -gt 0 ]; then
    fuzz
fi
export DFLASH2_SMOLLM2=${DFLASH2_SMOLLM2:-$(scripts/fetch-models.sh smollm2)}
# the trained drafter when this machine has it, else the soak generates one
trained="$("$root/scripts/shared-models.sh")/smollm2-135m-dflash2.gguf"
part() { # name command...: runs one part, records its last line
    local name=$1; shift
    echo "== $name" >&2
    local log="$root/target/reliability-$name.log" t0=$SECONDS
    set +e
    "$@" >"$log" 2>&1
    local rc=$?
    set -e
    local line
    line="$name: $(grep -E "$summary_re" "$log" | tail -1 | sed "s/^$name: //") [$((SECONDS - t0)) s]"
    [ $rc -eq 0 ] || { line="$line — FAILED (exit $rc, see $log)"; status=1; }
    echo "$line" >&2
    summary+=("$line")
}

if [[ $skip != *,soak,* ]]; then
    steps=10000
    [ $quick = 1 ] && steps=200
    summary_re="soak result|panicked"
    [ -f "$trained" ] && export DFLASH2_SOAK_DRAFTER="$trained"
    part soak env DFLASH2_SOAK_STEPS=$steps cargo test -q --release --test soak -- --ignored --nocapture
fi
san_args=()
[ $quick = 1 ] && san_args=(--quick)
tools=(asan ubsan valgrind)
[ $quick = 1 ] && tools=(asan) # why: see --quick above
for tool in "${tools[@]}"; do
    if [[ $skip != *,$tool,* ]]; then
        summary_re="^$tool:"
        part "$tool" scripts/sanitizers.sh "${san_args[@]}" "$tool"
    fi
done
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
# the statistical tests at their full sizes (scripts/test.sh halves them on CI's 2
# cores): 5,000 samples per sampled-verification check, 300 seeds per prompt of the
# server's token-distribution test
if [[ $skip != *,statistics,* ]] && [ $quick = 0 ]; then
    summary_re="^test result:|passed, .* failed"
    stats_server=$(scripts/server.sh build)
    stats_drafter="$trained"
    [ -f "$stats_drafter" ] || stats_drafter="$root/target/reliability-drafter.gguf"
    [ -f "$stats_drafter" ] || cargo run -q --release -p dflash2-fixtures -- drafter-for "$DFLASH2_SMOLLM2" "$stats_drafter"
    cargo run -q --release -p dflash2-fixtures -- set "$root/target/reliability-fixtures" >/dev/null
    part statistics bash -c "DFLASH2_SAMPLING_SAMPLES=5000 cargo test --release --test engine_sampling \
        --test engine_tree_sampled && DFLASH2_SERVER_DIST_SEEDS=300 python3 -u tests/server/test_server.py \
        --server '$stats_server' --target '$DFLASH2_SMOLLM2' --draft '$stats_drafter' \
        --fixtures '$root/target/reliability-fixtures' --only token_distribution \
        --workdir '$root/target/server-statistics'"
fi
# device backends: placements over RPC nodes on loopback and on the Vulkan build
# (Mesa's llvmpipe), faults, -sm modes (scripts/devices.sh; its --quick part, the RPC
# placements, runs in scripts/test.sh itself)
if [[ $skip != *,devices,* ]] && [ $quick = 0 ]; then
    summary_re="rows, .* failed checks"
    part devices scripts/devices.sh
fi
# llama.cpp's own server tests without and with the drafter (scripts/llama-server-tests.sh
# --all, over an hour on 2 busy cores: not in --quick; scripts/test.sh runs its probabilities subset)
if [[ $skip != *,server-suite,* ]] && [ $quick = 0 ]; then
    summary_re="^differential:"
    part server-suite scripts/llama-server-tests.sh --all
fi

echo
echo "reliability summary ($SECONDS s in all, builds included):"
printf '  %s\n' "${summary[@]}"
exit $status
