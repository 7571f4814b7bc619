#!/usr/bin/env python3
"""Draws docs/throughput-vs-rtt.svg: base-sync keys/s against round trip,
aether-replicator and etcdctl make-mirror, from the REPORT lines of
`cargo bench --bench mirror -- wan/` and `e2e/bench-make-mirror.sh --wan`.

    e2e/plot-throughput-vs-rtt.py BENCH_LOG MAKE_MIRROR_LOG [OUT.svg]

A log-scale y axis: the two tools are two orders of magnitude apart. No
plotting library: the SVG is written by hand.
"""
import math
import re
import sys


def reports(path, kind):
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("REPORT " + kind + " "):
                rows.append(dict(kv.split("=", 1) for kv in line.split()[2:]))
    return rows


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    out = sys.argv[3] if len(sys.argv) > 3 else "docs/throughput-vs-rtt.svg"
    ours = [(float(r["rtt_ms"]), float(r["base_sync_keys_per_s"])) for r in reports(sys.argv[1], "wan")]
    mm_rows = reports(sys.argv[2], "make_mirror_wan")
    mm = [(float(r["rtt_ms"]), float(r["make_mirror_keys_per_s"])) for r in mm_rows]
    ours_bin = [(float(r["rtt_ms"]), float(r["aether_keys_per_s"])) for r in mm_rows]
    if not ours or not mm:
        sys.exit("no REPORT lines found")
    series = [
        ("aether-replicator (engine, 50k keys, criterion)", "#1f77b4", ours),
        ("aether-replicator (binary, script, 20k keys)", "#2ca02c", ours_bin),
        ("etcdctl make-mirror (script, fixed window)", "#d62728", mm),
    ]
    w, h, left, right, top, bottom = 680.0, 420.0, 80.0, 20.0, 40.0, 50.0
    max_x = max(x for _, _, pts in series for x, _ in pts) or 1.0
    ys = [max(y, 1.0) for _, _, pts in series for _, y in pts]
    lo, hi = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    if hi == lo:
        hi += 1

    def px(x):
        return left + (w - left - right) * x / max_x

    def py(y):
        return h - bottom - (h - bottom - top) * (math.log10(max(y, 1.0)) - lo) / (hi - lo)

    o = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{w:.0f}' height='{h:.0f}' font-family='sans-serif' font-size='12'>",
         "<rect width='100%' height='100%' fill='white'/>",
         f"<text x='{w / 2:.0f}' y='20' text-anchor='middle' font-size='14'>Base sync throughput against round trip to the peer</text>"]
    for d in range(lo, hi + 1):
        y = py(10 ** d)
        o.append(f"<line x1='{left}' x2='{w - right}' y1='{y:.1f}' y2='{y:.1f}' stroke='#ddd'/>")
        o.append(f"<text x='{left - 6}' y='{y + 4:.1f}' text-anchor='end'>{10 ** d:,}</text>")
    for x in sorted({x for _, _, pts in series for x, _ in pts}):
        o.append(f"<text x='{px(x):.1f}' y='{h - bottom + 18}' text-anchor='middle'>{x:.0f}</text>")
    o.append(f"<text x='{(left + w - right) / 2:.0f}' y='{h - 12}' text-anchor='middle'>round trip between mirror and peer (ms)</text>")
    o.append(f"<text x='18' y='{(top + h - bottom) / 2:.0f}' text-anchor='middle' transform='rotate(-90 18 {(top + h - bottom) / 2:.0f})'>keys/s (log)</text>")
    o.append(f"<line x1='{left}' x2='{left}' y1='{top}' y2='{h - bottom}' stroke='black'/>")
    o.append(f"<line x1='{left}' x2='{w - right}' y1='{h - bottom}' y2='{h - bottom}' stroke='black'/>")
    for i, (name, color, pts) in enumerate(series):
        pts = sorted(pts)
        if not pts:
            continue
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        o.append(f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{path}'/>")
        for x, y in pts:
            o.append(f"<circle cx='{px(x):.1f}' cy='{py(y):.1f}' r='3' fill='{color}'/>")
        ly = top + 12 + 16 * i
        o.append(f"<line x1='{w - 330}' x2='{w - 310}' y1='{ly}' y2='{ly}' stroke='{color}' stroke-width='2'/>")
        o.append(f"<text x='{w - 305}' y='{ly + 4}'>{name}</text>")
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")
    print(out)


if __name__ == "__main__":
    main()
