#!/usr/bin/env python3
"""Fixes dflash2 applies to the pinned llama.cpp tree before building it: anchored
replacements, like server/patch.py. Each anchor must occur exactly once in the
pristine file; a tree that already carries a fix is left as it is; any other tree
is not the one these fixes were written for, and the script stops and says which
anchor failed.

    ggml-fixes.py SRC_DIR

1. meta-zero-fill (ggml/src/ggml-backend-meta.cpp, the all-reduce fallback of
   `-sm tensor`). A device whose slice of a weight is empty (llama.cpp rounds
   every slice down to its granularity: SmolLM2's attention, 576 columns in
   units of 384, gives one of two devices all of it and the other nothing) never
   computes its partial result; before the all-reduce ggml "zeroes" it by
   scaling it by 0, i.e. it multiplies memory nothing wrote by 0. Where those
   bytes hold NaN or Inf (an attention mask's -inf left in the compute buffer,
   or what an RPC server's earlier client left in reused memory) the sum is NaN,
   every logit is NaN and greedy decoding answers "........". The fix fills the
   partial with 0 (GGML_OP_FILL, which reads nothing) and exports
   `ggml_backend_meta_dflash2_fills_empty_slices` so that libdflash2 can tell a
   ggml with the fix from one without it (src/sys/ggml/meta.rs).
"""

import pathlib
import sys

MARK = "dflash2"

FIXES = [
    ("meta-zero-fill", "ggml/src/ggml-backend-meta.cpp", [
        ("            node_zero->op = GGML_OP_SCALE; // FIXME 0.0f * NaN == NaN\n"
         "            node_zero->src[0] = node;\n",
         "            // dflash2 (scripts/ggml-fixes.py): fill with 0, reading nothing; scaling by 0\n"
         "            // memory nothing wrote keeps its NaN and Inf\n"
         "            node_zero->op = GGML_OP_FILL;\n"
         "            node_zero->src[0] = node;\n"),
        ("static void ggml_backend_meta_buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {\n",
         "// dflash2 (scripts/ggml-fixes.py): this ggml fills a device's empty-slice partial\n"
         "// results with 0 before an all-reduce instead of scaling them by 0\n"
         "extern \"C\" {\n"
         "GGML_API int ggml_backend_meta_dflash2_fills_empty_slices(void);\n"
         "}\n"
         "int ggml_backend_meta_dflash2_fills_empty_slices(void) { return 1; }\n"
         "\n"
         "static void ggml_backend_meta_buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {\n"),
    ]),
]


def apply(src: pathlib.Path) -> None:
    for name, rel, edits in FIXES:
        path = src / rel
        text = path.read_text()
        done = all(new in text for _, new in edits)
        if done:
            print(f"[ggml-fixes] {name}: already applied to {rel}", file=sys.stderr)
            continue
        for old, new in edits:
            n = text.count(old)
            if n != 1:
                sys.exit(f"[ggml-fixes] {name}: anchor found {n} times in {rel} (expected once): "
                         f"this llama.cpp tree is not the pinned one\n{old}")
            text = text.replace(old, new)
        path.write_text(text)
        print(f"[ggml-fixes] {name}: applied to {rel}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    apply(pathlib.Path(sys.argv[1]))
