//! Endpoints and configs for the unit tests of the view's files.

use bytes::Bytes;

use crate::etcd::{Event, EventKind, KeyValue};
use crate::schema::EndpointKey;

use super::config::ViewConfig;
use super::endpoint::Endpoint;

pub(super) fn kv(key: &str, value: &str, rev: i64) -> KeyValue {
    Event::synthetic(
        EventKind::Put,
        Bytes::from(key.to_owned()),
        Bytes::from(value.to_owned()),
        rev,
    )
    .kv
}

pub(super) fn ep(cfg: &ViewConfig, region: &str, ip: &str, value: &str) -> Endpoint {
    let key = EndpointKey::new(region, "c1", "svc", "http", ip).unwrap();
    let raw = cfg.schema.endpoint_key(&key);
    Endpoint::new(key, &kv(&raw, value, 1), cfg)
}

pub(super) fn cfg() -> ViewConfig {
    ViewConfig::new("b").zone("b-1")
}
