//! The deployment artefacts under `deploy/`: each Kubernetes overlay is rendered with `kubectl kustomize`
//! and its objects are checked against each other (selectors, ports, probes, mounts, references), and the
//! container's arguments, environment and config.toml must pass the replicator's own `--check-config`
//! with the mounted files replaced by generated ones. The PrometheusRule must carry exactly the rules
//! file, every alert must have a runbook section and promtool unit tests firing and not firing.
//!
//! The overlays are `deploy/gen-overlays.sh`'s output: the checked-in examples must be exactly what it
//! writes, and what it writes for three and five regions (into a temp dir) passes the same checks, as a
//! mesh: every region's peers are the others' own etcds, one user per origin on each etcd. The checks
//! must catch a hand-edited overlay, and the generator must refuse bad region lists.
//!
//! The checks of one region's objects are tests/common/manifests.rs's, which tests/helm.rs runs on the
//! Helm chart's renders.
//!
//! `e2e/check-deploy.sh` runs promtool on the rules, their tests and the dashboard's expressions.

mod common;
#[path = "common/manifests.rs"]
mod manifests;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use manifests::*;
use serde_json::Value;

/// The checked-in examples under deploy/kubernetes/examples/: (directory, the regions
/// deploy/gen-overlays.sh was given, in order).
const EXAMPLES: [(&str, &[&str]); 2] = [
    ("two-region", &["a", "b"]),
    ("three-region", &["a", "b", "c"]),
];

/// The overlays under `root` (region-R for each of `regions`, nothing else) as one mesh: each region's
/// peers are exactly the other regions, each pointing at that region's own etcd, and on every etcd each
/// origin has a user of its own; then every overlay on its own (`check_overlay`).
fn check_mesh(root: &Path, regions: &[&str]) {
    let dirs: BTreeSet<String> = fs::read_dir(root)
        .unwrap_or_else(|e| panic!("read {}: {e}", root.display()))
        .map(|e| {
            e.expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let expected: BTreeSet<String> = regions.iter().map(|r| format!("region-{r}")).collect();
    assert_eq!(dirs, expected, "{}: one overlay per region", root.display());
    let configs: BTreeMap<&str, toml::Table> = regions
        .iter()
        .map(|r| (*r, read_config(&root.join(format!("region-{r}")))))
        .collect();
    for (region, config) in &configs {
        for peer in others(regions, region) {
            assert_eq!(
                config["peers"][peer]["endpoints"], configs[peer]["local"]["endpoints"],
                "region {region}'s [peers.{peer}] endpoints are not region {peer}'s own etcd"
            );
        }
    }
    // On region P's etcd: P's own replicator's user, and one per origin mirroring into it.
    for (peer, config) in &configs {
        let mut users = BTreeMap::new();
        users.insert(toml_str(&config["local"]["username"]).to_owned(), *peer);
        for origin in others(regions, peer) {
            let user = toml_str(&configs[origin]["peers"][*peer]["username"]);
            if let Some(other) = users.insert(user.to_owned(), origin) {
                panic!(
                    "regions {other} and {origin} both use the user {user:?} on region {peer}'s etcd"
                );
            }
        }
    }
    for region in regions {
        check_overlay(
            &root.join(format!("region-{region}")),
            region,
            &others(regions, region),
        );
    }
}

fn check_overlay(dir: &Path, region: &str, expected_peers: &[&str]) {
    let render = Render {
        objects: kustomize(dir),
    };
    let namespace = format!("aether-{region}");
    for o in &render.objects {
        if o["kind"] != "Namespace" {
            assert_eq!(
                o["metadata"]["namespace"], namespace,
                "{} {} is not in {namespace}",
                o["kind"], o["metadata"]["name"]
            );
        }
    }

    check_render(&render, region, expected_peers);
}

#[test]
fn two_region_example_renders_a_consistent_mesh_that_passes_check_config() {
    let (name, regions) = EXAMPLES[0];
    check_mesh(&example_dir(name), regions);
}

#[test]
fn three_region_example_renders_a_consistent_mesh_that_passes_check_config() {
    let (name, regions) = EXAMPLES[1];
    check_mesh(&example_dir(name), regions);
}

#[test]
fn generated_three_regions_render_a_consistent_mesh_that_passes_check_config() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let regions = ["eu-west", "us-east", "ap-south-1"];
    generate(tmp.path(), &regions);
    check_mesh(tmp.path(), &regions);
}

#[test]
fn generated_five_regions_render_a_consistent_mesh_that_passes_check_config() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let regions = ["r1", "r2", "r3", "r4", "r5"];
    generate(tmp.path(), &regions);
    check_mesh(tmp.path(), &regions);
}

