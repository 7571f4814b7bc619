//! The merged registry at one revision: `service → protocol → [Endpoint]`
//! and the origins, with the queries a reader makes and the copy-on-write
//! updates the view's task applies.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::mirror::state::State;
use crate::schema::EndpointKey;

use super::change::Change;
use super::endpoint::Endpoint;
use super::origin::OriginStatus;
use super::rank::find;

/// One service's endpoints by protocol.
#[derive(Clone, Debug, Default)]
struct Service {
    protocols: BTreeMap<String, Vec<Arc<Endpoint>>>,
}

/// The merged registry at one revision: `service → protocol → [Endpoint]`,
/// each list ordered by priority, then address, region and cluster.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    pub(super) revision: i64,
    len: usize,
    services: BTreeMap<String, Arc<Service>>,
    pub(super) origins: BTreeMap<String, OriginStatus>,
}

/// What an upsert did.
pub(super) enum Upsert {
    Added(Arc<Endpoint>),
    Updated(Arc<Endpoint>, Arc<Endpoint>),
    Unchanged,
}

impl Registry {
    /// The revision the registry reflects: the snapshot's, then that of the
    /// last change applied.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no endpoints.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The services, in name order.
    pub fn services(&self) -> impl Iterator<Item = &str> {
        self.services.keys().map(String::as_str)
    }

    /// One service's protocols and their endpoints, in protocol order.
    pub fn protocols(&self, service: &str) -> impl Iterator<Item = (&str, &[Arc<Endpoint>])> {
        self.services
            .get(service)
            .into_iter()
            .flat_map(|s| s.protocols.iter().map(|(p, v)| (p.as_str(), v.as_slice())))
    }

    /// The endpoints of one service and protocol, closest first.
    pub fn endpoints(&self, service: &str, protocol: &str) -> &[Arc<Endpoint>] {
        self.services
            .get(service)
            .and_then(|s| s.protocols.get(protocol))
            .map_or(&[], Vec::as_slice)
    }

    /// Every endpoint of one service: by protocol, then closest first.
    pub fn service_endpoints(&self, service: &str) -> Vec<Arc<Endpoint>> {
        self.protocols(service)
            .flat_map(|(_, eps)| eps.iter().cloned())
            .collect()
    }

