#!/usr/bin/env bash
# dflash2 under AddressSanitizer, UndefinedBehaviorSanitizer and valgrind memcheck.
#
#   scripts/sanitizers.sh [--quick] [asan] [ubsan] [valgrind]     (no part named: all three)
#
# asan      The Rust tests (every test target of the workspace: unit tests and
#           tests/*.rs; --quick: the API-surface ones) built with
#           -Zsanitizer=address (nightly): ASan and LeakSanitizer. Then the C
#           tests (ctest/ through find_package(dflash2), tools/ included; --quick:
#           without the SmolLM2 parity and the benchmark smokes) compiled by gcc
#           with -fsanitize=address,undefined and linked against that same
#           ASan-instrumented libdflash2.so. The Rust library carries no ASan
#           runtime (a cdylib never does); the C program brings gcc's
#           libasan.so, loaded first, and the library's instrumentation (same
#           ABI: __asan_version_mismatch_check_v8) reports through it.
# ubsan     The C tests compiled with -fsanitize=undefined, against a
#           libdflash2.so built with debug assertions and overflow checks; and
#           the Rust tests built so too. Rust has no UBSan: safe Rust has no
#           undefined behaviour to find, and its analogue of UBSan's arithmetic
#           checks are overflow-checks and debug-assertions (on every crate:
#           a wrapped integer or a broken debug_assert! fails the test).
# valgrind  The C tests under valgrind memcheck (--leak-check=full), against
#           dflash2 built on the portable llama.cpp (DFLASH2_LLAMA_VARIANT=portable
#           in scripts/llama-cpp.sh: valgrind cannot execute the pinned native
#           build's AVX-512 / AMX code).
#
# libllama and ggml are not instrumented (prebuilt), but their heap calls go
# through ASan's allocator and valgrind sees everything, so a wrong free, a
# double free, a leak or an uninitialised read of theirs that dflash2 causes is
# seen too. Every report counts, whatever the exit status of the test it came
# from (some C tests pass on a regular expression of their output). Suppressions
# (scripts/sanitizers/*.supp) are only for libllama/ggml internals, each
# explained there.
#
# Prints one line per part ("asan: ...", "ubsan: ...", "valgrind: ..."); exits
# non-zero on any report or failed test. Logs and reports: target/san/PART/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

quick=0
parts=()
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        asan | ubsan | valgrind) parts+=("$arg") ;;
        *) echo "usage: $0 [--quick] [asan] [ubsan] [valgrind]" >&2; exit 2 ;;
    esac
