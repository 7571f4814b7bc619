//! `demo-view`: the two-region demo's live view (e2e/demo.sh), one frame a
//! second. Per region: the leader and standby (from the replicas' metrics
//! pages), its replication to every other region (synced, lag, the peer
//! lease's time left), each origin's copy as the region's consumers see it
//! (`aether-replicator endpoints --output json`, the product's own view),
//! and the newest keys there, so a key typed by hand is seen arriving.
//!
//! On a terminal each frame redraws the screen in place; otherwise frames
//! follow each other. A write that fails (the reader of a pipe went away)
//! ends the view quietly with exit 0: demo.sh then cleans up.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::state::{KEY_ROOT, Mesh, now_ms, utc_hms};
use crate::{http, procs};

/// Keys listed as the newest in each region.
const NEWEST: usize = 4;

pub(crate) fn cmd_demo_view(dir: PathBuf, frames: Option<u32>, mesh_cmd: String) {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    let mut shown = 0;
    loop {
        let started = Instant::now();
        // Re-read every frame: `restart` changes pids and ports.
        let mesh = Mesh::load_or_die(dir.clone(), " (run e2e/demo.sh)");
        let mut frame = render(&mesh, &mesh_cmd, frames.is_some());
        if tty {
            // Home, each line cleared to its end, then the rest of the screen.
            frame = format!("\x1b[H{}\x1b[K\x1b[J", frame.replace('\n', "\x1b[K\n"));
        }
        if out
            .write_all(frame.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return;
        }
        shown += 1;
        if frames.is_some_and(|n| shown >= n) {
            return;
        }
        std::thread::sleep(Duration::from_secs(1).saturating_sub(started.elapsed()));
    }
}

