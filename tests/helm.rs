//! The Helm chart deploy/helm/aether-replicator, rendered and checked with the real helm: `HELM_BIN`, else
//! the directory e2e/install-helm.sh installs into; without it every test fails with the install command.
//!
//! - `helm lint --strict` passes on the defaults and on each values file under the chart's ci/;
//! - for meshes of 2, 3 and 5 regions, `helm template` with each region's values.yaml (written by
//!   deploy/gen-overlays.sh next to the region's kustomize overlay) passes the checks the overlays get
//!   (tests/common/manifests.rs: selectors, probes, every mount against a setting of config.toml,
//!   `--check-config` on the container), and is the overlay's objects but for metadata and the names
//!   kustomize hashes: a Helm region and a kustomize region cannot differ;
//! - every setting the chart takes is a flag of the binary, and all of them set pass `--check-config`;
//! - bad values fail at render (= install) with a message naming the value;
//! - deploy/kubernetes/base is the chart's render (deploy/helm/sync.sh --check), and the check catches a
//!   change on either side.
//!
//! e2e/check-deploy.sh validates the same renders against Kubernetes 1.27's schemas.

mod common;
#[path = "common/manifests.rs"]
mod manifests;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use manifests::*;
use serde_json::Value;

const CHART: &str = "deploy/helm/aether-replicator";
/// The release name the generated values files' instructions install under.
const RELEASE: &str = "aether-replicator";

fn chart() -> PathBuf {
    repo().join(CHART)
}

/// The helm binary; a missing one fails the test with how to install it.
fn helm_bin() -> PathBuf {
    let path = std::env::var_os("HELM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache")
                });
            cache.join("aether-replicator/helm-v3.16.4/helm")
        });
    assert!(
        path.is_file(),
        "helm is missing ({}): install it with `bash e2e/install-helm.sh` (it prints the directory; \
         tests take $HELM_BIN, else that directory's helm)",
        path.display()
    );
    path
}

/// `helm ARGS...`: Ok(stdout) when it exits 0, else Err(stderr).
fn helm<S: AsRef<OsStr>>(args: &[S]) -> Result<String, String> {
    let out = Command::new(helm_bin())
        .args(args)
        .output()
        .expect("run helm");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm's output is UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `helm template` of the chart with `values` files and `--set-json` pairs.
fn template(values: &[&Path], set_json: &[&str]) -> Result<Vec<Value>, String> {
    let mut args: Vec<String> = vec![
        "template".into(),
        RELEASE.into(),
        chart().display().to_string(),
    ];
    for v in values {
        args.extend(["--values".into(), v.display().to_string()]);
    }
    for s in set_json {
        args.extend(["--set-json".into(), s.to_string()]);
    }
    helm(&args).map(|out| yaml_docs(&out))
}

fn ci_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(chart().join("ci"))
        .expect("the chart's ci/")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn lint_strict_passes_on_the_defaults_and_every_ci_values_file() {
    let ci = ci_values();
    assert!(
        ci.len() >= 2,
        "the chart's ci/ holds a values file per region of the two-region example: {ci:?}"
    );
    let chart = chart().display().to_string();
    let mut runs: Vec<Vec<String>> = vec![vec!["lint".into(), "--strict".into(), chart.clone()]];
    for f in &ci {
        runs.push(vec![
            "lint".into(),
            "--strict".into(),
            chart.clone(),
            "--values".into(),
            f.display().to_string(),
        ]);
    }
    for args in runs {
        if let Err(e) = helm(&args) {
            panic!("helm {} failed: {e}", args.join(" "));
        }
    }
}

/// A name kustomize's generators hashed (`aether-replicator-config-7h2m9tk8bd`), without the hash.
fn unhashed(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((head, hash))
            if name.starts_with("aether-replicator-")
                && hash.len() == 10
                && hash.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            head
        }
        _ => name,
    }
}

