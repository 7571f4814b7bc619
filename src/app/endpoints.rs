//! `aether-replicator endpoints`: the merged registry as one region's
//! consumers see it, from a [`RegistryView`] on that region's etcd.
//!
//! Without `--watch` it prints the view once. With `--watch` it prints the
//! view, then one line per change until shutdown. Tables are for people;
//! `--output json` is one JSON document, or JSON lines with `--watch`.
//!
//! The view starts with one line per origin region: whether its copy here
//! is `local` (the viewer's own region, the source), `mirrored` (a
//! replicator's state key is present) or `no-state` (endpoints without a
//! state key: its lease just lapsed, or keys written by hand); whether a
//! complete copy was made (`SYNCED`: endpoints of an origin that says `no`
//! may be a half-done first copy); its staleness in seconds, by this
//! machine's clock against the replicator's heartbeat (`unknown` without
//! one); and its endpoints (all services). `--watch` prints an `origin`
//! line when an origin appears or goes, or its synced marker or state key
//! changes; not per heartbeat.
//!
//! ```text
//! ORIGIN  KIND      SYNCED  STALENESS  ENDPOINTS
//! a       mirrored  yes     0.8s       30
//! b       local     yes     0.0s       21
//!
//! SERVICE   PROTOCOL  IP        REGION  CLUSTER  ZONE  PRIORITY
//! checkout  grpc      10.0.0.7  b       prod-1   b-1   0
//! added service=checkout protocol=grpc ip=10.0.0.8 region=a cluster=c zone=a-1 priority=2 revision=57
//! origin region=c kind=mirrored synced=no staleness=unknown endpoints=0 revision=58
//! resynced revision=90 compact_revision=88 added=1 updated=0 removed=2
//! ```

use std::io::Write;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::error::Result;
use crate::etcd::Client;
use crate::view::{
    Change, Endpoint, EndpointValue, OriginStatus, Registry, RegistryView, ViewConfig, unix_ms_now,
};

/// How the command prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns, then `key=value` change lines.
    #[default]
    Table,
    /// One JSON document, or JSON lines with `--watch`.
    Json,
}

/// The validated settings of `endpoints`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointsOptions {
    /// The view: root, region, zone, page size.
    pub view: ViewConfig,
    /// Only this service.
    pub service: Option<String>,
    /// Keep printing changes until shutdown.
    pub watch: bool,
    /// Table or JSON.
    pub output: Output,
}

/// Prints the view to `out` (and, with `watch`, its changes until
/// `shutdown` resolves).
pub async fn run<W: Write>(
    client: Client,
    opts: &EndpointsOptions,
    out: &mut W,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let view = RegistryView::start(client, opts.view.clone()).await?;
    let (snapshot, mut changes) = view.snapshot_and_subscribe();
    let filter = opts.service.as_deref();
    match (opts.output, opts.watch) {
        (Output::Table, _) => out.write_all(render_view(&snapshot, filter).as_bytes())?,
        (Output::Json, false) => {
            let doc = snapshot_json(&snapshot, filter, view.skipped());
            let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
            writeln!(out, "{text}")?;
        }
        (Output::Json, true) => {
            let mut doc = snapshot_json(&snapshot, filter, view.skipped());
            doc["event"] = json!("snapshot");
            writeln!(out, "{doc}")?;
        }
    }
    out.flush()?;
    if !opts.watch {
        view.shutdown().await;
        return Ok(());
    }
    tokio::pin!(shutdown);
    loop {
        let change = tokio::select! {
            _ = &mut shutdown => break,
            c = changes.recv() => c,
        };
        match change {
            Ok(c) => {
                if c.endpoint().is_some_and(|e| !matches(e, filter)) {
                    continue;
                }
                match opts.output {
                    Output::Table => writeln!(out, "{}", change_line(&c))?,
                    Output::Json => writeln!(out, "{}", change_json(&c))?,
                }
            }
            Err(RecvError::Lagged(missed)) => {
                // Changes were lost: say so and print the view again.
                let snapshot = view.snapshot();
                match opts.output {
                    Output::Table => {
                        writeln!(out, "lagged missed={missed}")?;
                        out.write_all(render_view(&snapshot, filter).as_bytes())?;
                    }
                    Output::Json => {
                        writeln!(out, "{}", json!({"event": "lagged", "missed": missed}))?;
                        let mut doc = snapshot_json(&snapshot, filter, view.skipped());
                        doc["event"] = json!("snapshot");
                        writeln!(out, "{doc}")?;
                    }
                }
            }
            Err(RecvError::Closed) => break,
        }
        out.flush()?;
    }
    view.shutdown().await;
    Ok(())
}

