//! Locality ranking: the three priorities, how a viewer assigns them, and
//! the order endpoints keep within one protocol (closest first), with the
//! lookup of a key in a list so ordered.

use std::net::IpAddr;
use std::sync::Arc;

use crate::schema::EndpointKey;

use super::config::ViewConfig;
use super::endpoint::Endpoint;

/// Priority of an endpoint in the viewer's own zone.
pub const PRIORITY_ZONE: u8 = 0;
/// Priority of an endpoint elsewhere in the viewer's region.
pub const PRIORITY_REGION: u8 = 1;
/// Priority of an endpoint in a foreign region: failover only.
pub const PRIORITY_FOREIGN: u8 = 2;

impl ViewConfig {
    /// The locality priority of an endpoint of `origin` region in `zone`,
    /// as seen by this viewer.
    pub fn priority(&self, origin: &str, zone: Option<&str>) -> u8 {
        if origin != self.region {
            PRIORITY_FOREIGN
        } else if self.zone.is_some() && zone == self.zone.as_deref() {
            PRIORITY_ZONE
        } else {
            PRIORITY_REGION
        }
    }
}

/// Ordering within one protocol: priority, then address (parsed addresses
/// numerically, before unparsable ones), then region and cluster.
type SortKey<'a> = (u8, bool, Option<IpAddr>, &'a str, &'a str, &'a str);

impl Endpoint {
    pub(super) fn sort_key(&self) -> SortKey<'_> {
        probe(self.priority, self.addr, &self.key)
    }
}

fn probe(priority: u8, addr: Option<IpAddr>, key: &EndpointKey) -> SortKey<'_> {
    (
        priority,
        addr.is_none(),
        addr,
        &key.ip,
        &key.region,
        &key.cluster,
    )
}

/// The index of `key` in a sorted list. Its priority is not known, so each
/// of the three is tried: three binary searches.
pub(super) fn find(list: &[Arc<Endpoint>], key: &EndpointKey) -> Option<usize> {
    let addr = key.ip.parse().ok();
    (PRIORITY_ZONE..=PRIORITY_FOREIGN).find_map(|p| {
        let want = probe(p, addr, key);
        list.binary_search_by(|e| e.sort_key().cmp(&want)).ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::test_support::{cfg, ep};

    #[test]
    fn priorities_by_locality() {
        let c = cfg();
        let z = |z: &str| format!(r#"{{"zone":"{z}","region":"x"}}"#);
        assert_eq!(ep(&c, "b", "10.0.0.1", &z("b-1")).priority, PRIORITY_ZONE);
        assert_eq!(ep(&c, "b", "10.0.0.1", &z("b-2")).priority, PRIORITY_REGION);
        assert_eq!(ep(&c, "b", "10.0.0.1", "{}").priority, PRIORITY_REGION);
        // The same zone name in another region is still foreign.
        assert_eq!(
            ep(&c, "a", "10.0.0.1", &z("b-1")).priority,
            PRIORITY_FOREIGN
        );
        // Without a viewer zone nothing is priority 0.
        let nz = ViewConfig::new("b");
        assert_eq!(ep(&nz, "b", "10.0.0.1", "{}").priority, PRIORITY_REGION);
        assert_eq!(
            ep(&nz, "b", "10.0.0.1", &z("b-1")).priority,
            PRIORITY_REGION
        );
    }
}