/// The checked-in examples are exactly what deploy/gen-overlays.sh writes (its --check: `diff -r`).
#[test]
fn the_examples_are_exactly_what_the_generator_writes() {
    for (name, regions) in EXAMPLES {
        let dir = example_dir(name);
        let mut args = vec![
            "--check".to_owned(),
            "--out".to_owned(),
            dir.display().to_string(),
        ];
        args.extend(regions.iter().map(|r| r.to_string()));
        let (code, stdout, stderr) = gen_overlays(&args);
        assert_eq!(
            code,
            Some(0),
            "{} is not what `deploy/gen-overlays.sh {}` writes: regenerate it with \
             `deploy/gen-overlays.sh --force --out deploy/kubernetes/examples/{name} {}`\n{stdout}{stderr}",
            dir.display(),
            regions.join(" "),
            regions.join(" ")
        );
    }
}

/// --check fails on an edited file and on an extra one (what the test above relies on).
#[test]
fn the_generators_check_catches_an_edited_or_extra_file() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().display().to_string();
    generate(tmp.path(), &["a", "b", "c"]);
    let check = || gen_overlays(&["--check", "--out", &out, "a", "b", "c"]);
    assert_eq!(check().0, Some(0), "fresh output passes --check");

    let edited = tmp.path().join("region-b/peer-c.yaml");
    let original = fs::read_to_string(&edited).expect("peer-c.yaml");
    fs::write(
        &edited,
        original.replace("readOnly: true", "readOnly: false"),
    )
    .expect("edit");
    let (code, _, stderr) = check();
    assert_eq!(code, Some(1), "--check passed an edited file: {stderr}");
    assert!(stderr.contains("peer-c.yaml"), "{stderr}");
    fs::write(&edited, original).expect("restore");

    fs::write(tmp.path().join("region-a/extra.yaml"), "{}\n").expect("extra file");
    let (code, _, stderr) = check();
    assert_eq!(code, Some(1), "--check passed an extra file: {stderr}");
    assert!(stderr.contains("extra.yaml"), "{stderr}");
}

/// Bad region lists: a one-line error naming the problem, exit 2, nothing written.
#[test]
fn the_generator_refuses_bad_region_lists() {
    let long = "r".repeat(57);
    let cases: &[(&[&str], &str)] = &[
        (&["a"], "at least two regions"),
        (&[], "at least two regions"),
        (&["a", "b", "a"], "region \"a\" is given twice"),
        (&["a", "b/c"], "region \"b/c\": must not contain '/'"),
        (&["a", ""], "region \"\": must not be empty"),
        (&["a", "B"], "region \"B\": must be lowercase letters"),
        (&["a", "b.c"], "region \"b.c\": must be lowercase"),
        (&["a", "b-"], "region \"b-\": must be lowercase"),
        (&["a", "--", "-b"], "region \"-b\": must be lowercase"),
        (&["a", &long], "at most 56 characters"),
        (&["a", "b", "--bogus"], "unknown option --bogus"),
    ];
    for (regions, expected) in cases {
        let tmp = tempfile::tempdir().expect("temp dir");
        let out = tmp.path().join("out");
        let mut args = vec!["--out".to_owned(), out.display().to_string()];
        args.extend(regions.iter().map(|r| r.to_string()));
        let (code, stdout, stderr) = gen_overlays(&args);
        assert_eq!(code, Some(2), "{regions:?}: exit code; {stdout}{stderr}");
        assert!(
            stderr.starts_with("error: ")
                && stderr.lines().count() == 1
                && stderr.contains(expected),
            "{regions:?}: expected one line `error: ...{expected}...`, got {stderr:?}"
        );
        assert!(!out.exists(), "{regions:?}: wrote {}", out.display());
    }
}

