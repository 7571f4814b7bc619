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
//! `e2e/check-deploy.sh` runs promtool on the rules, their tests and the dashboard's expressions.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The checked-in examples under deploy/kubernetes/examples/: (directory, the regions
/// deploy/gen-overlays.sh was given, in order).
const EXAMPLES: [(&str, &[&str]); 2] = [
    ("two-region", &["a", "b"]),
    ("three-region", &["a", "b", "c"]),
];
/// What the test substitutes for the downward API's `status.podIP`.
const POD_IP: &str = "127.0.0.1";
/// ... and for `metadata.name`.
const POD_NAME: &str = "aether-replicator-5d9c7b6f4-x2x9q";
const CONFIG_KEY: &str = "config.toml";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn example_dir(name: &str) -> PathBuf {
    repo().join("deploy/kubernetes/examples").join(name)
}

/// `deploy/gen-overlays.sh ARGS...`: (exit code, stdout, stderr).
fn gen_overlays<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (Option<i32>, String, String) {
    let out = Command::new("bash")
        .arg(repo().join("deploy/gen-overlays.sh"))
        .args(args)
        .output()
        .expect("run bash deploy/gen-overlays.sh");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes the overlays of `regions` under `out` with the generator, which must succeed.
fn generate(out: &Path, regions: &[&str]) {
    let mut args = vec!["--out".to_owned(), out.display().to_string()];
    args.extend(regions.iter().map(|r| r.to_string()));
    let (code, stdout, stderr) = gen_overlays(&args);
    assert_eq!(
        code,
        Some(0),
        "deploy/gen-overlays.sh {}: {stdout}{stderr}",
        args.join(" ")
    );
}

fn others<'a>(regions: &[&'a str], region: &str) -> Vec<&'a str> {
    regions.iter().copied().filter(|r| *r != region).collect()
}

fn toml_str(v: &toml::Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v:?}"))
}

fn read_config(overlay: &Path) -> toml::Table {
    let path = overlay.join(CONFIG_KEY);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

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

/// `kubectl kustomize DIR`, parsed. A missing kubectl is a failure, with how to install it.
fn kustomize(dir: &Path) -> Vec<Value> {
    let out = match Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "kubectl is not installed (needed to render deploy/kubernetes): install it with \
             `curl -fsSLo /usr/local/bin/kubectl https://dl.k8s.io/release/v1.32.4/bin/linux/amd64/kubectl \
             && chmod +x /usr/local/bin/kubectl` or from https://kubernetes.io/docs/tasks/tools/"
        ),
        Err(e) => panic!("running kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_docs(&String::from_utf8(out.stdout).expect("kustomize output is UTF-8"))
}

fn yaml_docs(text: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("a YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

fn yaml_file(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut docs = yaml_docs(&text);
    assert_eq!(docs.len(), 1, "{}: one YAML document", path.display());
    docs.remove(0)
}

/// The rendered objects of one overlay, by kind and name.
struct Render {
    objects: Vec<Value>,
}

impl Render {
    fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let all = self.all(kind);
        assert_eq!(all.len(), 1, "exactly one {kind} in the render");
        all[0]
    }

    fn named(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name:?} is referenced but not in the render"))
    }
}

fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v}"))
}

fn arr(v: &Value) -> &Vec<Value> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a list, got {v}"))
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), s(v).to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// `matchLabels` selects `pod`: non-empty, and every pair is on the pod.
fn assert_selects(what: &str, match_labels: &Value, pod: &BTreeMap<String, String>) {
    let sel = labels(match_labels);
    assert!(!sel.is_empty(), "{what}: empty selector");
    for (k, v) in &sel {
        assert_eq!(
            pod.get(k),
            Some(v),
            "{what}: selector {k}={v} does not match the pods' labels {pod:?}"
        );
    }
}

fn container(render: &Render) -> &Value {
    let containers = arr(&render.one("Deployment")["spec"]["template"]["spec"]["containers"]);
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// The value of `--NAME=VALUE` in `args`.
fn flag<'a>(args: &'a [Value], name: &str) -> &'a str {
    let prefix = format!("--{name}=");
    let found: Vec<&str> = args
        .iter()
        .filter_map(|a| s(a).strip_prefix(prefix.as_str()))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "exactly one {prefix}... in the args {args:?}"
    );
    found[0]
}

