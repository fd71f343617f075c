#!/usr/bin/env python3
"""dflash2 on real device backends: placements of the target and the drafter over
llama.cpp RPC servers on loopback (remote devices) and, with --vulkan-tools, the
Vulkan device of a Vulkan build (Mesa's llvmpipe), each through the C API (the
dflash2-bench host) and through llama-server, compared with target-only on the
same placement; then the faults. Prints one table and writes it as JSON.

    devices.py --tools DIR --server BIN --rpc-server BIN --target GGUF --draft GGUF
               --fixtures DIR --workdir DIR [--vulkan-tools DIR --vulkan-server BIN] [--quick]

A check that fails is a FAIL line and exit code 1; the table says what each
placement measured: identical n/n (T = 0), tau against the CPU-only run's,
tokens/s against target-only on the same placement, and error lines in the logs.
"""

import argparse
import base64
import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
import test_server as ts  # noqa: E402  (its Server: start, wait, request, stop, logs)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS_FILE = os.path.join(ROOT, "tools", "prompts", "devices.txt")
ERRORS = re.compile(r"\berror\b|\bfailed\b|assert|abort|fatal", re.I)
# llama.cpp's own draft-dflash path logs these while fitting memory (see test_server.py)
# llama.cpp's own warnings: its draft context's memory fit (upstream), and its memory
# fit, which -sm tensor does not implement (every server on that placement says so)
UPSTREAM_FIT_NOISE = re.compile(ts.Server.UPSTREAM_FIT_NOISE + r"|llama_params_fit is not implemented for SPLIT_MODE_TENSOR")

ROWS = []      # the table
FAILURES = []  # (check, message)


def log_errors(text, allowed=None):
    return [l for l in text.splitlines() if ERRORS.search(l) and not (allowed and allowed.search(l))]


def check(name, ok, message=""):
    if not ok:
        FAILURES.append((name, message))
        print(f"FAIL {name}: {message}", flush=True)
    return ok


def row(**kw):
    ROWS.append(kw)
    print("  " + json.dumps(kw), flush=True)


class RpcServer:
    """A ggml-rpc-server on 127.0.0.1 serving its CPU (one thread): a remote device.
    The CPU is named: the Vulkan build's server would serve llvmpipe, and dies of
    heap corruption ("corrupted double-linked list") on its first graph."""

    def __init__(self, name):
        self.port = ts.free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log_path = os.path.join(ARGS.workdir, f"rpc-{name}-{self.port}.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([ARGS.rpc_server, "-H", "127.0.0.1", "-p", str(self.port), "-t", "1", "-d", "CPU"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise AssertionError(f"ggml-rpc-server on {self.endpoint} did not start")
                time.sleep(0.1)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Rpc:
    """`n` RPC servers for one placement; their devices are RPC0 .. RPC{n-1}."""

    def __init__(self, n):
        self.servers = [RpcServer(f"{i}") for i in range(n)]

    def flag(self):
        return ["--rpc", ",".join(s.endpoint for s in self.servers)] if self.servers else []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for s in self.servers:
            s.kill()


class Placement:
    """Where the target and the drafter go, in llama.cpp's terms.

    target: --device list ("none": the CPU), ngl: target layers offloaded (None: all),
    draft: the drafter's --draft-device list (None: dflash2's default, with the head)."""

    def __init__(self, name, backend, n_rpc, target, ngl=None, draft=None, note="", sm=None):
        self.name, self.backend, self.n_rpc = name, backend, n_rpc
        self.target, self.ngl, self.draft, self.note, self.sm = target, ngl, draft, note, sm

    def env(self, role="bench"):
        env = dict(os.environ)
        if self.backend == "vulkan":
            env["GGML_VK_VISIBLE_DEVICES"] = "0"  # llvmpipe is a CPU-type device, skipped unless named
            # each process role its own shader cache (two processes writing one at once is where
            # Mesa 22.3 corrupted its heap), seeded from the benches' (compiling ggml-vulkan's
            # pipelines for llvmpipe takes minutes); outside the logs folder, so that clearing the
            # logs keeps them and only a machine's first run pays for the compiles
            caches = os.path.join(os.path.dirname(os.path.abspath(ARGS.workdir)), "mesa-cache")
            cache, seed = os.path.join(caches, role), os.path.join(caches, "bench")
            os.makedirs(caches, exist_ok=True)  # Mesa makes the cache's own folder, not its parents
            if not os.path.isdir(cache) and os.path.isdir(seed):
                shutil.copytree(seed, cache)
            env["MESA_SHADER_CACHE_DIR"] = cache
        return env

    def bench_flags(self):
        f = []
        if self.target:
            f += ["--device", self.target]
        f += ["-ngl", str(self.ngl if self.ngl is not None else 99)]
        if self.draft is not None:
            f += ["--draft-device", self.draft]
        if self.sm:
            f += ["-sm", self.sm]
        return f

    def server_flags(self, with_drafter):
        f = ["-ngl", str(self.ngl if self.ngl is not None else 99)]
        if self.target:
            f += ["-dev", self.target]
        if with_drafter and self.draft is not None:
            f += ["-devd", self.draft]
        if self.sm:
            f += ["-sm", self.sm]
        return f

    def tools(self):
        return ARGS.vulkan_tools if self.backend == "vulkan" else ARGS.tools

    def server(self):
        return ARGS.vulkan_server if self.backend == "vulkan" else ARGS.server


# --------------------------------------------------------------- library (C API)

def run_bench(placement, rpc, extra, name, prompts=PROMPTS_FILE, pair=None):
    """dflash2-bench on this placement (of `pair`, (target, drafter), else the run's);
    returns (exit code, results by (np, mode), stderr)."""
    target, draft = pair or (ARGS.target, ARGS.draft)
    out_json = os.path.join(ARGS.workdir, f"bench-{name}.json")
    cmd = [os.path.join(placement.tools(), "dflash2-bench"), "--target", target, "--draft", draft,
           "--prompts", prompts, "--threads", "2", "--reps", "1", "--json", out_json,
           "--svg", os.path.join(ARGS.workdir, f"bench-{name}.svg")] + rpc.flag() + placement.bench_flags() + extra
    log_path = os.path.join(ARGS.workdir, f"bench-{name}.log")
    with open(log_path, "wb") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=placement.env(), timeout=3600)
    text = open(log_path, errors="replace").read()
    results = {}
    if code == 0:
        for r in json.load(open(out_json))["results"]:
            results[(r["np"], r["mode"])] = r
    return code, results, text


def identical(r):
    same = r["identical_to_ar"]
    return f"{sum(same)}/{len(same)}" if same else "-"


CPU_TAU = {}  # (np, mode, temp) -> tau of the CPU-only run
LAYER_TAU = {}  # the same, of the target split by layer over two RPC nodes (rpc2)


