#!/usr/bin/env python3
"""Moderate endpoint churn for e2e/multiregion.sh (quiet, record): puts and
deletes of endpoint keys in every region's etcd, through etcd's JSON gateway
(/v3/kv/put, /v3/kv/deleterange), until SIGTERM.

    churn.py STATE RATE REGION=URL...

STATE is the harness's state dir (only so that the command line names it and
`multiregion.sh down` finds the process). RATE is operations per second per
region. Each region gets a pool of 24 endpoint keys under
/aether/v1/regions/<region>/clusters/c1/services/churn-<n>/...: an absent key
is put, a present one is overwritten (two times in three) or deleted. On
SIGTERM prints one line, "puts=N deletes=N errors=N", and exits 0.
Loopback URLs only.
"""
import base64
import json
import random
import signal
import sys
import time
import urllib.request

POOL = 24


def b64(s):
    return base64.b64encode(s.encode()).decode()


def call(url, path, body):
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    rate = float(sys.argv[2])
    regions = []
    for arg in sys.argv[3:]:
        name, url = arg.split("=", 1)
        if not url.startswith("http://127.0.0.1:"):
            sys.exit(f"churn.py: {url}: loopback URLs only")
        regions.append((name, url))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    present = {name: set() for name, _ in regions}
    counts = {"puts": 0, "deletes": 0, "errors": 0}
    rng = random.Random()
    # One operation per region per tick, the regions' ticks spread evenly.
    tick = 1.0 / (rate * len(regions))
    nxt = time.monotonic()
    gen = 0
    while not stop:
        for name, url in regions:
            if stop:
                break
            i = rng.randrange(POOL)
            octet = "abcde".index(name) + 1 if name in "abcde" else 9
            key = (
                f"/aether/v1/regions/{name}/clusters/c1/services/churn-{i % 3}"
                f"/protocols/http/endpoints/10.{octet}.50.{i}"
            )
            try:
                if i in present[name] and rng.random() < 1 / 3:
                    call(url, "/v3/kv/deleterange", {"key": b64(key)})
                    present[name].discard(i)
                    counts["deletes"] += 1
                else:
                    gen += 1
                    value = json.dumps(
                        {"clusterName": "c1", "region": name, "zone": f"{name}-1", "port": 8080, "gen": gen},
                        separators=(",", ":"),
                    )
                    call(url, "/v3/kv/put", {"key": b64(key), "value": b64(value)})
                    present[name].add(i)
                    counts["puts"] += 1
            except Exception as e:  # noqa: BLE001 - counted and reported, never fatal
                counts["errors"] += 1
                print(f"churn: {name}: {e}", file=sys.stderr, flush=True)
            nxt += tick
            wait = nxt - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                nxt = time.monotonic()
    print(" ".join(f"{k}={v}" for k, v in counts.items()), flush=True)


if __name__ == "__main__":
    main()
