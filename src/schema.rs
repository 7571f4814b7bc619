//! Key schema of the endpoint registry.
//!
//! Every endpoint lives at one key, laid out origin-first:
//!
//! ```text
//! <root><region>/clusters/<cluster>/services/<service>/protocols/<proto>/endpoints/<ip>
//! ```
//!
//! With the default root that is
//! `/aether/v1/regions/eu-west/clusters/prod-1/services/checkout/protocols/grpc/endpoints/10.0.0.7`.
//!
//! The region comes first so that each region owns exactly one contiguous
//! subtree, `<root><region>/`. A region only ever writes under its own
//! subtree and the replicator mirrors that subtree verbatim into the other
//! regions; because the partitions are disjoint, cross-region replication
//! never has two writers for the same key and is therefore conflict-free.
//!
//! The root defaults to [`DEFAULT_ROOT`] (`/aether/v1/regions/`) but is
//! configurable through [`Schema::new`], since some deployments namespace the
//! registry (for example `/tenant-a/aether/v1/regions/`). Keys are therefore
//! always built and parsed relative to a [`Schema`].
//!
//! A variable segment (region, cluster, service, protocol, ip) must be
//! non-empty and must not contain `/`; nothing else is restricted, so IPv4
//! and IPv6 addresses (`10.0.0.7`, `fd00::1`) are both valid. See
//! [`validate_segment`].
//!
//! ```rust
//! use aether_replicator::schema::{EndpointKey, Schema};
//!
//! let schema = Schema::default();
//! let key = EndpointKey::new("eu-west", "prod-1", "checkout", "grpc", "fd00::1")?;
//! let raw = schema.endpoint_key(&key);
//! assert_eq!(
//!     raw,
//!     "/aether/v1/regions/eu-west/clusters/prod-1/services/checkout/protocols/grpc/endpoints/fd00::1"
//! );
//! assert!(raw.starts_with(&schema.region_prefix("eu-west")?));
//! assert_eq!(schema.parse(raw.as_bytes())?, key);
//! assert_eq!(schema.region_of(raw.as_bytes()), Some("eu-west"));
//! # Ok::<(), aether_replicator::schema::SchemaError>(())
//! ```

/// The default root under which all regions live.
pub const DEFAULT_ROOT: &str = "/aether/v1/regions/";

const CLUSTERS: &str = "clusters";
const SERVICES: &str = "services";
const PROTOCOLS: &str = "protocols";
const ENDPOINTS: &str = "endpoints";

/// Endpoint key layout after the root: (literal preceding the variable, variable kind).
const LAYOUT: [(Option<&str>, &str); 5] = [
    (None, "region"),
    (Some(CLUSTERS), "cluster"),
    (Some(SERVICES), "service"),
    (Some(PROTOCOLS), "protocol"),
    (Some(ENDPOINTS), "ip"),
];

