#!/usr/bin/env python3
"""llama-server with dflash2 under load and faults (issue 11 item 5; loopback only).

16 concurrent clients on -np 4 for --seconds, mixing streaming and non-streaming
greedy requests, clients disconnecting mid-stream, malformed JSON, prompts larger
than the context and generations running into the context's end. Afterwards the
T = 0 answers must still equal the no-drafter server's, the log must hold no
dflash2 error, assert or crash, and the RSS at the end must be within 10% of the
RSS after the first fifth of the load (warm-up: slots and arenas grown) plus the
prompt cache's budget (--cache-ram 16, filling as the load goes on).
Then the faults: a corrupt FILE.dflash2 beside a /slots save is refused (the
draft state starts over) and the server keeps answering identically; a drafter
file truncated on disk after start-up leaves the running server answering.

    load_faults.py --server BIN --target GGUF --draft GGUF [--seconds 300] [--workdir DIR]

Reuses test_server.py's Server and helpers (its ARGS is set from ours).
"""

import argparse
import http.client
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402

N_CLIENTS = 16
# the prompt cache may legitimately fill up to this much after the warm-up
CACHE_MIB = 16
# what the faults legitimately make the server log
EXPECTED_NOISE = (r"exceeds the available context size|failed to parse|parse error|invalid JSON|"
                  r"\[json\.exception|json parse|draft state of sequence \d+ not restored")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {k: 0 for k in ("served", "streamed", "disconnects", "malformed", "oversized", "beyond_ctx",
                                 "failed")}
        self.failures = []

    def add(self, key, why=None):
        with self.lock:
            self.c[key] += 1
            if why is not None and len(self.failures) < 20:
                self.failures.append(why)


