#!/usr/bin/env python3
"""End-to-end tests of llama-server with dflash2 on the hybrid and multimodal
fixtures (loopback only), with the servers and checks of test_server.py.

The hybrid qwen35 target (gated delta net + attention, M-RoPE) with its DFlash2
drafter must answer exactly what the same server without a drafter answers
(greedy) through one and four slots, prompt cache reuse, prompt checkpoints,
/slots save and restore and a cancelled request. The multimodal pair
(vision-target + qwen3vl_merger mmproj) must answer chat requests holding an
image identically with and without dflash2, with image rows injected or skipped,
in a row and concurrently, and go on drafting after the image. Every server log
stays free of errors.

    test_hybrid_vision.py --server BIN --fixtures DIR [--only NAME] [--workdir DIR]
"""

import argparse
import base64
import concurrent.futures
import http.client
import json
import os
import sys
import tempfile
import time

import test_server as ts
from test_server import DEFAULT_DRAFT, DRAFT, LONG, assert_drafting, slots_run

PROMPTS = ["the draft model is fast", "one two three", "code: a list of the", "it is not a block but a token and"]


# stands for the projector arguments in a server's argument list (known only once ts.ARGS is set)
MMPROJ = "<mmproj>"


def on_target(name, *specs):
    """ts.with_servers with every server on fixture `name` (the drafter is the qwen35 one)."""
    def wrap(body):
        def run():
            ts.ARGS.target = os.path.join(ts.ARGS.fixtures, name)
            mmproj = ["--mmproj", os.path.join(ts.ARGS.fixtures, "vision-mmproj.gguf")]
            concrete = [(n, [x for a in args for x in (mmproj if a == MMPROJ else [a])]) for n, args in specs]
            ts.with_servers(*concrete)(body)()
        run.__name__ = body.__name__
        return run
    return wrap


def drafted(server):
    return server.metrics().get("dflash2_drafted_tokens_total", 0)


# ---------------------------------------------------------------- hybrid qwen35

HYBRID = "qwen35-target.gguf"


@on_target(HYBRID, ("reference", ["-np", "1", "-c", "2048"]), ("dflash2", ["-np", "1", "-c", "2048"] + [DRAFT]))
def test_hybrid_answers_equal_the_no_drafter_server(ref, spec):
    for p in PROMPTS:
        want, got = ref.chat(p), spec.chat(p)
        assert got == want, f"prompt {p!r}:\n  dflash2:   {got!r}\n  reference: {want!r}"
    assert_drafting(spec)
    assert spec.request("GET", "/slots")[0]["draft"]["n_drafted"] > 0