def library_rows(placement, rpc, nps, modes, n_predict, temp=0.0, n_prompts=4, pair=None):
    # -ub 512 on every placement: the tools default to 63 on a CPU-only target (T = 0
    # identity), which would round the CPU rows' prompts unlike the RPC rows' and
    # part their sampled draws, whose tau is compared
    extra = ["--np", ",".join(map(str, nps)), "--modes", ",".join(["ar"] + modes), "--n-predict", str(n_predict),
             "--tree", "7", "-ub", "512"]
    if temp > 0:
        extra += ["--temp", str(temp), "--seed", "7"]
    prompts = trimmed_prompts(n_prompts) if n_prompts < 4 else PROMPTS_FILE
    name = f"{placement.name}-T{temp}-{n_prompts}x{n_predict}{'-fixture' if pair else ''}".replace("/", "_")
    name = name.replace(" ", "_")
    code, res, text = run_bench(placement, rpc, extra, name, prompts, pair)
    errors = log_errors(text)
    if not check(f"library {placement.name} T={temp}", code == 0, f"dflash2-bench exited {code}:\n{text[-1500:]}"):
        row(placement=placement.name, face="library", np="-", mode=",".join(modes), temp=temp, identical="-",
            tau="-", tok_s="-", errors=len(errors), note=f"exit {code}: {last_error_line(text)}")
        return
    for np_ in nps:
        ar = res[(np_, "ar")]
        for mode in modes:
            r = res[(np_, mode)]
            key = (np_, mode, temp, n_prompts, n_predict)
            if pair is None and placement.name == "cpu":
                CPU_TAU[key] = r["tau"]
            if placement.name == "rpc2":
                LAYER_TAU[(key, pair)] = r["tau"]
            # a target split by tensor sums its products in another order than on one device:
            # its tau is set against the same nodes split by layer, not the CPU's
            cpu_tau = CPU_TAU.get(key) if pair is None and not placement.sm else None
            same = identical(r)
            note = None
            if temp == 0 and same.split("/")[0] != same.split("/")[1]:
                # a target that is not batch-invariant on this placement (its argmax for a row
                # decoded with the verify batch differs from that row decoded alone) makes every
                # speculative decoder differ from one-token-at-a-time decoding: llama.cpp's own
                # draft-dflash differs on the same prompts then
                up = res.get((np_, "upstream"))
                shared = up is not None and up["identical_to_ar"] == r["identical_to_ar"]
                if mode != "upstream":
                    check(f"library {placement.name} np {np_} {mode} identical", shared,
                          f"{same}; upstream: {identical(up) if up else 'not run'}")
                note = "differs where upstream differs (the target is not batch-invariant here)" if shared else None
            if mode.startswith("dflash2") and ARGS.trained and pair is None:
                check(f"library {placement.name} np {np_} {mode} drafts accepted", r["accepted"] > 0, str(r["accepted"]))
            if cpu_tau is not None:
                # RPC nodes compute with the CPU's kernels: the same drafts, tau within 1%. Vulkan's
                # arithmetic differs, which flips near-ties of the draft lattice (on these short runs
                # two equally good drafters differ by ~6% on the CPU itself): no collapse, 10%
                bound = 0.01 if placement.backend != "vulkan" else 0.10
                check(f"library {placement.name} np {np_} {mode} tau vs CPU", r["tau"] >= cpu_tau * (1 - bound)
                      and (bound > 0.01 or r["tau"] <= cpu_tau * 1.01), f"{r['tau']:.3f} vs {cpu_tau:.3f}")
            head = r.get("head") or {}
            if placement.sm == "tensor" and mode.startswith("dflash2"):
                layer_tau = LAYER_TAU.get((key, pair))
                moved = head.get("bytes_moved", 0) / max(head.get("noise_decodes", 0), 1)
                gather = head.get("bytes_full_gather", 0) / max(head.get("noise_decodes", 0), 1)
                slices = head.get("slices", 0)
                parts = [f"tau -sm layer {layer_tau:.3f}" if layer_tau else "",
                         f"head in {slices} vocabulary slices" if slices > 1 else
                         "head whole on each node (tied embeddings)" if slices == 1 else "",
                         f"{moved:.0f} B/decode moved vs {gather:.0f} full-logit gather" if head.get('slices', 1) > 1
                         else "",
                         # the Q4_1 target's tap features differ under -sm tensor (its own arithmetic)
                         "tau gap vs -sm layer: docs/tensor-parallel.md" if pair is None and layer_tau else ""]
                note = "; ".join(x for x in [note or ""] + parts if x)
                if pair is not None and layer_tau is not None:
                    # the fixture's tiny matmuls take one kernel split or not: the same drafts as -sm layer
                    check(f"library {placement.name} np {np_} {mode} tau = -sm layer's", r["tau"] == layer_tau,
                          f"{r['tau']} vs {layer_tau}")
                if pair is not None:
                    # the fixture target's own output.weight: split by vocabulary rows
                    want = len(placement.target.split(","))
                    check(f"library {placement.name} np {np_} {mode} head slices", head.get("slices") == want
                          and 0 < head["bytes_moved"] < head["bytes_full_gather"], str(head))
            row(placement=placement.name + (" (fixture pair)" if pair else ""), face="library", np=np_, mode=mode,
                temp=temp, identical=same,
                tau=round(r["tau"], 3), cpu_tau=round(cpu_tau, 3) if cpu_tau else None,
                tok_s=round(r["tokens_per_s"]["median"], 2), ar_tok_s=round(ar["tokens_per_s"]["median"], 2),
                accepted=f"{r['accepted']}/{r['drafted']}", errors=len(errors), note=note)
        own, lib = res.get((np_, "dflash2")), res.get((np_, "dflash2-libllama"))
        if own and lib:
            # the two draft graphs on one placement: on the CPU's kernels (CPU, RPC nodes) at
            # np 1 the same drafts; at np > 1 the own graph injects every sequence's rows in one
            # batch where libllama splits them (another matmul kernel for single rows), and on
            # another backend's arithmetic: near-ties may flip (1%, 10% on Vulkan)
            if placement.backend != "vulkan" and np_ == 1:
                check(f"library {placement.name} np {np_} own graph = libllama's",
                      (own["accepted"], own["drafted"]) == (lib["accepted"], lib["drafted"]),
                      f"own {own['accepted']}/{own['drafted']}, libllama {lib['accepted']}/{lib['drafted']}")
            else:
                bound = 0.10 if placement.backend == "vulkan" else 0.01
                check(f"library {placement.name} np {np_} own graph tau vs libllama's",
                      abs(own["tau"] - lib["tau"]) <= bound * lib["tau"], f"{own['tau']:.3f} vs {lib['tau']:.3f}")
    check(f"library {placement.name} T={temp} log", not errors, "\n".join(errors[:5]))


def trimmed_prompts(n):
    path = os.path.join(ARGS.workdir, f"prompts-{n}.txt")
    with open(PROMPTS_FILE) as f, open(path, "w") as out:
        out.write("".join(f.readlines()[:n]))
    return path


def last_error_line(text):
    errs = log_errors(text)
    return errs[-1].strip()[:200] if errs else text.strip().splitlines()[-1][:200] if text.strip() else ""


# --------------------------------------------------------------------- server

