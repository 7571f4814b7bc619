//! The manual cannot drift from the binary: the configuration reference
//! lists exactly the flags clap defines, the metrics reference exactly the
//! series `/metrics` serves, every alert of the rules file is documented,
//! and every one-machine example in the README and docs/ runs (trycmd).
//!
//! Links, tracker numbers and paths are checked by `e2e/check-docs.py`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use aether_replicator::app::certs::FileExpiry;
use aether_replicator::app::config::Cli;
use aether_replicator::app::incoming::{LeaseLookup, OriginStatus};
use aether_replicator::app::metrics::{AppState, registry, render};
use aether_replicator::etcd::LeaseId;
use aether_replicator::mirror::state::State;
use aether_replicator::mirror::stats::PeerStats;

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `--flags` in the first cell of each table row of `text`, with the
/// row's text, by the `## ` section they are under.
fn documented_flags(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = h.trim().to_string();
            out.entry(section.clone()).or_default();
            continue;
        }
        let Some(row) = line.strip_prefix("| ") else {
            continue;
        };
        let first = row.split(" |").next().unwrap_or("");
        for word in first.split(|c: char| c == '`' || c.is_whitespace() || c == ',') {
            if let Some(name) = word.strip_prefix("--")
                && !name.is_empty()
                && name.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            {
                out.entry(section.clone())
                    .or_default()
                    .insert(name.to_string(), line.to_string());
            }
        }
    }
    out
}

/// Long flags of `cmd` as `--help` shows them (not hidden, not clap's own
/// help and version), with their environment variable.
fn flags(cmd: &clap::Command) -> BTreeMap<String, Option<String>> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let long = a.get_long()?;
            if matches!(long, "help" | "version") {
                return None;
            }
            let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            Some((long.to_string(), env))
        })
        .collect()
}

/// (a) docs/configuration.md has a `## ` section per command, headed
/// "`aether-replicator`" for a plain run and "`aether-replicator <sub>`"
/// for each subcommand, whose tables list exactly the command's flags, each
/// row naming the flag's environment variable. A subcommand that takes a
/// run's flags (it has `--config`) lists only its own; the run's are in
/// the run's section.
#[test]
fn the_configuration_reference_lists_exactly_the_binarys_flags() {
    let doc = documented_flags(&read("docs/configuration.md"));
    let cli = Cli::command_line();
    let top = flags(&cli);
    let mut problems = Vec::new();
    let mut check = |section: &str, want: &BTreeMap<String, Option<String>>| {
        let Some(have) = doc.get(section) else {
            problems.push(format!("no section \"## {section}\""));
            return;
        };
        for (flag, env) in want {
            match have.get(flag) {
                None => problems.push(format!("{section}: --{flag} is not documented")),
                Some(row) => {
                    if let Some(env) = env
                        && !row.contains(env.as_str())
                    {
                        problems.push(format!("{section}: --{flag}'s row does not name {env}"));
                    }
                }
            }
        }
        for flag in have.keys() {
            if !want.contains_key(flag) {
                problems.push(format!("{section}: --{flag} is documented but not a flag"));
            }
        }
    };
    check("`aether-replicator`", &top);
    for sub in cli.get_subcommands() {
        let name = sub.get_name();
        if name == "help" {
            continue;
        }
        let mut own = flags(sub);
        if own.contains_key("config") {
            own.retain(|flag, _| !top.contains_key(flag));
        }
        check(&format!("`aether-replicator {name}`"), &own);
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md and the binary's flags differ:\n{}",
        problems.join("\n")
    );
}