/// Errors from building, validating or parsing registry keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A segment passed to a constructor was empty.
    #[error("empty {kind} segment")]
    EmptySegment {
        /// Which segment (`"region"`, `"cluster"`, ...).
        kind: &'static str,
    },
    /// A segment passed to a constructor contained `/`.
    #[error("{kind} segment {value:?} contains '/'")]
    SlashInSegment {
        /// Which segment (`"region"`, `"cluster"`, ...).
        kind: &'static str,
        /// The offending value.
        value: String,
    },
    /// The configured root is not a valid root.
    #[error("invalid key root {root:?}: {reason}")]
    InvalidRoot {
        /// The rejected root.
        root: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A key does not start with the schema's root.
    #[error("key {key:?} is not under root {root:?}")]
    NotUnderRoot {
        /// The key.
        key: String,
        /// The schema's root.
        root: String,
    },
    /// A key is under the root but is not a well-formed endpoint key.
    #[error("malformed endpoint key {key:?}: {reason}")]
    Malformed {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A raw key is not valid UTF-8.
    #[error("key is not valid UTF-8: {key:?}")]
    NotUtf8 {
        /// The key, lossily decoded.
        key: String,
    },
}

/// Checks one variable key segment: it must be non-empty and must not
/// contain `/`.
///
/// That is the whole rule; any other character (including `:`, `.`, spaces,
/// non-ASCII and control characters) is accepted, so IPv4 and IPv6 addresses
/// are valid `ip` segments. `kind` names the segment in the error.
pub fn validate_segment(kind: &'static str, s: &str) -> Result<(), SchemaError> {
    if s.is_empty() {
        return Err(SchemaError::EmptySegment { kind });
    }
    if s.contains('/') {
        return Err(SchemaError::SlashInSegment {
            kind,
            value: s.to_owned(),
        });
    }
    Ok(())
}

/// The identity of one endpoint: the variable segments of its key.
///
/// [`EndpointKey::new`] validates every segment. The fields are public, so a
/// value built by hand may bypass that; use [`EndpointKey::validate`] to check
/// one before turning it into a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointKey {
    /// Origin region, the owner of the key.
    pub region: String,
    /// Cluster within the region.
    pub cluster: String,
    /// Service name.
    pub service: String,
    /// Protocol (`grpc`, `http`, ...).
    pub protocol: String,
    /// Endpoint address, IPv4 or IPv6.
    pub ip: String,
}

impl EndpointKey {
    /// Builds an endpoint key, validating every segment with
    /// [`validate_segment`].
    pub fn new(
        region: impl Into<String>,
        cluster: impl Into<String>,
        service: impl Into<String>,
        protocol: impl Into<String>,
        ip: impl Into<String>,
    ) -> Result<Self, SchemaError> {
        let key = Self {
            region: region.into(),
            cluster: cluster.into(),
            service: service.into(),
            protocol: protocol.into(),
            ip: ip.into(),
        };
        key.validate()?;
        Ok(key)
    }

    /// Validates every segment, reporting the first invalid one.
    pub fn validate(&self) -> Result<(), SchemaError> {
        validate_segment("region", &self.region)?;
        validate_segment("cluster", &self.cluster)?;
        validate_segment("service", &self.service)?;
        validate_segment("protocol", &self.protocol)?;
        validate_segment("ip", &self.ip)
    }
}

/// The key layout under one root. Defaults to [`DEFAULT_ROOT`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema {
    root: String,
}

impl Default for Schema {
    fn default() -> Self {
        Self {
            root: DEFAULT_ROOT.to_owned(),
        }
    }
}

impl Schema {
    /// Creates a schema rooted at `root`.
    ///
    /// The root must start and end with `/`, contain at least one segment
    /// (`/` alone is rejected) and contain no empty segment (`//`).
    pub fn new(root: impl Into<String>) -> Result<Self, SchemaError> {
        let root = root.into();
        let reason = if !root.starts_with('/') {
            Some("must start with '/'")
        } else if !root.ends_with('/') {
            Some("must end with '/'")
        } else if root.len() < 2 {
            Some("must contain at least one segment")
        } else if root.contains("//") {
            Some("must not contain an empty segment ('//')")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(SchemaError::InvalidRoot { root, reason }),
            None => Ok(Self { root }),
        }
    }

    /// The root, always starting and ending with `/`.
    #[must_use]
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The prefix of the subtree owned by `region`: `<root><region>/`.
    pub fn region_prefix(&self, region: &str) -> Result<String, SchemaError> {
        validate_segment("region", region)?;
        Ok(format!("{}{region}/", self.root))
    }

    /// The prefix of one cluster's keys: `<root><region>/clusters/<cluster>/`.
    pub fn cluster_prefix(&self, region: &str, cluster: &str) -> Result<String, SchemaError> {
        validate_segment("region", region)?;
        validate_segment("cluster", cluster)?;
        Ok(format!("{}{region}/{CLUSTERS}/{cluster}/", self.root))
    }