# the placements' server rows draft greedy chains (greedy trees with --spec-dflash2-tree),
# not the server's default controller: every step drafts, which their "drafts" checks need
GREEDY = ["--spec-dflash2-walk", "greedy"]


def server_args(placement, rpc, extra, with_drafter):
    args = rpc.flag() + placement.server_flags(with_drafter) + extra
    if with_drafter:
        args += ["-md", ARGS.draft, "--spec-type", "draft-dflash"] + GREEDY
    return args


def start(name, args, placement, target=None, env=None):
    """ts.Server (a llama-server on loopback) of the placement's build, with its environment
    (and `env`'s variables)."""
    old_env, old_args = dict(os.environ), (ts.ARGS.server, ts.ARGS.target)
    os.environ.clear()
    os.environ.update(placement.env(role=name))
    os.environ.update(env or {})
    ts.ARGS.server = placement.server()
    ts.ARGS.target = target or ARGS.target
    try:
        return ts.Server(name, args)
    finally:
        os.environ.clear()
        os.environ.update(old_env)
        ts.ARGS.server, ts.ARGS.target = old_args


def stop_all(servers):
    codes = {}
    for s in servers:
        try:
            codes[s.name] = s.stop()
        except AssertionError as e:
            codes[s.name] = str(e)[:300]
    return codes


def chat(server, prompt, n, **extra):
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "seed": 1, "max_tokens": n,
            "cache_prompt": False, **extra}
    res = server.request("POST", "/v1/chat/completions", body, timeout=1800)
    return res["choices"][0]["message"]["content"], res.get("timings", {}).get("predicted_per_second", 0.0)


def slots_tau(server, n_slots):
    slots = server.request("GET", "/slots")[:n_slots]
    acc = sum(s["draft"]["n_accepted"] for s in slots)
    steps = sum(s["draft"]["n_verify_steps"] for s in slots)
    drafted = sum(s["draft"]["n_drafted"] for s in slots)
    return ((acc + steps) / steps if steps else 0.0), acc, drafted


def server_rows(placement, rpc, n_prompts, n_predict, np_=1, tree=0, sampled=False):
    prompts = [l.strip() for l in open(PROMPTS_FILE) if l.strip()][:n_prompts]
    common = ["-c", str(2048 * np_), "-np", str(np_)] + (["-kvu"] if tree else [])
    spec_extra = common + (["--spec-dflash2-tree", str(tree)] if tree else [])
    # sampled drafts that adapt to what the engine measured draw differently in a second
    # request: the seed check below needs them fixed
    spec_extra += ["--spec-dflash2-adapt-sampled", "off"] if sampled else []
    mode = f"dflash2-tree {tree}" if tree else "dflash2"
    tag = f"{placement.name} np {np_} {mode}"
    # an rpc-server serves one client at a time (a second one waits for the first to
    # leave): the reference server gets RPC servers of its own
    ref_rpc = Rpc(placement.n_rpc)
    ref = start("reference", server_args(placement, ref_rpc, common, False), placement)
    spec = start("dflash2", server_args(placement, rpc, spec_extra, True), placement)
    servers = [ref, spec]
    same = n_same = 0
    tok_s, ar_tok_s = [], []
    note = ""
    try:
        for s in servers:
            s.wait_ready(timeout=900)
        for p in prompts:
            want, r = chat(ref, p, n_predict)
            ar_tok_s.append(r)
            got, g = chat(spec, p, n_predict)
            tok_s.append(g)
            n_same += 1
            same += got == want
            check(f"server {tag} identical", got == want, f"{p!r}:\n  dflash2:   {got!r}\n  reference: {want!r}")
        if np_ > 1 and not tree:
            # the slots at once (split KV cache: each answers as alone)
            with concurrent.futures.ThreadPoolExecutor(np_) as pool:
                got = list(pool.map(lambda p: chat(spec, p, n_predict)[0], prompts[:np_]))
            want = [chat(ref, p, n_predict)[0] for p in prompts[:np_]]
            for g, w in zip(got, want):
                n_same += 1
                same += g == w
                check(f"server {tag} concurrent identical", g == w, f"{g!r} vs {w!r}")
        tau, acc, drafted = slots_tau(spec, np_)
        check(f"server {tag} drafts", drafted > 0, "nothing drafted")
        if ARGS.trained:
            check(f"server {tag} drafts accepted", acc > 0, "no draft accepted")
        if sampled:
            # a sampled request: verified losslessly (rejection sampling), reproducible with its seed
            a = chat(spec, prompts[0], 16, temperature=0.8, seed=42)[0]
            b = chat(spec, prompts[0], 16, temperature=0.8, seed=42)[0]
            verify = sorted({s["draft"]["verify"] for s in spec.request("GET", "/slots")})
            check(f"server {tag} T=0.8", a == b and any("rejection-sampling" in v for v in verify),
                  f"{verify}: {a!r} / {b!r}")
            note = f"T=0.8 request: verify {verify}, seed-reproducible {a == b}"
        log = spec.log_text()
        placed = re.findall(r"dflash2: drafter on (.*)", log)
        reserved = re.findall(r"reserving ([\d.]+ MiB) per device for the dflash2 drafter", log)
        note = "; ".join(x for x in [f"drafter on {placed[0].strip()}" if placed else "",
                                     f"{reserved[0]} reserved per device" if reserved else "", note] if x)
    finally:
        codes = stop_all(servers)
        ref_rpc.__exit__()
    errors = sum(len(log_errors(s.log_text(), UPSTREAM_FIT_NOISE)) for s in servers)
    for s in servers:
        check(f"server {tag} {s.name} exit", codes[s.name] == 0, f"{codes[s.name]}\n{s.log_tail()}")
    check(f"server {tag} logs", errors == 0, "\n".join(sum((log_errors(s.log_text()) for s in servers), [])[:5]))
    row(placement=placement.name, face="server", np=np_, mode=mode, temp=0.0, identical=f"{same}/{n_same}",
        tau=round(tau, 3), tok_s=round(sum(tok_s) / len(tok_s), 2) if tok_s else 0,
        ar_tok_s=round(sum(ar_tok_s) / len(ar_tok_s), 2) if ar_tok_s else 0, accepted=f"{acc}/{drafted}",
        errors=errors, note=note)


# --------------------------------------------------------------------- faults

