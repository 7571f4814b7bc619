//! `aether-replicator migrate`: the cutover from the legacy flat layout
//! `<legacy>/<service>/protocols/<proto>/endpoints/<ip>` to the origin-first
//! v1 keys.
//!
//! The origin of each endpoint comes from its value (`region`,
//! `clusterName`), else from `--region`/`--cluster`. The value is copied
//! byte for byte.
//!
//! Nothing is ever overwritten. The legacy keys and the v1 keys they map to
//! are read first and each legacy key is classified: to write (no v1 key),
//! already migrated (a v1 key with the same value), a conflict (a v1 key
//! with another value) or malformed. Only the absent keys are written, up to
//! [`MAX_KEYS_PER_TXN`] per txn, each txn guarded by `version == 0` on every
//! key it writes. If something wrote one of them in between, the txn fails
//! as a whole and its keys are retried one per txn, which tells which keys
//! raced and whether to an equal value. So the command is idempotent: a
//! second run has nothing to write.
//!
//! `--delete-legacy` deletes the legacy prefix only when every legacy key
//! has a v1 key with an equal value, and in a txn guarded on the legacy
//! range being unchanged since that check, so a legacy key written
//! meanwhile is never lost.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use bytes::Bytes;

use crate::error::Result;
use crate::etcd::{
    Client, Compare, CompareOp, Delete, Op, OpResponse, Put, Range, Txn, TxnBatcher, TxnLimits,
    prefix_end,
};
use crate::schema::{EndpointKey, Schema, validate_segment};

/// The legacy layout's default prefix.
pub const DEFAULT_LEGACY_PREFIX: &str = "/aether/services/";
/// Most keys written by one txn. Each key costs a put and a compare, and
/// etcd's `--max-txn-ops` limits the compares too.
pub const MAX_KEYS_PER_TXN: usize = 64;
/// Keys listed by name when `--delete-legacy` refuses.
pub const MISSING_LISTED: usize = 20;

/// What to migrate and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrateOptions {
    /// The v1 layout.
    pub schema: Schema,
    /// The legacy prefix, starting and ending with `/`.
    pub legacy_prefix: String,
    /// Region for values without a `region` field.
    pub region: Option<String>,
    /// Cluster for values without a `clusterName` field.
    pub cluster: Option<String>,
    /// Write the missing v1 keys (otherwise a dry run).
    pub apply: bool,
    /// Delete the legacy prefix once every key is migrated.
    pub delete_legacy: bool,
    /// The etcd's txn limits.
    pub limits: TxnLimits,
    /// Keys per page when reading.
    pub page_size: usize,
}

impl MigrateOptions {
    /// A dry run with the default prefixes and limits.
    pub fn new(region: Option<String>, cluster: Option<String>) -> Self {
        MigrateOptions {
            schema: Schema::default(),
            legacy_prefix: DEFAULT_LEGACY_PREFIX.to_string(),
            region,
            cluster,
            apply: false,
            delete_legacy: false,
            limits: TxnLimits::default(),
            page_size: crate::mirror::DEFAULT_PAGE_SIZE,
        }
    }
}

/// What one legacy key is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// No v1 key yet.
    ToWrite,
    /// The v1 key holds the same value.
    Migrated,
    /// The v1 key holds another value; it is left alone.
    Conflict,
    /// Not migratable, and why.
    Malformed(String),
}

/// One legacy key, classified.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The legacy key, lossily decoded if it is not UTF-8.
    pub legacy_key: String,
    /// Its value.
    pub value: Bytes,
    /// The v1 key it maps to; `None` when malformed.
    pub v1_key: Option<String>,
    /// What it is.
    pub status: Status,
}

/// Every legacy key, classified against the v1 keys.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The revision the legacy keys were read at.
    pub legacy_revision: i64,
    /// The legacy keys in key order.
    pub entries: Vec<Entry>,
}

impl Plan {
    /// How many entries have this status (malformed ones of any reason
    /// for `Malformed(_)`).
    pub fn count(&self, status: &Status) -> usize {
        self.entries
            .iter()
            .filter(|e| match (status, &e.status) {
                (Status::Malformed(_), Status::Malformed(_)) => true,
                (a, b) => a == b,
            })
            .count()
    }
}