fn env_field_ref<'a>(container: &'a Value, name: &str) -> &'a str {
    let env = arr(&container["env"]);
    let var = env
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("env {name} is missing"));
    s(&var["valueFrom"]["fieldRef"]["fieldPath"])
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

    // Deployment: replicas, selector, anti-affinity, security.
    let deploy = render.one("Deployment");
    let spec = &deploy["spec"];
    assert_eq!(spec["replicas"], 3, "3 replicas");
    let pod_labels = labels(&spec["template"]["metadata"]["labels"]);
    assert_selects(
        "Deployment selector",
        &spec["selector"]["matchLabels"],
        &pod_labels,
    );
    let pod = &spec["template"]["spec"];
    let anti =
        arr(&pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]);
    let on_host = anti
        .iter()
        .find(|t| t["topologyKey"] == "kubernetes.io/hostname")
        .expect("a required pod anti-affinity term on kubernetes.io/hostname");
    assert_selects(
        "anti-affinity",
        &on_host["labelSelector"]["matchLabels"],
        &pod_labels,
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    render.named("ServiceAccount", s(&pod["serviceAccountName"]));

    // PodDisruptionBudget.
    let pdb = &render.one("PodDisruptionBudget")["spec"];
    assert_selects(
        "PodDisruptionBudget",
        &pdb["selector"]["matchLabels"],
        &pod_labels,
    );
    assert!(
        pdb["maxUnavailable"] == 1 || pdb["minAvailable"] == 1,
        "PodDisruptionBudget: maxUnavailable 1 or minAvailable 1, got {pdb}"
    );

    // The container: metrics port, probes on it, bound on the pod IP, replica id from the pod name.
    let c = container(&render);
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(
        c["resources"]["requests"].is_object() && c["resources"]["limits"]["memory"].is_string(),
        "resources: requests and a memory limit"
    );
    let port = arr(&c["ports"])
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a container port named metrics");
    let metrics_port = port["containerPort"].as_u64().expect("containerPort");
    // The startup probe on /healthz: a failing one kills the container, and /readyz fails for what a
    // restart cannot fix (the local etcd down, a leader in a long first sync).
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe} path");
        assert!(
            get["port"] == "metrics" || get["port"] == metrics_port,
            "{probe} must probe the metrics port, got {}",
            get["port"]
        );
    }
    let startup = &c["startupProbe"];
    let budget = startup["periodSeconds"].as_u64().unwrap_or(10)
        * startup["failureThreshold"].as_u64().unwrap_or(3);
    assert!(
        budget >= 30,
        "startupProbe: {budget} s before the container is killed; give a slow start at least 30 s"
    );
    let args = arr(&c["args"]);
    assert_eq!(
        flag(args, "metrics-addr"),
        format!("$(POD_IP):{metrics_port}"),
        "metrics bound on the pod IP at the metrics port"
    );
    assert_eq!(env_field_ref(c, "POD_IP"), "status.podIP");
    assert_eq!(
        env_field_ref(c, "AETHER_REPLICATOR_REPLICA_ID"),
        "metadata.name"
    );

    // Volumes: everything referenced exists, with the keys the items name.
    let volumes: BTreeMap<String, &Value> = arr(&pod["volumes"])
        .iter()
        .map(|v| (s(&v["name"]).to_owned(), v))
        .collect();
    // Files each volume holds: path in the volume -> (kind, object name, key).
    let mut volume_files: BTreeMap<String, BTreeMap<String, (String, String, String)>> =
        BTreeMap::new();
    for (name, v) in &volumes {
        let mut sources: Vec<(&str, &Value)> = Vec::new();
        if v["configMap"].is_object() {
            sources.push(("ConfigMap", &v["configMap"]));
        } else if v["secret"].is_object() {
            sources.push(("Secret", &v["secret"]));
        } else if let Some(list) = v["projected"]["sources"].as_array() {
            for src in list {
                if src["configMap"].is_object() {
                    sources.push(("ConfigMap", &src["configMap"]));
                } else if src["secret"].is_object() {
                    sources.push(("Secret", &src["secret"]));
                }
            }
        }
        assert!(!sources.is_empty(), "volume {name}: no ConfigMap or Secret");
        let files = volume_files.entry(name.clone()).or_default();
        for (kind, src) in sources {
            let obj_name = src["name"]
                .as_str()
                .or_else(|| src["secretName"].as_str())
                .expect("a ConfigMap or Secret name");
            let obj = render.named(kind, obj_name);
            let data = obj["data"].as_object().expect("data");
            let items = arr(&src["items"]);
            for item in items {
                let key = s(&item["key"]);
                assert!(
                    data.contains_key(key),
                    "volume {name}: {kind} {obj_name} has no key {key}"
                );
                files.insert(
                    s(&item["path"]).to_owned(),
                    (kind.to_owned(), obj_name.to_owned(), key.to_owned()),
                );
            }
        }
    }
    let mounts: BTreeMap<String, String> = arr(&c["volumeMounts"])
        .iter()
        .map(|m| {
            let vol = s(&m["name"]);
            assert!(
                volumes.contains_key(vol),
                "volumeMount of unknown volume {vol}"
            );
            (s(&m["mountPath"]).to_owned(), vol.to_owned())
        })
        .collect();
    // The file at an absolute path in the container: (volume, file in it).
    let file_at = |path: &str| -> (String, (String, String, String)) {
        let (dir, file) = path.rsplit_once('/').expect("an absolute path");
        let vol = mounts
            .get(dir)
            .unwrap_or_else(|| panic!("{path}: no volume is mounted at {dir}"));
        let entry = volume_files[vol]
            .get(file)
            .unwrap_or_else(|| panic!("{path}: volume {vol} has no file {file}"))
            .clone();
        (vol.clone(), entry)
    };

    // --config names the ConfigMap's config.toml.
    let config_path = flag(args, "config");
    let (_, (kind, cm_name, key)) = file_at(config_path);
    assert_eq!(kind, "ConfigMap", "--config must point into the ConfigMap");
    let config_text = s(&render.named("ConfigMap", &cm_name)["data"][key.as_str()]).to_owned();
    let config: toml::Table = toml::from_str(&config_text).expect("config.toml is TOML");
    assert_eq!(config["region"].as_str(), Some(region));
    let peers = config["peers"].as_table().expect("[peers]");
    assert_eq!(
        peers.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        expected_peers.iter().copied().collect(),
        "region {region}'s peers"
    );
    // Every file the config names is a mounted Secret file.
    let mut tables = vec![(
        "local".to_owned(),
        config["local"].as_table().expect("[local]"),
    )];
    for (p, t) in peers {
        tables.push((format!("peers.{p}"), t.as_table().expect("a peer table")));
    }
    // ... and no two etcds share a Secret: each peer's material is its own.
    let mut secret_of: BTreeMap<String, String> = BTreeMap::new();
    for (table, t) in &tables {
        for k in ["ca", "cert", "key", "password_file"] {
            let Some(path) = t.get(k) else { continue };
            let (vol, (kind, name, _)) = file_at(path.as_str().expect("a path"));
            assert_eq!(
                kind, "Secret",
                "[{table}] {k}: volume {vol} is not a Secret"
            );
            let owner = secret_of
                .entry(name.clone())
                .or_insert_with(|| table.clone());
            assert_eq!(
                owner, table,
                "[{table}] {k}: Secret {name} also holds [{owner}]'s files"
            );
        }
    }

    // Service and ServiceMonitor.
    let svc = render.one("Service");
    assert_selects("Service", &svc["spec"]["selector"], &pod_labels);
    let svc_port = arr(&svc["spec"]["ports"])
        .iter()
        .find(|p| p["targetPort"] == "metrics" || p["targetPort"] == metrics_port)
        .expect("a Service port targeting the metrics port");
    let sm = render.one("ServiceMonitor");
    assert_selects(
        "ServiceMonitor",
        &sm["spec"]["selector"]["matchLabels"],
        &labels(&svc["metadata"]["labels"]),
    );
    let endpoint = &arr(&sm["spec"]["endpoints"])[0];
    assert_eq!(
        endpoint["port"], svc_port["name"],
        "ServiceMonitor port name"
    );
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(
        endpoint["honorLabels"], true,
        "ServiceMonitor: without honorLabels the `region` target label renames the series' own `region` \
         (is_leader, the incoming side) to exported_region"
    );
    // The `region` target label comes from a pod label carrying this region.
    let region_relabel = arr(&endpoint["relabelings"])
        .iter()
        .find(|r| r["targetLabel"] == "region")
        .expect("a relabeling to the region target label");
    let source = s(&arr(&region_relabel["sourceLabels"])[0]);
    let pod_label = pod_labels
        .iter()
        .find(|(k, _)| {
            let meta: String = k
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            source == format!("__meta_kubernetes_pod_label_{meta}")
        })
        .unwrap_or_else(|| panic!("{source} names no pod label"));
    assert_eq!(pod_label.1, region, "pod label {}", pod_label.0);
    if let Some(job_label) = sm["spec"]["jobLabel"].as_str() {
        assert_eq!(
            labels(&svc["metadata"]["labels"])
                .get(job_label)
                .map(String::as_str),
            Some("aether-replicator"),
            "the rules select job=\"aether-replicator\""
        );
    }

    // The PrometheusRule carries the rules file.
    assert_eq!(
        render.one("PrometheusRule")["spec"],
        rules(),
        "the rendered PrometheusRule differs from the rules file"
    );

    check_config_passes(&render, c, &config_text, &mounts, &volume_files, region);
}

