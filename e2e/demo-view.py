"""One region's part of the demo's view, from `aether-replicator endpoints
--output json` on stdin (the product's own view of that region's etcd):

  python3 e2e/demo-view.py REGIONS NEWEST < endpoints.json

prints each origin region's copy (kind, synced, staleness in seconds,
endpoints), a region without a copy here as `none`, then the NEWEST keys
written most recently into this etcd (highest mod revision first), so a key
put by hand is seen arriving. Input that is not JSON (the command failed)
is shown as its last line.
"""

import json
import sys


def table(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("    " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def main():
    regions, newest = sys.argv[1].split(), int(sys.argv[2])
    text = sys.stdin.read()
    try:
        doc = json.loads(text)
    except ValueError:
        lines = text.strip().splitlines() or ["no output"]
        print("    aether-replicator endpoints: " + lines[-1])
        return
    rows = [("ORIGIN", "KIND", "SYNCED", "STALENESS", "ENDPOINTS")]
    listed = set()
    for o in doc["origins"]:
        listed.add(o["region"])
        s = o["staleness_seconds"]
        rows.append((o["region"], o["kind"], "yes" if o["synced"] else "no",
                     "unknown" if s is None else "%.1fs" % s, str(o["endpoints"])))
    rows += [(r, "none", "-", "-", "0") for r in regions if r not in listed]
    table(rows)
    print("  newest keys here:")
    rows = [("REV", "ORIGIN", "SERVICE/PROTOCOL", "IP:PORT", "ZONE")]
    for e in sorted(doc["endpoints"], key=lambda e: -e["mod_revision"])[:newest]:
        value = e["value"] if isinstance(e["value"], dict) else {}
        rows.append((str(e["mod_revision"]), e["region"], e["service"] + "/" + e["protocol"],
                     "%s:%s" % (e["ip"], value.get("port", "?")), e["zone"] or "-"))
    table(rows)


main()
