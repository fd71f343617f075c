#!/usr/bin/env bash
# Measures a cost curve -- the relative time of one target decode by its total rows, 1 row =
# 1.0 -- on any device with the pinned llama.cpp's own llama-batched-bench, and writes it in
# the format of tools/cost-worlds/*.txt (docs/cost-worlds.md), ready for `--cost-world FILE`.
#
#   scripts/measure-cost-curve.sh [-DCMAKE_FLAG=...]... --model M.gguf [options] [-- ARGS]
#
#   -D...            CMake flags for the llama.cpp build of llama-batched-bench, e.g.
#                    -DGGML_CUDA=ON, -DGGML_METAL=ON, -DGGML_VULKAN=ON. Each set of flags gets
#                    its own build folder in the cache (built once, only that target).
#   --model M.gguf   the target model to measure (required unless --build-only)
#   --depth N        KV depth: tokens already in the cache when the rows are decoded
#                    (default 4096)
#   --rows LIST      row counts to measure, comma-separated (default
#                    1,2,3,4,5,6,7,8,9,10,12,16,24,32,48,64,128,256); 1 is always added
#   --tg N           decode steps timed per row count (default 32)
#   --reps N         repeat the whole sweep N times, keep each row count's fastest (default 1)
#   --name NAME      the curve's `# name:` (default: measured-<model file name>)
#   --out FILE       write the curve there (default: stdout)
#   --build-only     build llama-batched-bench and print its path
#   -- ARGS          passed on to llama-batched-bench, after this script's own flags (later
#                    flags win): e.g. `-- -ngl 99 -fa on`, `-- -t 8`, `-- --repack`
#
# What is measured: llama-batched-bench with one shared prompt of DEPTH tokens (-pps, unified
# KV cache -kvu), then for each row count B its text-generation phase: B sequences decode one
# token each per step, TG steps, so every step is one decode of B rows on top of DEPTH
# cached tokens. Time of one B-row decode = T_TG / TG (= B / S_TG); the curve is that time
# divided by the 1-row time. Weight repacking is off by default (--no-repack, as dflash2
# loads models: repacked AMX kernels segfault on some CPUs); pass `-- --repack` to measure
# with it. Timing noise can make a row count measure faster than a smaller one; a cost
# world must not fall with rows, so such a point is raised to the one before it and its
# measured value is kept in a comment.
#
# Environment: DFLASH2_CACHE (cache root, as scripts/llama-cpp.sh), DFLASH2_JOBS (build jobs,
# default nproc).
set -euo pipefail
SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

model=""
depth=4096
rows="1,2,3,4,5,6,7,8,9,10,12,16,24,32,48,64,128,256"
tg=32
reps=1
name=""
out=""
build_only=0
cmake_user=()
bench_extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        -D*) cmake_user+=("$1"); shift ;;
        --model) model=${2:?--model needs a file}; shift 2 ;;
        --depth) depth=${2:?--depth needs a number}; shift 2 ;;
        --rows) rows=${2:?--rows needs a list}; shift 2 ;;
        --tg) tg=${2:?--tg needs a number}; shift 2 ;;
        --reps) reps=${2:?--reps needs a number}; shift 2 ;;
        --name) name=${2:?--name needs a name}; shift 2 ;;
        --out) out=${2:?--out needs a file}; shift 2 ;;
        --build-only) build_only=1; shift ;;
        -h|--help) usage ;;
        --) shift; bench_extra=("$@"); break ;;
        *) echo "[measure-cost-curve] unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$depth" "$tg" "$reps"; do
    case "$n" in ''|*[!0-9]*) echo "[measure-cost-curve] --depth, --tg and --reps take whole numbers" >&2; exit 2 ;; esac
done
[ "$tg" -ge 1 ] && [ "$reps" -ge 1 ] || { echo "[measure-cost-curve] --tg and --reps must be >= 1" >&2; exit 2; }
# the row counts: whole numbers >= 1, sorted, unique, 1 included
rows=$(echo "1,$rows" | tr ',' '\n' | sed '/^$/d' | while read -r r; do
    case "$r" in *[!0-9]*) echo "[measure-cost-curve] --rows: '$r' is not a whole number" >&2; exit 2 ;; esac
    [ "$r" -ge 1 ] && echo "$r"