/// The result of writing the missing keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Keys written.
    pub written: usize,
    /// Txns that wrote them.
    pub txns: usize,
    /// Keys someone else wrote between the read and the write, to an equal
    /// value (so they are migrated) or not (so they are conflicts, listed
    /// in [`MigrateReport::conflicts`]).
    pub raced_equal: usize,
    /// See `raced_equal`.
    pub raced_conflict: usize,
}

/// What `--delete-legacy` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// The legacy prefix was deleted: this many keys.
    Deleted(i64),
    /// Refused: these legacy keys (first [`MISSING_LISTED`], with why) have
    /// no v1 key with an equal value; `missing` counts all of them.
    Refused {
        /// How many legacy keys are not migrated.
        missing: usize,
        /// Some of them, with their status.
        examples: Vec<(String, &'static str)>,
    },
    /// Refused: a legacy key changed after the check.
    Changed,
}

/// Everything a run did, for printing and for tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrateReport {
    /// Whether the run wrote (`--apply`).
    pub apply: bool,
    /// Legacy keys found.
    pub legacy_keys: usize,
    /// Legacy keys with no v1 key when read.
    pub to_write: usize,
    /// Legacy keys whose v1 key holds the same value.
    pub already_migrated: usize,
    /// Conflicts: legacy key and v1 key, including those found while
    /// writing.
    pub conflicts: Vec<(String, String)>,
    /// Malformed legacy keys and why.
    pub malformed: Vec<(String, String)>,
    /// Migratable legacy keys per origin region.
    pub regions: BTreeMap<String, usize>,
    /// With `--apply`.
    pub applied: Option<Applied>,
    /// With `--delete-legacy`.
    pub deletion: Option<Deletion>,
    /// The legacy prefix.
    pub legacy_prefix: String,
}

impl MigrateReport {
    /// False when `--delete-legacy` was refused.
    pub fn ok(&self) -> bool {
        !matches!(
            self.deletion,
            Some(Deletion::Refused { .. } | Deletion::Changed)
        )
    }

    /// The printable report.
    ///
    /// ```text
    /// migrate: dry-run legacy_keys=N to_write=N already_migrated=N conflicts=N malformed=N
    /// regions: a=N b=N
    /// applied: written=N txns=N raced_equal=N raced_conflict=N
    /// conflict: <legacy key> -> <v1 key>
    /// malformed: <legacy key>: <reason>
    /// delete-legacy: deleted N keys under <prefix>
    /// delete-legacy: refused: N of N legacy keys have no v1 key with an equal value
    ///   missing (conflict): <legacy key>
    ///   ... and N more
    /// ```
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mode = if self.apply { "apply" } else { "dry-run" };
        let _ = writeln!(
            out,
            "migrate: {mode} legacy_keys={} to_write={} already_migrated={} conflicts={} malformed={}",
            self.legacy_keys,
            self.to_write,
            self.already_migrated,
            self.conflicts.len(),
            self.malformed.len()
        );
        if !self.regions.is_empty() {
            let regions: Vec<String> = self
                .regions
                .iter()
                .map(|(r, n)| format!("{r}={n}"))
                .collect();
            let _ = writeln!(out, "regions: {}", regions.join(" "));
        }
        if let Some(a) = &self.applied {
            let _ = writeln!(
                out,
                "applied: written={} txns={} raced_equal={} raced_conflict={}",
                a.written, a.txns, a.raced_equal, a.raced_conflict
            );
        }
        for (legacy, v1) in &self.conflicts {
            let _ = writeln!(out, "conflict: {legacy} -> {v1}");
        }
        for (legacy, why) in &self.malformed {
            let _ = writeln!(out, "malformed: {legacy}: {why}");
        }
        match &self.deletion {
            None => {}
            Some(Deletion::Deleted(n)) => {
                let _ = writeln!(
                    out,
                    "delete-legacy: deleted {n} keys under {}",
                    self.legacy_prefix
                );
            }
            Some(Deletion::Refused { missing, examples }) => {
                let _ = writeln!(
                    out,
                    "delete-legacy: refused: {missing} of {} legacy keys have no v1 key with an equal value",
                    self.legacy_keys
                );
                for (key, why) in examples {
                    let _ = writeln!(out, "  missing ({why}): {key}");
                }
                if *missing > examples.len() {
                    let _ = writeln!(out, "  ... and {} more", missing - examples.len());
                }
            }
            Some(Deletion::Changed) => {
                let _ = writeln!(
                    out,
                    "delete-legacy: refused: legacy keys changed during the check; nothing deleted, run again"
                );
            }
        }
        out
    }
}

