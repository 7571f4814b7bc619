#!/usr/bin/env python3
"""Checks for the PromQL in deploy/ (run by e2e/check-deploy.sh).

  check-exprs.py rules DASHBOARD.json OUT.yml   write every panel query of the dashboard as a recording rule,
                                                 so that `promtool check rules OUT.yml` parses each one
  check-exprs.py names FILE...                   every aether_replicator_* metric named in FILE is one the
                                                 replicator exports (notes/config-format.md); catches typos
"""
import json
import re
import sys

# Grafana's variables, replaced by values that keep the expression valid PromQL.
SUBSTITUTIONS = [
    (r"\$__rate_interval|\$\{__rate_interval\}", "1m"),
    (r"\$__interval|\$\{__interval\}", "1m"),
    (r"\$__range|\$\{__range\}", "1h"),
    (r"\$\{?region\}?", ".*"),
]

KNOWN = {
    # per peer
    "source_revision", "applied_revision", "lag_revisions", "apply_latency_seconds",
    "events_applied_total", "txns_applied_total", "bytes_applied_total", "errors_total",
    "keepalive_success_total", "keepalive_failure_total", "keepalive_age_seconds", "lease_remaining_seconds", "lease_granted_ttl_seconds",
    "resyncs_total", "split_revisions_total", "sync_keys_put_total", "sync_keys_deleted_total",
    "peer_up", "peer_synced", "peer_staleness_seconds", "peer_lapsed", "lapses_total", "conflicts_total",
    "peer_conflicted", "verify_skipped_total",
    "verify_runs_total", "verify_repairs_total", "verify_unchanged_total", "peer_txn_ops_limit", "peer_request_bytes_limit",
    "window_txns", "window_bytes", "rtt_seconds",
    # per replica
    "is_leader", "build_info", "reloads_total", "reload_failures_total",
    "certificate_expiry_timestamp_seconds",
    # incoming copies
    "origin_copy_present", "origin_lease_remaining_seconds", "origin_staleness_seconds",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def cmd_rules(dashboard, out):
    with open(dashboard) as f:
        dash = json.load(f)
    rules = []
    for p in panels(dash["panels"]):
        for t in p.get("targets", []):
            expr = t.get("expr")
            if not expr:
                continue
            for pattern, value in SUBSTITUTIONS:
                expr = re.sub(pattern, value, expr)
            if "$" in expr:
                sys.exit(f"panel {p['title']!r} {t['refId']}: unknown variable in {expr!r}")
            rules.append({"record": f"dashboard:panel_{p['id']}_{t['refId']}", "expr": expr})
    if not rules:
        sys.exit(f"{dashboard}: no expressions found")
    # JSON is YAML: promtool reads it as a rules file.
    with open(out, "w") as f:
        json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, indent=1)
    print(f"{len(rules)} expressions from {dashboard}")


def cmd_names(files):
    bad = []
    for path in files:
        with open(path) as f:
            text = f.read()
        for name in sorted(set(re.findall(r"\baether_replicator_([a-z0-9_]+)", text))):
            base = name
            for suffix in HISTOGRAM_SUFFIXES:
                if name.endswith(suffix) and name[: -len(suffix)] in KNOWN:
                    base = name[: -len(suffix)]
            if base not in KNOWN:
                bad.append(f"{path}: aether_replicator_{name} is not a metric the replicator exports")
    if bad:
        sys.exit("\n".join(bad))
    print(f"metric names ok in {len(files)} files")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "rules":
        cmd_rules(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "names":
        cmd_names(sys.argv[2:])
    else:
        sys.exit(__doc__)