    /// The full key of an endpoint.
    ///
    /// Segments are not re-validated; a key from [`EndpointKey::new`] or
    /// [`Schema::parse`] always yields a key that parses back to itself.
    #[must_use]
    pub fn endpoint_key(&self, key: &EndpointKey) -> String {
        let EndpointKey {
            region,
            cluster,
            service,
            protocol,
            ip,
        } = key;
        format!(
            "{root}{region}/{CLUSTERS}/{cluster}/{SERVICES}/{service}/{PROTOCOLS}/{protocol}/{ENDPOINTS}/{ip}",
            root = self.root,
        )
    }

    /// Parses a raw etcd key into an [`EndpointKey`].
    ///
    /// The key must be UTF-8 ([`SchemaError::NotUtf8`]), start with the root
    /// ([`SchemaError::NotUnderRoot`]) and then match the layout exactly:
    /// literal segments in place, no empty segment, nothing after the ip, no
    /// trailing slash ([`SchemaError::Malformed`], naming the problem).
    pub fn parse(&self, key: &[u8]) -> Result<EndpointKey, SchemaError> {
        let key = std::str::from_utf8(key).map_err(|_| SchemaError::NotUtf8 {
            key: String::from_utf8_lossy(key).into_owned(),
        })?;
        let rest =
            key.strip_prefix(self.root.as_str())
                .ok_or_else(|| SchemaError::NotUnderRoot {
                    key: key.to_owned(),
                    root: self.root.clone(),
                })?;
        let malformed = |reason: String| SchemaError::Malformed {
            key: key.to_owned(),
            reason,
        };

        // Nine segments; a tenth item is whatever follows the ip.
        let mut segs = rest.splitn(10, '/');
        let mut vars: [&str; 5] = [""; 5];
        let mut prev = "root";
        for (i, (literal, kind)) in LAYOUT.into_iter().enumerate() {
            if let Some(literal) = literal {
                match segs.next() {
                    None => return Err(malformed(format!("missing `{literal}` after {prev}"))),
                    Some(s) if s == literal => {}
                    Some("") => {
                        return Err(malformed(format!(
                            "expected `{literal}` after {prev}, found empty segment"
                        )));
                    }
                    Some(s) => {
                        return Err(malformed(format!(
                            "expected `{literal}` after {prev}, found `{s}`"
                        )));
                    }
                }
                prev = literal;
            }
            match segs.next() {
                None => return Err(malformed(format!("missing {kind} after `{prev}`"))),
                Some("") => return Err(malformed(format!("empty {kind} segment"))),
                Some(s) => vars[i] = s,
            }
            prev = kind;
        }
        match segs.next() {
            None => {}
            Some("") => return Err(malformed("trailing '/' after ip".to_owned())),
            Some(extra) => {
                return Err(malformed(format!(
                    "unexpected segments after ip: `{extra}`"
                )));
            }
        }
        let [region, cluster, service, protocol, ip] = vars.map(str::to_owned);
        Ok(EndpointKey {
            region,
            cluster,
            service,
            protocol,
            ip,
        })
    }