def wait_exit(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "hung"


def fault_rpc_killed_under_the_server(p=None):
    p = p or Placement("rpc2", "rpc", 2, "RPC0,RPC1")
    with Rpc(2) as rpc:
        s = start("killed", server_args(p, rpc, ["-np", "1", "-c", "2048"], True), p)
        s.wait_ready(timeout=300)
        result = {}

        def long_request():
            try:
                s.request("POST", "/completion", {"prompt": "Count from one to two hundred:", "n_predict": 600,
                                                  "temperature": 0, "ignore_eos": True}, timeout=120)
                result["client"] = "answered"
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                result["client"] = f"error: {type(e).__name__}"

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(long_request)
            time.sleep(3)
            started = time.time()
            rpc.servers[1].kill()
            code = wait_exit(s.proc, 60)
            fut.result(timeout=120)
        s.log.close()
        log = s.log_text()
        line = next((l for l in log.splitlines() if "ggml-rpc" in l), "")
        ok = code == 1 and "exiting with status 1" in log and result.get("client", "").startswith("error")
        check(f"fault: RPC server killed under llama-server ({p.name})", ok,
              f"exit {code}, client {result}:\n{s.log_tail()}")
        row(placement=p.name, face="server", np=1, mode="fault: an RPC server killed mid-generation", temp=0.0,
            identical="-", tau="-", tok_s="-", errors="-",
            note=f"exit {code} after {time.time() - started:.1f}s; client: {result.get('client')}; log: {line.strip()}")


def fault_rpc_unreachable_at_start():
    port = ts.free_port()  # nothing listens there
    p = Placement("rpc-unreachable", "rpc", 0, "")
    s = start("unreachable", ["--rpc", f"127.0.0.1:{port}", "-ngl", "99", "-md", ARGS.draft, "--spec-type",
                              "draft-dflash"], p)
    code = wait_exit(s.proc, 120)
    s.log.close()
    log = s.log_text()
    ok = code == 1 and f"Failed to connect to 127.0.0.1:{port}" in log
    check("fault: RPC server unreachable at start-up", ok, f"exit {code}:\n{s.log_tail()}")
    row(placement="rpc-unreachable", face="server", np=1, mode="fault: RPC address does not answer at start-up",
        temp=0.0, identical="-", tau="-", tok_s="-", errors="-",
        note=f"exit {code}; log: {next((l for l in log.splitlines() if 'Failed to connect' in l), '').strip()}")


def fault_rpc_killed_under_the_library():
    with Rpc(2) as rpc:
        p = Placement("rpc2", "rpc", 2, "RPC0,RPC1")
        cmd = [os.path.join(ARGS.tools, "dflash2-bench"), "--target", ARGS.target, "--draft", ARGS.draft,
               "--modes", "ar,dflash2", "--np", "1", "--reps", "1", "--n-predict", "200", "--threads", "2",
               "--json", os.path.join(ARGS.workdir, "bench-killed.json"), "--svg",
               os.path.join(ARGS.workdir, "bench-killed.svg"), "--prompts", PROMPTS_FILE] + rpc.flag() + p.bench_flags()
        log_path = os.path.join(ARGS.workdir, "bench-killed.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=p.env())
            # kill a node once target-only is done: in the middle of dflash2's generations
            deadline = time.time() + 300
            while "rep 0 ar" not in open(log_path, errors="replace").read() and time.time() < deadline \
                    and proc.poll() is None:
                time.sleep(0.2)
            time.sleep(2)
            rpc.servers[0].kill()
            code = wait_exit(proc, 60)
        text = open(log_path, errors="replace").read()
        ok = code == 1 and "an RPC server did not answer or went away" in text
        check("fault: RPC server killed under the C API host", ok, f"exit {code}:\n{text[-800:]}")
        line = next((l for l in text.splitlines() if "ggml-rpc" in l), "")
        row(placement="rpc2", face="library", np=1, mode="fault: an RPC server killed mid-generation", temp=0.0,
            identical="-", tau="-", tok_s="-", errors="-", note=f"exit {code}; log: {line.strip()}")


def upstream_vs_dflash2_drafter_off_the_head():
    """--draft-device / -devd none with the head on an RPC node: llama.cpp's own
    path aborts (the library row of dflash2 and its server row are placements)."""
    with Rpc(1) as rpc:
        p = Placement("rpc-target/cpu-drafter", "rpc", 1, "RPC0", draft="none")
        # the C API host: upstream's draft context in the same process
        code, _, text = run_bench(p, rpc, ["--modes", "ar,upstream", "--np", "1", "--n-predict", "8"],
                                  "upstream-off-head")
        line = next((l for l in text.splitlines() if "pre-allocated tensor" in l), last_error_line(text))
        row(placement=p.name, face="library", np=1, mode="upstream", temp=0.0, identical="-", tau="-", tok_s="-",
            errors="-", note=f"exit {code}; log: {line.strip()}")
        # llama-server with --spec-dflash2-upstream: it aborts at start-up or on the first request
        s = start("upstream", server_args(p, rpc, ["-np", "1", "-c", "2048", "--spec-dflash2-upstream"], True), p)
        code = wait_exit(s.proc, 120)
        if code == "hung":
            code = "still serving"
        s.log.close()
        log = s.log_text()
        line = next((l for l in log.splitlines() if "pre-allocated tensor" in l), last_error_line(log))
        row(placement=p.name, face="server", np=1, mode="upstream (--spec-dflash2-upstream)", temp=0.0,
            identical="-", tau="-", tok_s="-", errors="-", note=f"exit {code}; log: {line.strip()}")


def split_modes():
    """-sm row and -sm tensor over two RPC nodes: what the target, upstream and dflash2 do."""
    for sm in ("row", "tensor"):
        p = Placement(f"rpc2 -sm {sm}", "rpc", 2, "RPC0,RPC1")
        outcomes = {}
        for name, extra, drafter in (("reference", [], False),
                                     ("upstream", ["--spec-dflash2-upstream"], True),
                                     ("dflash2", [], True)):
            with Rpc(2) as rpc:  # fresh nodes for each server: nothing left over from another client
                s = start(f"sm-{sm}-{name}", server_args(p, rpc, ["-np", "1", "-c", "2048", "-sm", sm] + extra,
                                                         drafter), p)
                try:
                    s.wait_ready(timeout=300)
                    out, _ = chat(s, "List three colors.", 12)
                    outcomes[name] = f"serves: {out!r}"
                    s.stop()
                except Exception:
                    code = wait_exit(s.proc, 30)
                    s.log.close()
                    errs = [l for l in log_errors(s.log_text(), UPSTREAM_FIT_NOISE) if re.search(r" E ", l)]
                    # the message, not its timestamp; long ones keep their start, which names the cause
                    outcomes[name] = f"exit {code}: {errs[0].split(' E ', 1)[-1].strip()[:300] if errs else ''}"
        # dflash2 serves what the reference serves, or refuses at start-up with exit 1
        d = outcomes["dflash2"]
        ok = d.startswith("exit 1") or (d == outcomes["reference"] and d.startswith("serves"))
        check(f"-sm {sm}: dflash2 serves like the reference or refuses with exit 1", ok, str(outcomes))
        for name, what in outcomes.items():
            row(placement=p.name, face="server", np=1, mode=name, temp=0.0, identical="-", tau="-", tok_s="-",
                errors="-", note=what)


# ------------------------------------------------------- hybrid and image fixtures

FIXTURE_PROMPTS = ["the draft model is fast", "one two three"]


def fixture_paths(kind):
    f = ARGS.fixtures
    target = os.path.join(f, "qwen35-target.gguf" if kind == "hybrid" else "vision-target.gguf")
    extra = [] if kind == "hybrid" else ["--mmproj", os.path.join(f, "vision-mmproj.gguf")]
    return target, os.path.join(f, "qwen35-drafter.gguf"), extra


def fixture_library_row(placement, rpc, kind):
    """dflash2-demo (target-only, then dflash2, through the C API) on a fixture pair:
    the hybrid qwen35 target (recurrent state with its layers), or the vision target
    with an image decoded by the projector (libmtmd puts it on the GPU device)."""
    target, draft, extra = fixture_paths(kind)
    if kind == "image":
        extra += ["--image", os.path.join(ARGS.fixtures, "vision-image.png")]
    cmd = [os.path.join(placement.tools(), "dflash2-demo"), "--brief", "--target", target, "--draft", draft, "--n-predict", "24",
           "--threads", "2"] + [x for p in FIXTURE_PROMPTS[:1] for x in ("--prompt", p)] + extra + rpc.flag() \
        + placement.bench_flags()
    log_path = os.path.join(ARGS.workdir, f"demo-{placement.name}-{kind}.log".replace("/", "_"))
    with open(log_path, "wb") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=placement.env(), timeout=3600)
    text = open(log_path, errors="replace").read()
    same = re.search(r"dflash2 output identical to target-only: (\d+)/(\d+)", text)
    spec = re.search(r"dflash2\s+([\d.]+) tok/s.*tau ([\d.]+)\s+accepted (\d+)/(\d+)", text)
    ar = re.search(r"target only\s+([\d.]+) tok/s", text)
    errors = log_errors(text)
    ok = code == 0 and same and same.group(1) == same.group(2) and spec and int(spec.group(4)) > 0
    check(f"library {placement.name} {kind}", ok, f"exit {code}:\n{text[-1200:]}")
    row(placement=f"{placement.name} ({kind})", face="library", np=1, mode="dflash2", temp=0.0,
        identical=f"{same.group(1)}/{same.group(2)}" if same else "-", tau=float(spec.group(2)) if spec else "-",
        tok_s=float(spec.group(1)) if spec else "-", ar_tok_s=float(ar.group(1)) if ar else "-",
        accepted=f"{spec.group(3)}/{spec.group(4)}" if spec else "-", errors=len(errors),
        note="image rows decoded by the projector before the prompt" if kind == "image" else
        "recurrent state with the target's layers")


def fixture_server_row(placement, rpc, kind):
    target, draft, extra = fixture_paths(kind)
    common = ["-np", "1", "-c", "2048"] + extra
    ref_rpc = Rpc(placement.n_rpc)
    ref = start("reference", ref_rpc.flag() + placement.server_flags(False) + common, placement, target)
    spec = start("dflash2", rpc.flag() + placement.server_flags(True) + common
                 + ["-md", draft, "--spec-type", "draft-dflash"] + GREEDY, placement, target)
    servers = [ref, spec]
    same = n = 0
    try:
        for s in servers:
            s.wait_ready(timeout=900)
        for p in FIXTURE_PROMPTS:
            if kind == "image":
                ask = lambda s: image_chat(s, p)
            else:
                ask = lambda s: chat(s, p, 24)[0]
            want, got = ask(ref), ask(spec)
            n += 1
            same += got == want
            check(f"server {placement.name} {kind} identical", got == want, f"{got!r} vs {want!r}")
        tau, acc, drafted = slots_tau(spec, 1)
        check(f"server {placement.name} {kind} drafts", drafted > 0, "nothing drafted")
    finally:
        codes = stop_all(servers)
        ref_rpc.__exit__()
    errors = sum(len(log_errors(s.log_text())) for s in servers)
    for s in servers:
        check(f"server {placement.name} {kind} {s.name} exit", codes[s.name] == 0, f"{codes[s.name]}")
    check(f"server {placement.name} {kind} logs", errors == 0,
          "\n".join(sum((log_errors(s.log_text()) for s in servers), [])[:5]))
    row(placement=f"{placement.name} ({kind})", face="server", np=1, mode="dflash2", temp=0.0,
        identical=f"{same}/{n}", tau=round(tau, 3), tok_s="-", accepted=f"{acc}/{drafted}", errors=errors,
        note="projector (--mmproj) on the GPU device" if kind == "image" else "")


def image_chat(server, text):
    with open(os.path.join(ARGS.fixtures, "vision-image.png"), "rb") as f:
        url = "data:image/png;base64," + base64.b64encode(f.read()).decode()
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "seed": 1, "max_tokens": 24}
    return server.request("POST", "/v1/chat/completions", body, timeout=1800)["choices"][0]["message"]["content"]