fn matches(e: &Endpoint, service: Option<&str>) -> bool {
    service.is_none_or(|s| e.key.service == s)
}

fn selected<'r>(
    registry: &'r Registry,
    service: Option<&'r str>,
) -> Box<dyn Iterator<Item = &'r Arc<Endpoint>> + 'r> {
    match service {
        Some(s) => Box::new(registry.protocols(s).flat_map(|(_, eps)| eps.iter())),
        None => Box::new(registry.iter()),
    }
}

const HEADER: [&str; 7] = [
    "SERVICE", "PROTOCOL", "IP", "REGION", "CLUSTER", "ZONE", "PRIORITY",
];

const ORIGIN_HEADER: [&str; 5] = ["ORIGIN", "KIND", "SYNCED", "STALENESS", "ENDPOINTS"];

/// The origins table, a blank line, then the endpoints table.
pub fn render_view(registry: &Registry, service: Option<&str>) -> String {
    let mut out = render_origins(registry, unix_ms_now());
    out.push('\n');
    out.push_str(&render_table(registry, service));
    out
}

/// `local`, `mirrored` (a state key is present) or `no-state`.
pub fn origin_kind(o: &OriginStatus) -> &'static str {
    if o.local {
        "local"
    } else if o.state_present {
        "mirrored"
    } else {
        "no-state"
    }
}

/// Staleness at `now_unix_ms` as seconds with one decimal (`0.8s`), or
/// `unknown`.
pub fn staleness_text(o: &OriginStatus, now_unix_ms: i64) -> String {
    o.staleness_at(now_unix_ms)
        .map_or_else(|| "unknown".into(), |d| format!("{:.1}s", d.as_secs_f64()))
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// The origins as aligned columns: region, kind, synced (yes/no),
/// staleness at `now_unix_ms`, endpoints; in region order.
pub fn render_origins(registry: &Registry, now_unix_ms: i64) -> String {
    let rows: Vec<Vec<String>> = registry
        .origins()
        .map(|(region, o)| {
            vec![
                region.to_owned(),
                origin_kind(o).to_owned(),
                yes_no(o.synced).to_owned(),
                staleness_text(o, now_unix_ms),
                o.endpoints.to_string(),
            ]
        })
        .collect();
    columns(&ORIGIN_HEADER, &rows)
}

/// Aligned columns, two spaces apart, no trailing spaces.
fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i + 1 < cells.len() {
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    };
    line(header);
    for row in rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&cells);
    }
    out
}

/// The endpoints as aligned columns: service, protocol, ip, origin region
/// and cluster, zone (`-` if none), priority; sorted by service, protocol,
/// priority and ip. Just the header when empty.
pub fn render_table(registry: &Registry, service: Option<&str>) -> String {
    let rows: Vec<Vec<String>> = selected(registry, service)
        .map(|e| {
            vec![
                e.key.service.clone(),
                e.key.protocol.clone(),
                e.key.ip.clone(),
                e.key.region.clone(),
                e.key.cluster.clone(),
                e.zone.clone().unwrap_or_else(|| "-".into()),
                e.priority.to_string(),
            ]
        })
        .collect();
    columns(&HEADER, &rows)
}

/// One endpoint as JSON: `service`, `protocol`, `ip`, `region`,
/// `cluster`, `zone` (or null), `priority`, `mod_revision`, `lease`,
/// `value` (the decoded JSON, or the raw value as a string) and
/// `value_is_json`.
pub fn endpoint_json(e: &Endpoint) -> Value {
    let value = match &e.value {
        EndpointValue::Json(v) => v.clone(),
        EndpointValue::NotJson(raw) => Value::String(String::from_utf8_lossy(raw).into_owned()),
    };
    json!({
        "service": e.key.service,
        "protocol": e.key.protocol,
        "ip": e.key.ip,
        "region": e.key.region,
        "cluster": e.key.cluster,
        "zone": e.zone,
        "priority": e.priority,
        "mod_revision": e.mod_revision,
        "lease": e.lease.get(),
        "value": value,
        "value_is_json": e.value.is_json(),
    })
}