/// Splits a legacy key into service, protocol and ip.
pub fn parse_legacy<'k>(prefix: &str, key: &'k str) -> Result<(&'k str, &'k str, &'k str), String> {
    const FORM: &str = "<service>/protocols/<protocol>/endpoints/<ip>";
    let rest = key
        .strip_prefix(prefix)
        .ok_or_else(|| format!("not under {prefix}"))?;
    let segs: Vec<&str> = rest.split('/').collect();
    match segs.as_slice() {
        [service, "protocols", protocol, "endpoints", ip] => {
            for (kind, s) in [("service", service), ("protocol", protocol), ("ip", ip)] {
                if s.is_empty() {
                    return Err(format!("empty {kind} segment (expected {FORM})"));
                }
            }
            Ok((service, protocol, ip))
        }
        _ => Err(format!("does not match {prefix}{FORM}")),
    }
}

/// The origin region and cluster of a legacy value: its `region` and
/// `clusterName` fields (`null` counts as absent), else the flags.
pub fn origin(
    value: &[u8],
    region: Option<&str>,
    cluster: Option<&str>,
) -> Result<(String, String), String> {
    let object = match serde_json::from_slice::<serde_json::Value>(value) {
        Ok(serde_json::Value::Object(m)) => Some(m),
        _ => None,
    };
    let pick = |field: &str, kind: &'static str, flag: &str, given: Option<&str>| match object
        .as_ref()
        .and_then(|m| m.get(field))
    {
        Some(serde_json::Value::String(s)) => {
            validate_segment(kind, s).map_err(|e| format!("{field} field: {e}"))?;
            Ok(s.clone())
        }
        None | Some(serde_json::Value::Null) => given.map(str::to_owned).ok_or_else(|| {
            format!("no {kind}: the value has no {field} field and {flag} is not given")
        }),
        Some(other) => Err(format!("{field} field is not a string: {other}")),
    };
    Ok((
        pick("region", "region", "--region", region)?,
        pick("clusterName", "cluster", "--cluster", cluster)?,
    ))
}

/// Reads the legacy keys and the v1 keys they map to, and classifies them.
pub async fn plan(client: &Client, opts: &MigrateOptions) -> Result<Plan> {
    let (legacy, root) = (opts.legacy_prefix.as_str(), opts.schema.root());
    if legacy.is_empty() || legacy.starts_with(root) || root.starts_with(legacy) {
        return Err(crate::error::Error::Config(format!(
            "legacy prefix {legacy:?} overlaps the registry root {root:?}"
        )));
    }
    let mut scan = client.scan_prefix(opts.legacy_prefix.clone(), opts.page_size, 0);
    let mut entries = Vec::new();
    let mut legacy_revision = 0;
    // v1 key → entry index, by region.
    let mut wanted: BTreeMap<String, HashMap<String, usize>> = BTreeMap::new();
    while let Some(page) = scan.next_page().await? {
        legacy_revision = page.revision;
        for kv in page.kvs {
            let (key, value) = kv.into_key_value();
            let legacy_key = String::from_utf8_lossy(&key).into_owned();
            let classified = std::str::from_utf8(&key)
                .map_err(|_| "key is not valid UTF-8".to_string())
                .and_then(|k| parse_legacy(&opts.legacy_prefix, k))
                .and_then(|(service, protocol, ip)| {
                    let (region, cluster) =
                        origin(&value, opts.region.as_deref(), opts.cluster.as_deref())?;
                    EndpointKey::new(region, cluster, service, protocol, ip)
                        .map_err(|e| e.to_string())
                });
            let entry = match classified {
                Ok(ek) => {
                    let v1 = opts.schema.endpoint_key(&ek);
                    wanted
                        .entry(ek.region)
                        .or_default()
                        .insert(v1.clone(), entries.len());
                    Entry {
                        legacy_key,
                        value,
                        v1_key: Some(v1),
                        status: Status::ToWrite,
                    }
                }
                Err(reason) => Entry {
                    legacy_key,
                    value,
                    v1_key: None,
                    status: Status::Malformed(reason),
                },
            };
            entries.push(entry);
        }
    }
    for (region, keys) in &wanted {
        let prefix = opts.schema.region_prefix(region).map_err(|e| {
            crate::error::Error::Config(format!("region {region:?} from the values: {e}"))
        })?;
        let mut scan = client.scan_prefix(prefix, opts.page_size, 0);
        while let Some(page) = scan.next_page().await? {
            for kv in &page.kvs {
                let Ok(k) = std::str::from_utf8(kv.key()) else {
                    continue;
                };
                if let Some(&i) = keys.get(k) {
                    let e = &mut entries[i];
                    e.status = if kv.value() == &e.value {
                        Status::Migrated
                    } else {
                        Status::Conflict
                    };
                }
            }
        }
    }
    Ok(Plan {
        legacy_revision,
        entries,
    })
}