    /// Every endpoint: by service, protocol, priority, address, region and
    /// cluster.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Endpoint>> {
        self.services
            .values()
            .flat_map(|s| s.protocols.values().flatten())
    }

    /// The endpoint at `key`, if present.
    pub fn get(&self, key: &EndpointKey) -> Option<&Arc<Endpoint>> {
        let list = self.endpoints(&key.service, &key.protocol);
        find(list, key).map(|i| &list[i])
    }

    /// Every listed origin, in region order: the viewer's own region, each
    /// region with a state key here, each region with endpoints here.
    pub fn origins(&self) -> impl Iterator<Item = (&str, &OriginStatus)> {
        self.origins.iter().map(|(r, s)| (r.as_str(), s))
    }

    /// One origin's status, if it is listed.
    pub fn origin(&self, region: &str) -> Option<&OriginStatus> {
        self.origins.get(region)
    }

    /// Whether `region`'s copy is synced: true for the viewer's own region
    /// and for an origin whose state key says a complete copy was made;
    /// false otherwise (not yet synced, no state key, unknown region).
    pub fn is_synced(&self, region: &str) -> bool {
        self.origins.get(region).is_some_and(|o| o.synced)
    }

    /// Like [`Registry::service_endpoints`], without the endpoints of
    /// origins whose copy is not synced.
    pub fn synced_endpoints(&self, service: &str) -> Vec<Arc<Endpoint>> {
        self.protocols(service)
            .flat_map(|(_, eps)| eps.iter())
            .filter(|e| self.is_synced(&e.key.region))
            .cloned()
            .collect()
    }

    #[cfg(test)]
    pub(super) fn build(revision: i64, endpoints: Vec<Endpoint>) -> Registry {
        Registry::build_with(revision, endpoints, None, Vec::new())
    }

    /// The registry of `endpoints` at `revision`, with the origins: `local`
    /// (the viewer's region), those of `states` (region, decoded value, mod
    /// revision) and those with endpoints.
    pub(super) fn build_with(
        revision: i64,
        endpoints: Vec<Endpoint>,
        local: Option<&str>,
        states: Vec<(String, Option<State>, i64)>,
    ) -> Registry {
        let mut origins: BTreeMap<String, OriginStatus> = BTreeMap::new();
        if let Some(local) = local {
            origins.insert(local.to_owned(), OriginStatus::local(0));
        }
        for (region, state, mod_revision) in states {
            origins
                .entry(region)
                .or_default()
                .set_state(Some((state, mod_revision)));
        }
        let mut services: BTreeMap<String, Service> = BTreeMap::new();
        let len = endpoints.len();
        for ep in endpoints {
            match origins.get_mut(&ep.key.region) {
                Some(o) => o.endpoints += 1,
                None => {
                    let o = OriginStatus {
                        endpoints: 1,
                        ..OriginStatus::default()
                    };
                    origins.insert(ep.key.region.clone(), o);
                }
            }
            services
                .entry(ep.key.service.clone())
                .or_default()
                .protocols
                .entry(ep.key.protocol.clone())
                .or_default()
                .push(Arc::new(ep));
        }
        for s in services.values_mut() {
            for list in s.protocols.values_mut() {
                list.sort_unstable_by(|a, b| a.sort_key().cmp(&b.sort_key()));
            }
        }
        Registry {
            revision,
            len,
            services: services
                .into_iter()
                .map(|(k, v)| (k, Arc::new(v)))
                .collect(),
            origins,
        }
    }

    /// Applies `f` to `region`'s status (a fresh unlisted one if there is
    /// none) and returns the [`Change::Origin`] it makes, if any.
    pub(super) fn update_origin(
        &mut self,
        region: &str,
        revision: i64,
        f: impl FnOnce(&mut OriginStatus),
    ) -> Option<Change> {
        let (before, after) = match self.origins.get_mut(region) {
            Some(o) => {
                let before = Some(o.signal());
                f(o);
                if o.listed() {
                    (before, Some(o.signal()))
                } else {
                    self.origins.remove(region);
                    (before, None)
                }
            }
            None => {
                let mut o = OriginStatus::default();
                f(&mut o);
                if !o.listed() {
                    return None;
                }
                let after = Some(o.signal());
                self.origins.insert(region.to_owned(), o);
                (None, after)
            }
        };
        (before != after).then(|| Change::Origin {
            region: region.to_owned(),
            status: self.origins.get(region).cloned(),
            revision,
        })
    }

    pub(super) fn upsert(&mut self, ep: Endpoint) -> Upsert {
        let service = Arc::make_mut(self.services.entry(ep.key.service.clone()).or_default());
        let list = service
            .protocols
            .entry(ep.key.protocol.clone())
            .or_default();
        let old = find(list, &ep.key).map(|i| list.remove(i));
        let unchanged = old.as_ref().is_some_and(|o| o.value == ep.value);
        let ep = Arc::new(ep);
        let at = list
            .binary_search_by(|e| e.sort_key().cmp(&ep.sort_key()))
            .unwrap_or_else(|i| i);
        list.insert(at, ep.clone());
        match old {
            None => {
                self.len += 1;
                Upsert::Added(ep)
            }
            Some(_) if unchanged => Upsert::Unchanged,
            Some(old) => Upsert::Updated(old, ep),
        }
    }

    pub(super) fn remove(&mut self, key: &EndpointKey) -> Option<Arc<Endpoint>> {
        let slot = self.services.get_mut(&key.service)?;
        let i = find(slot.protocols.get(&key.protocol)?, key)?;
        let service = Arc::make_mut(slot);
        let list = service.protocols.get_mut(&key.protocol)?;
        let old = list.remove(i);
        if list.is_empty() {
            service.protocols.remove(&key.protocol);
            if service.protocols.is_empty() {
                self.services.remove(&key.service);
            }
        }
        self.len -= 1;
        Some(old)
    }

    /// Counts an endpoint of `region` in (`added`) or out, returning the
    /// origin change it makes, if any.
    pub(super) fn count(&mut self, region: &str, added: bool, revision: i64) -> Option<Change> {
        self.update_origin(region, revision, |o| {
            if added {
                o.endpoints += 1;
            } else {
                o.endpoints = o.endpoints.saturating_sub(1);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::etcd::LeaseId;
    use std::time::Duration;

    use super::*;
    use crate::view::test_support::{cfg, ep};

    #[test]
    fn lists_are_ordered_and_upserts_keep_the_order() {
        let c = cfg();
        let eps = vec![
            ep(&c, "a", "10.0.0.2", "{}"),
            ep(&c, "b", "10.0.0.10", "{}"),
            ep(&c, "b", "fd00::1", r#"{"zone":"b-1"}"#),
            ep(&c, "b", "10.0.0.9", r#"{"zone":"b-1"}"#),
            ep(&c, "b", "fe80::1%eth0", "{}"),
            ep(&c, "b", "10.0.0.2", "{}"),
        ];
        let mut reg = Registry::build(5, eps);
        let order = |r: &Registry| -> Vec<String> {
            r.endpoints("svc", "http")
                .iter()
                .map(|e| format!("{}:{}:{}", e.priority, e.key.region, e.key.ip))
                .collect()
        };
        assert_eq!(
            order(&reg),
            [
                "0:b:10.0.0.9",
                "0:b:fd00::1",
                "1:b:10.0.0.2",
                "1:b:10.0.0.10",
                "1:b:fe80::1%eth0",
                "2:a:10.0.0.2"
            ]
        );
        assert_eq!(reg.len(), 6);
        // Moving zones moves the endpoint; an equal value changes nothing.
        let moved = ep(&c, "b", "10.0.0.9", r#"{"zone":"b-2"}"#);
        assert!(matches!(reg.upsert(moved), Upsert::Updated(..)));
        assert!(matches!(
            reg.upsert(ep(&c, "b", "10.0.0.9", r#"{"zone":"b-2"}"#)),
            Upsert::Unchanged
        ));
        assert!(matches!(
            reg.upsert(ep(&c, "a", "10.0.0.1", "{}")),
            Upsert::Added(_)
        ));
        assert_eq!(
            order(&reg),
            [
                "0:b:fd00::1",
                "1:b:10.0.0.2",
                "1:b:10.0.0.9",
                "1:b:10.0.0.10",
                "1:b:fe80::1%eth0",
                "2:a:10.0.0.1",
                "2:a:10.0.0.2"
            ]
        );
        assert_eq!(reg.len(), 7);
        let key = EndpointKey::new("b", "c1", "svc", "http", "fe80::1%eth0").unwrap();
        assert!(reg.get(&key).is_some());
        assert!(reg.remove(&key).is_some());
        assert!(reg.remove(&key).is_none());
        assert!(reg.get(&key).is_none());
        assert_eq!(reg.len(), 6);
        for ip in ["fd00::1", "10.0.0.2", "10.0.0.9", "10.0.0.10"] {
            let key = EndpointKey::new("b", "c1", "svc", "http", ip).unwrap();
            assert!(reg.remove(&key).is_some(), "{ip}");
        }
        for ip in ["10.0.0.1", "10.0.0.2"] {
            let key = EndpointKey::new("a", "c1", "svc", "http", ip).unwrap();
            assert!(reg.remove(&key).is_some(), "{ip}");
        }
        assert!(reg.is_empty());
        assert_eq!(reg.services().count(), 0, "empty services are dropped");
    }

    #[test]
    fn snapshots_are_not_affected_by_later_changes() {
        let c = cfg();
        let mut current = Arc::new(Registry::build(1, vec![ep(&c, "b", "10.0.0.1", "{}")]));
        let before = current.clone();
        Arc::make_mut(&mut current).upsert(ep(&c, "b", "10.0.0.2", "{}"));
        assert_eq!(before.len(), 1);
        assert_eq!(current.len(), 2);
    }

    fn state(synced: bool, heartbeat_unix_ms: i64) -> State {
        State {
            revision: 40,
            lease: LeaseId::new(7),
            holder: 1,
            source_cluster: 2,
            source_id: 0,
            heartbeat_unix_ms,
            synced,
            lease_ttl: 0,
        }
    }

    #[test]
    fn origins_follow_state_keys_and_endpoint_counts() {
        let c = cfg();
        let mut reg = Registry::build_with(
            3,
            vec![ep(&c, "a", "10.0.0.1", "{}"), ep(&c, "x", "10.0.0.2", "{}")],
            Some("b"),
            vec![("a".into(), Some(state(false, 0)), 2)],
        );
        let listed: Vec<(&str, bool, bool, usize)> = reg
            .origins()
            .map(|(r, o)| (r, o.synced, o.state_present, o.endpoints))
            .collect();
        assert_eq!(
            listed,
            [
                ("a", false, true, 1),
                ("b", true, false, 0),
                ("x", false, false, 1)
            ]
        );
        // The viewer's own region is current; a state key without a
        // heartbeat, or no state key, is unknown.
        let now = 1_000_000;
        assert_eq!(
            reg.origin("b").unwrap().staleness_at(now),
            Some(Duration::ZERO)
        );
        assert_eq!(reg.origin("a").unwrap().staleness_at(now), None);
        assert_eq!(reg.origin("x").unwrap().staleness_at(now), None);
        assert!(reg.is_synced("b") && !reg.is_synced("a") && !reg.is_synced("x"));
        assert!(!reg.is_synced("nowhere"));
        assert_eq!(reg.synced_endpoints("svc").len(), 0);

        // A heartbeat alone is no change; the synced marker is.
        let set = |r: &mut Registry, st: Option<State>, rev| {
            r.update_origin("a", rev, |o| o.set_state(Some((st, rev))))
        };
        assert!(set(&mut reg, Some(state(false, now - 500)), 4).is_none());
        assert_eq!(
            reg.origin("a").unwrap().staleness_at(now),
            Some(Duration::from_millis(500))
        );
        // A heartbeat ahead of the viewer's clock is suspect: as old as it
        // is far ahead, never fresher than one written now.
        assert!(set(&mut reg, Some(state(false, now + 500)), 5).is_none());
        assert_eq!(
            reg.origin("a").unwrap().staleness_at(now),
            Some(Duration::from_millis(500))
        );
        match set(&mut reg, Some(state(true, now)), 6) {
            Some(Change::Origin {
                region,
                status: Some(s),
                revision: 6,
            }) => {
                assert_eq!(region, "a");
                assert!(s.synced && s.state_present);
                assert_eq!(
                    (s.endpoints, s.source_revision, s.lease),
                    (1, 40, LeaseId::new(7))
                );
            }
            other => panic!("expected an origin change, got {other:?}"),
        }
        assert_eq!(reg.synced_endpoints("svc").len(), 1);
        // A value that does not decode: present, not synced.
        assert!(set(&mut reg, None, 7).is_some());
        let a = reg.origin("a").unwrap();
        assert!(a.state_present && !a.synced && a.heartbeat_unix_ms == 0);
        // The key gone: still listed while it has endpoints, then not.
        assert!(reg.update_origin("a", 8, |o| o.set_state(None)).is_some());
        assert!(!reg.origin("a").unwrap().state_present);
        match reg.count("a", false, 9) {
            Some(Change::Origin { status: None, .. }) => {}
            other => panic!("expected the origin to go, got {other:?}"),
        }
        assert!(reg.origin("a").is_none());
        // The viewer's own region ignores a stray state key, and stays
        // listed without endpoints.
        assert!(reg.update_origin("b", 10, |o| o.set_state(None)).is_none());
        assert!(reg.origin("b").unwrap().synced);
        // A new origin with endpoints only is listed, not synced.
        assert!(matches!(
            reg.count("z", true, 11),
            Some(Change::Origin { status: Some(ref s), .. }) if !s.synced
        ));
    }
}
