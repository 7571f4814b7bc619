//! What tests/deploy.rs (the kustomize overlays) and tests/helm.rs (the Helm chart) check alike on a
//! region's rendered objects: selectors, ports, probes, every mount against a setting of config.toml, and
//! the container's arguments, environment and config.toml through the replicator's own `--check-config`;
//! and the helpers both use to run deploy/gen-overlays.sh and read what it writes.
//!
//! Included by both with `#[path]`, so each uses a part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// What the test substitutes for the downward API's `status.podIP`.
pub(crate) const POD_IP: &str = "127.0.0.1";
/// ... and for `metadata.name`.
pub(crate) const POD_NAME: &str = "aether-replicator-5d9c7b6f4-x2x9q";
pub(crate) const CONFIG_KEY: &str = "config.toml";

pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn example_dir(name: &str) -> PathBuf {
    repo().join("deploy/kubernetes/examples").join(name)
}

/// `deploy/gen-overlays.sh ARGS...`: (exit code, stdout, stderr).
pub(crate) fn gen_overlays<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (Option<i32>, String, String) {
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
pub(crate) fn generate(out: &Path, regions: &[&str]) {
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

pub(crate) fn others<'a>(regions: &[&'a str], region: &str) -> Vec<&'a str> {
    regions.iter().copied().filter(|r| *r != region).collect()
}

pub(crate) fn toml_str(v: &toml::Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v:?}"))
}

pub(crate) fn read_config(overlay: &Path) -> toml::Table {
    let path = overlay.join(CONFIG_KEY);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `kubectl kustomize DIR`, parsed. A missing kubectl is a failure, with how to install it.
pub(crate) fn kustomize(dir: &Path) -> Vec<Value> {
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

pub(crate) fn yaml_docs(text: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("a YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

pub(crate) fn yaml_file(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut docs = yaml_docs(&text);
    assert_eq!(docs.len(), 1, "{}: one YAML document", path.display());
    docs.remove(0)
}

/// The rendered objects of one overlay, by kind and name.
pub(crate) struct Render {
    pub objects: Vec<Value>,
}

impl Render {
    pub(crate) fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    pub(crate) fn one(&self, kind: &str) -> &Value {
        let all = self.all(kind);
        assert_eq!(all.len(), 1, "exactly one {kind} in the render");
        all[0]
    }

    pub(crate) fn named(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name:?} is referenced but not in the render"))
    }
}

pub(crate) fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v}"))
}

pub(crate) fn arr(v: &Value) -> &Vec<Value> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a list, got {v}"))
}

pub(crate) fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), s(v).to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// `matchLabels` selects `pod`: non-empty, and every pair is on the pod.
pub(crate) fn assert_selects(what: &str, match_labels: &Value, pod: &BTreeMap<String, String>) {
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

pub(crate) fn container(render: &Render) -> &Value {
    let containers = arr(&render.one("Deployment")["spec"]["template"]["spec"]["containers"]);
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// The value of `--NAME=VALUE` in `args`.
pub(crate) fn flag<'a>(args: &'a [Value], name: &str) -> &'a str {
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

pub(crate) fn env_field_ref<'a>(container: &'a Value, name: &str) -> &'a str {
    let env = arr(&container["env"]);
    let var = env
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("env {name} is missing"));
    s(&var["valueFrom"]["fieldRef"]["fieldPath"])
}

/// The checks of one region's rendered objects (however rendered): `region`'s Deployment, PDB, Service,
/// ServiceMonitor and PrometheusRule, its config.toml naming `expected_peers`, every file it names a
/// mounted Secret file, and `--check-config` passing on the container as the kubelet would start it.
pub(crate) fn check_render(render: &Render, region: &str, expected_peers: &[&str]) {
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
    let c = container(render);
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

    check_config_passes(render, c, &config_text, &mounts, &volume_files, region);
}

/// Runs the built binary with the container's args and env plus `--check-config`, the mounted files
/// materialised under a temp dir (generated PEM for the certificates, a password file) and their paths
/// in config.toml and the args rewritten to it. It must exit 0.
pub(crate) fn check_config_passes(
    render: &Render,
    c: &Value,
    config_text: &str,
    mounts: &BTreeMap<String, String>,
    volume_files: &BTreeMap<String, BTreeMap<String, (String, String, String)>>,
    region: &str,
) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let root = tmp.path().join("root");
    let pki = crate::common::generate_tls(&tmp.path().join("pki"));
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

/// The panic message of `f`, which must panic.
pub(crate) fn panic_message(f: impl FnOnce()) -> String {
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .expect_err("the checks passed a broken overlay");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|m| m.to_string()))
        .unwrap_or_default()
}

pub(crate) fn rules() -> Value {
    yaml_file(&repo().join("deploy/prometheus/aether-replicator.rules.yml"))
}