@on_target(HYBRID, ("reference", ["-np", "1", "-c", "2048"]), ("dflash2", ["-np", "4", "-c", "8192"] + [DRAFT]))
def test_hybrid_four_parallel_slots_answer_like_single_requests(ref, spec):
    want = [ref.chat(p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(spec.chat, PROMPTS))
    for p, g, w in zip(PROMPTS, got, want):
        assert g == w, f"prompt {p!r}:\n  dflash2 -np 4: {g!r}\n  reference:     {w!r}"
    assert assert_drafting(spec)["spec_decode_num_drafts_total"] >= 4


@on_target(HYBRID, ("reference", ["-np", "1", "-c", "2048", "--cache-reuse", "4"]),
           ("dflash2", ["-np", "1", "-c", "2048", "--cache-reuse", "4", "-lv", "4"] + [DRAFT]))
def test_hybrid_prompt_cache_keeps_answers_identical(ref, spec):
    first = LONG + "Jupiter is the largest planet. Question: which planet is red? Answer:"
    second = LONG + "Question: which planet is red? Answer:"
    for prompt in (first, first, second):
        want = ref.complete(prompt, cache_prompt=True)
        got = spec.complete(prompt, cache_prompt=True)
        assert got == want, f"prompt {prompt[-40:]!r}:\n  dflash2:   {got!r}\n  reference: {want!r}"
    assert spec.metrics().get("prompt_tokens_cached_total", 0) > 0
    assert_drafting(spec)


CHECKPOINTS = ["-np", "1", "-c", "2048", "-lv", "4", "-b", "64", "-ub", "64", "--checkpoint-min-step", "0"]


@on_target(HYBRID, ("reference", CHECKPOINTS), ("dflash2", CHECKPOINTS + [DRAFT]))
def test_hybrid_prompt_checkpoints_restore_identically(ref, spec):
    # a recurrent state cannot be cut back: a prompt that leaves the cached
    # tokens part way resumes from a context checkpoint (target state + draft
    # state), taken every prompt batch here
    def run(server):
        first = LONG + "Question: which planet is red? Answer:"
        out = [server.complete(first, cache_prompt=True)]
        out.append(server.complete(first + out[0] + " Question: which planet is hot? Answer:", cache_prompt=True))
        out.append(server.complete(LONG + "Mars has two moons. Tell me about Earth:", cache_prompt=True))
        return out

    want, got = run(ref), run(spec)
    assert got == want, f"\n  dflash2:   {got!r}\n  reference: {want!r}"
    log = spec.log_text()
    assert "created context checkpoint" in log, "no prompt checkpoint taken"
    assert "restored context checkpoint" in log, "no prompt checkpoint restored"
    assert "not restored" not in log
    assert_drafting(spec)


def test_hybrid_slot_save_and_restore_keep_answers_identical():
    ref_dir = tempfile.mkdtemp(dir=ts.ARGS.workdir)
    spec_dir = tempfile.mkdtemp(dir=ts.ARGS.workdir)

    @on_target(HYBRID, ("reference", ["-np", "1", "-c", "2048", "--slot-save-path", ref_dir]),
               ("dflash2", ["-np", "1", "-c", "2048", "--slot-save-path", spec_dir] + [DRAFT]))
    def run(ref, spec):
        want = slots_run(ref, ref_dir)
        got = slots_run(spec, spec_dir)
        assert got == want, f"\n  dflash2:   {got!r}\n  reference: {want!r}"
        assert os.path.getsize(os.path.join(spec_dir, "slot0.bin.dflash2")) > 0, "no draft state saved"
        assert "not restored" not in spec.log_text()
        assert_drafting(spec)

    run()


@on_target(HYBRID, ("reference", ["-np", "1", "-c", "2048"]), ("dflash2", ["-np", "1", "-c", "2048"] + [DRAFT]))
def test_hybrid_cancelled_request_leaves_the_server_answering_identically(ref, spec):
    conn = http.client.HTTPConnection("127.0.0.1", spec.port, timeout=60)
    body = json.dumps({"prompt": LONG + "Tell a long story:", "n_predict": 300, "stream": True, "temperature": 0,
                       "ignore_eos": True})
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    chunks = 0
    while chunks < 5:
        if resp.fp.readline().startswith(b"data:"):
            chunks += 1
    conn.close()  # cancel in the middle of generating (and drafting)
    time.sleep(1.0)
    for p in PROMPTS[:2]:
        assert spec.chat(p) == ref.chat(p), p
    assert spec.request("GET", "/health")["status"] == "ok"
    assert_drafting(spec)


@on_target(HYBRID, ("reference", ["-np", "1", "-c", "2048"]),
           ("tree", ["-np", "1", "-c", "2048", "--spec-dflash2-tree", "8"] + [DRAFT]),
           ("tree-kvu", ["-np", "2", "-kvu", "-c", "4096", "--spec-dflash2-tree", "8"] + [DRAFT]))
def test_hybrid_with_trees_asked_for_drafts_chains_and_answers_identically(ref, tree, tree_kvu):
    # a recurrent state is one per sequence: the tree's paths cannot share it (the
    # vision fixture's target is a qwen35 hybrid too: the same fallback)
    for p in PROMPTS[:2]:
        want = ref.chat(p, n_predict=24)
        assert tree.chat(p, n_predict=24) == want, p
        assert tree_kvu.chat(p, n_predict=24) == want, p
    for server, n_slots in ((tree, 1), (tree_kvu, 2)):
        log = server.log_text()
        assert log.count("recurrent or hybrid and cannot branch: the slots draft chains") == 1, log[-2000:]
        assert "tree verification: up to" not in log
        assert_drafting(server)
        total, slots = ts.tree_counters(server, n_slots)
        assert total["n_drafted"] > 0 and total["n_steps"] == 0, slots
        assert slots[0]["draft"]["verify"] == "greedy", slots[0]


@on_target(HYBRID, ("reference", ["-np", "1", "-c", "2048"]), ("default", ["-c", "4096"] + [DEFAULT_DRAFT]))
def test_hybrid_default_server_drafts_chains_with_the_controller_and_answers_identically(ref, default):
    # the server's defaults (the adaptive walk, trees of up to 63 nodes) on a
    # target that cannot branch, through llama-server's automatic 4 slots: the
    # controller sizes chains, and the reason is an info line, not a warning
    for p in PROMPTS[:2]:
        want = ref.chat(p, n_predict=24)
        assert default.chat(p, n_predict=24) == want, p
    log = default.log_text()
    assert log.count("I dflash2: trees (the adaptive walk's default budget of 63 nodes): the target's memory is "
                     "recurrent or hybrid and cannot branch: the slots draft chains") == 1, log[-2000:]
    assert "dflash2: adaptive walk, chains (default:" in log
    total = ts.assert_default_budgets(default, 4, tree_budget=0)
    assert total["n_tree"] == 0, total


# ---------------------------------------------------------------- multimodal

VISION = "vision-target.gguf"


def image_request(server, text, n_predict=ts.N_PREDICT):
    """A chat request holding the fixture PNG as an OpenAI image_url data URI; the whole response."""
    with open(os.path.join(ts.ARGS.fixtures, "vision-image.png"), "rb") as f:
        url = "data:image/png;base64," + base64.b64encode(f.read()).decode()
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "seed": 1,
            "max_tokens": n_predict}
    return server.request("POST", "/v1/chat/completions", body)