# ------------------------------------------------- -sm tensor chat (issue 43)

CHAT_PROMPTS_FILE = os.path.join(ROOT, "tools", "prompts", "chat-varied.txt")
QUICK_CHAT = (0, 2, 4, 7)  # the lines of CHAT_PROMPTS_FILE that --quick sends
# a chat client's request: the template applied by the server, its prompt cache on
CHAT_BODY = {"temperature": 0, "max_tokens": 24}
POISON = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1] + "/libggml-rpc.so")
base = ctypes.CDLL(sys.argv[1] + "/libggml-base.so")
lib.ggml_backend_rpc_buffer_type.restype = ctypes.c_void_p
lib.ggml_backend_rpc_buffer_type.argtypes = [ctypes.c_char_p, ctypes.c_uint32]
base.ggml_backend_buft_alloc_buffer.restype = ctypes.c_void_p
base.ggml_backend_buft_alloc_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
base.ggml_backend_buffer_clear.argtypes = [ctypes.c_void_p, ctypes.c_uint8]
base.ggml_backend_buffer_free.argtypes = [ctypes.c_void_p]
for endpoint in sys.argv[2:]:
    buft = lib.ggml_backend_rpc_buffer_type(endpoint.encode(), 0)
    for _ in range(2):
        big = base.ggml_backend_buft_alloc_buffer(buft, 32 << 20)
        assert big, "alloc"
        base.ggml_backend_buffer_free(big)
        bufs = [base.ggml_backend_buft_alloc_buffer(buft, 8 << 20) for _ in range(16)]
        assert all(bufs), "alloc"
        for b in bufs:
            base.ggml_backend_buffer_clear(b, 0xff)
        for b in bufs:
            base.ggml_backend_buffer_free(b)