/// Runs the migration as `opts` says: classify, then maybe write, then
/// maybe delete the legacy prefix.
pub async fn migrate(client: &Client, opts: &MigrateOptions) -> Result<MigrateReport> {
    let plan = plan(client, opts).await?;
    let mut report = MigrateReport {
        apply: opts.apply,
        legacy_keys: plan.entries.len(),
        to_write: plan.count(&Status::ToWrite),
        already_migrated: plan.count(&Status::Migrated),
        conflicts: Vec::new(),
        malformed: Vec::new(),
        regions: BTreeMap::new(),
        applied: None,
        deletion: None,
        legacy_prefix: opts.legacy_prefix.clone(),
    };
    for e in &plan.entries {
        match (&e.status, &e.v1_key) {
            (Status::Malformed(why), _) => {
                report.malformed.push((e.legacy_key.clone(), why.clone()))
            }
            (Status::Conflict, Some(v1)) => {
                report.conflicts.push((e.legacy_key.clone(), v1.clone()));
            }
            _ => {}
        }
        if let Some(v1) = &e.v1_key
            && let Some(region) = opts.schema.region_of(v1.as_bytes())
        {
            *report.regions.entry(region.to_string()).or_default() += 1;
        }
    }
    if opts.apply {
        let (applied, raced) = apply(client, opts.limits, &plan).await?;
        report.conflicts.extend(raced);
        report.applied = Some(applied);
    }
    if opts.delete_legacy {
        let check = if opts.apply {
            self::plan(client, opts).await?
        } else {
            plan
        };
        report.deletion = Some(delete_legacy(client, opts, &check).await?);
    }
    Ok(report)
}

/// Writes the v1 keys of the plan's [`Status::ToWrite`] entries where
/// still absent; returns the counts and the conflicts found on the way
/// (legacy key, v1 key).
pub async fn apply(
    client: &Client,
    limits: TxnLimits,
    plan: &Plan,
) -> Result<(Applied, Vec<(String, String)>)> {
    let entries: Vec<&Entry> = plan
        .entries
        .iter()
        .filter(|e| e.status == Status::ToWrite)
        .collect();
    // Each key is a put and its guard ("absent"): the packer counts both.
    let mut packer = TxnBatcher::new(TxnLimits {
        max_ops: limits.max_ops.clamp(1, MAX_KEYS_PER_TXN),
        ..limits
    });
    let by_key: HashMap<&str, &Entry> = entries.iter().map(|e| (v1(e), *e)).collect();
    let mut applied = Applied::default();
    let mut raced = Vec::new();
    for e in &entries {
        let key = v1(e).to_owned();
        packer.push_guarded(
            Put::new(key.clone(), e.value.clone()),
            Compare::version(key, CompareOp::Equal, 0),
        );
        while let Some(parts) = packer.pop_parts() {
            write_batch(client, parts, &by_key, &mut applied, &mut raced).await?;
        }
    }
    packer.flush();
    while let Some(parts) = packer.pop_parts() {
        write_batch(client, parts, &by_key, &mut applied, &mut raced).await?;
    }
    Ok((applied, raced))
}

fn v1(e: &Entry) -> &str {
    e.v1_key.as_deref().unwrap_or_default()
}