/// Runs the built binary with the container's args and env plus `--check-config`, the mounted files
/// materialised under a temp dir (generated PEM for the certificates, a password file) and their paths
/// in config.toml and the args rewritten to it. It must exit 0.
fn check_config_passes(
    render: &Render,
    c: &Value,
    config_text: &str,
    mounts: &BTreeMap<String, String>,
    volume_files: &BTreeMap<String, BTreeMap<String, (String, String, String)>>,
    region: &str,
) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let root = tmp.path().join("root");
    let pki = common::generate_tls(&tmp.path().join("pki"));
    let rebase = |path: &str| -> String { format!("{}{path}", root.display()) };
    let mut rewritten_config = config_text.to_owned();
    for mount in mounts.keys() {
        rewritten_config =
            rewritten_config.replace(&format!("\"{mount}/"), &format!("\"{}/", rebase(mount)));
    }
    for (mount, vol) in mounts {
        let dir = PathBuf::from(rebase(mount));
        fs::create_dir_all(&dir).expect("mount dir");
        for (file, (kind, _, key)) in &volume_files[vol] {
            let contents: Vec<u8> = match (kind.as_str(), key.as_str()) {
                ("ConfigMap", CONFIG_KEY) => rewritten_config.clone().into_bytes(),
                ("ConfigMap", other) => {
                    let data = &render.one("ConfigMap")["data"];
                    s(&data[other]).as_bytes().to_vec()
                }
                ("Secret", "ca.crt") => pki.ca_pem(),
                ("Secret", "tls.crt") => pki.client_cert_pem(),
                ("Secret", "tls.key") => pki.client_key_pem(),
                ("Secret", "password") => b"an-example-password\n".to_vec(),
                (kind, key) => panic!("{kind} key {key}: the test does not know what to put there"),
            };
            fs::write(dir.join(file), contents).expect("write a mounted file");
        }
    }

    // The kubelet's $(VAR) expansion, with the downward API's values simulated.
    let mut env: Vec<(String, String)> = Vec::new();
    for e in arr(&c["env"]) {
        let name = s(&e["name"]).to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else {
            match s(&e["valueFrom"]["fieldRef"]["fieldPath"]) {
                "status.podIP" => POD_IP.to_owned(),
                "metadata.name" => POD_NAME.to_owned(),
                other => panic!("env {name}: no simulated value for fieldRef {other}"),
            }
        };
        env.push((name, value));
    }
    let args: Vec<String> = arr(&c["args"])
        .iter()
        .map(|a| {
            let mut a = s(a).to_owned();
            for (k, v) in &env {
                a = a.replace(&format!("$({k})"), v);
            }
            assert!(!a.contains("$("), "arg {a}: unexpanded variable");
            match a.strip_prefix("--config=") {
                Some(path) => format!("--config={}", rebase(path)),
                None => a,
            }
        })
        .collect();

    let out = Command::new(env!("CARGO_BIN_EXE_aether-replicator"))
        .args(&args)
        .arg("--check-config")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run aether-replicator");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "region {region}: the manifest's args, env and config.toml fail the replicator's own validation \
         (`aether-replicator {} --check-config`, exit {:?}): {}{}\n\
         (--config and --check-config are the agreed interface of notes/config-format.md; this fails \
         until they are on the branch)",
        args.join(" "),
        out.status.code(),
        stderr.trim(),
        stdout.trim()
    );
    assert!(
        stdout.contains(&format!("config ok: region {region}")),
        "region {region}: --check-config said {stdout:?}"
    );
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

/// The panic message of `f`, which must panic.
fn panic_message(f: impl FnOnce()) -> String {
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .expect_err("the checks passed a broken overlay");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|m| m.to_string()))
        .unwrap_or_default()
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

fn rules() -> Value {
    yaml_file(&repo().join("deploy/prometheus/aether-replicator.rules.yml"))
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
