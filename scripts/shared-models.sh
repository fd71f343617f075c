#!/usr/bin/env bash
# Prints the folder of the shared SmolLM2 drafters (smollm2-135m-dflash2.gguf, the
# trained one, and smollm2-135m-dflash2-random.gguf): $DFLASH2_SHARED_MODELS when
# set; else ../shared/models beside this checkout; else, for a clone of a local
# checkout (CI's fresh clone in a temporary folder), ../shared/models beside the
# checkout it was cloned from; else ../shared/models beside this checkout, which
# then does not exist (callers check for the files and fall back to generated ones).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${DFLASH2_SHARED_MODELS:-}" ]; then
    echo "$DFLASH2_SHARED_MODELS"
    exit 0
fi
if [ -d "$root/../shared/models" ]; then
    (cd "$root/../shared/models" && pwd)
    exit 0
fi
origin=$(git -C "$root" remote get-url origin 2>/dev/null || true)
if [ -n "$origin" ] && [ -d "$origin/../shared/models" ]; then
    (cd "$origin/../shared/models" && pwd)
    exit 0
fi
echo "$root/../shared/models"