def image_chat(server, text, n_predict=ts.N_PREDICT):
    return image_request(server, text, n_predict)["choices"][0]["message"]["content"]


# image tokens of the fixture PNG (64 x 32) through the qwen3vl_merger projector
N_IMAGE_TOKENS = 8


def assert_image_reaches_the_target(server, text):
    """The request's prompt holds the image's tokens (the projector ran), not just the text."""
    with_image = image_request(server, text, 1)["usage"]["prompt_tokens"]
    body = {"messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 1}
    text_only = server.request("POST", "/v1/chat/completions", body)["usage"]["prompt_tokens"]
    assert with_image >= text_only + N_IMAGE_TOKENS, f"prompt tokens with the image {with_image}, without {text_only}"


IMAGE_PROMPTS = ["describe the image", "what is in the list", "the draft model is", "one two three"]

# image requests served by dflash2 servers, and tokens drafted after them (reported at the end)
SERVED = {"image_requests": 0, "drafted_after_images": 0}


def assert_drafts_after_images(spec, before, n_requests):
    """Drafting went on after the image requests: the counters grew."""
    after = drafted(spec)
    assert after > before, f"no tokens drafted after {n_requests} image request(s)"
    SERVED["image_requests"] += n_requests
    SERVED["drafted_after_images"] += int(after - before)


def vision_pair(*extra):
    return (("reference", ["-np", "1", "-c", "4096"] + [MMPROJ]),
            ("dflash2", ["-np", "1", "-c", "4096"] + [MMPROJ] + list(extra) + [DRAFT]))


@on_target(VISION, *vision_pair())
def test_an_image_request_is_answered_identically(ref, spec):
    before = drafted(spec)
    want, got = image_chat(ref, IMAGE_PROMPTS[0]), image_chat(spec, IMAGE_PROMPTS[0])
    assert got == want, f"\n  dflash2:   {got!r}\n  reference: {want!r}"
    assert_drafts_after_images(spec, before, 1)
    assert_image_reaches_the_target(spec, IMAGE_PROMPTS[0])
    m = spec.metrics()
    assert m.get("dflash2_injected_rows_total", 0) > 0
    # a text request after the image one
    assert spec.chat(PROMPTS[0]) == ref.chat(PROMPTS[0])


@on_target(VISION, *vision_pair("--spec-dflash2-image-rows", "skip"))
def test_an_image_request_with_image_rows_skipped_is_answered_identically(ref, spec):
    before = drafted(spec)
    for text in IMAGE_PROMPTS[:2]:
        want, got = image_chat(ref, text), image_chat(spec, text)
        assert got == want, f"{text!r}:\n  dflash2:   {got!r}\n  reference: {want!r}"
    assert_drafts_after_images(spec, before, 2)
    assert_image_reaches_the_target(spec, IMAGE_PROMPTS[0])


@on_target(VISION, *vision_pair())
def test_image_requests_in_a_row_are_answered_identically(ref, spec):
    before = drafted(spec)
    for text in IMAGE_PROMPTS:
        want, got = image_chat(ref, text), image_chat(spec, text)
        assert got == want, f"{text!r}:\n  dflash2:   {got!r}\n  reference: {want!r}"
    assert_drafts_after_images(spec, before, len(IMAGE_PROMPTS))


@on_target(VISION, ("reference", ["-np", "1", "-c", "4096"] + [MMPROJ]),
           ("dflash2", ["-np", "2", "-c", "8192"] + [MMPROJ] + [DRAFT]))
def test_concurrent_image_requests_on_two_slots_are_answered_identically(ref, spec):
    want = [image_chat(ref, t) for t in IMAGE_PROMPTS]
    before = drafted(spec)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda t: image_chat(spec, t), IMAGE_PROMPTS))
    for t, g, w in zip(IMAGE_PROMPTS, got, want):
        assert g == w, f"{t!r}:\n  dflash2 -np 2: {g!r}\n  reference:     {w!r}"
    assert_drafts_after_images(spec, before, len(IMAGE_PROMPTS))
    assert all(s["draft"]["n_drafted"] > 0 for s in spec.request("GET", "/slots")), "a slot drafted nothing"


