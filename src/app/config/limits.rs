//! Single values with bounds: txn limits, counts, lease TTLs, registry
//! prefixes and key segments, each refused in a message naming where it
//! came from ([`Origin`]).

use std::fmt;
use std::time::Duration;

use super::super::parse::{parse_byte_size, parse_duration};
use super::args::RootArg;
use super::error::{ConfigError, Origin};
use crate::etcd::{DEFAULT_MAX_ENCODING_MESSAGE_SIZE, TxnLimits};
use crate::schema::{Schema, SchemaError, validate_segment};

/// Smallest `--max-txn-ops`.
pub const MIN_MAX_TXN_OPS: usize = 2;
/// Smallest `--max-request-bytes`.
pub const MIN_MAX_REQUEST_BYTES: usize = 4096;
/// Largest `--max-request-bytes`: the client's largest outgoing message.
pub const MAX_MAX_REQUEST_BYTES: usize = DEFAULT_MAX_ENCODING_MESSAGE_SIZE;
/// Largest lease TTL etcd grants, in seconds (etcd's `MaxLeaseTTL`).
pub const MAX_LEASE_TTL_SECS: u64 = 9_000_000_000;
/// etcd's shortest lease at its default election timeout (see
/// [`crate::mirror::MIN_LEASE_TTL`]).
pub(crate) const MIN_LEASE_TTL_SECS: u64 = crate::mirror::MIN_LEASE_TTL.as_secs();

impl RootArg {
    /// `--root` as a schema root (see [`prefix_flag`]).
    pub(super) fn schema(&self) -> Result<Schema, ConfigError> {
        prefix_flag("--root", &self.root)
    }
}

/// A prefix flag (`--root`, `--legacy-prefix`) checked as a schema root:
/// it starts and ends with '/', has a segment and no empty one.
pub(super) fn prefix_flag(flag: &'static str, raw: &str) -> Result<Schema, ConfigError> {
    prefix(&Origin::Flag(flag.into()), raw)
}

/// A registry prefix from `origin`, checked as a schema root.
pub(super) fn prefix(origin: &Origin, raw: &str) -> Result<Schema, ConfigError> {
    match Schema::new(raw) {
        Ok(schema) => Ok(schema),
        Err(SchemaError::InvalidRoot { root, reason }) => Err(origin.refuse("root", root, reason)),
        Err(e) => Err(origin.refuse("root", raw, e)),
    }
}

/// A count that must be at least 1 (`--max-inflight`, `--page-size`).
pub(super) fn at_least_one(origin: &Origin, n: usize) -> Result<usize, ConfigError> {
    if n < 1 {
        return Err(origin.refuse("number", n, "must be at least 1"));
    }
    Ok(n)
}

/// `--max-txn-ops` and `--max-request-bytes` (or the file's keys),
/// checked.
pub(super) fn txn_limits(
    (max_txn_ops, ops): (usize, &Origin),
    (raw, bytes_origin): (&str, &Origin),
) -> Result<TxnLimits, ConfigError> {
    if max_txn_ops < MIN_MAX_TXN_OPS {
        return Err(ops.refuse(
            "txn op limit",
            max_txn_ops,
            format!("must be at least {MIN_MAX_TXN_OPS}"),
        ));
    }
    let bytes = parse_byte_size(raw).map_err(|e| bytes_origin.refuse("byte size", raw, e))?;
    let max_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    if max_bytes < MIN_MAX_REQUEST_BYTES {
        return Err(bytes_origin.refuse(
            "byte size",
            raw,
            format!("must be at least {MIN_MAX_REQUEST_BYTES}"),
        ));
    }
    if max_bytes > MAX_MAX_REQUEST_BYTES {
        return Err(bytes_origin.refuse(
            "byte size",
            raw,
            format!(
                "must be at most {MAX_MAX_REQUEST_BYTES} (64MiB, the client's largest request)"
            ),
        ));
    }
    Ok(TxnLimits {
        max_ops: max_txn_ops,
        max_bytes,
    })
}

/// A flag holding one key segment (`--region`, `--service`, ...).
pub(super) fn segment_flag(
    flag: &'static str,
    kind: &'static str,
    value: &str,
) -> Result<(), ConfigError> {
    validate_segment(kind, value)
        .map_err(|e| ConfigError::new(flag, format!("{flag} {value:?}: {}", segment(&e))))
}

/// `--page-size`, at least 1.
pub(super) fn page_size_flag(page_size: usize) -> Result<usize, ConfigError> {
    at_least_one(&Origin::Flag("--page-size".into()), page_size)
}

/// The reason in a segment error, without the segment's kind.
pub(super) fn segment(e: &SchemaError) -> &'static str {
    match e {
        SchemaError::EmptySegment { .. } => "must not be empty",
        _ => "must not contain '/'",
    }
}

/// Parses a TTL: a duration of whole seconds that etcd accepts.
pub(super) fn lease_ttl(origin: &Origin, raw: &str) -> Result<Duration, ConfigError> {
    let refuse = |why: &dyn fmt::Display| origin.refuse("duration", raw, why);
    let ttl = parse_duration(raw).map_err(|e| refuse(&e))?;
    if ttl.subsec_nanos() != 0 {
        return Err(refuse(
            &"must be a whole number of seconds (etcd lease TTLs are whole seconds)",
        ));
    }
    if ttl.as_secs() < MIN_LEASE_TTL_SECS {
        return Err(refuse(&format_args!(
            "must be at least {MIN_LEASE_TTL_SECS}s: etcd grants no shorter lease (at its default election timeout), and a lease granted longer than asked would look like another TTL to every new session"
        )));
    }
    if ttl.as_secs() > MAX_LEASE_TTL_SECS {
        return Err(refuse(&format_args!(
            "must be at most {MAX_LEASE_TTL_SECS}s (etcd's largest lease TTL)"
        )));
    }
    Ok(ttl)
}

/// A duration of at least `min`.
pub(super) fn at_least(origin: &Origin, raw: &str, min: Duration) -> Result<Duration, ConfigError> {
    match parse_duration(raw) {
        Ok(d) if d >= min => Ok(d),
        Ok(_) => Err(origin.refuse("duration", raw, format_args!("must be at least {min:?}"))),
        Err(why) => Err(origin.refuse("duration", raw, why)),
    }
}

/// A duration that may be `"off"` (`None`); `default` when not given.
pub(super) fn duration_or_off(
    origin: &Origin,
    raw: Option<&str>,
    default: Option<Duration>,
) -> Result<Option<Duration>, ConfigError> {
    match raw {
        None => Ok(default),
        Some("off") => Ok(None),
        Some(raw) => match parse_duration(raw) {
            Ok(d) => Ok(Some(d)),
            Err(why) => Err(origin.refuse("duration", raw, why)),
        },
    }
}
