//! The difference between two registries as changes: what a resync emits
//! so that a consumer applying changes needs nothing else.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::schema::EndpointKey;

use super::change::Change;
use super::endpoint::Endpoint;
use super::origin::OriginStatus;
use super::registry::Registry;

impl Registry {
    /// The changes that turn `self` into `new`, in `new`'s order, then the
    /// removals in `self`'s order.
    pub(super) fn diff(&self, new: &Registry) -> Vec<Change> {
        let revision = new.revision;
        let mut old: HashMap<&EndpointKey, &Arc<Endpoint>> =
            self.iter().map(|e| (&e.key, e)).collect();
        let mut changes = Vec::new();
        for ep in new.iter() {
            match old.remove(&ep.key) {
                None => changes.push(Change::Added {
                    endpoint: ep.clone(),
                    revision,
                }),
                Some(o) if o.value != ep.value => changes.push(Change::Updated {
                    old: o.clone(),
                    new: ep.clone(),
                    revision,
                }),
                Some(_) => {}
            }
        }
        for ep in self.iter() {
            if old.contains_key(&ep.key) {
                changes.push(Change::Removed {
                    endpoint: ep.clone(),
                    revision,
                });
            }
        }
        let regions: BTreeSet<&String> = self.origins.keys().chain(new.origins.keys()).collect();
        for region in regions {
            let (o, n) = (self.origins.get(region), new.origins.get(region));
            if o.map(OriginStatus::signal) != n.map(OriginStatus::signal) {
                changes.push(Change::Origin {
                    region: region.clone(),
                    status: n.cloned(),
                    revision,
                });
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::test_support::{cfg, ep};

    #[test]
    fn diff_lists_additions_updates_and_removals() {
        let c = cfg();
        let old = Registry::build(
            1,
            vec![
                ep(&c, "b", "10.0.0.1", "{}"),
                ep(&c, "b", "10.0.0.2", r#"{"v":1}"#),
                ep(&c, "a", "10.0.0.3", "{}"),
            ],
        );
        let new = Registry::build(
            9,
            vec![
                ep(&c, "b", "10.0.0.1", "{}"),
                ep(&c, "b", "10.0.0.2", r#"{"v":2}"#),
                ep(&c, "b", "10.0.0.4", "{}"),
            ],
        );
        let got: Vec<String> = old
            .diff(&new)
            .iter()
            .map(|c| match c {
                Change::Origin { region, status, .. } => {
                    format!("origin {region} {:?} {}", status, c.revision())
                }
                _ => {
                    let e = c.endpoint().unwrap();
                    format!("{} {} {}", c.kind(), e.key.ip, c.revision())
                }
            })
            .collect();
        assert_eq!(
            got,
            [
                "updated 10.0.0.2 9",
                "added 10.0.0.4 9",
                "removed 10.0.0.3 9",
                "origin a None 9"
            ]
        );
        assert!(new.diff(&new).is_empty());
    }
}