"""


def poison(rpc):
    """Fills each RPC server's reusable memory with NaN bytes (in a process of its own,
    which then leaves: an RPC server serves one client at a time): what a server that
    served another client before holds. A target that reads memory nothing wrote
    answers "....." after this (issue 43)."""
    lib = os.path.join(os.path.dirname(os.path.dirname(ARGS.rpc_server)), "lib")
    subprocess.check_call([sys.executable, "-c", POISON, lib] + [s.endpoint for s in rpc.servers], timeout=120)


def chat_prompts():
    """The chat prompts; --quick (CI) asks four of them, short to long, the longest
    (a prompt of several ubatches) among them."""
    prompts = [l.strip() for l in open(CHAT_PROMPTS_FILE) if l.strip()]
    if not ARGS.quick:
        return CHAT_PROMPTS_FILE, prompts
    prompts = [prompts[i] for i in QUICK_CHAT]
    path = os.path.join(ARGS.workdir, "chat-quick.txt")
    with open(path, "w") as out:
        out.write("".join(p + "\n" for p in prompts))
    return path, prompts


def chat_client(server, prompt):
    body = {"messages": [{"role": "user", "content": prompt}], **CHAT_BODY}
    res = server.request("POST", "/v1/chat/completions", body, timeout=1800)
    return res["choices"][0]["message"]["content"]


def chat_flags(placement):
    """llama-server's flags of a placement; a CPU share of -sm tensor is the target's
    layers past -ngl (llama-server's -dev takes no CPU device)."""
    f = ["-ngl", str(placement.ngl if placement.ngl is not None else 99), "-sm", placement.sm]
    return f + (["-dev", placement.target] if placement.target and "CPU" not in placement.target.split(",") else [])


def tensor_chat(placement, rpc, configs):
    """llama-server split by tensor, as issue 43 ran it: no drafter, then dflash2 in each
    of `configs` ((name, np, extra flags)), one after another on the same RPC servers,
    each started after the servers' memory was filled with NaN bytes; the chat prompts
    sent by a chat client (the template applied, the prompt cache on), one at a time:
    every answer must equal the no-drafter server's (same flags); at np 4 also four at
    once, counted against it (see below why not checked)."""
    _, prompts = chat_prompts()

    def serve(name, np_, extra):
        # one unified KV cache everywhere: the slots' trees need it, and the reference decodes on the same;
        # -ub 63: the nodes compute with ggml's CPU kernels, whose flash attention tiles 64+ query rows of
        # one ubatch (np 4 x 16-node trees: 64 rows) and rounds near-ties otherwise than one row (the
        # README's identity condition; llama-server bounds verify rows by itself on CPU-only targets, and
        # cannot tell what kernels an RPC node runs)
        args = rpc.flag() + chat_flags(placement) + ["-c", str(2048 * np_), "-np", str(np_), "-kvu", "-ub", "63"]
        args += extra
        poison(rpc)
        server = start(name, args, placement)
        try:
            server.wait_ready(timeout=900)
            answers = [chat_client(server, p) for p in prompts]
            together = []
            if np_ > 1:
                with concurrent.futures.ThreadPoolExecutor(np_) as pool:
                    together = list(pool.map(lambda p: chat_client(server, p), prompts[:np_]))
            tau = slots_tau(server, np_) if extra else (0.0, 0, 0)
            log = server.log_text()
        finally:
            code = stop_all([server])[name]
        check(f"server {placement.name} {name} exit", code == 0, f"{code}\n{server.log_tail()}")
        return answers, together, tau, log

    # on a ggml that keeps NaN in empty slices (what the environment variable makes the
    # pinned build read as) the dflash2 server must refuse this split at start-up, saying why
    refused = start("refused", rpc.flag() + chat_flags(placement) + ["-c", "2048", "-np", "1", "-md", ARGS.draft,
                                                                    "--spec-type", "draft-dflash"], placement,
                    env={"DFLASH2_TEST_GGML_KEEPS_NAN_IN_EMPTY_SLICES": "1"})
    code = wait_exit(refused.proc, 120)
    refused.log.close()
    reason = next((l for l in refused.log_text().splitlines() if "leftover memory" in l), "")
    check(f"server {placement.name} refused on a ggml without the fix", code == 1 and "leave a device without a slice"
          in reason, f"exit {code}: {refused.log_tail()}")
    row(placement=placement.name + " (chat)", face="server", np=1, mode="ggml without meta-zero-fill", temp=0.0,
        identical="-", tau="-", tok_s="-", errors="-", note=f"exit {code}: {reason.split(' E ', 1)[-1][:160]}")
    references = {}  # np -> (answers one at a time, np at once): the no-drafter server with the same flags
    for name, np_, extra in configs:
        if np_ not in references:
            want, want_together, _, _ = serve(f"reference-np{np_}", np_, [])
            dots = [a for a in want + want_together if a and set(a) <= {".", " "}]
            check(f"server {placement.name} reference np {np_} answers", not dots, f"{len(dots)} answers of dots")
            references[np_] = (want, want_together)
        want, want_together = references[np_]
        spec = ["-md", ARGS.draft, "--spec-type", "draft-dflash", "--spec-draft-n-max", "7"] + extra
        got, together, (tau, acc, drafted), log = serve(f"dflash2-{name}-np{np_}".replace(" ", ""), np_, spec)
        same = sum(g == w for g, w in zip(got, want))
        for p, g, w in zip(prompts, got, want):
            check(f"server {placement.name} {name} np {np_} identical", g == w,
                  f"{p[:60]!r}:\n  dflash2:   {g!r}\n  reference: {w!r}")
        # requests at once are batched as they arrive, several sequences in one ubatch: the
        # target's kernels round a row by what shares its ubatch, and target-only itself
        # answered them otherwise from run to run (two nodes + CPU layers, np 4: 1 of 4 in
        # one of three runs), so they are counted, not checked
        at_once = sum(g == w for g, w in zip(together, want_together))
        if "greedy" in name:
            # the greedy walk drafts every step (the controller may draft little on this CPU)
            check(f"server {placement.name} {name} np {np_} drafts", acc > 0 and drafted > 0, f"{acc}/{drafted}")
        filled = "fills those devices' partial results with 0" in log
        row(placement=placement.name + " (chat)", face="server", np=np_, mode=name, temp=0.0,
            identical=f"{same}/{len(got)}", tau=round(tau, 3), tok_s="-", accepted=f"{acc}/{drafted}", errors="-",
            note="; ".join(x for x in ["empty slices filled with 0 (meta-zero-fill)" if filled else "",
                                        f"{np_} at once: {at_once}/{len(together)} as target-only's (not checked)"
                                        if together else ""] if x))


def tensor_chat_library(placement, rpc, nps):
    """The same chat prompts through the library (dflash2-bench) on the placement:
    target-only, the greedy chain and the controller, at each np; NaN bytes first."""
    poison(rpc)
    # -ub 63: these nodes compute with ggml's CPU kernels, whose flash attention tiles 64+ query
    # rows of one ubatch and rounds near-ties otherwise than one row (the README's identity
    # condition); the controller's np 4 trees verify up to 4 x 64 rows
    extra = ["--np", ",".join(map(str, nps)), "--modes", "ar,dflash2,dflash2-auto", "--n-predict", "24",
             "-ub", "63"]
    name = f"{placement.name}-chat".replace(" ", "_").replace("/", "_")
    code, res, text = run_bench(placement, rpc, extra, name, chat_prompts()[0])
    if not check(f"library {placement.name} chat", code == 0, f"dflash2-bench exited {code}:\n{text[-1500:]}"):
        return
    for np_ in nps:
        for mode in ("dflash2", "dflash2-auto"):
            r = res[(np_, mode)]
            same = identical(r)
            check(f"library {placement.name} chat np {np_} {mode} identical",
                  same.split("/")[0] == same.split("/")[1], same)
            row(placement=placement.name + " (chat)", face="library", np=np_, mode=mode, temp=0.0, identical=same,
                tau=round(r["tau"], 3), tok_s=round(r["tokens_per_s"]["median"], 2),
                ar_tok_s=round(res[(np_, "ar")]["tokens_per_s"]["median"], 2),
                accepted=f"{r['accepted']}/{r['drafted']}", errors="-", note="")


# ------------------------------------------------------------------ placements

def cpu():
    return Placement("cpu", "rpc", 0, "none", ngl=0)


def rpc_placements():
    return [
        Placement("rpc2", "rpc", 2, "RPC0,RPC1", note="target over two RPC nodes, drafter with the head (RPC1)"),
        Placement("rpc-target/cpu-drafter", "rpc", 1, "RPC0", draft="none",
                  note="drafter layers on the CPU, the head's product on RPC0"),
    ]


def tensor_placement():
    return Placement("rpc2 -sm tensor", "rpc", 2, "RPC0,RPC1", sm="tensor",
                     note="target split by tensor over two RPC nodes; the drafter on RPC0 reads the head's slices")


def tensor_cpu_placement():
    # the library only: llama-server's -dev takes no CPU device ("invalid device: CPU")
    return Placement("rpc2+cpu -sm tensor", "rpc", 2, "RPC0,RPC1,CPU", sm="tensor",
                     note="target split by tensor over two RPC nodes and the CPU")


def tensor_cpu_server_placement():
    # llama-server's -dev takes no CPU device: the CPU's part is the target's last
    # layers (-ngl 20 of 30), the rest split by tensor over the two nodes
    return Placement("rpc2 -sm tensor + cpu layers", "rpc", 2, "RPC0,RPC1,CPU", sm="tensor", ngl=20,
                     note="20 layers split by tensor over two RPC nodes, 10 on the CPU")


def fixture_pair():
    """The fixture target (its own output.weight, which -sm tensor splits by vocabulary
    rows; SmolLM2's head is its tied token embeddings, which every device holds whole)."""
    return (os.path.join(ARGS.fixtures, "target.gguf"), os.path.join(ARGS.fixtures, "drafter.gguf"))


def upstream_on_tensor_split():
    """llama.cpp's draft-dflash on the -sm tensor placement (library): what it does with
    SmolLM2 (its head whole on each node) and with the fixture pair (a head in slices)."""
    p = tensor_placement()
    for pair, what in ((None, ""), (fixture_pair(), " (fixture pair)")):
        with Rpc(2) as rpc:
            extra = ["--np", "1", "--modes", "ar,upstream", "--n-predict", "16"]
            name = "sm-tensor-upstream" + ("-fixture" if pair else "")
            code, res, text = run_bench(p, rpc, extra, name, trimmed_prompts(2), pair)
        if code == 0:
            r = res[(1, "upstream")]
            note = f"runs: identical {identical(r)}, tau {r['tau']:.3f}"
        else:
            line = next((l for l in text.splitlines() if "GGML_ASSERT" in l or "error" in l.lower()), "")
            note = f"exit {code}: {(line or last_error_line(text)).strip()[:200]}"
        row(placement=p.name + what, face="library", np=1, mode="upstream", temp=0.0, identical="-", tau="-",
            tok_s="-", errors="-", note=note)


def tensor_split_distribution(placement, rpc):
    """T = 0.8 on the fixture pair split by tensor (its head read in slices): the
    tokens the server with sampled trees emits and those of the server without a
    drafter pass llama-server tests' two-sample chi-square test per prompt and
    position; the same test tells T = 0.8 from T = 0.3, so it can fail (the fixture's
    random logits are flatter than a trained model's: T 0.5 is too close to tell)."""
    target, draft = fixture_pair()
    # the fixture model answers in milliseconds, but the server's round trips add up on CI's 2 cores
    ts.DIST_SEEDS = 150 if ARGS.quick else 400
    common = ["-np", "1", "-c", "1024"]
    ref_rpc = Rpc(placement.n_rpc)
    ref = start("reference", ref_rpc.flag() + placement.server_flags(False) + common, placement, target)
    spec = start("dflash2", rpc.flag() + placement.server_flags(True) + common
                 + ["-md", draft, "--spec-type", "draft-dflash", "--spec-dflash2-tree", "7"] + GREEDY, placement,
                 target)
    servers = [ref, spec]
    worst, power = 1.0, 1.0
    try:
        for s in servers:
            s.wait_ready(timeout=900)
        for prompt in ("one two three four", "the cat sat on the mat"):
            want = ts.sampled_answers(ref, prompt, 0.8)
            got = ts.sampled_answers(spec, prompt, 0.8)
            cooler = ts.sampled_answers(ref, prompt, 0.3)
            for j in range(ts.DIST_TOKENS):
                worst = min(worst, ts.chi_square_p(ts.token_counts(want, j), ts.token_counts(got, j)))
                power = min(power, ts.chi_square_p(ts.token_counts(want, j), ts.token_counts(cooler, j)))
        slots = spec.request("GET", "/slots")
        verify = slots[0]["draft"]["verify"]
        drafted = slots[0]["draft"]["n_drafted"]
    finally:
        codes = stop_all(servers)
        ref_rpc.__exit__()
    check(f"server {placement.name} T=0.8 distribution", worst > 1e-3 and power < 1e-3 and drafted > 0
          and verify == "rejection-sampling-tree", f"p {worst:.3g}, power {power:.2g}, {verify}, {drafted} drafted")
    for s in servers:
        check(f"server {placement.name} T=0.8 {s.name} exit", codes[s.name] == 0, f"{codes[s.name]}")
    row(placement=placement.name + " (fixture pair)", face="server", np=1, mode="dflash2-tree 7", temp=0.8,
        identical="-", tau="-", tok_s="-", errors="-",
        note=f"chi-square over {ts.DIST_SEEDS} seeds x 2 prompts x {ts.DIST_TOKENS} tokens: smallest p {worst:.3f} "
             f"(T 0.3 against T 0.8: {power:.2g}); verify {verify}, {drafted} drafted")


def vulkan_placements():
    return [
        Placement("vulkan", "vulkan", 0, "Vulkan0"),
        Placement("vulkan-target/cpu-drafter", "vulkan", 0, "Vulkan0", draft="none"),
        Placement("cpu-target/vulkan-drafter", "vulkan", 0, "none", ngl=0, draft="Vulkan0"),
        Placement("vulkan+rpc+cpu", "vulkan", 1, "Vulkan0,RPC0", ngl=20,
                  note="11 layers on the CPU, then Vulkan0, then RPC0 with the head"),
    ]


def run_step(name, fn, *args, **kw):
    if ARGS.only and not any(o in name for o in ARGS.only.split("|")):
        return
    start_t = time.time()
    print(f"== {name}", flush=True)
    try:
        fn(*args, **kw)
    except Exception:
        check(name, False, traceback.format_exc())
    print(f"   ({time.time() - start_t:.0f}s)", flush=True)


def with_rpc(placement, fn, *args, **kw):
    with Rpc(placement.n_rpc) as rpc:
        fn(placement, rpc, *args, **kw)


def print_table():
    cols = ["placement", "face", "np", "mode", "temp", "identical", "tau", "cpu_tau", "tok_s", "ar_tok_s",
            "accepted", "errors", "note"]
    print("\n" + " | ".join(cols))
    for r in ROWS:
        print(" | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols))


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--tools", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--rpc-server", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--vulkan-tools")
    ap.add_argument("--vulkan-server")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--only", help="run the steps whose name contains this, or one of A|B|... (the CPU tau comes "
                                   "from 'library cpu', the -sm layer tau from 'library rpc2')")
    ARGS = ap.parse_args()
    ARGS.trained = os.path.basename(ARGS.draft) == "smollm2-135m-dflash2.gguf"
    os.makedirs(ARGS.workdir, exist_ok=True)
    ts.ARGS = argparse.Namespace(server=ARGS.server, target=ARGS.target, draft=ARGS.draft, workdir=ARGS.workdir)
    start_t = time.time()

    n_predict = 24
    # --quick (CI): the library's rows on two of the four prompts (every placement alike:
    # their tau is compared across placements)
    n_prompts = 2 if ARGS.quick else 4
    # dflash2 runs the library's own draft graph, dflash2-libllama libllama's: compared per placement
    chain_modes = ["upstream", "dflash2", "dflash2-libllama", "dflash2-tree"]
    # the CPU-only run first: every other placement's tau is compared with it
    run_step("library cpu", with_rpc, cpu(), library_rows, [1, 4], chain_modes, n_predict, n_prompts=n_prompts)
    for p in rpc_placements():
        modes = chain_modes if p.draft is None else ["dflash2", "dflash2-libllama", "dflash2-tree"]
        run_step(f"library {p.name}", with_rpc, p, library_rows, [1, 4], modes, n_predict, n_prompts=n_prompts)
    for p in (cpu(), rpc_placements()[0]):
        run_step(f"library {p.name} T=0.8", with_rpc, p, library_rows, [1, 4], ["dflash2", "dflash2-tree"], n_predict,
                 temp=0.8, n_prompts=n_prompts)
    # -sm tensor: SmolLM2 (its head whole on each node) and the fixture pair (a head in slices)
    tp = tensor_placement()
    run_step(f"library {tp.name}", with_rpc, tp, library_rows, [1, 4], ["dflash2", "dflash2-tree"], n_predict,
             n_prompts=n_prompts)
    run_step("library rpc2, fixture pair", with_rpc, rpc_placements()[0], library_rows, [1, 4],
             ["dflash2", "dflash2-tree"], n_predict, pair=fixture_pair(), n_prompts=n_prompts)
    run_step(f"library {tp.name}, head in slices", with_rpc, tp, library_rows, [1, 4], ["dflash2", "dflash2-tree"],
             n_predict, pair=fixture_pair(), n_prompts=n_prompts)
    run_step(f"library {tp.name}: upstream", upstream_on_tensor_split)
    tc = tensor_cpu_placement()
    run_step(f"library {tc.name}, head in slices", with_rpc, tc, library_rows, [1, 4], ["dflash2", "dflash2-tree"],
             n_predict, pair=fixture_pair(), n_prompts=n_prompts)
    run_step("server rpc2 np 1", with_rpc, rpc_placements()[0], server_rows, 4, n_predict)
    run_step("server rpc2 np 4 chains", with_rpc, rpc_placements()[0], server_rows, 4, n_predict, np_=4)
    run_step("server rpc2 np 4 trees", with_rpc, rpc_placements()[0], server_rows, 4, n_predict, np_=4, tree=7,
             sampled=True)
    run_step("server rpc-target/cpu-drafter", with_rpc, rpc_placements()[1], server_rows, 2, n_predict)
    run_step(f"server {tp.name} np 1", with_rpc, tp, server_rows, 2, n_predict)
    run_step(f"server {tp.name} np 4 trees", with_rpc, tp, server_rows, 2, n_predict, np_=4, tree=7, sampled=True)
    run_step(f"server {tp.name} T=0.8 distribution", with_rpc, tp, tensor_split_distribution)
    # issue 43: chat requests on NaN-filled RPC memory, the server against its no-drafter twin
    # (the controller with trees: the default; chains: --spec-dflash2-tree 0; the greedy walk
    # drafts every step, chains and 15-node trees)
    greedy = ["--spec-dflash2-walk", "greedy"]
    walks = [("controller", []), ("chains", ["--spec-dflash2-tree", "0"]),
             ("greedy trees", greedy + ["--spec-dflash2-tree", "15"])]
    if not ARGS.quick:
        walks.append(("greedy chains", greedy + ["--spec-dflash2-tree", "0"]))
    chat_configs = [(walk, np_, extra) for np_ in (1, 4) for walk, extra in walks]
    run_step(f"server {tp.name} chat", with_rpc, tp, tensor_chat, chat_configs)
    # --quick (CI's 90 minutes): with CPU layers, the server's controller and greedy trees
    # but not its chains, and not the library's chat; every walk and the library's chat
    # run on the same split without CPU layers
    cpu_configs = [c for c in chat_configs if not ARGS.quick or c[0] != "chains"]
    tcs = tensor_cpu_server_placement()
    run_step(f"server {tcs.name} chat", with_rpc, tcs, tensor_chat, cpu_configs)
    for p in (tp, tc) if not ARGS.quick else (tp,):
        run_step(f"library {p.name} chat", with_rpc, p, tensor_chat_library, [1, 4])
    run_step("upstream with the drafter off the head", upstream_vs_dflash2_drafter_off_the_head)
    run_step("fault: RPC killed under the server", fault_rpc_killed_under_the_server)
    run_step("fault: RPC killed under the library", fault_rpc_killed_under_the_library)
    run_step(f"fault: RPC killed under the server, {tp.name}", fault_rpc_killed_under_the_server, tp)
    run_step("fault: RPC unreachable at start-up", fault_rpc_unreachable_at_start)
    run_step("split modes", split_modes)

    if not ARGS.quick and ARGS.vulkan_tools:
        # llvmpipe runs SmolLM2 at a few tokens/s: fewer, shorter prompts
        vk_prompts, vk_predict = 2, 12
        run_step("library cpu (short)", with_rpc, cpu(), library_rows, [1], chain_modes, vk_predict,
                 n_prompts=vk_prompts)
        for p in vulkan_placements():
            modes = chain_modes if p.draft is None else ["dflash2", "dflash2-libllama"]
            run_step(f"library {p.name}", with_rpc, p, library_rows, [1], modes, vk_predict, n_prompts=vk_prompts)
            run_step(f"server {p.name}", with_rpc, p, server_rows, vk_prompts, vk_predict)
        vk = vulkan_placements()[0]
        for kind in ("hybrid", "image"):
            run_step(f"library vulkan {kind}", with_rpc, vk, fixture_library_row, kind)
            run_step(f"server vulkan {kind}", with_rpc, vk, fixture_server_row, kind)

    print_table()
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"rows": ROWS, "failures": FAILURES, "seconds": round(time.time() - start_t)}, f, indent=1)
    print(f"\n{len(ROWS)} rows, {len(FAILURES)} failed checks in {time.time() - start_t:.0f}s (logs in {ARGS.workdir})")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