fn render(mesh: &Mesh, mesh_cmd: &str, oneshot: bool) -> String {
    let st = &mesh.st;
    let mut f = format!(
        "aether-replicator demo: regions {}, mirror lease TTL {}s    {}\n{}\n",
        st.regions.join(" "),
        st.ttl,
        utc_hms(now_ms() / 1000),
        "-".repeat(79)
    );
    for r in &st.regions {
        region(mesh, r, &mut f);
    }
    let url = |r: &str| {
        st.etcds.get(r).map_or_else(String::new, |e| {
            format!("http://127.0.0.1:{}", e.client_port)
        })
    };
    let pids = |r: &str| {
        st.slots
            .iter()
            .filter_map(|s| {
                st.replicas
                    .get(&format!("{r}/{s}"))
                    .map(|p| p.pid.to_string())
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    f += "Type a key into region a and see it arrive in b:\n";
    f += &format!(
        "    etcdctl --endpoints={} put {KEY_ROOT}a/clusters/prod-a1/services/hello/protocols/http/endpoints/10.1.9.9 '{{\"zone\":\"a-1\",\"port\":8080}}'\n",
        url("a")
    );
    f += "Failover: stop region a's replicators; a's staleness in b grows, and a's\n";
    f += &format!(
        "endpoints vanish from b once the lease ({}s) runs out:\n",
        st.ttl
    );
    f += &format!("    kill {}\n", pids("a"));
    f += &format!(
        "Bring them back:  {mesh_cmd} restart a --state {}\n",
        mesh.dir_str()
    );
    f += &format!(
        "(b's: kill {})    logs: {}/logs\n",
        pids("b"),
        mesh.dir_str()
    );
    f += if oneshot {
        "DEMO_ONESHOT: rendering 3 times\n"
    } else {
        "Ctrl-C stops the demo.\n"
    };
    f
}

fn region(mesh: &Mesh, r: &str, f: &mut String) {
    let st = &mesh.st;
    let (mut leader, mut page, mut standby) = (None, String::new(), Vec::new());
    for s in &st.slots {
        let Some(p) = st.replicas.get(&format!("{r}/{s}")) else {
            continue;
        };
        let m = http::get(p.port, "/metrics", Duration::from_secs(1)).unwrap_or_default();
        if m.is_empty() {
            standby.push(format!("{r}/{s} down"));
        } else if http::metric(&m, "aether_replicator_is_leader").as_deref() == Some("1") {
            leader = Some(format!("{r}/{s} pid {}", p.pid));
            page = m;
        } else {
            standby.push(format!("{r}/{s} pid {} standby", p.pid));
        }
    }
    let port = st.etcds.get(r).map_or(0, |e| e.client_port);
    *f += &format!(
        "region {r}  etcd :{port}  leader {}{}\n",
        leader.as_deref().unwrap_or("NONE"),
        if standby.is_empty() {
            String::new()
        } else {
            format!(" ({})", standby.join(", "))
        }
    );
    for p in st.regions.iter().filter(|p| *p != r) {
        if leader.is_none() {
            *f += &format!("  {r} -> {p}: not replicating (no leader in {r})\n");
            continue;
        }
        let m = |name: &str| http::metric(&page, &format!("{name}{{peer=\"{p}\"}}"));
        let synced = if m("aether_replicator_peer_synced").as_deref() == Some("1") {
            "synced"
        } else {
            "NOT synced"
        };
        let ttl: f64 = m("aether_replicator_lease_remaining_seconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *f += &format!(
            "  {r} -> {p}: {synced}, lag {} revisions, peer lease {ttl:.1}s left\n",
            m("aether_replicator_lag_revisions").unwrap_or_else(|| "?".into())
        );
    }
    *f += &format!("  as consumers in {r} see it (aether-replicator endpoints --region {r}):\n");
    *f += &consumers(mesh, r, port);
    f.push('\n');
}

/// `aether-replicator endpoints --output json` of region `r`, as tables:
/// each origin's copy, then the newest keys.
fn consumers(mesh: &Mesh, r: &str, port: u16) -> String {
    let bin = mesh.path("bin/aether-replicator");
    let args = [
        "endpoints".to_string(),
        "--local-etcd".into(),
        format!("http://127.0.0.1:{port}"),
        "--region".into(),
        r.into(),
        "--output".into(),
        "json".into(),
    ];
    let (text, err) = match procs::run_timeout(5, &bin.to_string_lossy(), &args) {
        Some(o) => (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        ),
        None => (String::new(), format!("cannot run {}", bin.display())),
    };
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(&text) else {
        let last = format!("{text}{err}");
        let last = last
            .trim()
            .lines()
            .last()
            .unwrap_or("no output")
            .to_string();
        return format!("    aether-replicator endpoints: {last}\n");
    };
    tables(&doc, &mesh.st.regions)
}

/// The view of one `endpoints --output json` document.
fn tables(doc: &serde_json::Value, regions: &[String]) -> String {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    let mut rows = vec![
        ["ORIGIN", "KIND", "SYNCED", "STALENESS", "ENDPOINTS"]
            .map(String::from)
            .to_vec(),
    ];
    let origins = doc["origins"].as_array().cloned().unwrap_or_default();
    for o in &origins {
        rows.push(vec![
            s(&o["region"]),
            s(&o["kind"]),
            if o["synced"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            }
            .into(),
            o["staleness_seconds"]
                .as_f64()
                .map_or("unknown".into(), |v| format!("{v:.1}s")),
            o["endpoints"].to_string(),
        ]);
    }
    for r in regions {
        if !origins.iter().any(|o| o["region"].as_str() == Some(r)) {
            rows.push(vec![
                r.clone(),
                "none".into(),
                "-".into(),
                "-".into(),
                "0".into(),
            ]);
        }
    }
    let mut out = table(&rows);
    out += "  newest keys here:\n";
    let mut eps = doc["endpoints"].as_array().cloned().unwrap_or_default();
    eps.sort_by_key(|e| std::cmp::Reverse(e["mod_revision"].as_i64().unwrap_or(0)));
    let mut rows = vec![
        ["REV", "ORIGIN", "SERVICE/PROTOCOL", "IP:PORT", "ZONE"]
            .map(String::from)
            .to_vec(),
    ];
    for e in eps.iter().take(NEWEST) {
        let port = e["value"]["port"].to_string();
        rows.push(vec![
            e["mod_revision"].to_string(),
            s(&e["region"]),
            format!("{}/{}", s(&e["service"]), s(&e["protocol"])),
            format!(
                "{}:{}",
                s(&e["ip"]),
                if port == "null" { "?".into() } else { port }
            ),
            Some(s(&e["zone"]))
                .filter(|z| !z.is_empty())
                .unwrap_or("-".into()),
        ]);
    }
    out + &table(&rows)
}

/// Left-aligned columns two spaces apart, indented by four.
fn table(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            format!("    {}\n", cells.join("  ").trim_end())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_lists_every_origin_and_the_newest_keys_first() {
        let doc = serde_json::json!({
            "origins": [
                {"region": "a", "kind": "local", "synced": true, "staleness_seconds": null, "endpoints": 2},
                {"region": "b", "kind": "copy", "synced": false, "staleness_seconds": 1.25, "endpoints": 1}
            ],
            "endpoints": [
                {"mod_revision": 5, "region": "a", "service": "cart", "protocol": "http",
                 "ip": "10.1.1.21", "zone": "a-1", "value": {"port": 8081}},
                {"mod_revision": 9, "region": "b", "service": "search", "protocol": "grpc",
                 "ip": "10.2.0.11", "zone": "", "value": "opaque"}
            ]
        });
        let regions = ["a", "b", "c"].map(String::from);
        assert_eq!(
            tables(&doc, &regions),
            "    ORIGIN  KIND   SYNCED  STALENESS  ENDPOINTS
    a       local  yes     unknown    2
    b       copy   no      1.2s       1
    c       none   -       -          0
  newest keys here:
    REV  ORIGIN  SERVICE/PROTOCOL  IP:PORT         ZONE
    9    b       search/grpc       10.2.0.11:?     -
    5    a       cart/http         10.1.1.21:8081  a-1
"
        );
    }
}