    /// The region segment of any key under the root, or `None` if the key is
    /// not under the root or its region segment is empty or not UTF-8.
    ///
    /// Only the root and the region segment are examined, so this works for
    /// every key in a region's subtree, not just endpoint keys.
    #[must_use]
    pub fn region_of<'k>(&self, key: &'k [u8]) -> Option<&'k str> {
        let rest = key.strip_prefix(self.root.as_bytes())?;
        let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
        let region = std::str::from_utf8(&rest[..end]).ok()?;
        (!region.is_empty()).then_some(region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ek(region: &str, cluster: &str, service: &str, protocol: &str, ip: &str) -> EndpointKey {
        EndpointKey::new(region, cluster, service, protocol, ip).unwrap()
    }

    fn sample() -> EndpointKey {
        ek("eu-west", "prod-1", "checkout", "grpc", "10.0.0.7")
    }

    const SAMPLE: &str = "/aether/v1/regions/eu-west/clusters/prod-1/services/checkout/protocols/grpc/endpoints/10.0.0.7";

    fn malformed_reason(schema: &Schema, key: &str) -> String {
        match schema.parse(key.as_bytes()) {
            Err(SchemaError::Malformed { key: k, reason }) => {
                assert_eq!(k, key);
                reason
            }
            other => panic!("expected Malformed for {key:?}, got {other:?}"),
        }
    }

    #[test]
    fn build_and_parse_round_trip() {
        let schema = Schema::default();
        let key = sample();
        let raw = schema.endpoint_key(&key);
        assert_eq!(raw, SAMPLE);
        assert_eq!(schema.parse(raw.as_bytes()).unwrap(), key);
    }

    #[test]
    fn ipv6_endpoints() {
        let schema = Schema::default();
        for ip in [
            "fd00::1",
            "2001:db8::5",
            "::1",
            "fe80::1%eth0",
            "::ffff:10.0.0.1",
        ] {
            let key = ek("us-east", "c", "s", "http", ip);
            let raw = schema.endpoint_key(&key);
            assert!(raw.ends_with(&format!("/endpoints/{ip}")));
            assert_eq!(schema.parse(raw.as_bytes()).unwrap(), key);
        }
    }

    #[test]
    fn segments_may_look_like_literals() {
        let schema = Schema::default();
        let key = ek("clusters", "services", "protocols", "endpoints", "regions");
        let raw = schema.endpoint_key(&key);
        assert_eq!(schema.parse(raw.as_bytes()).unwrap(), key);
    }

    #[test]
    fn custom_root() {
        let schema = Schema::new("/tenant-a/aether/v1/regions/").unwrap();
        assert_eq!(schema.root(), "/tenant-a/aether/v1/regions/");
        let key = sample();
        let raw = schema.endpoint_key(&key);
        assert_eq!(raw, format!("/tenant-a{SAMPLE}"));
        assert_eq!(schema.parse(raw.as_bytes()).unwrap(), key);
        assert_eq!(schema.region_of(raw.as_bytes()), Some("eu-west"));
        // The default schema does not accept it, and vice versa.
        assert!(matches!(
            Schema::default().parse(raw.as_bytes()),
            Err(SchemaError::NotUnderRoot { .. })
        ));
        assert!(matches!(
            schema.parse(SAMPLE.as_bytes()),
            Err(SchemaError::NotUnderRoot { .. })
        ));
        // A single-segment root is fine.
        let short = Schema::new("/r/").unwrap();
        let raw = short.endpoint_key(&key);
        assert!(raw.starts_with("/r/eu-west/clusters/"));
        assert_eq!(short.parse(raw.as_bytes()).unwrap(), key);
    }

    #[test]
    fn default_schema() {
        assert_eq!(Schema::default().root(), DEFAULT_ROOT);
        assert_eq!(Schema::new(DEFAULT_ROOT).unwrap(), Schema::default());
    }

    #[test]
    fn invalid_roots() {
        for (root, reason) in [
            ("", "must start with '/'"),
            ("aether/v1/", "must start with '/'"),
            ("/aether/v1", "must end with '/'"),
            ("/", "must contain at least one segment"),
            ("//", "must not contain an empty segment ('//')"),
            ("/aether//v1/", "must not contain an empty segment ('//')"),
        ] {
            assert_eq!(
                Schema::new(root),
                Err(SchemaError::InvalidRoot {
                    root: root.to_owned(),
                    reason
                }),
                "root {root:?}"
            );
        }
    }

    #[test]
    fn prefixes_are_prefixes_of_keys() {
        for schema in [Schema::default(), Schema::new("/ns/regions/").unwrap()] {
            let key = sample();
            let raw = schema.endpoint_key(&key);
            let region = schema.region_prefix(&key.region).unwrap();
            let cluster = schema.cluster_prefix(&key.region, &key.cluster).unwrap();
            assert_eq!(region, format!("{}eu-west/", schema.root()));
            assert_eq!(
                cluster,
                format!("{}eu-west/clusters/prod-1/", schema.root())
            );
            assert!(raw.starts_with(&region));
            assert!(raw.starts_with(&cluster));
            assert!(cluster.starts_with(&region));
            // A region's prefix does not cover a region whose name extends it.
            let other = schema.endpoint_key(&ek("eu-west-2", "prod-1", "s", "p", "1.2.3.4"));
            assert!(!other.starts_with(&region));
        }
    }

    #[test]
    fn prefixes_validate_segments() {
        let schema = Schema::default();
        assert_eq!(
            schema.region_prefix(""),
            Err(SchemaError::EmptySegment { kind: "region" })
        );
        assert_eq!(
            schema.region_prefix("eu/west"),
            Err(SchemaError::SlashInSegment {
                kind: "region",
                value: "eu/west".to_owned()
            })
        );
        assert_eq!(
            schema.cluster_prefix("eu", ""),
            Err(SchemaError::EmptySegment { kind: "cluster" })
        );
        assert_eq!(
            schema.cluster_prefix("", "c"),
            Err(SchemaError::EmptySegment { kind: "region" })
        );
    }

    #[test]
    fn validate_segment_rules() {
        for ok in [
            "a",
            "10.0.0.1",
            "fd00::1",
            "2001:db8::5",
            "with space",
            "ünïcode",
            "nul\0byte",
            ".",
            "..",
        ] {
            assert_eq!(validate_segment("x", ok), Ok(()), "{ok:?}");
        }
        assert_eq!(
            validate_segment("service", ""),
            Err(SchemaError::EmptySegment { kind: "service" })
        );
        for bad in ["/", "a/b", "/a", "a/"] {
            assert_eq!(
                validate_segment("ip", bad),
                Err(SchemaError::SlashInSegment {
                    kind: "ip",
                    value: bad.to_owned()
                })
            );
        }
    }

    #[test]
    fn constructor_rejects_each_segment() {
        let valid = ["r", "c", "s", "p", "1.2.3.4"];
        let kinds = ["region", "cluster", "service", "protocol", "ip"];
        for (i, kind) in kinds.into_iter().enumerate() {
            let mut parts = valid;
            parts[i] = "";
            let [r, c, s, p, ip] = parts;
            assert_eq!(
                EndpointKey::new(r, c, s, p, ip),
                Err(SchemaError::EmptySegment { kind })
            );
            parts[i] = "x/y";
            let [r, c, s, p, ip] = parts;
            assert_eq!(
                EndpointKey::new(r, c, s, p, ip),
                Err(SchemaError::SlashInSegment {
                    kind,
                    value: "x/y".to_owned()
                })
            );
        }
        let mut hand_built = sample();
        hand_built.protocol.clear();
        assert_eq!(
            hand_built.validate(),
            Err(SchemaError::EmptySegment { kind: "protocol" })
        );
    }

    #[test]
    fn parse_rejects_non_utf8() {
        let mut raw = SAMPLE.as_bytes().to_vec();
        raw.push(0xff);
        match Schema::default().parse(&raw) {
            Err(SchemaError::NotUtf8 { key }) => assert!(key.starts_with(SAMPLE)),
            other => panic!("expected NotUtf8, got {other:?}"),
        }
    }

    #[test]
    fn parse_rejects_keys_outside_root() {
        let schema = Schema::default();
        for key in [
            "",
            "/",
            "/aether/v1/regions",
            "/aether/v1/regionsX/eu/clusters/c/services/s/protocols/p/endpoints/1",
            "/aether/v2/regions/eu/clusters/c/services/s/protocols/p/endpoints/1",
            "aether/v1/regions/eu/clusters/c/services/s/protocols/p/endpoints/1",
        ] {
            assert_eq!(
                schema.parse(key.as_bytes()),
                Err(SchemaError::NotUnderRoot {
                    key: key.to_owned(),
                    root: DEFAULT_ROOT.to_owned()
                }),
                "{key:?}"
            );
        }
    }

    #[test]
    fn parse_rejects_structural_errors() {
        let schema = Schema::default();
        let r = DEFAULT_ROOT;
        let cases = [
            // Missing segments.
            (r.to_owned(), "empty region segment"),
            (format!("{r}eu"), "missing `clusters` after region"),
            (
                format!("{r}eu/clusters"),
                "missing cluster after `clusters`",
            ),
            (
                format!("{r}eu/clusters/c"),
                "missing `services` after cluster",
            ),
            (
                format!("{r}eu/clusters/c/services/s/protocols/p"),
                "missing `endpoints` after protocol",
            ),
            (
                format!("{r}eu/clusters/c/services/s/protocols/p/endpoints"),
                "missing ip after `endpoints`",
            ),
            // Prefixes (trailing slash) are not endpoint keys.
            (
                format!("{r}eu/"),
                "expected `clusters` after region, found empty segment",
            ),
            (
                format!("{r}eu/clusters/c/"),
                "expected `services` after cluster, found empty segment",
            ),
            (
                format!("{r}eu/clusters/c/services/s/protocols/p/endpoints/"),
                "empty ip segment",
            ),
            (format!("{SAMPLE}/"), "trailing '/' after ip"),
            // Empty segments.
            (
                format!("{r}/clusters/c/services/s/protocols/p/endpoints/1"),
                "empty region segment",
            ),
            (
                format!("{r}eu/clusters//services/s/protocols/p/endpoints/1"),
                "empty cluster segment",
            ),
            (
                format!("{r}eu/clusters/c/services//protocols/p/endpoints/1"),
                "empty service segment",
            ),
            (
                format!("{r}eu/clusters/c/services/s/protocols//endpoints/1"),
                "empty protocol segment",
            ),
            (
                format!("{r}eu//clusters/c/services/s/protocols/p/endpoints/1"),
                "expected `clusters` after region, found empty segment",
            ),
            // Wrong literals.
            (
                format!("{r}eu/cluster/c/services/s/protocols/p/endpoints/1"),
                "expected `clusters` after region, found `cluster`",
            ),
            (
                format!("{r}eu/clusters/c/svc/s/protocols/p/endpoints/1"),
                "expected `services` after cluster, found `svc`",
            ),
            (
                format!("{r}eu/clusters/c/services/s/protocol/p/endpoints/1"),
                "expected `protocols` after service, found `protocol`",
            ),
            (
                format!("{r}eu/clusters/c/services/s/protocols/p/ENDPOINTS/1"),
                "expected `endpoints` after protocol, found `ENDPOINTS`",
            ),
            // Extra trailing segments.
            (
                format!("{SAMPLE}/extra"),
                "unexpected segments after ip: `extra`",
            ),
            (
                format!("{SAMPLE}/a/b"),
                "unexpected segments after ip: `a/b`",
            ),
            (format!("{SAMPLE}//"), "unexpected segments after ip: `/`"),
            (format!("{SAMPLE}/x/"), "unexpected segments after ip: `x/`"),
        ];
        for (key, want) in cases {
            assert_eq!(malformed_reason(&schema, &key), want, "key {key:?}");
        }
    }

    #[test]
    fn trailing_segment_report_with_repeated_ip() {
        // The ip text also occurs earlier in the key; the report must still
        // point at what follows the ip segment.
        let schema = Schema::default();
        let key = ek("1", "1", "1", "1", "1");
        let raw = format!("{}/1/1", schema.endpoint_key(&key));
        assert_eq!(
            malformed_reason(&schema, &raw),
            "unexpected segments after ip: `1/1`"
        );
    }

    #[test]
    fn error_messages_name_the_problem() {
        let schema = Schema::default();
        let err = schema
            .parse(format!("{SAMPLE}/extra").as_bytes())
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("extra") && msg.contains("malformed"), "{msg}");
        assert!(!msg.contains('\n'));
        let msg = validate_segment("cluster", "a/b").unwrap_err().to_string();
        assert_eq!(msg, r#"cluster segment "a/b" contains '/'"#);
        let msg = Schema::new("x").unwrap_err().to_string();
        assert_eq!(msg, r#"invalid key root "x": must start with '/'"#);
        assert_eq!(
            SchemaError::EmptySegment { kind: "ip" }.to_string(),
            "empty ip segment"
        );
    }

    #[test]
    fn region_of_any_key() {
        let schema = Schema::default();
        assert_eq!(schema.region_of(SAMPLE.as_bytes()), Some("eu-west"));
        let r = DEFAULT_ROOT;
        assert_eq!(schema.region_of(format!("{r}eu/").as_bytes()), Some("eu"));
        assert_eq!(schema.region_of(format!("{r}eu").as_bytes()), Some("eu"));
        assert_eq!(
            schema.region_of(format!("{r}eu/clusters/c/meta").as_bytes()),
            Some("eu")
        );
        // Non-UTF-8 beyond the region segment does not matter.
        let mut raw = format!("{r}eu/").into_bytes();
        raw.push(0xff);
        assert_eq!(schema.region_of(&raw), Some("eu"));
        // ...but in the region segment it does.
        let mut raw = r.as_bytes().to_vec();
        raw.extend_from_slice(&[0xff, b'/']);
        assert_eq!(schema.region_of(&raw), None);
        assert_eq!(schema.region_of(r.as_bytes()), None);
        assert_eq!(schema.region_of(format!("{r}/x").as_bytes()), None);
        assert_eq!(schema.region_of(b"/aether/v1/regions"), None);
        assert_eq!(schema.region_of(b"/other/eu/"), None);
        assert_eq!(schema.region_of(b""), None);
    }

    /// Tiny deterministic LCG (Knuth's MMIX constants).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 33
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn segment(&mut self) -> String {
            const ALPHABET: &str = "azAZ09-_.:%@ +=éß€\u{1F980}\\?#";
            let alphabet: Vec<char> = ALPHABET.chars().collect();
            let len = 1 + self.below(8);
            (0..len)
                .map(|_| alphabet[self.below(alphabet.len())])
                .collect()
        }

        fn literal_or_segment(&mut self) -> String {
            const LITERALS: &[&str] =
                &["clusters", "services", "protocols", "endpoints", "regions"];
            if self.below(8) == 0 {
                LITERALS[self.below(LITERALS.len())].to_owned()
            } else {
                self.segment()
            }
        }

        fn ip(&mut self) -> String {
            match self.below(3) {
                0 => format!(
                    "{}.{}.{}.{}",
                    self.below(256),
                    self.below(256),
                    self.below(256),
                    self.below(256)
                ),
                1 => format!("fd00::{:x}", self.below(0x10000)),
                _ => format!(
                    "2001:db8:{:x}::{:x}:{:x}",
                    self.below(0x10000),
                    self.below(0x10000),
                    self.below(0x10000)
                ),
            }
        }
    }

    #[test]
    fn generated_round_trips() {
        let schemas = [
            Schema::default(),
            Schema::new("/tenant-a/aether/v1/regions/").unwrap(),
            Schema::new("/x/").unwrap(),
        ];
        let mut rng = Lcg(0x5eed);
        for i in 0..600 {
            let schema = &schemas[i % schemas.len()];
            let ip = if rng.below(4) == 0 {
                rng.segment()
            } else {
                rng.ip()
            };
            let key = EndpointKey::new(
                rng.literal_or_segment(),
                rng.literal_or_segment(),
                rng.literal_or_segment(),
                rng.literal_or_segment(),
                ip,
            )
            .unwrap();
            let raw = schema.endpoint_key(&key);
            assert_eq!(schema.parse(raw.as_bytes()).as_ref(), Ok(&key), "{raw:?}");
            assert_eq!(schema.region_of(raw.as_bytes()), Some(key.region.as_str()));
            assert!(raw.starts_with(&schema.region_prefix(&key.region).unwrap()));
            assert!(raw.starts_with(&schema.cluster_prefix(&key.region, &key.cluster).unwrap()));
            // Any extension of a valid key is rejected.
            let extended = format!("{raw}/{}", rng.segment());
            assert!(matches!(
                schema.parse(extended.as_bytes()),
                Err(SchemaError::Malformed { .. })
            ));
        }
    }
}