/// `v` with every string `f` maps, and without the object keys named `drop`. A `defaultMode` written
/// 0440 is the number Kubernetes reads (YAML 1.1's octal), not the string YAML 1.2 makes of it.
fn normalized(v: &Value, f: &dyn Fn(&str) -> String, drop: &str) -> Value {
    match v {
        Value::String(s) => Value::String(f(s)),
        Value::Array(a) => Value::Array(a.iter().map(|x| normalized(x, f, drop)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| k.as_str() != drop)
                .map(|(k, x)| match (k.as_str(), x) {
                    ("defaultMode", Value::String(mode)) => (
                        k.clone(),
                        Value::from(u64::from_str_radix(mode, 8).expect("an octal mode")),
                    ),
                    _ => (k.clone(), normalized(x, f, drop)),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// An object as the comparison sees it: without metadata (labels differ by design: Helm's own, the
/// release's instance), and a Deployment without its pod template's metadata (checked apart) and with
/// its volumes and mounts in name order (kustomize's patches put each peer's first).
fn comparable(o: &Value) -> Value {
    let mut o = o.clone();
    let obj = o.as_object_mut().expect("an object");
    obj.remove("metadata");
    if let Some(t) = obj
        .get_mut("spec")
        .and_then(|s| s.get_mut("template"))
        .and_then(Value::as_object_mut)
    {
        t.remove("metadata");
        let by_name = |list: Option<&mut Value>| {
            if let Some(Value::Array(items)) = list {
                items.sort_by(|a, b| s(&a["name"]).cmp(s(&b["name"])));
            }
        };
        let pod = t.get_mut("spec").expect("a pod spec");
        by_name(pod.get_mut("volumes"));
        for c in pod["containers"].as_array_mut().into_iter().flatten() {
            by_name(c.get_mut("volumeMounts"));
        }
    }
    o
}

/// Region `region` of the mesh under `root` (deploy/gen-overlays.sh's output): the Helm render of its
/// values.yaml passes the overlays' checks, and is its kustomize overlay's objects.
fn check_region(root: &Path, region: &str, regions: &[&str]) {
    let dir = root.join(format!("region-{region}"));
    let values = dir.join("values.yaml");
    let objects = template(&[&values], &[])
        .unwrap_or_else(|e| panic!("helm template with {}: {e}", values.display()));
    let overlay = kustomize(&dir);

    // The Secrets are the operator's (the values file says how to create them): the overlay's, which
    // kustomize generates from the same secrets/ files, under the names the values file gives.
    let mut render = Render { objects };
    for o in &overlay {
        if o["kind"] == "Secret" {
            let mut secret = o.clone();
            let name = unhashed(s(&o["metadata"]["name"])).to_owned();
            secret["metadata"]["name"] = Value::String(name);
            render.objects.push(secret);
        }
    }
    check_render(&render, region, &others(regions, region));

    let config = |objects: &[Value]| -> toml::Table {
        let cm = objects
            .iter()
            .find(|o| o["kind"] == "ConfigMap")
            .expect("a ConfigMap");
        toml::from_str(s(&cm["data"]["config.toml"])).expect("config.toml is TOML")
    };
    assert_eq!(
        config(&render.objects),
        config(&overlay),
        "region {region}: the chart's config.toml differs from the overlay's"
    );

    // Object by object, the overlay's with its hashed names made plain, the release's without the
    // instance label it adds to selectors.
    let kinds = |objects: &[Value]| -> BTreeSet<String> {
        objects
            .iter()
            .map(|o| s(&o["kind"]).to_owned())
            .filter(|k| k != "Namespace" && k != "Secret")
            .collect()
    };
    assert_eq!(
        kinds(&render.objects),
        kinds(&overlay),
        "region {region}: the kinds of objects"
    );
    let plain = |s: &str| s.to_owned();
    let unhash = |s: &str| unhashed(s).to_owned();
    for kind in kinds(&overlay) {
        let from_helm = render.one(&kind);
        let from_kustomize = overlay
            .iter()
            .find(|o| o["kind"] == kind.as_str())
            .expect("the kind is there");
        if kind == "ConfigMap" {
            continue; // compared parsed above; the comments differ
        }
        assert_eq!(
            normalized(&comparable(from_helm), &plain, "app.kubernetes.io/instance"),
            normalized(&comparable(from_kustomize), &unhash, ""),
            "region {region}: the chart's {kind} differs from the overlay's"
        );
    }
    // The release's pods carry every label the overlay's do (the ServiceMonitor's `region` among them).
    let pod_labels = |d: &Value| labels(&d["spec"]["template"]["metadata"]["labels"]);
    let release = pod_labels(render.one("Deployment"));
    for (k, v) in pod_labels(
        overlay
            .iter()
            .find(|o| o["kind"] == "Deployment")
            .expect("a Deployment"),
    ) {
        assert_eq!(release.get(&k), Some(&v), "region {region}: pod label {k}");
    }
}

fn check_helm_mesh(root: &Path, regions: &[&str]) {
    for region in regions {
        check_region(root, region, regions);
    }
}

#[test]
fn two_region_example_values_render_the_example_overlays() {
    check_helm_mesh(&example_dir("two-region"), &["a", "b"]);
}

#[test]
fn three_region_example_values_render_the_example_overlays() {
    check_helm_mesh(&example_dir("three-region"), &["a", "b", "c"]);
}

#[test]
fn generated_five_region_values_render_the_generated_overlays() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let regions = ["r1", "r2", "r3", "r4", "r5"];
    generate(tmp.path(), &regions);
    check_helm_mesh(tmp.path(), &regions);
}

/// The comparison above is not vacuous: a release that differs from the overlay fails it.
#[test]
fn a_release_that_differs_from_its_overlay_fails_the_comparison() {
    let cases: &[(&str, &str, &str)] = &[
        // A setting only the release has: config.toml differs.
        (
            "settings:\n  leaseTtlSeconds: 60\n",
            "a",
            "the chart's config.toml differs",
        ),
        // The same config, a different pod.
        (
            "image:\n  pullPolicy: Always\n",
            "a",
            "the chart's Deployment differs",
        ),
        (
            "serviceMonitor:\n  interval: 30s\n",
            "b",
            "the chart's ServiceMonitor differs",
        ),
    ];
    for (extra, region, expected) in cases {
        let tmp = tempfile::tempdir().expect("temp dir");
        generate(tmp.path(), &["a", "b"]);
        let values = tmp.path().join(format!("region-{region}/values.yaml"));
        let mut text = fs::read_to_string(&values).expect("values.yaml");
        text.push_str(extra);
        fs::write(&values, text).expect("write values.yaml");
        let msg = panic_message(|| check_region(tmp.path(), region, &["a", "b"]));
        assert!(
            msg.contains(expected),
            "{extra:?}: expected {expected:?}, got {msg}"
        );
    }
}

/// The chart's `settings`, from values.schema.json.
fn schema_settings() -> Vec<String> {
    let schema: Value = serde_json::from_str(
        &fs::read_to_string(chart().join("values.schema.json")).expect("values.schema.json"),
    )
    .expect("values.schema.json is JSON");
    schema["properties"]["settings"]["properties"]
        .as_object()
        .expect("settings' properties")
        .keys()
        .cloned()
        .collect()
}

/// A setting's flag: `maxTxnOps` is --max-txn-ops, and the TTLs, given in seconds, --lease-ttl and
/// --election-ttl.
fn flag_of(setting: &str) -> String {
    let mut flag = String::from("--");
    for c in setting.trim_end_matches("Seconds").chars() {
        if c.is_ascii_uppercase() {
            flag.push('-');
        }
        flag.push(c.to_ascii_lowercase());
    }
    flag
}

#[test]
fn every_setting_the_chart_takes_is_a_flag_of_the_binary() {
    let out = Command::new(env!("CARGO_BIN_EXE_aether-replicator"))
        .arg("--help")
        .output()
        .expect("run aether-replicator --help");
    let help = String::from_utf8_lossy(&out.stdout);
    let settings = schema_settings();
    assert!(settings.len() >= 10, "settings: {settings:?}");
    for setting in &settings {
        let flag = flag_of(setting);
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{flag} "))),
            "settings.{setting}: the binary has no {flag}"
        );
    }
}

/// Every setting set (ci/tuned-values.yaml), and a peer with limits of its own: the config passes
/// `--check-config`, with each setting under its file key.
#[test]
fn every_setting_set_passes_check_config() {
    let tuned = chart().join("ci/tuned-values.yaml");
    let values = yaml_file(&tuned);
    let set: BTreeSet<&String> = values["settings"]
        .as_object()
        .expect("settings")
        .keys()
        .collect();
    for setting in schema_settings() {
        assert!(
            set.contains(&setting),
            "{} does not set settings.{setting}",
            tuned.display()
        );
    }
    let objects = template(&[&tuned], &[]).unwrap_or_else(|e| panic!("helm template: {e}"));
    let mut render = Render { objects };
    // The Secrets the values name, with the keys the chart's README gives them.
    for (name, keys) in [
        (
            "aether-replicator-local-etcd-tls",
            &["ca.crt", "tls.crt", "tls.key"][..],
        ),
        ("aether-replicator-local-etcd-auth", &["password"][..]),
        (
            "aether-replicator-peer-b-tls",
            &["ca.crt", "tls.crt", "tls.key"][..],
        ),
        ("aether-replicator-peer-b-auth", &["password"][..]),
    ] {
        let data: serde_json::Map<String, Value> = keys
            .iter()
            .map(|k| (k.to_string(), Value::from("")))
            .collect();
        render.objects.push(serde_json::json!({
            "kind": "Secret", "metadata": {"name": name}, "data": data
        }));
    }
    check_render(&render, "a", &["b"]);
    let cm = render.one("ConfigMap");
    let config: toml::Table = toml::from_str(s(&cm["data"]["config.toml"])).expect("TOML");
    for setting in schema_settings() {
        let key = flag_of(&setting)[2..].replace('-', "_");
        assert!(config.contains_key(&key), "config.toml has no {key}");
    }
    assert_eq!(config["peers"]["b"]["max_txn_ops"].as_integer(), Some(64));
}

#[test]
fn monitoring_objects_are_switched_by_values() {
    let ci = chart().join("ci/region-a-values.yaml");
    let kinds = |set: &[&str]| -> BTreeSet<String> {
        template(&[&ci], set)
            .unwrap_or_else(|e| panic!("helm template {set:?}: {e}"))
            .iter()
            .map(|o| s(&o["kind"]).to_owned())
            .collect()
    };
    let all = kinds(&[]);
    assert!(all.contains("ServiceMonitor") && all.contains("PrometheusRule"));
    let off = kinds(&[
        "serviceMonitor.enabled=false",
        "prometheusRule.enabled=false",
    ]);
    let expected: BTreeSet<String> = all
        .into_iter()
        .filter(|k| k != "ServiceMonitor" && k != "PrometheusRule")
        .collect();
    assert_eq!(off, expected);
}

/// Bad values fail `helm template` (as they fail `helm install`) with a message naming the value: the
/// schema's, or the chart's own for what a schema cannot say.
#[test]
fn bad_values_are_refused_with_a_message_naming_the_value() {
    let ci = chart().join("ci/region-a-values.yaml");
    template(&[&ci], &[]).unwrap_or_else(|e| panic!("{} itself fails: {e}", ci.display()));
    // (values over ci/region-a-values.yaml, what the error must say)
    let cases: &[(&str, &str)] = &[
        // A peer without endpoints, or with none in the list.
        (
            "peers:\n  c:\n    username: aether-replicator-a\n",
            "peers.c: endpoints is required",
        ),
        (
            "peers:\n  c:\n    endpoints: []\n",
            "peers.c.endpoints: Array must have at least 1 items",
        ),
        // A region name with '/', in the region and as a peer.
        ("region: eu/west\n", "- region: Does not match pattern"),
        (
            "peers:\n  eu/west:\n    endpoints: [\"https://etcd.eu-west.example.net:2379\"]\n",
            "peers: Property name of \"eu/west\" does not match",
        ),
        // A TTL below the minimum.
        (
            "settings:\n  leaseTtlSeconds: 3\n",
            "settings.leaseTtlSeconds: Must be greater than or equal to 4",
        ),
        (
            "settings:\n  electionTtlSeconds: 1\n",
            "settings.electionTtlSeconds: Must be greater than or equal to 2",
        ),
        (
            "settings:\n  electionTtlSeconds: 16\n",
            "settings.electionTtlSeconds: 16 is more than half of settings.leaseTtlSeconds (30)",
        ),
        (
            "settings:\n  leaseTtl: 30s\n",
            "settings: Additional property leaseTtl is not allowed",
        ),
        (
            "settings:\n  verifyInterval: 10\n",
            "settings.verifyInterval: Invalid type",
        ),
        ("region: \"\"\n", "region: required"),
        (
            "peers:\n  a:\n    endpoints: [\"https://etcd.region-a.example.net:2379\"]\n",
            "peers.a: region a cannot be its own peer",
        ),
    ];
    for (bad, expected) in cases {
        let tmp = tempfile::tempdir().expect("temp dir");
        let file = tmp.path().join("bad-values.yaml");
        fs::write(&file, bad).expect("write the values");
        match template(&[&ci, &file], &[]) {
            Ok(_) => panic!("{bad:?}: helm template passed"),
            Err(e) => assert!(
                e.contains(expected),
                "{bad:?}: expected {expected:?} in {e}"
            ),
        }
    }
}

/// `deploy/helm/sync.sh ARGS` in the tree `root`: (exit code, stderr).
fn sync(root: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new("bash")
        .arg(root.join("deploy/helm/sync.sh"))
        .args(args)
        .env("HELM_BIN", helm_bin())
        .output()
        .expect("run deploy/helm/sync.sh");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// deploy/kubernetes/base (but its PrometheusRule), the chart's copy of the rules and its ci/ region
/// values are what deploy/helm/sync.sh derives.
#[test]
fn the_kustomize_base_is_the_charts_render() {
    let (code, stderr) = sync(&repo(), &["--check"]);
    assert_eq!(
        code,
        Some(0),
        "the chart and what derives from it differ: run deploy/helm/sync.sh\n{stderr}"
    );
}

/// ... and the check catches a change to either side.
#[test]
fn the_sync_check_catches_a_change_on_either_side() {
    let tmp = tempfile::tempdir().expect("temp dir");
    for dir in [
        "deploy/helm",
        "deploy/kubernetes/base",
        "deploy/kubernetes/examples/two-region",
        "deploy/prometheus",
    ] {
        let to = tmp.path().join(dir);
        fs::create_dir_all(to.parent().expect("a parent")).expect("mkdir");
        let status = Command::new("cp")
            .arg("-R")
            .arg(repo().join(dir))
            .arg(&to)
            .status()
            .expect("cp");
        assert!(status.success(), "cp -R {dir}");
    }
    assert_eq!(sync(tmp.path(), &["--check"]).0, Some(0), "a fresh copy");
    // (file, text, replacement, the file the diff names)
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "deploy/helm/aether-replicator/templates/service.yaml",
            "publishNotReadyAddresses: true",
            "publishNotReadyAddresses: false",
            "deploy/kubernetes/base/service.yaml",
        ),
        (
            "deploy/kubernetes/base/deployment.yaml",
            "maxSurge: 0",
            "maxSurge: 1",
            "deploy/kubernetes/base/deployment.yaml",
        ),
        (
            "deploy/prometheus/aether-replicator.rules.yml",
            "for: 10m",
            "for: 20m",
            "files/aether-replicator.rules.yml",
        ),
        (
            "deploy/kubernetes/examples/two-region/region-b/values.yaml",
            "username: aether-replicator-b",
            "username: mirror-b",
            "ci/region-b-values.yaml",
        ),
    ];
    for (file, from, to, named) in cases {
        let path = tmp.path().join(file);
        let original = fs::read_to_string(&path).expect("read");
        assert!(original.contains(from), "{file} has no {from:?}");
        fs::write(&path, original.replacen(from, to, 1)).expect("write");
        let (code, stderr) = sync(tmp.path(), &["--check"]);
        assert_eq!(code, Some(1), "{file}: --check passed the edit: {stderr}");
        assert!(
            stderr.contains(named),
            "{file}: expected {named} in {stderr}"
        );
        fs::write(&path, original).expect("restore");
    }
    // A values file in ci/ for a region the example does not have.
    let extra = tmp
        .path()
        .join("deploy/helm/aether-replicator/ci/region-c-values.yaml");
    fs::write(&extra, "region: c\n").expect("write");
    let (code, stderr) = sync(tmp.path(), &["--check"]);
    assert_eq!(code, Some(1), "an extra ci/ file: {stderr}");
    assert!(stderr.contains("region-c-values.yaml"), "{stderr}");
}