done | sort -n | uniq | paste -sd, -)
max_rows=${rows##*,}

log() {
    echo "[measure-cost-curve] $*" >&2
}

# --- build llama-batched-bench from the pinned source, one build folder per set of flags ---
src=$("$SCRIPTS_DIR/llama-cpp.sh" src)
if [ ! -f "$src/.dflash2-fetched" ]; then
    log "the pinned llama.cpp source is not fetched yet: running scripts/llama-cpp.sh build"
    "$SCRIPTS_DIR/llama-cpp.sh" build >/dev/null
fi
pin_root=$(dirname "$src")
if [ ${#cmake_user[@]} -eq 0 ]; then
    key=default
else
    key=$(printf '%s\n' "${cmake_user[@]}" | sha256sum | cut -c1-12)
fi
build="$pin_root/batched-bench-$key"
bench="$build/bin/llama-batched-bench"
stamp="$build/.dflash2-built"
mkdir -p "$build"
exec 9>"$build/.lock"
flock 9
if [ ! -f "$stamp" ] || [ ! -x "$bench" ]; then
    generator=()
    command -v ninja >/dev/null && [ ! -f "$build/CMakeCache.txt" ] && generator=(-G Ninja)
    log "building llama-batched-bench into $build (flags: ${cmake_user[*]:-none}); a few minutes once"
    cmake -S "$src" -B "$build" "${generator[@]}" \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
        ${cmake_user[@]+"${cmake_user[@]}"} >"$build/configure.log" 2>&1 \
        || { tail -30 "$build/configure.log" >&2; log "cmake failed (log: $build/configure.log)"; exit 1; }
    cmake --build "$build" -j "${DFLASH2_JOBS:-$(nproc)}" --target llama-batched-bench >"$build/build.log" 2>&1 \
        || { tail -30 "$build/build.log" >&2; log "build failed (log: $build/build.log)"; exit 1; }
    printf '%s\n' "flags: ${cmake_user[*]:-none}" > "$stamp"
fi
exec 9>&-
if [ "$build_only" = 1 ]; then
    echo "$bench"
    exit 0
fi
[ -n "$model" ] || { log "--model is required (see --help)"; exit 2; }
[ -f "$model" ] || { log "no model file at $model"; exit 2; }

# --- run it ---
ubatch=$(( max_rows > 512 ? max_rows : 512 ))
nbatch=$(( ubatch > 2048 ? ubatch : 2048 ))
ctx=$(( depth + max_rows * tg + 256 ))
raw=$(mktemp)
trap 'rm -f "$raw" "$raw.log" "$raw.curve"' EXIT
cmd=("$bench" -m "$model" -c "$ctx" -b "$nbatch" -ub "$ubatch"
     -npp "$depth" -ntg "$tg" -npl "$rows" -pps -kvu --no-repack --output-format jsonl
     ${bench_extra[@]+"${bench_extra[@]}"})
log "running: ${cmd[*]}"
for rep in $(seq 1 "$reps"); do
    [ "$reps" -gt 1 ] && log "sweep $rep of $reps"
    if ! "${cmd[@]}" >"$raw.log" 2>&1; then
        tail -30 "$raw.log" >&2
        log "llama-batched-bench failed"
        exit 1
    fi
    grep -a '^{"n_kv_max"' "$raw.log" >> "$raw" || true
done

device=""
if command -v nvidia-smi >/dev/null 2>&1; then
    device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
fi
[ -n "$device" ] || device=$(grep -a -m1 -oE '(Device description|using device [^ ]+ \(|ggml_metal_device_init: GPU name|found [0-9]+ [A-Za-z]+ devices)[^)]*' "$raw.log" | head -1 || true)
[ -n "$device" ] || device="$(uname -m) CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)"

python3 - "$raw" "$rows" "$tg" "$depth" "${name:-measured-$(basename "$model" .gguf)}" \
        "$(basename "$model")" "$device" "${cmake_user[*]:-none}" "${cmd[*]}" > "$raw.curve" <<'EOF'
import json, sys, datetime
raw, rows, tg, depth, name, model, device, flags, cmd = sys.argv[1:]
want = [int(r) for r in rows.split(",")]
best = {}
for line in open(raw):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if j.get("tg") != int(tg) or j.get("t_tg", 0) <= 0:
        continue
    t = j["t_tg"] / j["tg"]          # seconds per decode of pl rows
    pl = j["pl"]
    if pl not in best or t < best[pl]:
        best[pl] = t
missing = [r for r in want if r not in best]
if 1 not in best:
    sys.exit("no 1-row result from llama-batched-bench (context too small? see its log)")
if missing:
    print("[measure-cost-curve] no result for rows %s (context too small?), left out" % missing, file=sys.stderr)
base = best[1]
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
print("# name: %s" % name)
print("# what: relative time of one target decode by its total rows (all sequences together), 1 row = 1.0")
print("# source: measured %s with scripts/measure-cost-curve.sh (llama-batched-bench of the pinned llama.cpp, "
      "cmake flags: %s), %s, model %s, KV depth %s, time per decode = T_TG / TG of B sequences decoding one token "
      "each (B rows) over %s steps, divided by the 1-row time" % (now, flags, device, model, depth, tg))
print("# command: %s" % cmd)
print("# measured: rows, ms per decode, S_TG tokens/s")
for r in sorted(best):
    print("#   %d %.3f %.2f" % (r, best[r] * 1000, r / best[r]))
prev = 0.0
for r in sorted(best):
    rel = best[r] / base
    if r == 1:
        rel = 1.0
    if rel < prev:
        print("# %d rows measured %.3f, below the point before it: raised to %.3f (a cost world does not fall with rows)" % (r, rel, prev))
        rel = prev
    print("%d %.3f" % (r, rel))
    prev = rel
EOF
if [ -n "$out" ]; then
    mkdir -p "$(dirname "$out")"
    cp "$raw.curve" "$out"
    log "wrote $out"
else
    cat "$raw.curve"
fi
rm -f "$raw.curve"
