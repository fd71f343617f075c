#!/usr/bin/env bash
# dflash2's Rust integration tests under AddressSanitizer (and LeakSanitizer):
# the library, the tests and std are instrumented (nightly, -Zsanitizer=address);
# libllama/ggml are not, but their heap calls go through ASan's allocator, so a
# wrong free, a double free or a leak of theirs that dflash2 causes is seen too.
# No suppressions: none were needed (a report fails the run).
#
#   scripts/sanitizers.sh [--quick]     --quick: the API-surface tests only
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = --quick ] && quick=1

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal >&2
DFLASH2_LLAMA_PREFIX=${DFLASH2_LLAMA_PREFIX:-$(scripts/llama-cpp.sh build)}
export DFLASH2_LLAMA_PREFIX
export DFLASH2_SMOLLM2=${DFLASH2_SMOLLM2:-$(scripts/fetch-models.sh smollm2)}
host=$(rustc -vV | sed -n 's/^host: //p')
# --target keeps RUSTFLAGS off the build scripts (bindgen, cbindgen run uninstrumented)
export RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/asan
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0"
tests=(--test engine_robustness --test engine_misuse --test engine_threads --test engine_state --test checkpoint)
[ $quick = 1 ] || tests=(--tests)
cargo +nightly test -j "${DFLASH2_JOBS:-2}" --release --target "$host" "${tests[@]}" 2>&1 | tee target/asan-tests.log |
    grep -E "^test result|ERROR: (Address|Leak)Sanitizer|^SUMMARY" >&2 || true
passed=$(grep -o '^test result: ok. [0-9]*' target/asan-tests.log | awk '{s += $4} END {print s + 0}')
binaries=$(grep -c '^test result' target/asan-tests.log || true)
reports=$(grep -c 'ERROR: \(Address\|Leak\)Sanitizer' target/asan-tests.log || true)
echo "asan: $binaries test binaries, $passed tests passed, $reports sanitizer reports"
[ "$reports" = 0 ] && [ "$binaries" -gt 0 ] && ! grep -q '^test result: FAILED' target/asan-tests.log
