//! `aether-replicator endpoints`: the merged registry as one region's
//! consumers see it, from a [`RegistryView`] on that region's etcd.
//!
//! Without `--watch` it prints the view once. With `--watch` it prints the
//! view, then one line per change until shutdown. Tables are for people;
//! `--output json` is one JSON document, or JSON lines with `--watch`.
//!
//! ```text
//! SERVICE   PROTOCOL  IP        REGION  CLUSTER  ZONE  PRIORITY
//! checkout  grpc      10.0.0.7  b       prod-1   b-1   0
//! added service=checkout protocol=grpc ip=10.0.0.8 region=a cluster=c zone=a-1 priority=2 revision=57
//! resynced revision=90 compact_revision=88 added=1 updated=0 removed=2
//! ```

use std::io::Write;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::error::Result;
use crate::etcd::Client;
use crate::view::{Change, Endpoint, EndpointValue, Registry, RegistryView, ViewConfig};

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
        (Output::Table, _) => out.write_all(render_table(&snapshot, filter).as_bytes())?,
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
                        out.write_all(render_table(&snapshot, filter).as_bytes())?;
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

/// The view as aligned columns: service, protocol, ip, origin region and
/// cluster, zone (`-` if none), priority; sorted by service, protocol,
/// priority and ip. Just the header when empty.
pub fn render_table(registry: &Registry, service: Option<&str>) -> String {
    let rows: Vec<[String; 7]> = selected(registry, service)
        .map(|e| {
            [
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
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                l.push_str(cell);
                let pad = widths[i] - cell.chars().count() + 2;
                l.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(&l);
        out.push('\n');
    };
    line(&HEADER);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&cells);
    }
    out
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
        "lease": e.lease,
        "value": value,
        "value_is_json": e.value.is_json(),
    })
}

/// `{"revision": R, "skipped": N, "endpoints": [...]}`.
pub fn snapshot_json(registry: &Registry, service: Option<&str>, skipped: u64) -> Value {
    let endpoints: Vec<Value> = selected(registry, service)
        .map(|e| endpoint_json(e))
        .collect();
    json!({
        "revision": registry.revision(),
        "skipped": skipped,
        "endpoints": endpoints,
    })
}

/// One change as a `key=value` line:
/// `added service=S protocol=P ip=I region=R cluster=C zone=Z priority=N revision=V`
/// (`updated`, `removed` alike), or
/// `resynced revision=V compact_revision=C added=N updated=N removed=N`.
pub fn change_line(c: &Change) -> String {
    match c {
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
/// "added": N, "updated": N, "removed": N}`.
pub fn change_json(c: &Change) -> Value {
    match c {
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
