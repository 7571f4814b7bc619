//! `State::decode`, the parser of a peer's state key value, on arbitrary
//! bytes: never panics; whatever decodes encodes to a value that decodes
//! to the same state, with no negative TTL. And the other way: a state
//! made from the input's first 57 bytes survives `encode` then `decode`.
#![no_main]

use aether_replicator::etcd::LeaseId;
use aether_replicator::mirror::state::State;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(state) = State::decode(data) {
        assert!(state.lease_ttl >= 0, "{data:?} decoded with a negative ttl");
        let again = State::decode(&state.encode());
        assert_eq!(again, Some(state), "{data:?} does not round-trip");
        // Only v1 values decode, and only valid UTF-8.
        assert!(data.starts_with(b"v1"), "{data:?}");
        assert!(std::str::from_utf8(data).is_ok(), "{data:?}");
    }
    if let Some(state) = state_from(data) {
        let encoded = state.encode();
        assert_eq!(
            State::decode(&encoded),
            Some(state),
            "{state:?} encodes to {encoded:?}, which does not decode to it"
        );
    }
});

/// A state from fixed-width fields: every field takes any value a writer
/// could put there (a TTL below zero reads as 0, so it is not generated).
fn state_from(data: &[u8]) -> Option<State> {
    let mut fields = data.chunks_exact(8).map(|c| {
        let mut b = [0; 8];
        b.copy_from_slice(c);
        b
    });
    let mut next = || fields.next();
    let (revision, lease, holder, source_cluster, source_id, heartbeat, ttl) = (
        i64::from_le_bytes(next()?),
        i64::from_le_bytes(next()?),
        u64::from_le_bytes(next()?),
        u64::from_le_bytes(next()?),
        u64::from_le_bytes(next()?),
        i64::from_le_bytes(next()?),
        i64::from_le_bytes(next()?),
    );
    Some(State {
        revision,
        lease: LeaseId::new(lease),
        holder,
        source_cluster,
        source_id,
        heartbeat_unix_ms: heartbeat,
        synced: data.get(56).is_some_and(|b| b & 1 == 1),
        lease_ttl: ttl.checked_abs().unwrap_or(i64::MAX),
    })
}