/// One txn for the batch; if any key appeared meanwhile, one txn per key.
async fn write_batch(
    client: &Client,
    (guards, ops): (Vec<Compare>, Vec<Op>),
    by_key: &HashMap<&str, &Entry>,
    applied: &mut Applied,
    raced: &mut Vec<(String, String)>,
) -> Result<()> {
    let batch: Vec<&Entry> = ops
        .iter()
        .filter_map(|op| op.key())
        .filter_map(|k| std::str::from_utf8(k).ok())
        .filter_map(|k| by_key.get(k).copied())
        .collect();
    let resp = client.txn(Txn::new().when(guards).and_then(ops)).await?;
    applied.txns += 1;
    if resp.succeeded {
        applied.written += batch.len();
        return Ok(());
    }
    for e in batch {
        let key = v1(e).to_owned();
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([Put::new(key.clone(), e.value.clone())])
            .or_else([Range::key(key.clone())]);
        let resp = client.txn(txn).await?;
        applied.txns += 1;
        if resp.succeeded {
            applied.written += 1;
            continue;
        }
        let current = match resp.responses.first() {
            Some(OpResponse::Range(r)) => r.kvs().first().map(|kv| kv.value().clone()),
            _ => None,
        };
        if current.as_ref() == Some(&e.value) {
            applied.raced_equal += 1;
        } else {
            applied.raced_conflict += 1;
            raced.push((e.legacy_key.clone(), key));
        }
    }
    Ok(())
}

/// Deletes the legacy prefix if `check` shows every key migrated, guarded
/// on no legacy key having changed since `check` read them.
pub async fn delete_legacy(
    client: &Client,
    opts: &MigrateOptions,
    check: &Plan,
) -> Result<Deletion> {
    let not_migrated: Vec<&Entry> = check
        .entries
        .iter()
        .filter(|e| e.status != Status::Migrated)
        .collect();
    if !not_migrated.is_empty() {
        let examples = not_migrated
            .iter()
            .take(MISSING_LISTED)
            .map(|e| {
                let why = match e.status {
                    Status::ToWrite => "no v1 key",
                    Status::Conflict => "conflict",
                    _ => "malformed",
                };
                (e.legacy_key.clone(), why)
            })
            .collect();
        return Ok(Deletion::Refused {
            missing: not_migrated.len(),
            examples,
        });
    }
    let prefix = opts.legacy_prefix.clone();
    let unchanged =
        Compare::mod_revision(prefix.clone(), CompareOp::Less, check.legacy_revision + 1)
            .with_range_end(prefix_end(prefix.as_bytes()));
    let resp = client
        .txn(
            Txn::new()
                .when([unchanged])
                .and_then([Delete::prefix(prefix)]),
        )
        .await?;
    if !resp.succeeded {
        return Ok(Deletion::Changed);
    }
    let deleted = match resp.responses.first() {
        Some(OpResponse::Delete(d)) => d.deleted,
        _ => 0,
    };
    Ok(Deletion::Deleted(deleted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_keys() {
        let p = DEFAULT_LEGACY_PREFIX;
        assert_eq!(
            parse_legacy(p, "/aether/services/s/protocols/grpc/endpoints/fd00::1"),
            Ok(("s", "grpc", "fd00::1"))
        );
        for bad in [
            "/aether/services/s/protocols/grpc/endpoints/",
            "/aether/services/s/protocols/grpc/endpoints/1/x",
            "/aether/services/s/protocol/grpc/endpoints/1",
            "/aether/services//protocols/grpc/endpoints/1",
            "/aether/services/s",
            "/other/s/protocols/grpc/endpoints/1",
        ] {
            assert!(parse_legacy(p, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn origin_from_value_or_flags() {
        let o = |v: &str, r: Option<&str>, c: Option<&str>| origin(v.as_bytes(), r, c);
        assert_eq!(
            o(
                r#"{"region":"eu","clusterName":"c9"}"#,
                Some("x"),
                Some("y")
            ),
            Ok(("eu".into(), "c9".into()))
        );
        assert_eq!(
            o(r#"{"zone":"z"}"#, Some("x"), Some("y")),
            Ok(("x".into(), "y".into()))
        );
        assert_eq!(
            o(r#"{"region":null}"#, Some("x"), Some("y")),
            Ok(("x".into(), "y".into()))
        );
        assert_eq!(
            o("not json", Some("x"), Some("y")),
            Ok(("x".into(), "y".into()))
        );
        assert!(
            o("not json", None, Some("y"))
                .unwrap_err()
                .contains("--region")
        );
        assert!(o("{}", Some("x"), None).unwrap_err().contains("--cluster"));
        assert!(
            o(r#"{"region":"a/b"}"#, Some("x"), Some("y"))
                .unwrap_err()
                .contains("'/'")
        );
        assert!(
            o(r#"{"region":""}"#, Some("x"), Some("y"))
                .unwrap_err()
                .contains("empty")
        );
        assert!(
            o(r#"{"region":7}"#, Some("x"), Some("y"))
                .unwrap_err()
                .contains("not a string")
        );
    }
}