def post(port, path, raw, timeout=300):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, raw, {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def one_request(port, rng, counts):
    kind = rng.choices(["complete", "stream", "disconnect", "malformed", "oversized", "beyond_ctx"],
                       weights=[30, 30, 15, 10, 7, 8])[0]
    prompt = rng.choice(ts.PROMPTS) + " " + " ".join(rng.choice(["alpha", "beta", "gamma", "delta"])
                                                     for _ in range(rng.randint(0, 30)))
    body = {"prompt": prompt, "temperature": 0, "n_predict": rng.randint(8, 48), "cache_prompt": rng.random() < 0.5}
    try:
        if kind == "complete":
            conn, r = post(port, "/completion", json.dumps(body))
            data = json.loads(r.read())
            conn.close()
            if r.status == 200 and isinstance(data.get("content"), str):
                counts.add("served")
            else:
                counts.add("failed", f"complete: {r.status} {str(data)[:200]}")
        elif kind in ("stream", "disconnect"):
            body["stream"] = True
            conn, r = post(port, "/completion", json.dumps(body))
            if r.status != 200:
                counts.add("failed", f"stream: {r.status} {r.read()[:200]!r}")
                conn.close()
                return
            stop_after = rng.randint(1, 6) if kind == "disconnect" else None
            chunks, done = 0, False
            while True:
                line = r.fp.readline()
                if not line:
                    break
                if line.startswith(b"data:"):
                    chunks += 1
                    if b'"stop":true' in line or b'"stop": true' in line:
                        done = True
                    if stop_after is not None and chunks >= stop_after:
                        break
            conn.close()
            if stop_after is not None:
                counts.add("disconnects")
            elif done:
                counts.add("streamed")
            else:
                counts.add("failed", f"stream ended after {chunks} chunks without stop")
        elif kind == "malformed":
            raw = rng.choice(['{"prompt": "hi", "n_predict": ', "not json at all", '{"prompt": [1, 2, {"x": }]}',
                              '{"prompt": "a", "n_predict": "many"}', "\x00\x01\x02"])
            conn, r = post(port, "/completion", raw, timeout=60)
            r.read()
            conn.close()
            if 400 <= r.status < 500 or r.status == 500:
                counts.add("malformed")
            else:
                counts.add("failed", f"malformed JSON answered {r.status}")
        elif kind == "oversized":
            body["prompt"] = "word " * rng.randint(3000, 20000)
            conn, r = post(port, "/completion", json.dumps(body), timeout=120)
            data = r.read()
            conn.close()
            if r.status >= 400:
                counts.add("oversized")
            else:
                counts.add("failed", f"an oversized prompt answered {r.status}: {data[:200]!r}")
        else:
            # a prompt near the slot's context and a generation running into its end
            body["prompt"] = ts.LONG * 3 + prompt
            body["n_predict"] = 400
            conn, r = post(port, "/completion", json.dumps(body))
            data = r.read()
            conn.close()
            if r.status == 200 or r.status >= 400:
                counts.add("beyond_ctx")
            else:
                counts.add("failed", f"beyond the context: {r.status} {data[:200]!r}")
    except (OSError, http.client.HTTPException, ValueError) as e:
        counts.add("failed", f"{kind}: {type(e).__name__}: {e}")


def load(server, seconds, seed):
    counts = Counts()
    stop = time.time() + seconds
    warm_at = time.time() + seconds / 5
    rss = {}

    def client(i):
        rng = random.Random(seed * 1000 + i)
        while time.time() < stop:
            one_request(server.port, rng, counts)

    def watch():
        while time.time() < warm_at:
            time.sleep(0.5)
        rss["warm"] = rss_kib(server.proc.pid)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(N_CLIENTS)] + [threading.Thread(target=watch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts, rss["warm"]


def answers(server):
    return [server.complete(p) for p in ts.PROMPTS] + [server.chat(p) for p in ts.PROMPTS[:2]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--seconds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="dflash2-load-")
    os.makedirs(args.workdir, exist_ok=True)
    ts.ARGS = argparse.Namespace(server=args.server, target=args.target, draft=args.draft, fixtures=None,
                                 workdir=args.workdir)
    slot_dir = tempfile.mkdtemp(dir=args.workdir)
    # the drafter the second part truncates is a copy
    drafter = os.path.join(args.workdir, "drafter-copy.gguf")
    shutil.copyfile(args.draft, drafter)
    ts.ARGS.draft = drafter
    common = ["-np", "4", "-c", "2048", "--cache-ram", str(CACHE_MIB)]
    ref = ts.Server("reference", common).wait_ready()
    spec = ts.Server("dflash2", common + ["--slot-save-path", slot_dir, ts.DRAFT]).wait_ready()
    failed = []
    try:
        want = answers(ref)
        got = answers(spec)
        assert got == want, f"before the load:\n  dflash2:   {got!r}\n  reference: {want!r}"
        rss_before = rss_kib(spec.proc.pid)
        start = time.time()
        counts, rss_warm = load(spec, args.seconds, args.seed)
        took = time.time() - start
        time.sleep(1.0)
        rss_after = rss_kib(spec.proc.pid)
        got = answers(spec)
        identical = got == want
        c = counts.c
        print(f"load: {took:.0f}s, {N_CLIENTS} clients on -np 4: served {c['served']} + streamed {c['streamed']}, "
              f"disconnects {c['disconnects']}, malformed refused {c['malformed']}, oversized refused "
              f"{c['oversized']}, beyond the context {c['beyond_ctx']}, failed {c['failed']}; "
              f"T=0 answers identical after: {identical}; RSS before {rss_before} KiB, after warm-up {rss_warm} KiB, "
              f"at the end {rss_after} KiB ({(rss_after / rss_warm - 1) * 100:+.1f}%)", flush=True)
        if c["failed"]:
            failed.append("failed requests:\n  " + "\n  ".join(counts.failures))
        if not identical:
            failed.append(f"answers changed after the load:\n  dflash2:   {got!r}\n  reference: {want!r}")
        if rss_after > rss_warm * 1.10 + CACHE_MIB * 1024:
            failed.append(f"RSS grew from {rss_warm} KiB to {rss_after} KiB (more than 10% + the prompt cache)")
        if min(c["served"], c["streamed"], c["disconnects"], c["malformed"]) == 0:
            failed.append(f"some request kinds never ran: {c}")

        # a corrupt FILE.dflash2: the draft state is refused, the slot still restores
        a = ts.LONG + "Question: how many moons does Earth have? Answer:"
        first_ref = ref.complete(a, id_slot=0, cache_prompt=True)
        first = spec.complete(a, id_slot=0, cache_prompt=True)
        spec.request("POST", "/slots/0?action=save", {"filename": "slot0.bin"})
        blob = os.path.join(slot_dir, "slot0.bin.dflash2")
        data = bytearray(open(blob, "rb").read())
        for i in range(16, len(data), 97):
            data[i] ^= 0x5A
        open(blob, "wb").write(bytes(data[: len(data) * 2 // 3]))
        spec.complete("Name a fruit that is yellow:", id_slot=0, cache_prompt=True)
        spec.request("POST", "/slots/0?action=restore", {"filename": "slot0.bin"})
        cont = a + first + " Question: which planet is the hottest? Answer:"
        after_corrupt = spec.complete(cont, id_slot=0, cache_prompt=True)
        want_cont = ref.complete(a + first_ref + " Question: which planet is the hottest? Answer:")
        ok_corrupt = first == first_ref and after_corrupt == want_cont and "not restored" in spec.log_text()
        print(f"corrupt slot file: draft state refused ({'not restored' in spec.log_text()}), answers identical "
              f"({first == first_ref and after_corrupt == want_cont})", flush=True)
        if not ok_corrupt:
            failed.append("a corrupt FILE.dflash2 was not refused cleanly")

        # the drafter truncated on disk while the server runs
        with open(drafter, "r+b") as f:
            f.truncate(os.path.getsize(drafter) // 3)
        got = answers(spec)
        print(f"drafter truncated on disk: answers identical {got == want}, server alive {spec.proc.poll() is None}",
              flush=True)
        if got != want:
            failed.append("answers changed after the drafter was truncated on disk")
    except Exception as e:  # noqa: BLE001 — reported below with the logs
        failed.append(f"{type(e).__name__}: {e}")
    finally:
        codes = [(s, s.stop()) for s in (ref, spec)]
    for s, code in codes:
        if code != 0:
            failed.append(f"{s.name} exited with {code}:\n{s.log_tail()}")
        bad = [line for line in s.log_text().splitlines()
               if not re.search(EXPECTED_NOISE, line)
               and re.search(r"\berror\b|\bfailed\b|assert|abort|segfault|"
                             r"dflash2 (process|draft|accept|seq_rm|seq_cp|seq_shift):", line, re.I)]
        if bad:
            failed.append(f"{s.name} log has errors:\n  " + "\n  ".join(bad[:10]))
    if failed:
        print("FAIL load_faults:\n" + "\n".join(failed) + f"\n(logs in {args.workdir})")
        sys.exit(1)
    print(f"PASS load_faults (logs in {args.workdir})")


if __name__ == "__main__":
    main()
