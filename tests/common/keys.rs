//! The load key shape shared by `benches/mirror.rs` and
//! `examples/loadgen.rs` (which includes this file alone, by `#[path]`), so
//! the benches and the comparison scripts write the same keys.

/// The i-th load key below `prefix`: about 85 bytes with the registry's
/// prefix, like its endpoint keys, spread over 500 services.
pub(crate) fn load_key(prefix: &str, i: usize) -> String {
    format!(
        "{prefix}clusters/c1/services/svc-{:03}/protocols/http/endpoints/10.{}.{}.{}",
        i % 500,
        (i >> 16) & 255,
        (i >> 8) & 255,
        i & 255
    )
}
