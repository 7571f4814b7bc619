//! `parse_duration` and `parse_byte_size` on arbitrary UTF-8: never panic,
//! and an accepted duration is greater than zero.
#![no_main]

use std::time::Duration;

use aether_replicator::app::parse::{parse_byte_size, parse_duration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = parse_duration(s) {
        assert!(d > Duration::ZERO, "parse_duration({s:?}) = {d:?}, not > 0");
    }
    let _ = parse_byte_size(s);
});