TESTS = [
    test_hybrid_answers_equal_the_no_drafter_server,
    test_hybrid_four_parallel_slots_answer_like_single_requests,
    test_hybrid_prompt_cache_keeps_answers_identical,
    test_hybrid_prompt_checkpoints_restore_identically,
    test_hybrid_slot_save_and_restore_keep_answers_identical,
    test_hybrid_cancelled_request_leaves_the_server_answering_identically,
    test_hybrid_with_trees_asked_for_drafts_chains_and_answers_identically,
    test_hybrid_default_server_drafts_chains_with_the_controller_and_answers_identically,
    test_an_image_request_is_answered_identically,
    test_an_image_request_with_image_rows_skipped_is_answered_identically,
    test_image_requests_in_a_row_are_answered_identically,
    test_concurrent_image_requests_on_two_slots_are_answered_identically,
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--only")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="dflash2-hybrid-")
    os.makedirs(args.workdir, exist_ok=True)
    args.draft = os.path.join(args.fixtures, "qwen35-drafter.gguf")
    args.target = None  # set per test
    ts.ARGS = args
    selected, failed = ts.run_tests(TESTS, args.only)
    print(f"image requests served by dflash2: {SERVED['image_requests']}, "
          f"tokens drafted after them: {SERVED['drafted_after_images']}")
    print(f"{selected - failed} passed, {failed} failed (logs in {args.workdir})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