/// One origin as JSON at `now_unix_ms`: `region`, `kind`, `local`,
/// `state_present`, `synced`, `staleness_seconds` (or null when unknown),
/// `heartbeat_unix_ms`, `source_revision`, `lease`, `endpoints`. `status`
/// `None` (an origin no longer listed) reads as a `no-state` origin
/// without endpoints.
pub fn origin_json(region: &str, status: Option<&OriginStatus>, now_unix_ms: i64) -> Value {
    let gone = OriginStatus::default();
    let o = status.unwrap_or(&gone);
    json!({
        "region": region,
        "kind": origin_kind(o),
        "local": o.local,
        "state_present": o.state_present,
        "synced": o.synced,
        "staleness_seconds": o.staleness_at(now_unix_ms).map(|d| d.as_secs_f64()),
        "heartbeat_unix_ms": o.heartbeat_unix_ms,
        "source_revision": o.source_revision,
        "lease": o.lease.get(),
        "endpoints": o.endpoints,
    })
}

/// `{"revision": R, "skipped": N, "origins": [...], "endpoints": [...]}`;
/// each endpoint also has `origin_synced`, its origin's synced marker.
pub fn snapshot_json(registry: &Registry, service: Option<&str>, skipped: u64) -> Value {
    let now = unix_ms_now();
    let origins: Vec<Value> = registry
        .origins()
        .map(|(region, o)| origin_json(region, Some(o), now))
        .collect();
    let endpoints: Vec<Value> = selected(registry, service)
        .map(|e| {
            let mut v = endpoint_json(e);
            v["origin_synced"] = json!(registry.is_synced(&e.key.region));
            v
        })
        .collect();
    json!({
        "revision": registry.revision(),
        "skipped": skipped,
        "origins": origins,
        "endpoints": endpoints,
    })
}

/// One change as a `key=value` line:
/// `added service=S protocol=P ip=I region=R cluster=C zone=Z priority=N revision=V`
/// (`updated`, `removed` alike),
/// `resynced revision=V compact_revision=C added=N updated=N removed=N`, or
/// `origin region=R kind=K synced=yes|no staleness=S endpoints=N revision=V`
/// (an origin no longer listed reads `kind=no-state synced=no
/// staleness=unknown endpoints=0`).
pub fn change_line(c: &Change) -> String {
    match c {
        Change::Origin {
            region,
            status,
            revision,
        } => {
            let gone = OriginStatus::default();
            let o = status.as_ref().unwrap_or(&gone);
            format!(
                "origin region={region} kind={} synced={} staleness={} endpoints={} revision={revision}",
                origin_kind(o),
                yes_no(o.synced),
                staleness_text(o, unix_ms_now()),
                o.endpoints,
            )
        }
        Change::Resynced {
            revision,
            compact_revision,
            added,
            updated,
            removed,
        } => {
            let compact = compact_revision.map_or_else(|| "-".to_string(), |r| r.to_string());
            format!(
                "resynced revision={revision} compact_revision={compact} added={added} updated={updated} removed={removed}"
            )
        }
        _ => {
            let e = c
                .endpoint()
                .expect("a change other than a resync has an endpoint");
            format!(
                "{} service={} protocol={} ip={} region={} cluster={} zone={} priority={} revision={}",
                c.kind(),
                e.key.service,
                e.key.protocol,
                e.key.ip,
                e.key.region,
                e.key.cluster,
                e.zone.as_deref().unwrap_or("-"),
                e.priority,
                c.revision()
            )
        }
    }
}

/// One change as a JSON line: `{"event": "added"|"updated"|"removed",
/// "revision": V, "endpoint": {...}}` (an update also has `"previous"`), or
/// `{"event": "resynced", "revision": V, "compact_revision": C|null,
/// "added": N, "updated": N, "removed": N}`, or `{"event": "origin",
/// "revision": V, "origin": {...}}` (see [`origin_json`]).
pub fn change_json(c: &Change) -> Value {
    match c {
        Change::Origin {
            region,
            status,
            revision,
        } => json!({
            "event": "origin",
            "revision": revision,
            "origin": origin_json(region, status.as_ref(), unix_ms_now()),
        }),
        Change::Resynced {
            revision,
            compact_revision,
            added,
            updated,
            removed,
        } => json!({
            "event": "resynced",
            "revision": revision,
            "compact_revision": compact_revision,
            "added": added,
            "updated": updated,
            "removed": removed,
        }),
        Change::Updated { old, new, revision } => json!({
            "event": "updated",
            "revision": revision,
            "endpoint": endpoint_json(new),
            "previous": endpoint_json(old),
        }),
        Change::Added { endpoint, revision } | Change::Removed { endpoint, revision } => json!({
            "event": c.kind(),
            "revision": revision,
            "endpoint": endpoint_json(endpoint),
        }),
    }
}
