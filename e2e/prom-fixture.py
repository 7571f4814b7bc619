#!/usr/bin/env python3
"""Reads the e2e harness's Prometheus (e2e/multiregion.sh quiet and record).

  prom-fixture.py fired PROM_URL START END
      Every alert that was firing at some evaluation in [START, END] (Unix
      seconds): one line per alert, its labels and the first and last moment
      it was seen firing (UTC). Nothing printed: none fired. Exit 2 if
      Prometheus does not answer.

  prom-fixture.py fixture PROM_URL START END RULES INSTANCES EXPECT OUT [COMMENT]
      A promtool test file (OUT) from the series recorded in [START, END] at a
      15 s step (query_range): every series whose metric name RULES (the
      shipped rules file) reads, aether_replicator_* and `up`. INSTANCES maps
      scraped addresses to stable names ("<port> <region> <slot>" lines, in
      start order: the first replica in slot 1 of region a is a1, a later one
      a1.2, ...). Values are rounded to 1e-3; a run of equal values is
      written `vxN`, a sample missing right after a present one `stale` (the
      staleness marker Prometheus wrote: target gone or scrape failed), and
      further missing ones `_`. EXPECT is the hand-written part (the
      promql_expr_test and alert_rule_test keys of the test), copied in
      verbatim. COMMENT lines go into the file's header.
"""
import datetime
import json
import math
import os
import re
import sys
import urllib.parse
import urllib.request

STEP = 15
LABEL_ORDER = ["job", "instance", "region", "origin", "peer"]


def get(url, path, params):
    q = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}{path}?{q}", timeout=30) as r:
            body = json.load(r)
    except Exception as e:  # noqa: BLE001
        print(f"prom-fixture: {url}{path}: {e}", file=sys.stderr)
        sys.exit(2)
    if body.get("status") != "success":
        print(f"prom-fixture: {path}: {body}", file=sys.stderr)
        sys.exit(2)
    return body["data"]


def utc(t):
    return datetime.datetime.fromtimestamp(float(t), datetime.timezone.utc).strftime("%H:%M:%S")


def cmd_fired(url, start, end):
    data = get(
        url,
        "/api/v1/query_range",
        {"query": 'ALERTS{alertstate="firing"}', "start": start, "end": end, "step": "1s"},
    )
    for s in sorted(data["result"], key=lambda s: sorted(s["metric"].items())):
        m = dict(s["metric"])
        name = m.pop("alertname", "?")
        m.pop("__name__", None)
        m.pop("alertstate", None)
        ts = [float(t) for t, _ in s["values"]]
        labels = ", ".join(f'{k}="{v}"' for k, v in sorted(m.items()))
        print(
            f"{name}{{{labels}}} firing from {utc(ts[0])} to {utc(ts[-1])} UTC"
            f" (+{ts[0] - float(start):.0f}s..+{ts[-1] - float(start):.0f}s into the window, {len(ts)} evaluations)"
        )


def metric_names(rules_path):
    with open(rules_path) as f:
        text = f.read()
    # aether_replicator_* are raw metrics; aether_replicator:... are the recordings.
    return sorted(set(re.findall(r"\b(aether_replicator_[a-z0-9_]+)", text))) + ["up"]


def instance_names(path):
    names, gens = {}, {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 3:
                continue
            port, region, slot = parts
            key = region + slot
            gens[key] = gens.get(key, 0) + 1
            names[f"127.0.0.1:{port}"] = key if gens[key] == 1 else f"{key}.{gens[key]}"
    return names


def fmt(v):
    v = round(v, 3)
    if v == 0:
        v = 0.0  # no "-0"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def compress(values):
    """values: list of str or None (missing). promtool's expanding notation."""
    out = []
    i = 0
    prev_present = False
    while i < len(values):
        v = values[i]
        if v is None:
            if prev_present:
                out.append("stale")
                prev_present = False
                i += 1
                continue
            j = i
            while j < len(values) and values[j] is None:
                j += 1
            n = j - i
            out.append("_" if n == 1 else f"_x{n}")
            i = j
            continue
        j = i
        while j < len(values) and values[j] == v:
            j += 1
        n = j - i
        out.append(v if n == 1 else f"{v}x{n - 1}")
        prev_present = True
        i = j
    return " ".join(out)


def cmd_fixture(url, start, end, rules, instances, expect, out, comment=""):
    start, end = float(start), float(end)
    steps = int(round((end - start) / STEP)) + 1
    names = metric_names(rules)
    inst = instance_names(instances)
    query = '{__name__=~"%s", job="aether-replicator"}' % "|".join(names)
    data = get(url, "/api/v1/query_range", {"query": query, "start": start, "end": end, "step": f"{STEP}s"})
    series = {}
    for s in data["result"]:
        m = dict(s["metric"])
        name = m.pop("__name__")
        if m.get("instance") in inst:
            m["instance"] = inst[m["instance"]]
        keys = sorted(m, key=lambda k: (LABEL_ORDER.index(k) if k in LABEL_ORDER else len(LABEL_ORDER), k))
        labels = ", ".join(f'{k}="{m[k]}"' for k in keys)
        sel = f"{name}{{{labels}}}"
        if sel in series:
            sys.exit(f"prom-fixture: two recorded series map to {sel} (instance names collide)")
        vals = [None] * steps
        for t, v in s["values"]:
            k = int(round((float(t) - start) / STEP))
            f = float(v)
            if 0 <= k < steps and not math.isnan(f):
                vals[k] = fmt(f)
        series[sel] = vals
    if not series:
        sys.exit("prom-fixture: Prometheus returned no series for the window")
    with open(expect) as f:
        expect_text = f.read()
    sort_key = lambda sel: (sel.split("{")[0] != "up", sel)  # noqa: E731
    with open(out, "w") as f:
        f.write("# GENERATED by e2e/multiregion.sh record (input_series), with the hand-written expectations\n")
        f.write(f"# of {os.path.relpath(expect, os.path.dirname(os.path.abspath(out)))} copied in below them.")
        f.write(" Regenerate as deploy/prometheus/README.md says.\n")
        for line in comment.splitlines():
            f.write(f"# {line}\n".replace("# \n", "#\n"))
        f.write(
            f"# {len(series)} series, {steps} samples each ({STEP}s apart, t=0 is "
            f"{datetime.datetime.fromtimestamp(start, datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}).\n"
        )
        f.write("rule_files:\n  - ../aether-replicator.rules.yml\n")
        f.write("evaluation_interval: 15s\n")
        f.write("group_eval_order:\n  - aether-replicator.recording\n  - aether-replicator.alerts\n")
        f.write("tests:\n  - interval: 15s\n    input_series:\n")
        for sel in sorted(series, key=sort_key):
            f.write(f"      - series: '{sel}'\n        values: '{compress(series[sel])}'\n")
        for line in expect_text.splitlines():
            f.write(("    " + line).rstrip() + "\n")
    print(f"{out}: {len(series)} series x {steps} samples ({STEP}s step) from {utc(start)} to {utc(end)} UTC")


def main():
    a = sys.argv[1:]
    if len(a) == 4 and a[0] == "fired":
        cmd_fired(*a[1:])
    elif len(a) in (8, 9) and a[0] == "fixture":
        cmd_fixture(*a[1:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
