#!/usr/bin/env python3
"""Server-side numbers: llama-server without a drafter (ar), with dflash2's greedy
chains (dflash2: --spec-dflash2-walk greedy, upstream's drafts), with the server's
default (adaptive: the controller, trees where the cache can branch) and with
llama.cpp's own draft-dflash (upstream: --spec-dflash2-upstream), at each -np, on the same
prompts. Sends every prompt concurrently (np at a time), reports aggregate
tokens/s, acceptance from /metrics, and whether every answer equals the
no-drafter server's.

With --temp T > 0 the requests sample (seed --seed): upstream drafts greedily
and matches the target's samples, dflash2 drafts by sampling and verifies by
rejection sampling; answers then differ by design, and the report compares tau
and the acceptance by draft position (accepted at position i per verify step,
from /slots) of dflash2 and upstream in the same run.

    scripts/server-bench.py --server BIN --target GGUF --draft GGUF [--np 1,4] [--n-predict 128]
                            [--temp 0.8] [--seed 1] [--modes ar,upstream,dflash2,adaptive]
"""

import argparse
import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What is 48 multiplied by 12? Show the steps.",
    "Write a short paragraph about the history of the bicycle.",
    "List five fruits that are rich in vitamin C.",
    "Return a JSON object describing a book with title, author and year.",
    "Explain what a hash table is in two sentences.",
    "Write a C function that returns the maximum of an integer array.",
    "Give three tips for writing clear emails.",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^llamacpp:(\S+) (\S+)$", text, re.M)}


def run(args, mode, np_):
    port = free_port()
    cmd = [args.server, "--host", "127.0.0.1", "--port", str(port), "-m", args.target, "--no-repack", "-t",
           str(args.threads), "--no-webui", "--metrics", "-np", str(np_), "-c", str(2048 * np_)]
    if mode != "ar":
        cmd += ["-md", args.draft, "--spec-type", "draft-dflash", "--spec-draft-n-max", str(args.n_max)]
    if mode == "upstream":
        cmd += ["--spec-dflash2-upstream"]
    elif mode == "dflash2":
        cmd += ["--spec-dflash2-walk", "greedy"]
    log = open(os.devnull, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except Exception:
                time.sleep(0.2)
        body = lambda p: {"messages": [{"role": "user", "content": p}], "temperature": args.temp, "seed": args.seed,
                          "max_tokens": args.n_predict}
        start = time.time()
        with concurrent.futures.ThreadPoolExecutor(np_) as pool:
            answers = list(pool.map(lambda p: post(port, "/v1/chat/completions", body(p)), PROMPTS))
        wall = time.time() - start
        m = metrics(port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/slots", timeout=30) as r:
            slots = json.loads(r.read())
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    texts = [a["choices"][0]["message"]["content"] for a in answers]
    steps, accepted_at = 0, []
    for s in slots:
        d = s.get("draft") or {}
        steps += d.get("n_verify_steps", 0)
        for i, n in enumerate(d.get("accepted_at", [])):
            accepted_at += [0] * (i + 1 - len(accepted_at))
            accepted_at[i] += n
    return {"mode": mode, "np": np_, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "texts": texts,
            "drafted": m.get("spec_decode_num_draft_tokens_total", 0),
            "accepted": m.get("spec_decode_num_accepted_tokens_total", 0),
            "verify_steps": m.get("spec_decode_num_drafts_total", 0),
            "by_position": [n / steps for n in accepted_at] if steps else []}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--np", default="1,4")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--n-max", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="ar,upstream,dflash2,adaptive")
    args = ap.parse_args()
    modes = args.modes.split(",")
    print(f"{'np':>3} {'mode':9} {'tok/s':>8} {'tokens':>7} {'accepted/drafted':>17} {'tau':>5} identical")
    for np_ in [int(x) for x in args.np.split(",")]:
        rows = {mode: run(args, mode, np_) for mode in modes}
        for mode, r in rows.items():
            r["tau"] = (r["accepted"] + r["verify_steps"]) / r["verify_steps"] if r["verify_steps"] else 1.0
            same = "-"
            if "ar" in rows and (args.temp == 0 or mode in ("ar", "upstream")):
                same = f"{sum(a == b for a, b in zip(r['texts'], rows['ar']['texts']))}/{len(PROMPTS)}"
            acc = f"{int(r['accepted'])}/{int(r['drafted'])}" if mode != "ar" else "-"
            print(f"{np_:>3} {mode:9} {r['tok_s']:8.1f} {r['tokens']:7d} {acc:>17} {r['tau']:5.2f} {same}")
            if r["by_position"]:
                print("      acceptance by draft position: " +
                      " ".join(f"{i + 1}:{100 * x:.0f}%" for i, x in enumerate(r["by_position"])))
        ratio = lambda a, b, k: rows[a][k] / rows[b][k] if a in rows and b in rows and rows[b][k] else float("nan")
        print(f"    np={np_}: tau dflash2/upstream {ratio('dflash2', 'upstream', 'tau'):.3f}, tok/s dflash2/upstream "
              f"{ratio('dflash2', 'upstream', 'tok_s'):.3f}, dflash2/ar {ratio('dflash2', 'ar', 'tok_s'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
