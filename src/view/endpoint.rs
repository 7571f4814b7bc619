//! One endpoint as the viewer sees it: its key, its decoded value, its
//! zone and locality priority (how that is ranked is in `rank`).

use std::net::IpAddr;

use bytes::Bytes;

use crate::etcd::KeyValue;
use crate::etcd::LeaseId;
use crate::schema::EndpointKey;

use super::config::ViewConfig;

/// An endpoint's value, decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum EndpointValue {
    /// Valid JSON, kept as it is (normally an object with `clusterName`,
    /// `region`, `zone` and whatever else the control plane writes).
    Json(serde_json::Value),
    /// Not JSON: the raw bytes.
    NotJson(Bytes),
}

impl EndpointValue {
    /// Decodes raw bytes; anything that is not JSON is kept as bytes.
    pub fn decode(raw: &Bytes) -> Self {
        match serde_json::from_slice(raw) {
            Ok(v) => EndpointValue::Json(v),
            Err(_) => EndpointValue::NotJson(raw.clone()),
        }
    }

    /// Whether the value is valid JSON.
    pub fn is_json(&self) -> bool {
        matches!(self, EndpointValue::Json(_))
    }

    /// A field of a JSON object value.
    pub fn field(&self, name: &str) -> Option<&serde_json::Value> {
        match self {
            EndpointValue::Json(v) => v.get(name),
            EndpointValue::NotJson(_) => None,
        }
    }

    /// A string field of a JSON object value.
    pub fn str_field(&self, name: &str) -> Option<&str> {
        self.field(name).and_then(serde_json::Value::as_str)
    }
}

/// One endpoint as the viewer sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    /// Origin region, cluster, service, protocol and ip, from the key.
    pub key: EndpointKey,
    /// The decoded value.
    pub value: EndpointValue,
    /// The value's `zone` field, if it is a string.
    pub zone: Option<String>,
    /// Locality: [`PRIORITY_ZONE`], [`PRIORITY_REGION`] or
    /// [`PRIORITY_FOREIGN`]; lower is closer.
    ///
    /// [`PRIORITY_ZONE`]: super::PRIORITY_ZONE
    /// [`PRIORITY_REGION`]: super::PRIORITY_REGION
    /// [`PRIORITY_FOREIGN`]: super::PRIORITY_FOREIGN
    pub priority: u8,
    /// Revision of the key's last write.
    pub mod_revision: i64,
    /// Lease of the key (a mirrored key carries its origin's mirror lease).
    pub lease: LeaseId,
    /// `key.ip` parsed, for ordering addresses numerically.
    pub(super) addr: Option<IpAddr>,
}

impl Endpoint {
    /// Builds the endpoint a key-value stands for, as seen by `config`'s
    /// viewer.
    pub fn new(key: EndpointKey, kv: &KeyValue, config: &ViewConfig) -> Endpoint {
        let value = EndpointValue::decode(kv.value());
        let zone = value.str_field("zone").map(str::to_owned);
        let priority = config.priority(&key.region, zone.as_deref());
        Endpoint {
            addr: key.ip.parse().ok(),
            key,
            value,
            zone,
            priority,
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::test_support::{cfg, ep};

    #[test]
    fn values_that_are_not_json_are_kept() {
        let c = cfg();
        let e = ep(&c, "b", "10.0.0.1", "not json {");
        assert!(!e.value.is_json());
        assert_eq!(
            e.value,
            EndpointValue::NotJson(Bytes::from_static(b"not json {"))
        );
        assert_eq!(e.zone, None);
        let e = ep(&c, "b", "10.0.0.1", r#"{"zone":"b-1","weight":3}"#);
        assert_eq!(e.value.field("weight"), Some(&serde_json::json!(3)));
        assert_eq!(e.zone.as_deref(), Some("b-1"));
        // A zone that is not a string is no zone.
        assert_eq!(ep(&c, "b", "10.0.0.1", r#"{"zone":7}"#).zone, None);
    }
}