/// --force replaces a previous output, but never a file under secrets/ that is no longer a placeholder.
#[test]
fn the_generator_never_overwrites_a_real_secret() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().display().to_string();
    generate(tmp.path(), &["a", "b"]);
    let (code, _, stderr) = gen_overlays(&["--out", &out, "a", "b"]);
    assert_eq!(code, Some(2), "a second run without --force: {stderr}");
    let (code, _, stderr) = gen_overlays(&["--force", "--out", &out, "a", "b", "c"]);
    assert_eq!(code, Some(0), "--force over placeholders: {stderr}");
    assert!(tmp.path().join("region-c/peer-a.yaml").exists());

    let key = tmp.path().join("region-a/secrets/peer-b/tls.key");
    fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").expect("a real key");
    let (code, _, stderr) = gen_overlays(&["--force", "--out", &out, "a", "b"]);
    assert_eq!(code, Some(2), "--force over a real key: {stderr}");
    assert!(stderr.contains("tls.key"), "{stderr}");
    assert_eq!(
        fs::read_to_string(&key).expect("the key"),
        "-----BEGIN PRIVATE KEY-----\n"
    );
    assert!(tmp.path().join("region-c").exists(), "nothing replaced");
}

/// The checks are not vacuous: hand-edited overlays of a generated mesh fail them.
#[test]
fn the_checks_catch_a_hand_edited_overlay() {
    let regions = ["a", "b", "c"];
    // (file, text, its replacement, the overlay to check (None: the whole mesh), what the failure says)
    let cases: &[(&str, &str, &str, Option<&str>, &str)] = &[
        // Peer b's Secrets mounted where [peers.b] does not look.
        (
            "region-a/peer-b.yaml",
            "mountPath: /etc/aether/peers/b",
            "mountPath: /etc/aether/peers/x",
            Some("a"),
            "no volume is mounted at /etc/aether/peers/b",
        ),
        // A peer patch left out of the kustomization.
        (
            "region-b/kustomization.yaml",
            "  - path: peer-c.yaml\n",
            "",
            Some("b"),
            "no volume is mounted at /etc/aether/peers/c",
        ),
        // Two peers' tables reading one peer's Secret.
        (
            "region-c/config.toml",
            "key = \"/etc/aether/peers/b/tls.key\"",
            "key = \"/etc/aether/peers/a/tls.key\"",
            Some("c"),
            "also holds [peers.a]'s files",
        ),
        // A setting the binary refuses.
        (
            "region-a/config.toml",
            "lease_ttl = \"30s\"",
            "lease_ttl = \"30 parsecs\"",
            Some("a"),
            "fail the replicator's own validation",
        ),
        // A peer pointed at the wrong etcd.
        (
            "region-c/config.toml",
            "https://etcd.region-a.",
            "https://etcd.region-b.",
            None,
            "region c's [peers.a] endpoints are not region a's own etcd",
        ),
        // Two origins sharing a user on one etcd.
        (
            "region-c/config.toml",
            "username = \"aether-replicator-c\"",
            "username = \"aether-replicator-b\"",
            None,
            "both use the user \"aether-replicator-b\" on region a's etcd",
        ),
    ];
    for (file, from, to, overlay, expected) in cases {
        let tmp = tempfile::tempdir().expect("temp dir");
        generate(tmp.path(), &regions);
        let path = tmp.path().join(file);
        let text = fs::read_to_string(&path).expect("read");
        assert!(text.contains(from), "{file} has no {from:?}");
        fs::write(&path, text.replacen(from, to, 1)).expect("write");
        let msg = panic_message(|| match overlay {
            Some(r) => check_overlay(
                &tmp.path().join(format!("region-{r}")),
                r,
                &others(&regions, r),
            ),
            None => check_mesh(tmp.path(), &regions),
        });
        assert!(
            msg.contains(expected),
            "{file}: {from:?} -> {to:?}: expected {expected:?}, got {msg}"
        );
    }
}

/// The image reports its git revision: the Containerfile's REVISION build argument reaches build.rs as
/// AETHER_REPLICATOR_REVISION, since .git is not in the build context.
#[test]
fn the_containerfile_passes_the_revision_to_the_build() {
    let text = fs::read_to_string(repo().join("Containerfile")).expect("Containerfile");
    let stages: Vec<&str> = text.split("\nFROM ").skip(1).collect();
    let build = stages
        .iter()
        .find(|st| st.lines().any(|l| l.contains("cargo build")))
        .expect("a stage running cargo build");
    assert!(
        build
            .lines()
            .any(|l| l.trim_start().starts_with("ARG REVISION")),
        "the build stage declares ARG REVISION:\n{build}"
    );
    assert!(
        build.contains("AETHER_REPLICATOR_REVISION=\"$REVISION\" cargo build"),
        "cargo build runs with AETHER_REPLICATOR_REVISION=\"$REVISION\":\n{build}"
    );
    let ignore = fs::read_to_string(repo().join(".containerignore")).expect(".containerignore");
    assert!(
        ignore.lines().any(|l| l.trim() == ".git"),
        "if .git is in the build context again, build.rs can read it and REVISION is not needed"
    );
}