/// Every series `/metrics` can serve: one peer, one incoming origin, one
/// reload and one certificate, so that no family is left out for want of
/// rows. Name -> type, as the text format's `# TYPE` lines give them, with
/// the suffix a reader queries a counter by (`_total`).
fn served_metrics() -> BTreeMap<String, String> {
    let state = AppState::default();
    state.region.set("a".to_string()).unwrap();
    let peer = PeerStats::new("b");
    peer.events.store(1, Relaxed);
    state.peers.lock().unwrap().push(Arc::new(peer));
    state.reloads.add("b");
    state.reloads.fail("b");
    state.reloads.set_expiry(
        "b",
        &[FileExpiry {
            file: "/etc/aether/peers/b/tls.crt".to_string(),
            not_after: 2_000_000_000,
        }],
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    state.incoming.send_replace(BTreeMap::from([(
        "c".to_string(),
        OriginStatus {
            present: true,
            state: Some(State {
                revision: 1,
                lease: LeaseId::NONE,
                holder: 1,
                source_cluster: 0,
                source_id: 0,
                heartbeat_unix_ms: now - 1000,
                synced: true,
                lease_ttl: 30,
            }),
            lease: LeaseId::NONE,
            ttl: Some(LeaseLookup {
                left: std::time::Duration::from_secs(20),
                granted: std::time::Duration::from_secs(30),
                at: std::time::Instant::now(),
            }),
        },
    )]));
    let text = render(&registry(Arc::new(state)));
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').expect("# TYPE name kind");
            // The text format names a counter's family with its `_total`;
            // not every encoder does, so add it where it is missing.
            let name = match kind {
                "counter" if !name.ends_with("_total") => format!("{name}_total"),
                _ => name.to_string(),
            };
            (name, kind.to_string())
        })
        .collect()
}

/// (b) docs/metrics.md lists exactly the series served, with their types:
/// a table row per metric, the name in backticks in the first cell and the
/// type in the second.
#[test]
fn the_metrics_reference_lists_exactly_the_metrics_served() {
    let served = served_metrics();
    assert!(
        served.len() > 40,
        "too few metrics rendered, the fixture is missing rows: {served:?}"
    );
    let doc = read("docs/metrics.md");
    let mut documented = BTreeMap::new();
    for line in doc.lines() {
        let Some(row) = line.strip_prefix("| `") else {
            continue;
        };
        let mut cells = row.split(" | ");
        let name = cells.next().unwrap_or("").trim_end_matches('`');
        let name = name.split('{').next().unwrap_or(name);
        if name.starts_with("aether_replicator_") || name.starts_with("process_") {
            let kind = cells.next().unwrap_or("").trim().to_string();
            documented.insert(name.to_string(), kind);
        }
    }
    let mut problems = Vec::new();
    for (name, kind) in &served {
        match documented.get(name) {
            None => problems.push(format!("{name} ({kind}) is served but not documented")),
            Some(k) if k != kind => {
                problems.push(format!("{name} is a {kind}, documented as {k:?}"))
            }
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !served.contains_key(name) {
            problems.push(format!("{name} is documented but not served"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/metrics.md and /metrics differ:\n{}",
        problems.join("\n")
    );
}

/// (c) Every alert of the rules file has a row in docs/metrics.md and a
/// section in docs/runbook.md; and if the README names any alert, it names
/// them all.
#[test]
fn every_alert_is_documented() {
    let rules = read("deploy/prometheus/aether-replicator.rules.yml");
    let alerts: BTreeSet<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::trim)
        .collect();
    assert_eq!(alerts.len(), 16, "alerts in the rules file: {alerts:?}");
    let metrics = read("docs/metrics.md");
    let runbook = read("docs/runbook.md");
    let readme = read("README.md");
    let mut problems = Vec::new();
    for alert in &alerts {
        if !metrics.contains(&format!("| `{alert}` |")) {
            problems.push(format!("docs/metrics.md has no row for {alert}"));
        }
        if !runbook.lines().any(|l| l.trim() == format!("## {alert}")) {
            problems.push(format!("docs/runbook.md has no section ## {alert}"));
        }
        if readme.contains("AetherReplicator") && !readme.contains(alert) {
            problems.push(format!("README.md names alerts but not {alert}"));
        }
    }
    let documented: BTreeSet<String> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("| `AetherReplicator"))
        .filter_map(|l| l.split('`').next())
        .map(|rest| format!("AetherReplicator{rest}"))
        .collect();
    for d in &documented {
        if !alerts.contains(d.as_str()) {
            problems.push(format!(
                "docs/metrics.md lists {d}, which the rules file lacks"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// (d) The ```console examples of the README and docs/ run against the
/// binary, from the repository's root, and print what they show (`[..]`
/// matches within a line, a line of `...` any lines). Blocks that need a
/// cluster are ```sh, not run. After a deliberate change of the output:
/// `TRYCMD=overwrite cargo test --test docs`.
#[test]
fn the_console_examples_run() {
    trycmd::TestCases::new()
        // Cargo builds the binary for an integration test and names it here.
        .register_bin(
            "aether-replicator",
            std::path::Path::new(env!("CARGO_BIN_EXE_aether-replicator")),
        )
        .case("README.md")
        .case("docs/*.md");
}