done
[ ${#parts[@]} -gt 0 ] || parts=(asan ubsan valgrind)

jobs=${DFLASH2_JOBS:-2}
supp="$root/scripts/sanitizers"
work="$root/target/san"
host=$(rustc -vV | sed -n 's/^host: //p')
DFLASH2_LLAMA_PREFIX=${DFLASH2_LLAMA_PREFIX:-$(scripts/llama-cpp.sh build)}
export DFLASH2_LLAMA_PREFIX
export DFLASH2_SMOLLM2=${DFLASH2_SMOLLM2:-$(scripts/fetch-models.sh smollm2)}
status=0

rust_tests=(--workspace --tests)
[ $quick = 1 ] && rust_tests=(--test engine_robustness --test engine_misuse --test engine_threads --test engine_state
    --test checkpoint)
# the C tests --quick leaves out: a SmolLM2 generation through both paths, and the benchmark smokes
c_quick_exclude='^(parity-smollm2|bench-smoke.*)$'

# fixtures of the C tests, written once by the plain build
fixtures="$work/fixtures"
if [ ! -f "$fixtures/set/target.gguf" ] || [ ! -f "$fixtures/smollm2-dflash2.gguf" ]; then
    mkdir -p "$fixtures"
    cargo run -q --release -p dflash2-fixtures -- set "$fixtures/set" >/dev/null
    cargo run -q --release -p dflash2-fixtures -- drafter-for "$DFLASH2_SMOLLM2" "$fixtures/smollm2-dflash2.gguf" >/dev/null
fi

# rust_tests_run LOG [cargo args...]: runs the Rust tests (every binary, failures
# or not); echoes "BINARIES PASSED FAILED"
rust_tests_run() {
    local log=$1; shift
    set +e
    "$@" --release --no-fail-fast "${rust_tests[@]}" >"$log" 2>&1
    set -e
    local binaries passed failed
    binaries=$(grep -c '^test result' "$log" || true)
    passed=$(grep -o '^test result: [A-Za-z]*\. [0-9]* passed' "$log" | awk '{s += $4} END {print s + 0}')
    failed=$(grep -o '[0-9]* failed;' "$log" | awk '{s += $1} END {print s + 0}')
    # a test binary that died (a sanitizer stops the process) prints no result line
    if grep -q '^error: test failed\|^error: [0-9]* targets failed' "$log"; then
        failed=$((failed > 0 ? failed : 1))
    fi
    echo "$binaries $passed $failed"
}

# c_tests_run NAME PREFIX CFLAGS [LAUNCHER...]: builds the C tests against the dflash2
# installed in PREFIX with CFLAGS and runs them through CTest (test programs under
# LAUNCHER, when given); echoes "RUN FAILED"
c_tests_run() {
    local name=$1 prefix=$2 cflags=$3; shift 3
    local dir="$work/$name" args=()
    args=(-S ctest -B "$dir/ctest" -DCMAKE_BUILD_TYPE=RelWithDebInfo -Ddflash2_DIR="$prefix/lib/cmake/dflash2"
        -DDFLASH2_FIXTURES="$fixtures/set" -DDFLASH2_SMOLLM2="$DFLASH2_SMOLLM2"
        -DDFLASH2_SMOLLM2_DRAFTER="$fixtures/smollm2-dflash2.gguf"
        "-DCMAKE_C_FLAGS=$cflags" "-DCMAKE_CXX_FLAGS=$cflags" "-DCMAKE_EXE_LINKER_FLAGS=$cflags")
    # CTest prefixes the tests that run a program of this build with the emulator
    # (cmake_minimum_required < 3.28 in ctest/: also when not cross-compiling)
    [ $# -gt 0 ] && args+=("-DCMAKE_CROSSCOMPILING_EMULATOR=$(IFS=';'; echo "$*")")
    # the tests that preload a fake libllama must preload the sanitizer runtime first
    [ -n "${c_preload:-}" ] && args+=("-DDFLASH2_TEST_PRELOAD=$c_preload")
    rm -rf "$dir/ctest"
    cmake "${args[@]}" >"$dir/cmake.log" 2>&1
    nice -n 10 cmake --build "$dir/ctest" -j "$jobs" >>"$dir/cmake.log" 2>&1
    local exclude=()
    [ $quick = 1 ] && exclude=(-E "$c_quick_exclude")
    set +e
    # CFLAGS: the pkg-config test compiles its program itself (ctest/pkgconfig-run.sh)
    CFLAGS="$cflags" nice -n 10 ctest --test-dir "$dir/ctest" --output-on-failure "${exclude[@]}" >"$dir/ctest.log" 2>&1
    set -e
    local run failed
    run=$(sed -n 's/.* tests passed, [0-9]* tests failed out of \([0-9]*\)/\1/p' "$dir/ctest.log" | tail -1)
    failed=$(sed -n 's/.* tests passed, \([0-9]*\) tests failed out of.*/\1/p' "$dir/ctest.log" | tail -1)
    echo "${run:-0} ${failed:-1}"
}

# reports DIR PATTERN: how many reports the files in DIR hold
reports() {
    cat "$1"/* 2>/dev/null | grep -c -E "$2" || true
}

# install_prefix DIR [env...]: builds dflash2 as the environment given says and installs it into DIR/prefix
install_prefix() {
    local dir=$1; shift
    rm -rf "$dir/prefix"
    if ! env "$@" nice -n 10 scripts/install.sh "$dir/prefix" >"$dir/install.log" 2>&1; then
        tail -20 "$dir/install.log" >&2
        return 1
    fi
}

part_asan() {
    local dir="$work/asan" start=$SECONDS
    rm -rf "$dir/reports" && mkdir -p "$dir/reports"
    rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal >&2
    # --target (CARGO_BUILD_TARGET) keeps RUSTFLAGS off the build scripts (bindgen, cbindgen run uninstrumented)
    local build=(RUSTUP_TOOLCHAIN=nightly RUSTFLAGS=-Zsanitizer=address CARGO_TARGET_DIR="$root/target/asan"
        CARGO_BUILD_TARGET="$host" CARGO_BUILD_JOBS="$jobs")
    local run=(ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:log_path=$dir/reports/asan"
        LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0:log_path=$dir/reports/ubsan:suppressions=$supp/ubsan.supp")
    local binaries passed failed c_run c_failed
    read -r binaries passed failed < <(rust_tests_run "$dir/rust-tests.log" env "${build[@]}" "${run[@]}" \
        nice -n 10 cargo test)
    install_prefix "$dir" "${build[@]}" || return 1
    read -r c_run c_failed < <(export "${run[@]}"; c_preload=$("${CC:-gcc}" -print-file-name=libasan.so) \
        c_tests_run asan "$dir/prefix" "-fsanitize=address,undefined -fno-omit-frame-pointer -g")
    local asan lsan ub
    asan=$(reports "$dir/reports" 'ERROR: AddressSanitizer')
    lsan=$(reports "$dir/reports" 'ERROR: LeakSanitizer')
    ub=$(reports "$dir/reports" 'runtime error:')
    echo "asan: Rust tests $passed passed, $failed failed ($binaries binaries); C tests $((c_run - c_failed))/$c_run" \
        "passed (-fsanitize=address,undefined); $asan ASan, $lsan LSan, $ub UBSan reports; $((SECONDS - start)) s"
    [ "$failed" = 0 ] && [ "$binaries" -gt 0 ] && [ "$c_failed" = 0 ] && [ "$c_run" -gt 0 ] &&
        [ "$asan" = 0 ] && [ "$lsan" = 0 ] && [ "$ub" = 0 ]
}

part_ubsan() {
    local dir="$work/ubsan" start=$SECONDS
    rm -rf "$dir/reports" && mkdir -p "$dir/reports"
    # Rust's own checks on every crate: integer overflow panics, debug_assert! holds
    local build=(CARGO_TARGET_DIR="$root/target/checked" CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
        CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true CARGO_BUILD_JOBS="$jobs")
    local run=(UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0:log_path=$dir/reports/ubsan:suppressions=$supp/ubsan.supp")
    local binaries passed failed c_run c_failed
    read -r binaries passed failed < <(rust_tests_run "$dir/rust-tests.log" env "${build[@]}" nice -n 10 cargo test)
    install_prefix "$dir" "${build[@]}" || return 1
    read -r c_run c_failed < <(export "${run[@]}"; c_tests_run ubsan "$dir/prefix" \
        "-fsanitize=undefined -fno-omit-frame-pointer -g")
    local ub
    ub=$(reports "$dir/reports" 'runtime error:')
    echo "ubsan: C tests $((c_run - c_failed))/$c_run passed (-fsanitize=undefined, library with Rust's checks)," \
        "$ub UBSan reports; Rust tests with overflow-checks + debug-assertions $passed passed, $failed failed" \
        "($binaries binaries); $((SECONDS - start)) s"
    [ "$failed" = 0 ] && [ "$binaries" -gt 0 ] && [ "$c_failed" = 0 ] && [ "$c_run" -gt 0 ] && [ "$ub" = 0 ]
}

part_valgrind() {
    local dir="$work/valgrind" start=$SECONDS
    rm -rf "$dir/reports" && mkdir -p "$dir/reports"
    command -v valgrind >/dev/null || { echo "valgrind: not installed (apt-get install valgrind)"; return 1; }
    local portable
    portable=$(env -u DFLASH2_LLAMA_PREFIX DFLASH2_LLAMA_VARIANT=portable DFLASH2_JOBS="$jobs" \
        nice -n 10 scripts/llama-cpp.sh build)
    install_prefix "$dir" DFLASH2_LLAMA_PREFIX="$portable" CARGO_TARGET_DIR="$root/target/portable" \
        CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_BUILD_JOBS="$jobs" || return 1
    local c_run c_failed
    read -r c_run c_failed < <(DFLASH2_LLAMA_PREFIX=$portable c_tests_run valgrind "$dir/prefix" "-g" \
        valgrind --error-exitcode=1 --leak-check=full --num-callers=40 --fair-sched=yes \
        --suppressions="$supp/valgrind.supp" --log-file="$dir/reports/vg.%p")
    local programs errors
    programs=$(ls "$dir/reports" | wc -l)
    errors=$(cat "$dir"/reports/* 2>/dev/null | sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' |
        awk '{s += $1} END {print s + 0}')
    echo "valgrind: C tests $((c_run - c_failed))/$c_run passed, $programs programs under memcheck, $errors errors" \
        "(portable llama.cpp at $portable); $((SECONDS - start)) s"
    [ "$c_failed" = 0 ] && [ "$c_run" -gt 0 ] && [ "$errors" = 0 ] && [ "$programs" -gt 0 ]
}

for part in "${parts[@]}"; do
    mkdir -p "$work/$part"
    "part_$part" || status=1
done
exit $status
