#!/usr/bin/env python3
"""Routes llama-server's speculative hooks to dflash2: anchored insertions into
the pinned llama.cpp tree's tools/server sources. Every anchor must occur
exactly once in the pristine file; otherwise the tree is not the one this patch
was written for, and the script stops and says which anchor failed.

    patch.py PRISTINE_SERVER_DIR OUT_SERVER_DIR

Reads the pristine tools/server files, writes patched copies of the files it
changes into OUT_SERVER_DIR (which may be the server dir itself).
"""

import pathlib
import sys

MARK = "// dflash2"

# our adapter's sources in this folder, compiled into the server
SOURCES = [
    "dflash2-server-args.cpp",
    "dflash2-server-engine.cpp",
    "dflash2-server-faults.cpp",
    "dflash2-server-hooks.cpp",
    "dflash2-server-init.cpp",
    "dflash2-server-report.cpp",
    "dflash2-server-state.cpp",
    "dflash2-server-tree.cpp",
    "dflash2-server-upstream.cpp",
    "dflash2-server-verify.cpp",
]

# (file, anchor, replacement); each replacement keeps the anchor's text where it
# can and adds one marked line or expression.
EDITS = [
    ("server-context.cpp",
     '#include "speculative.h"\n',
     '#include "speculative.h"\n#include "dflash2-server.h" ' + MARK + '\n'),
    # target outputs are sized for dflash2's effective draft length
    ("server-context.cpp",
     "params.n_batch, params.n_parallel, common_speculative_n_max(&params.speculative));",
     "params.n_batch, params.n_parallel, dflash2_server_output_n_max(params)); " + MARK),
    # tree verification (--spec-dflash2-tree): a batch row may carry several sequence ids
    ("server-context.cpp",
     "        bool is_prompt; // for stats tracking\n",
     "        bool is_prompt; // for stats tracking\n"
     "        std::vector<llama_seq_id> seq_ids = {}; // when set, the row's sequence ids (id_slot's first or not) " + MARK + "\n"),
    ("server-context.cpp",
     "                view.add(t.token, t.pos, t.id_slot, t.output);\n",
     "                if (!t.seq_ids.empty()) { view.add(t.token, t.pos, t.seq_ids, t.output); } else " + MARK + "\n"
     "                view.add(t.token, t.pos, t.id_slot, t.output);\n"),
    # a slot's draft rows: a chain as before, or a tree's anchor and nodes at their depths
    ("server-context.cpp",
     "            auto pos0 = prompt.tokens.pos_next();\n"
     "\n"
     "            add_ok &= batch.add(id, sampled, pos0++, true, false);\n"
     "            for (auto token : spec_draft) {\n"
     "                add_ok &= batch.add(this->id, token, pos0++, true, false);\n"
     "            }\n",
     "            add_ok &= dflash2_server_add_draft_rows(spec, id, sampled, spec_draft, prompt.tokens.pos_next(), " + MARK + "\n"
     "                    [&](llama_token token, llama_pos pos, const std::vector<llama_seq_id> & seq_ids) {\n"
     "                        const bool ok = batch.add(id, token, pos, true, false);\n"
     "                        if (ok) {\n"
     "                            batch.tokens.back().seq_ids = seq_ids;\n"
     "                        }\n"
     "                        return ok;\n"
     "                    });\n"),
    # tree verification: a batch whose last ubatch would be one row over parked cells gets the library's pad row
    ("server-context.cpp",
     "        GGML_ASSERT(batch.slot_batched || batch.size() == 0);\n",
     "        GGML_ASSERT(batch.slot_batched || batch.size() == 0);\n"
     "        if (spec && batch.size() > 0 && !batch.has_embd) { " + MARK + "\n"
     "            const int32_t id_slot_last = batch.tokens.back().id_slot, n_batch_max = (int32_t) llama_n_batch(ctx_tgt);\n"
     "            const llama_seq_id seq_last = batch.tokens.back().seq_ids.empty() ? id_slot_last : batch.tokens.back().seq_ids[0];\n"
     "            dflash2_server_pad_batch(spec.get(), (batch.size() - 1) % n_batch_max + 1, n_batch_max, seq_last,\n"
     "                    [&](llama_token token, llama_pos pos, const std::vector<llama_seq_id> & seq_ids) {\n"
     "                        const bool ok = batch.add(id_slot_last, token, pos, false, false);\n"
     "                        if (ok) {\n"
     "                            batch.tokens.back().seq_ids = seq_ids;\n"
     "                        }\n"
     "                        return ok;\n"
     "                    });\n"
     "        }\n"),
    # slot memory mirrors every operation into the dflash2 engine
    ("server-context.cpp",
     "    common_memory mem;\n",
     "    dflash2_server_memory mem; " + MARK + "\n"),
    # the speculative object: upstream's or dflash2's, behind overloads of every hook
    ("server-context.cpp",
     "    // speculative decoding\n    common_speculative * spec;\n",
     "    // speculative decoding\n    dflash2_server_spec * spec; " + MARK + "\n"),
    ("server-context.cpp",
     "                struct cb_data_t {\n                    common_speculative * spec;\n",
     "                struct cb_data_t {\n                    dflash2_server_spec * spec; " + MARK + "\n"),
    ("server-context.cpp",
     "    common_speculative_ptr spec;\n",
     "    dflash2_server_spec_ptr spec; " + MARK + "\n"),
    # prompt cache: the draft part of a saved slot is dflash2's state blob
    ("server-context.cpp",
     "const size_t cur_size_dft = ctx_dft ? llama_state_seq_get_size_ext(ctx_dft, id, LLAMA_STATE_SEQ_FLAGS_NONE) : 0;",
     "const size_t cur_size_dft = dflash2_server_state_size(spec, ctx_dft, id); " + MARK),
    ("server-context.cpp",
     "        if (ctx_dft) {\n"
     "            llama_state_seq_get_data_ext(ctx_dft, cur->data.drft.data(), cur_size_dft, id, LLAMA_STATE_SEQ_FLAGS_NONE);\n"
     "        }\n",
     "        dflash2_server_state_save(spec, ctx_dft, id, cur->data.drft); " + MARK + "\n"),
    # no upstream draft context when dflash2 serves: the drafter is loaded once, by dflash2
    ("server-context.cpp",
     "        if (has_spec) {\n            // spec_mtp doesn't use load a model internally",
     "        if (has_spec && !dflash2_server_routes(params_base)) { " + MARK + "\n"
     "            // spec_mtp doesn't use load a model internally"),
    ("server-context.cpp",
     "spec.reset(common_speculative_init(params_base.speculative, params_base.n_parallel));",
     "spec.reset(dflash2_server_spec_init(params_base, ctx_tgt)); " + MARK),
    # a drafter dflash2 cannot serve stops the server instead of running without drafts
    ("server-context.cpp",
     '                SRV_ERR("failed to initialize speculative decoding context: %s\\n", e.what());\n',
     '                SRV_ERR("failed to initialize speculative decoding context: %s\\n", e.what());\n'
     "                if (dflash2_server_init_failed(params_base)) { return false; } " + MARK + "\n"),
    # sampling: the slot's temperature and seed go into its draft request
    ("server-context.cpp",
     "                        drafting.push_back(&slot);\n",
     "                        drafting.push_back(&slot);\n"
     "                        dflash2_server_set_sampling(spec.get(), slot.id, slot.task->params.sampling, slot.smpl.get()); " + MARK + "\n"),
    # verification: lossless rejection sampling for sampled drafts, the emitted tokens' candidates kept
    ("server-context.cpp",
     "                    ? common_sampler_sample_and_accept_n(slot.smpl.get(), slot.ctx_tgt, slot.spec_i_batch, slot.spec_draft)\n",
     "                    ? dflash2_server_sample_and_accept_n(spec.get(), slot.id, slot.smpl.get(), slot.ctx_tgt, slot.spec_i_batch, slot.spec_draft,\n"
     "                            slot.spec_is_replay, slot.task->params.post_sampling_probs ? slot.task->params.sampling.n_probs : 0) " + MARK + "\n"),
    # probabilities of drafted tokens, as a plain step gives them
    ("server-context.cpp",
     "                // TODO: set result.probs\n",
     "                if (slot.task->params.sampling.n_probs > 0) { " + MARK + "\n"
     "                    const int32_t idx = dflash2_server_draft_probs_row(spec.get(), slot.smpl.get(), slot.id, i);\n"
     "                    if (idx >= 0) {\n"
     "                        populate_token_probs(slot, result, slot.task->params.post_sampling_probs, params_base.special, idx);\n"
     "                    }\n"
     "                }\n"),
    # dflash2 takes feature rows of any width from embedding batches (images)
    ("server-context.cpp",
     "        if (spec && batch.has_embd) {",
     "        if (spec && !spec->takes_embd_batches() && batch.has_embd) { " + MARK),
    # /slots: the slot's draft statistics
    ("server-context.cpp",
     '            {"is_processing", is_processing()},\n        };\n',
     '            {"is_processing", is_processing()},\n        };\n'
     "        if (can_speculate()) { res[\"draft\"] = json::parse(dflash2_server_slot_json(spec, id)); } " + MARK + "\n"),
    # /props: dflash2 and the llama.cpp it was built against
    ("server-context.cpp",
     '        { "cors_proxy_enabled",          params.ui_mcp_proxy },\n    };\n',
     '        { "cors_proxy_enabled",          params.ui_mcp_proxy },\n    };\n'
     "    props[\"dflash2\"] = json::parse(dflash2_server_props_json()); " + MARK + "\n"),
    # the drafter's memory is budgeted before the target is fitted and loaded
    ("server-context.cpp",
     "        llama_init = common_init_from_params(params_base);\n",
     "        llama_init = dflash2_server_init_target(params_base); " + MARK + "\n"),

    # /slots save and restore carry the draft state in FILE.dflash2
    ("server-context.cpp",
     '                        send_error(task, "Unable to save slot", ERROR_TYPE_SERVER);\n'
     "                        break;\n"
     "                    }\n",
     '                        send_error(task, "Unable to save slot", ERROR_TYPE_SERVER);\n'
     "                        break;\n"
     "                    }\n"
     "                    dflash2_server_slot_file_save(spec.get(), slot->id, filepath); " + MARK + "\n"),
    ("server-context.cpp",
     "                        slot->prompt.tokens = std::move(restored);\n",
     "                        slot->prompt.tokens = std::move(restored);\n"
     "                        dflash2_server_slot_file_load(ctx_tgt, slot->id, filepath); " + MARK + "\n"),

    ("server-task.cpp",
     '#include "speculative.h"\n',
     '#include "speculative.h"\n#include "dflash2-server.h" ' + MARK + '\n'),
    # prompt cache restore: dflash2 takes the draft part when it serves this target
    ("server-task.cpp",
     "            if (!data.empty()) {\n                GGML_ASSERT(ctx_dft);\n",
     "            if (!data.empty() && !dflash2_server_state_load(ctx_tgt, id_slot, data)) { " + MARK + "\n"
     "                GGML_ASSERT(ctx_dft);\n"),
    ("server-task.cpp",
     "    return prometheus.str();\n}\n",
     "    prometheus << dflash2_server_metrics(); " + MARK + "\n    return prometheus.str();\n}\n"),

    # our command-line options leave argv before llama.cpp parses it
    ("server.cpp",
     '#include "common.h"\n',
     '#include "common.h"\n#include "dflash2-server.h" ' + MARK + '\n'),
    ("server.cpp",
     "    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_SERVER)) {",
     "    if (!dflash2_server_take_args(argc, argv)) { return 1; } " + MARK + "\n"
     "    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_SERVER)) {"),

    # build: our adapter in server-context, linked to libdflash2
    ("CMakeLists.txt",
     "target_link_libraries(${TARGET} PUBLIC llama-common mtmd ${CMAKE_THREAD_LIBS_INIT})\n",
     "target_link_libraries(${TARGET} PUBLIC llama-common mtmd ${CMAKE_THREAD_LIBS_INIT})\n"
     "target_sources(${TARGET} PRIVATE " + " ".join("${DFLASH2_SERVER_DIR}/" + f for f in SOURCES) + ") # dflash2\n"
     "target_include_directories(${TARGET} PUBLIC ${DFLASH2_SERVER_DIR} ${DFLASH2_INCLUDE_DIR}) # dflash2\n"
     "target_link_libraries(${TARGET} PUBLIC ${DFLASH2_LIBRARY}) # dflash2\n"),
]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    on_disk = sorted(p.name for p in pathlib.Path(__file__).resolve().parent.glob("*.cpp"))
    if on_disk != sorted(SOURCES):
        sys.exit(f"patch: SOURCES {sorted(SOURCES)} differs from the .cpp files beside patch.py {on_disk}")
    pristine = pathlib.Path(sys.argv[1])
    out = pathlib.Path(sys.argv[2])
    files = {}
    for name, anchor, replacement in EDITS:
        text = files.get(name)
        if text is None:
            path = pristine / name
            if not path.is_file():
                sys.exit(f"patch: {path} is missing: not the pinned llama.cpp tree")
            text = path.read_text()
            if MARK in text:
                sys.exit(f"patch: {path} is already patched: pass the pristine server sources")
        count = text.count(anchor)
        if count != 1:
            first = anchor.strip().splitlines()[0]
            sys.exit(f"patch: anchor found {count} times (need exactly 1) in {name}: '{first}'\n"
                     "the llama.cpp tree differs from the pinned one this patch was written for")
        files[name] = text.replace(anchor, replacement)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        # an unchanged file keeps its time stamp: the server's build then does not compile it again
        path = out / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    print(f"patch: {len(EDITS)} insertions into {', '.join(sorted(files))}")


if __name__ == "__main__":
    main()
