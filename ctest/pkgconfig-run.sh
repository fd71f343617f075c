#!/bin/sh
# Builds a C program with nothing but `pkg-config --cflags --libs dflash2` (the
# dflash2.pc an install writes) and runs it with the remaining arguments.
#
#   pkgconfig-run.sh PKGCONFIG_DIR SOURCE.c OUTPUT [ARGS...]
set -eu
pc_dir=$1 src=$2 out=$3
shift 3
flags=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs dflash2)
# CFLAGS / LDFLAGS as any build takes them (scripts/sanitizers.sh passes -fsanitize=...)
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror ${CFLAGS:-} -I"$(dirname "$src")" "$src" $flags ${LDFLAGS:-} -o "$out"
exec "$out" "$@"
