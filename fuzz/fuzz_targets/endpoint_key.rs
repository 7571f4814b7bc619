//! `Schema::parse` on arbitrary bytes, under the default root and a custom
//! one: never panics, and whatever parses round-trips byte for byte through
//! `Schema::endpoint_key` and agrees with `Schema::region_of`.
#![no_main]

use std::sync::LazyLock;

use aether_replicator::schema::Schema;
use libfuzzer_sys::fuzz_target;

static SCHEMAS: LazyLock<[Schema; 3]> = LazyLock::new(|| {
    [
        Schema::default(),
        Schema::new("/x/y/").expect("valid root"),
        Schema::new("/r/").expect("valid root"),
    ]
});

fuzz_target!(|data: &[u8]| {
    for schema in SCHEMAS.iter() {
        check(schema, data);
    }
});

fn check(schema: &Schema, data: &[u8]) {
    let region = schema.region_of(data);
    let Ok(parsed) = schema.parse(data) else {
        return;
    };
    parsed.validate().expect("a parsed key has valid segments");
    let raw = schema.endpoint_key(&parsed);
    assert_eq!(
        raw.as_bytes(),
        data,
        "endpoint_key(parse(k)) != k under root {:?}",
        schema.root()
    );
    assert_eq!(
        region,
        Some(parsed.region.as_str()),
        "region_of disagrees with parse under root {:?}",
        schema.root()
    );
    assert_eq!(
        schema.region_prefix(&parsed.region).ok().as_deref(),
        Some(&raw[..schema.root().len() + parsed.region.len() + 1]),
        "the key is not under its region's prefix"
    );
}
