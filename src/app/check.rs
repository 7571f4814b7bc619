//! `aether-replicator check`: compare this region's subtree with every
//! peer's copy and print what differs.

use std::fmt::Write as _;

use super::config::Config;
use crate::error::Result;
use crate::etcd::Client;
use crate::mirror::check::{Report, compare};

/// Checks every peer; returns the printable report and whether all match.
pub async fn run(config: &Config) -> Result<(String, bool)> {
    let local = Client::connect(config.local.clone())?;
    let mut out = String::new();
    let mut all_match = true;
    for peer in &config.peers {
        let client = Client::connect(peer.client.clone())?;
        match compare(&local, &client, &config.mirror).await {
            Ok(report) => {
                all_match &= report.matches();
                render(&mut out, &peer.region, &report);
            }
            Err(e) => {
                all_match = false;
                let _ = writeln!(out, "peer {}: ERROR {e}", peer.region);
            }
        }
    }
    Ok((out, all_match))
}

fn render(out: &mut String, peer: &str, r: &Report) {
    let verdict = if r.matches() { "OK" } else { "DIFFERS" };
    let ttl = match r.lease_ttl {
        Some(t) if t > 0 => format!("{t}s"),
        Some(_) => "expired".to_string(),
        None => "no state key".to_string(),
    };
    let _ = writeln!(
        out,
        "peer {peer}: {verdict} source_keys={} peer_keys={} missing={} extra={} value_differs={} wrong_lease={} lease_ttl={ttl}",
        r.source_keys, r.peer_keys, r.missing, r.extra, r.value_differs, r.wrong_lease
    );
    for (what, key) in &r.examples {
        let _ = writeln!(out, "  {what}: {}", String::from_utf8_lossy(key));
    }
}
