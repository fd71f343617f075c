#!/usr/bin/env python3
"""Compares the two runs of llama.cpp's server tests (scripts/llama-server-tests.sh
--all): DIR/without.xml and DIR/with.xml (JUnit XML of pytest), DIR/*.seconds.

Writes DIR/summary.txt and DIR/summary.json: passed / failed / errors / skipped and
seconds of each run, the difference set (tests that pass without the drafter and
fail with it, and the reverse) with both runs' reasons, and every test failing in
both runs grouped by reason. Exits 1 when a test passes without the drafter and
fails with it and KNOWN (lines `TEST-ID-PREFIX | why`) does not list it.
"""

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

WORST = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
# llama-server's log lines at error level (the first one says why it stopped)
SERVER_ERROR = re.compile(r"^\d+\.\d+\.\d+\.\d+ E (.*)")


def reason(case, kind):
    """One line: pytest's message, and for a server that died, the first error
    line of its log."""
    node = case.find(kind)
    msg = (node.get("message") or node.text or "").strip().splitlines()
    line = msg[0] if msg else kind
    out = case.findtext("system-out") or ""
    if "Server process died" in line or "Server did not start" in line:
        why = [m.group(1).strip() for m in map(SERVER_ERROR.match, out.splitlines()) if m]
        if why:
            line += " — server: " + why[0]
    return line[:300]


def load(path):
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        if case.find("error") is not None:
            status, why = "error", reason(case, "error")
        elif case.find("failure") is not None:
            status, why = "failed", reason(case, "failure")
        elif case.find("skipped") is not None:
            status, why = "skipped", (case.find("skipped").get("message") or "")[:300]
        else:
            status, why = "passed", ""
        # a test that fails and errors in teardown appears twice: keep the worst
        old = results.get(test_id)
        if old is None or WORST[status] > WORST[old[0]]:
            results[test_id] = (status, why)
    return results


def load_known(path):
    known = []
    if path and os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line and not line.startswith("#"):
                prefix, _, why = line.partition("|")
                known.append((prefix.strip(), why.strip()))
    return known


def counts(results):
    c = {k: 0 for k in WORST}
    for status, _ in results.values():
        c[status] += 1
    return c


def group(why):
    # the reason without the parts that vary per test (numbers, quoted text)
    why = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", why)
    why = re.sub(r"\{[^{}]*\}", "{…}", why)
    return re.sub(r"\b\d+(\.\d+)?\b", "N", why)[:160]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--known")
    ap.add_argument("--drafter", default="")
    args = ap.parse_args()
    runs = {m: load(os.path.join(args.dir, f"{m}.xml")) for m in ("without", "with")}
    seconds = {}
    for m in runs:
        p = os.path.join(args.dir, f"{m}.seconds")
        seconds[m] = int(open(p).read()) if os.path.exists(p) else None
    known = load_known(args.known)

    def known_why(test_id):
        return next((why for prefix, why in known if test_id.startswith(prefix)), None)

    bad = ("failed", "error")
    # a run cut short (pytest interrupted) lacks its last tests: they are listed
    # as not run, not counted as failures of that run
    ids = sorted(set(runs["without"]) & set(runs["with"]))
    not_run = {"without": sorted(set(runs["with"]) - set(runs["without"])),
               "with": sorted(set(runs["without"]) - set(runs["with"]))}
    runs_all = runs
    runs = {m: {t: runs_all[m][t] for t in ids} for m in runs_all}
    worse, better, both = [], [], []
    for t in ids:
        (sw, ww), (sg, wg) = runs["without"][t], runs["with"][t]
        if sw == "passed" and sg in bad:
            worse.append({"test": t, "without": sw, "with": sg, "with_reason": wg, "known": known_why(t)})
        elif sw in bad and sg == "passed":
            better.append({"test": t, "without": sw, "without_reason": ww, "with": sg})
        elif sw in bad and sg in bad:
            both.append({"test": t, "without": sw, "with": sg, "without_reason": ww, "with_reason": wg})
    unexpected = [d for d in worse if not d["known"]]

    lines = [f"llama.cpp server tests (tools/server/tests/unit), {len(ids)} tests run both ways, on SmolLM2-135M-Instruct;"
             f" drafter {os.path.basename(args.drafter)}", "",
             f"{'':16}{'passed':>8}{'failed':>8}{'errors':>8}{'skipped':>8}{'seconds':>9}"]
    for m in ("without", "with"):
        c = counts(runs[m])
        lines.append(f"{m + ' drafter':16}{c['passed']:>8}{c['failed']:>8}{c['error']:>8}{c['skipped']:>8}"
                     f"{seconds[m] if seconds[m] is not None else '?':>9}")
    for m in runs:
        if not_run[m]:
            lines.append(f"not run {m} the drafter (that run was cut short): {len(not_run[m])}, "
                         f"from {not_run[m][0]}; counts above are of the tests run both ways")
    lines += ["", f"passes without the drafter, fails with it: {len(worse)} ({len(unexpected)} not known)"]
    for d in worse:
        lines.append(f"  {d['test']}: {d['with']}: {d['with_reason']}")
        lines.append(f"    {'known: ' + d['known'] if d['known'] else 'NOT KNOWN: a defect of ours until diagnosed'}")
    lines += ["", f"fails without the drafter, passes with it: {len(better)}"]
    for d in better:
        lines.append(f"  {d['test']}: without: {d['without']}: {d['without_reason']}")
    groups = {}
    for d in both:
        groups.setdefault(group(d["without_reason"]), []).append(d)
    lines += ["", f"fails in both runs: {len(both)}, by reason (without the drafter; "
              "* = the run with the drafter failed for another reason)"]
    for why, ds in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(ds)} × {why}")
        for d in ds:
            other = "*" if group(d["with_reason"]) != group(d["without_reason"]) else " "
            lines.append(f"     {other} {d['test']}" + (f"  [with: {d['with_reason']}]" if other == "*" else ""))
    cw, cg = counts(runs["without"]), counts(runs["with"])
    lines += ["", f"differential: passed/failed/errors/skipped without the drafter {cw['passed']}/{cw['failed']}/"
              f"{cw['error']}/{cw['skipped']}, with it {cg['passed']}/{cg['failed']}/{cg['error']}/{cg['skipped']};"
              f" passes without and fails with: {len(worse)} ({len(unexpected)} not known), the reverse: {len(better)}"]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.dir, "summary.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(args.dir, "summary.json"), "w") as f:
        json.dump({"counts": {m: counts(runs[m]) for m in runs}, "seconds": seconds,
                   "passes_without_fails_with": worse, "fails_without_passes_with": better,
                   "fails_in_both": both, "not_run": not_run}, f, indent=1)
    print(text)
    if unexpected:
        print(f"FAIL: {len(unexpected)} tests pass without the drafter and fail with it, not known", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