fn alerts() -> Vec<Value> {
    let rules = rules();
    arr(&rules["groups"])
        .iter()
        .flat_map(|g| arr(&g["rules"]).iter())
        .filter(|r| r["alert"].is_string())
        .cloned()
        .collect()
}

/// The committed PrometheusRule is the rules file (deploy/gen-prometheusrule.sh writes it).
#[test]
fn prometheusrule_carries_exactly_the_rules_file() {
    let pr = yaml_file(&repo().join("deploy/kubernetes/base/prometheusrule.yaml"));
    assert_eq!(pr["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pr["kind"], "PrometheusRule");
    assert_eq!(
        pr["spec"],
        rules(),
        "deploy/kubernetes/base/prometheusrule.yaml is out of date: run deploy/gen-prometheusrule.sh"
    );
}

/// Where the runbook_urls point: this repository's docs/runbook.md (Cargo.toml `repository`).
const RUNBOOK_BASE: &str = concat!(env!("CARGO_PKG_REPOSITORY"), "/blob/main/docs/runbook.md");

/// Every alert: a summary, a description and a runbook_url whose anchor is a section of
/// docs/runbook.md that says what it means and what to do.
#[test]
fn every_alert_has_a_summary_a_description_and_a_runbook_section() {
    let runbook = fs::read_to_string(repo().join("docs/runbook.md")).expect("docs/runbook.md");
    let sections: BTreeMap<String, &str> = runbook
        .split("\n## ")
        .skip(1)
        .map(|sec| {
            let (title, body) = sec.split_once('\n').unwrap_or((sec, ""));
            (title.trim().to_lowercase(), body)
        })
        .collect();
    let alerts = alerts();
    assert!(alerts.len() >= 10, "expected the full set of alerts");
    for alert in &alerts {
        let name = s(&alert["alert"]);
        let ann = &alert["annotations"];
        for k in ["summary", "description"] {
            assert!(
                ann[k].as_str().is_some_and(|t| t.len() > 10),
                "{name}: no {k}"
            );
        }
        // Absolute, so that Alertmanager can link it; the one base is in
        // deploy/gen-prometheusrule.sh, and points at this repository's runbook.
        let anchor = name.to_lowercase();
        assert_eq!(
            ann["runbook_url"],
            format!("{RUNBOOK_BASE}#{anchor}"),
            "{name}: runbook_url"
        );
        let body = sections
            .get(&anchor)
            .unwrap_or_else(|| panic!("docs/runbook.md has no section `## {name}`"));
        assert!(
            body.contains("**What it means.**") && body.contains("**What to do.**"),
            "docs/runbook.md `## {name}`: says what it means and what to do"
        );
    }
}

/// deploy/prometheus/tests.yml tests every alert both firing and not firing (promtool runs them in
/// e2e/check-deploy.sh).
#[test]
fn every_alert_has_promtool_tests_firing_and_not_firing() {
    let tests = yaml_file(&repo().join("deploy/prometheus/tests.yml"));
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for t in arr(&tests["tests"]) {
        for case in t["alert_rule_test"].as_array().into_iter().flatten() {
            let name = s(&case["alertname"]).to_owned();
            if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                firing.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    for alert in alerts() {
        let name = s(&alert["alert"]);
        assert!(
            firing.contains(name),
            "tests.yml never expects {name} to fire"
        );
        assert!(
            quiet.contains(name),
            "tests.yml never expects {name} to stay quiet"
        );
    }
}

/// The README's quick-start config is region a's config.toml of the example, so that it passes the
/// same `--check-config` as the manifests.
#[test]
fn the_readme_config_example_is_the_example_overlays_config() {
    let readme = fs::read_to_string(repo().join("README.md")).expect("README.md");
    let block = readme
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("a ```toml block in README.md");
    let from_readme: toml::Table = toml::from_str(block).expect("README's config is TOML");
    let from_overlay = read_config(&example_dir("two-region").join("region-a"));
    assert_eq!(
        from_readme, from_overlay,
        "README's quick-start config differs from deploy/kubernetes/examples/two-region/region-a/config.toml"
    );
}
