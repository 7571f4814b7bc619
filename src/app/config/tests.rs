//! The command line's tests: clap's definitions, and validation's
//! refusals and results. The parsers' own tests are in `app::parse`.

use clap::CommandFactory;
use clap::error::ErrorKind;

use std::time::Duration;

use clap::Parser;

use super::*;
use crate::app::endpoints::Output;
use crate::app::migrate::MigrateOptions;
use crate::app::parse::{INVALID_URLS, VALID_URLS};
use crate::etcd::{ClientConfig, Credentials, TlsConfig, TxnLimits};
use crate::mirror::{DEFAULT_LEASE_TTL, MirrorConfig};
use crate::schema::DEFAULT_ROOT;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("aether-replicator").chain(args.iter().copied()))
}

fn config(args: &[&str]) -> Result<Config, ConfigError> {
    parse(args)
        .expect("clap accepts the args")
        .run_args()
        .validate()
}

/// Asserts that validation refuses `args` with a one-line message that
/// starts with `flag` and contains `needle`.
#[track_caller]
fn refused(args: &[&str], flag: &str, needle: &str) -> String {
    refused_by(
        config(args).expect_err("validation refuses the args"),
        flag,
        needle,
    )
}

/// Asserts that `err` is a one-line message that starts with `flag` and
/// contains `needle`.
#[track_caller]
fn refused_by(err: ConfigError, flag: &str, needle: &str) -> String {
    let msg = err.to_string();
    assert_eq!(err.flag(), flag, "{msg}");
    assert!(
        msg.starts_with(flag),
        "{msg:?} does not start with {flag:?}"
    );
    assert!(msg.contains(needle), "{msg:?} does not contain {needle:?}");
    assert!(!msg.contains('\n'), "{msg:?} is not one line");
    msg
}

/// [`refused`] for a run of region a: `args` come after `--region=a`,
/// which nearly every case needs.
#[track_caller]
fn refused_in_a(args: &[&str], flag: &str, needle: &str) -> String {
    let mut argv = vec!["--region=a"];
    argv.extend_from_slice(args);
    refused(&argv, flag, needle)
}

/// A CA, and a certificate with its key, valid now: validation reads the
/// certificates' dates and whether the key is the certificate's
/// (`app::certs`); the handshake tests use a real etcd.
struct Pki {
    _dir: tempfile::TempDir,
    ca: String,
    cert: String,
    key: String,
    /// A password file holding "pw".
    password: String,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, pem: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.to_str().unwrap().to_string()
    };
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    Pki {
        ca: file("ca.pem", cert.pem()),
        cert: file("cert.pem", cert.pem()),
        key: file("key.pem", key.serialize_pem()),
        password: file("password", "pw\n".into()),
        _dir: dir,
    }
}

#[test]
fn tls_files_that_are_not_pem() {
    let pki = pki();
    let local_ca = format!("--local-ca={}", pki.key);
    assert_eq!(
        refused_in_a(
            &["--local-etcd=https://x:1", &local_ca],
            "--local-ca",
            "no PEM",
        ),
        format!(
            "--local-ca {:?}: no PEM \"-----BEGIN ...CERTIFICATE-----\" block",
            pki.key
        )
    );
    let peer_tls = format!("b=ca={},cert={},key={}", pki.ca, pki.cert, pki.cert);
    refused_in_a(
        &[
            "--peer-etcd=b=https://b:1",
            &format!("--peer-tls={peer_tls}"),
        ],
        "--peer-tls",
        "PRIVATE KEY",
    );
}

#[test]
fn clap_definition_is_consistent() {
    Cli::command().debug_assert();
    Cli::command_line().debug_assert();
}

/// The long flags `sub --help` lists.
fn listed_flags(sub: &str) -> Vec<String> {
    let cmd = Cli::command_line();
    let sub = cmd.find_subcommand(sub).unwrap();
    sub.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect()
}

#[test]
fn a_subcommands_help_lists_its_own_options_only() {
    let connection = [
        "config",
        "local-etcd",
        "local-ca",
        "local-cert",
        "local-key",
        "local-server-name",
        "local-user",
        "local-password-file",
        "peer-etcd",
        "peer-tls",
        "peer-auth",
        "region",
        "root",
    ];
    let with = |own: &[&str]| {
        let mut v: Vec<String> = own
            .iter()
            .chain(&connection)
            .map(|s| s.to_string())
            .collect();
        v.sort();
        v
    };
    for (sub, own) in [
        ("status", &["output", "max-staleness"][..]),
        ("check", &["page-size"][..]),
        (
            "setup-auth",
            &[
                "apply",
                "admin-user",
                "admin-password-file",
                "peer-admin-password-file",
            ][..],
        ),
    ] {
        let mut listed = listed_flags(sub);
        listed.sort();
        assert_eq!(listed, with(own), "{sub} --help");
    }
    // Hidden, not refused: a run's command line works for them as given.
    let cli = parse(&[
        "status",
        "--region=a",
        "--lease-ttl=60s",
        "--max-inflight=3",
    ])
    .unwrap();
    assert_eq!(cli.run_args().settings.lease_ttl.as_deref(), Some("60s"));
    // The subcommand's own options come first in its help.
    let mut cmd = Cli::command_line();
    let help = cmd
        .find_subcommand_mut("setup-auth")
        .unwrap()
        .render_help()
        .to_string();
    let own = help.find("--apply").unwrap();
    assert!(own < help.find("--config").unwrap(), "{help}");
}

#[test]
fn version_names_the_revision_and_the_build_date() {
    let v = Cli::command_line().render_version();
    let re_ok = v.starts_with(&format!(
        "aether-replicator {} (rev ",
        env!("CARGO_PKG_VERSION")
    )) && v.contains(", built ")
        && v.trim_end().ends_with(')');
    assert!(re_ok, "{v:?}");
    // A date, YYYY-MM-DD.
    let date = v
        .trim_end()
        .trim_end_matches(')')
        .rsplit(' ')
        .next()
        .unwrap();
    assert_eq!(date.len(), 10, "{v:?}");
    assert!(
        date.chars().all(|c| c.is_ascii_digit() || c == '-'),
        "{v:?}"
    );
}

#[test]
fn a_run_without_peers_is_refused() {
    let cli = parse(&["--region=a"]).unwrap();
    let err = cli.run_args().validate_run().unwrap_err();
    refused_by(err, "--peer-etcd", "no peer regions");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.toml");
    std::fs::write(&path, "region = \"a\"\n").unwrap();
    let path = path.to_str().unwrap();
    let cli = parse(&["--config", path]).unwrap();
    let msg = refused_by(
        cli.run_args().validate_run().unwrap_err(),
        "--peer-etcd",
        "[peers.<region>]",
    );
    assert!(msg.contains(path), "{msg}");
    let cli = parse(&["--region=a", "--peer-etcd=b=http://b:2379"]).unwrap();
    assert_eq!(cli.run_args().validate_run().unwrap().peers.len(), 1);
}

#[test]
fn log_levels() {
    let c = config(&["--region=a"]).unwrap();
    assert_eq!(c.log_level, DEFAULT_LOG_LEVEL);
    for level in [
        "debug",
        "WARN",
        "info,aether_replicator::mirror=debug",
        "aether_etcd=trace",
    ] {
        let c = config(&["--region=a", "--log-level", level]).unwrap();
        assert_eq!(c.log_level, level);
    }
    refused_in_a(
        &["--log-level=verbose"],
        "--log-level",
        "\"verbose\" is not a level",
    );
    refused_in_a(
        &["--log-level=info,x=loud"],
        "--log-level",
        "\"loud\" is not a level",
    );
}

#[test]
fn metrics_addr_forms() {
    let c = config(&["--region=a", "--metrics-addr=:9999"]).unwrap();
    assert_eq!(c.metrics_addr, "0.0.0.0:9999".parse().unwrap());
    let c = config(&["--region=a", "--metrics-addr=localhost:9999"]).unwrap();
    assert_eq!(c.metrics_addr, "127.0.0.1:9999".parse().unwrap());
    let e = parse(&["--region=a", "--metrics-addr=example.com:1"]).unwrap_err();
    assert!(e.to_string().contains("not an IP address"), "{e}");
}

#[test]
fn check_config_prints_the_effective_settings() {
    let c = config(&[
        "--region=a",
        "--peer-etcd=b=http://b:2379",
        "--lease-ttl=60s",
        "--lapse-after=off",
    ])
    .unwrap();
    let out = c.effective();
    for line in [
        "region = a\n",
        "lease_ttl = 60s\n",
        // The default election TTL, a third of the lease.
        "election_ttl = 20s\n",
        "lapse_after = off\n",
        "metrics_addr = 127.0.0.1:9464\n",
        "log_level = info\n",
        "peers.b = http://b:2379\n",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }
}

#[test]
fn every_flag_has_its_env_var() {
    let cli = Cli::command();
    let check = cli.find_subcommand("check").unwrap().clone();
    for cmd in [&cli, &check] {
        let mut n = 0;
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            // An action, not a setting: asked for on the command line.
            if long == "check-config" {
                assert_eq!(arg.get_env(), None);
                continue;
            }
            let want = env_of(long);
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(want.as_str()),
                "--{long}"
            );
            n += 1;
        }
        // The 20 of the flags' first version, plus --config,
        // --replica-id, --reload-interval, the four freshness flags,
        // --peer-connections, --local-password-file and
        // --max-concurrent-syncs, --log-level.
        assert_eq!(n, 31);
    }
}

#[test]
fn defaults() {
    let c = config(&["--region", "a"]).unwrap();
    assert_eq!(c.region, "a");
    assert_eq!(c.local, ClientConfig::new(["http://127.0.0.1:2379"]));
    assert!(c.peers.is_empty());
    let mirror = MirrorConfig {
        lease_ttl: DEFAULT_LEASE_TTL,
        ..MirrorConfig::new("a")
    };
    assert_eq!(c.mirror, mirror);
    assert_eq!(c.mirror.limits, TxnLimits::default());
    assert_eq!(c.mirror.root, DEFAULT_ROOT);
    assert_eq!(c.election_ttl, Duration::from_secs(10));
    assert_eq!(c.metrics_addr, "127.0.0.1:9464".parse().unwrap());
    assert_eq!(c.log_format, LogFormat::Text);
}

#[test]
fn everything_set() {
    let pki = pki();
    let local_cert = format!("--local-cert={}", pki.cert);
    let local_key = format!("--local-key={}", pki.key);
    let local_ca = format!("--local-ca={}", pki.ca);
    let local_password = format!("--local-password-file={}", pki.password);
    let peer_auth = format!("--peer-auth=c=mirror:@{}", pki.password);
    let peer_tls = format!(
        "b=ca={},cert={},key={},server-name=etcd.b",
        pki.ca, pki.cert, pki.key
    );
    let c = config(&[
        "--region=a",
        "--local-etcd=https://l1:2379, https://l2:2379",
        &local_ca,
        &local_cert,
        &local_key,
        "--local-server-name=etcd.a",
        "--local-user=root",
        &local_password,
        "--peer-etcd=b=https://b1:2379,https://b2:2379",
        "--peer-etcd",
        "c=http://c:2379",
        "--peer-tls",
        &peer_tls,
        &peer_auth,
        "--lease-ttl=1m30s",
        "--election-ttl=20s",
        "--max-txn-ops=64",
        "--max-request-bytes=512KiB",
        "--max-inflight=3",
        "--page-size=500",
        "--max-concurrent-syncs=9",
        "--root=/tenant/aether/v1/regions/",
        "--metrics-addr=[::1]:9000",
        "--log-format=json",
    ])
    .unwrap();
    assert_eq!(c.local.endpoints, ["https://l1:2379", "https://l2:2379"]);
    let tls = TlsConfig::new()
        .with_ca_file(pki.ca.clone())
        .with_client_files(pki.cert.clone(), pki.key.clone())
        .with_server_name("etcd.a");
    assert_eq!(c.local.tls, Some(tls.clone()));
    let root = Credentials {
        user: "root".into(),
        password: "pw".into(),
    };
    assert_eq!(c.local.credentials, Some(root));

    assert_eq!(c.peers.len(), 2);
    assert_eq!(c.peers[0].region, "b");
    assert_eq!(
        c.peers[0].client.endpoints,
        ["https://b1:2379", "https://b2:2379"]
    );
    let b_tls = tls.clone().with_server_name("etcd.b");
    assert_eq!(c.peers[0].client.tls, Some(b_tls));
    assert_eq!(c.peers[0].client.credentials, None);
    assert_eq!(c.peers[1].region, "c");
    assert_eq!(c.peers[1].client.tls, None);
    let mirror = Credentials {
        user: "mirror".into(),
        password: "pw".into(),
    };
    assert_eq!(c.peers[1].client.credentials, Some(mirror));

    assert_eq!(c.mirror.region, "a");
    assert_eq!(c.mirror.root, "/tenant/aether/v1/regions/");
    assert_eq!(c.mirror.lease_ttl, Duration::from_secs(90));
    assert_eq!(c.election_ttl, Duration::from_secs(20));
    let limits = TxnLimits {
        max_ops: 64,
        max_bytes: 512 * 1024,
    };
    assert_eq!(c.mirror.limits, limits);
    assert_eq!(c.mirror.max_inflight, 3);
    assert_eq!(c.mirror.page_size, 500);
    assert_eq!(c.mirror.max_concurrent_syncs, 9);
    assert_eq!(c.metrics_addr, "[::1]:9000".parse().unwrap());
    assert_eq!(c.log_format, LogFormat::Json);
}

#[test]
fn check_subcommand_takes_the_same_flags() {
    let cli = parse(&["check", "--region", "a", "--peer-etcd", "b=http://b:2379"]).unwrap();
    assert!(matches!(cli.command, Some(Command::Check(_))));
    let c = cli.run_args().validate().unwrap();
    assert_eq!(c.region, "a");
    assert_eq!(c.peers[0].region, "b");

    let cli = parse(&["--region", "a"]).unwrap();
    assert!(cli.command.is_none());
    assert_eq!(cli.run_args().settings.region.as_deref(), Some("a"));
}

#[test]
fn clap_errors_exit_with_2() {
    for args in [
        &[][..],
        &["check"],
        &["--region", "a", "check"],
        &["--region", "a", "--max-txn-ops", "many"],
        &["--region", "a", "--log-format", "xml"],
        &["--region", "a", "--bogus"],
    ] {
        let err = parse(args).expect_err("clap refuses");
        assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
    }
    let err = parse(&[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
    assert!(err.to_string().contains("--region"));
}

#[test]
fn bad_metrics_addr_is_a_clap_error() {
    for addr in ["localhost", "127.0.0.1", "127.0.0.1:http", "1.2.3.4:70000"] {
        let err = parse(&["--region", "a", "--metrics-addr", addr]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation, "{addr}");
        assert!(err.to_string().contains("--metrics-addr"), "{err}");
    }
}

#[test]
fn several_peers_in_one_value() {
    let pki = pki();
    let auth = format!("b=u:@{0};c=v:@{0}", pki.password);
    let c = config(&[
        "--region=a",
        "--peer-etcd",
        "b=http://b:2379;c=http://c1:2379,http://c2:2379",
        "--peer-auth",
        &auth,
    ])
    .unwrap();
    let regions: Vec<_> = c.peers.iter().map(|p| p.region.as_str()).collect();
    assert_eq!(regions, ["b", "c"]);
    assert_eq!(
        c.peers[1].client.endpoints,
        ["http://c1:2379", "http://c2:2379"]
    );
    assert_eq!(c.peers[1].client.credentials.as_ref().unwrap().user, "v");
}

/// Passwords come from files only: one on the command line (or in its
/// variable) is refused with the file form in the error, and never echoed;
/// one read from a file is not in any Debug output.
#[test]
fn passwords_are_read_from_files_only_and_never_shown() {
    for (args, flag, form) in [
        (
            &["--local-user=root", "--local-password=hunter2"][..],
            "--local-password",
            "--local-password-file PATH",
        ),
        (
            &["--peer-etcd=b=http://b:2379", "--peer-auth=b=u:hunter2"][..],
            "--peer-auth",
            "<region>=<user>:@<password-file>",
        ),
    ] {
        let msg = refused_in_a(args, flag, "files only");
        assert!(msg.contains(form), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
    }
    let pki = pki();
    std::fs::write(&pki.password, "swordfish\n").unwrap();
    let cli = parse(&[
        "--region=a",
        "--local-user=root",
        &format!("--local-password-file={}", pki.password),
        "--peer-etcd=b=http://b:2379",
        &format!("--peer-auth=b=u:@{}", pki.password),
    ])
    .unwrap();
    let c = cli.run_args().validate().unwrap();
    assert_eq!(
        c.peers[0].client.credentials.as_ref().unwrap().password,
        "swordfish"
    );
    let shown = format!("{cli:?} {c:?}");
    assert!(!shown.contains("swordfish"), "{shown}");
    // Both are re-read on rotation, as the file's password_file is.
    assert_eq!(c.local_password_file.as_ref().unwrap().path, pki.password);
    assert_eq!(c.peer_password_files["b"].path, pki.password);
}

#[test]
fn peer_spec_without_equals() {
    let msg = refused_in_a(&["--peer-etcd=b"], "--peer-etcd", "missing '='");
    assert_eq!(
        msg,
        "--peer-etcd \"b\": missing '=' (expected <region>=<url>[,<url>...])"
    );
}

#[test]
fn empty_endpoint_lists() {
    refused_in_a(
        &["--peer-etcd=b="],
        "--peer-etcd",
        "--peer-etcd b: empty endpoint list",
    );
    refused_in_a(
        &["--peer-etcd=b=,"],
        "--peer-etcd",
        "--peer-etcd b: empty endpoint list",
    );
    refused_in_a(
        &["--local-etcd="],
        "--local-etcd",
        "--local-etcd: empty endpoint list",
    );
    refused_in_a(
        &["--local-etcd", " , "],
        "--local-etcd",
        "empty endpoint list",
    );
    refused_in_a(
        &["--local-etcd=http://x:1,"],
        "--local-etcd",
        "empty URL in endpoint list",
    );
}

#[test]
fn urls_that_are_not_endpoints() {
    let msg = refused_in_a(&["--peer-etcd=b=htp:/x"], "--peer-etcd", "not a valid URL");
    assert_eq!(
        msg,
        "--peer-etcd b: \"htp:/x\" is not a valid URL (expected http://host:port or https://host:port)"
    );
    // The parser's own cases, and more that only reach it through a flag.
    let more = [
        "http://x:port",
        "http://x:",
        "http://x:2379?a=b",
        "http://x y:2379",
    ];
    for url in INVALID_URLS.into_iter().chain(more) {
        refused_in_a(&["--local-etcd", url], "--local-etcd", "is not a valid URL");
    }
    for url in VALID_URLS {
        let mut args = vec!["--region=a", "--local-etcd", url];
        let pki = pki();
        let ca = format!("--local-ca={}", pki.ca);
        if url.starts_with("https") {
            args.push(&ca);
        }
        config(&args).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

#[test]
fn duplicate_endpoints() {
    refused_in_a(
        &["--local-etcd=http://x:1,http://X:1/"],
        "--local-etcd",
        "duplicate endpoint",
    );
    refused_in_a(
        &["--local-etcd=http://x:1", "--peer-etcd=b=http://x:1"],
        "--peer-etcd",
        "--peer-etcd b: endpoint \"http://x:1\" is also in --local-etcd",
    );
    refused_in_a(
        &["--peer-etcd=b=http://x:1", "--peer-etcd=c=http://x:1"],
        "--peer-etcd",
        "is also in --peer-etcd b",
    );
}

#[test]
fn mixed_schemes() {
    let pki = pki();
    let ca = format!("--local-ca={}", pki.ca);
    refused_in_a(
        &["--local-etcd=http://x:1,https://y:1", &ca],
        "--local-etcd",
        "mixes http:// and https://",
    );
}

#[test]
fn duplicate_peer_region() {
    let msg = refused_in_a(
        &["--peer-etcd=b=http://b1:1", "--peer-etcd=b=http://b2:1"],
        "--peer-etcd",
        "duplicate",
    );
    assert_eq!(msg, "--peer-etcd: duplicate peer region \"b\"");
}

#[test]
fn peer_is_this_region() {
    let msg = refused_in_a(&["--peer-etcd=a=http://x:1"], "--peer-etcd", "this region");
    assert_eq!(
        msg,
        "--peer-etcd \"a=http://x:1\": peer region is this region (--region a)"
    );
}

#[test]
fn peer_region_with_slash_or_empty() {
    refused_in_a(
        &["--peer-etcd=b/c=http://x:1"],
        "--peer-etcd",
        "contains '/'",
    );
    refused_in_a(
        &["--peer-etcd==http://x:1"],
        "--peer-etcd",
        "empty peer region",
    );
}

#[test]
fn region_empty_or_with_slash() {
    assert_eq!(
        refused(&["--region="], "--region", "must not be empty"),
        "--region \"\": must not be empty"
    );
    refused(&["--region=a/b"], "--region", "must not contain '/'");
}

#[test]
fn zero_duration() {
    assert_eq!(
        refused_in_a(&["--lease-ttl=0s"], "--lease-ttl", "greater than zero"),
        "--lease-ttl \"0s\": must be greater than zero"
    );
    refused_in_a(
        &["--election-ttl=0ms"],
        "--election-ttl",
        "greater than zero",
    );
    refused_in_a(&["--lease-ttl=0h0m0s"], "--lease-ttl", "greater than zero");
}

#[test]
fn malformed_durations() {
    for (raw, why) in [
        ("abc", "not a duration"),
        ("10", "missing unit"),
        ("10x", "unknown unit"),
        ("-5s", "negative"),
        ("", "empty duration"),
        ("1.s", "not a duration"),
        (".5s", "not a duration"),
        ("1s30m", "largest to smallest"),
        ("1s1s", "largest to smallest"),
        ("1m 30s", "unknown unit"),
        ("99999999999999999999999999999999999999999h", "too large"),
    ] {
        let flag = format!("--lease-ttl={raw}");
        refused_in_a(&[&flag], "--lease-ttl", why);
    }
}

#[test]
fn ttls_are_whole_seconds() {
    refused_in_a(
        &["--lease-ttl=1500ms"],
        "--lease-ttl",
        "whole number of seconds",
    );
    refused_in_a(
        &["--election-ttl=2.5s"],
        "--election-ttl",
        "whole number of seconds",
    );
    refused_in_a(&["--lease-ttl=9000000001s"], "--lease-ttl", "at most");
    let c = config(&["--region=a", "--lease-ttl=2500ms", "--election-ttl=1s"]);
    assert!(c.is_err());
    let c = config(&["--region=a", "--lease-ttl=1.5m"]).unwrap();
    assert_eq!(c.mirror.lease_ttl, Duration::from_secs(90));
}

#[test]
fn election_ttl_at_most_half_the_lease_ttl() {
    assert_eq!(
        refused_in_a(
            &["--lease-ttl=30s", "--election-ttl=16s"],
            "--election-ttl",
            "must be at most 15s"
        ),
        "--election-ttl \"16s\": must be at most 15s, half of --lease-ttl 30s, so a successor takes over before the peers' copies can expire"
    );
    refused_in_a(
        &["--lease-ttl=30s", "--election-ttl=1m"],
        "--election-ttl",
        "must be at most 15s, half of --lease-ttl 30s",
    );
    let c = config(&["--region=a", "--lease-ttl=30s", "--election-ttl=15s"]).unwrap();
    assert_eq!(c.election_ttl, Duration::from_secs(15));
    // etcd grants 2 s for anything shorter, also for the election: the
    // default election TTL of a 3 s lease is 2 s, over half of it. The
    // error names the setting the user wrote and the smallest lease that
    // fits, never the defaulted election TTL.
    let m = refused_in_a(&["--lease-ttl=3s"], "--lease-ttl", "must be at least 4s");
    assert!(!m.contains("--election-ttl"), "{m}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "region = \"a\"\nlease_ttl = \"3s\"\n").unwrap();
    let path = path.to_str().unwrap();
    let err = config(&["--config", path]).unwrap_err();
    assert_eq!(err.flag(), "--config");
    let m = err.to_string();
    assert!(m.starts_with(&format!("{path}: lease_ttl: ")), "{m}");
    assert!(m.contains("must be at least 4s"), "{m}");
    assert!(!m.contains("election_ttl"), "{m}");
    // A lease too short for any election TTL says so.
    refused_in_a(
        &["--lease-ttl=3s", "--election-ttl=2s"],
        "--election-ttl",
        "raise --lease-ttl to at least 4s",
    );
}

#[test]
fn ttls_below_etcds_shortest_lease_are_refused() {
    refused_in_a(&["--lease-ttl=1s"], "--lease-ttl", "must be at least 2s");
    refused_in_a(
        &["--lease-ttl=30s", "--election-ttl=1s"],
        "--election-ttl",
        "must be at least 2s",
    );
    let c = config(&["--region=a", "--lease-ttl=4s"]).unwrap();
    assert_eq!(c.election_ttl, Duration::from_secs(2));
}

#[test]
fn default_election_ttl_is_a_third_rounded_up() {
    for (lease, election) in [(30, 10), (31, 11), (4, 2), (5, 2), (90, 30)] {
        let lease_ttl = format!("--lease-ttl={lease}s");
        let c = config(&["--region=a", &lease_ttl]).unwrap();
        assert_eq!(c.election_ttl, Duration::from_secs(election), "{lease}s");
    }
}

#[test]
fn limits() {
    refused_in_a(&["--max-txn-ops=1"], "--max-txn-ops", "at least 2");
    refused_in_a(&["--max-inflight=0"], "--max-inflight", "at least 1");
    refused_in_a(
        &["--peer-connections=0"],
        "--peer-connections",
        "at least 1",
    );
    refused_in_a(&["--page-size=0"], "--page-size", "at least 1");
    refused_in_a(
        &["--max-concurrent-syncs=0"],
        "--max-concurrent-syncs",
        "at least 1",
    );
    refused_in_a(
        &["--max-request-bytes=4095"],
        "--max-request-bytes",
        "at least 4096",
    );
    refused_in_a(
        &["--max-request-bytes=65MiB"],
        "--max-request-bytes",
        "at most",
    );
    refused_in_a(
        &["--max-request-bytes=1.5MB"],
        "--max-request-bytes",
        "ambiguous",
    );
    refused_in_a(
        &["--max-request-bytes=1.3KiB"],
        "--max-request-bytes",
        "whole number",
    );
    refused_in_a(
        &["--max-request-bytes=lots"],
        "--max-request-bytes",
        "not a size",
    );
    let c = config(&[
        "--region=a",
        "--max-txn-ops=2",
        "--max-request-bytes=1.5 MiB",
    ])
    .unwrap();
    assert_eq!(
        c.mirror.limits,
        TxnLimits {
            max_ops: 2,
            max_bytes: 1572864
        }
    );
}

#[test]
fn bad_root() {
    for (root, why) in [
        ("aether/", "must start with '/'"),
        ("/aether", "must end with '/'"),
        ("/", "at least one segment"),
        ("/a//b/", "empty segment"),
    ] {
        let root_flag = format!("--root={root}");
        refused_in_a(&[&root_flag], "--root", why);
    }
    refused_in_a(&["--root=/aether/v1/"], "--root", "overlaps");
    refused_in_a(&["--root=/aether/v1/replication/x/"], "--root", "overlaps");
}

#[test]
fn cert_without_key() {
    let pki = pki();
    let cert = format!("--local-cert={}", pki.cert);
    let key = format!("--local-key={}", pki.key);
    let ca = format!("--local-ca={}", pki.ca);
    let https = "--local-etcd=https://x:1";
    assert_eq!(
        refused_in_a(&[https, &ca, &cert], "--local-cert", "without"),
        "--local-cert is given without --local-key"
    );
    refused_in_a(
        &[https, &ca, &key],
        "--local-key",
        "--local-key is given without --local-cert",
    );
    let peer_tls = format!("b=ca={},cert={}", pki.ca, pki.cert);
    assert_eq!(
        refused_in_a(
            &["--peer-etcd=b=https://b:1", "--peer-tls", &peer_tls],
            "--peer-tls",
            "without"
        ),
        "--peer-tls b: cert is given without key"
    );
}

#[test]
fn missing_tls_file() {
    let pki = pki();
    let msg = refused_in_a(
        &["--local-etcd=https://x:1", "--local-ca=/nonexistent/ca.pem"],
        "--local-ca",
        "/nonexistent/ca.pem",
    );
    assert!(
        msg.starts_with("--local-ca \"/nonexistent/ca.pem\": "),
        "{msg}"
    );
    let peer_tls = format!("b=ca={},key=/nonexistent/k.pem,cert={}", pki.ca, pki.cert);
    refused_in_a(
        &["--peer-etcd=b=https://b:1", "--peer-tls", &peer_tls],
        "--peer-tls",
        "--peer-tls b: key \"/nonexistent/k.pem\": ",
    );
    let dir = format!("--local-ca={}", pki._dir.path().display());
    refused_in_a(
        &["--local-etcd=https://x:1", &dir],
        "--local-ca",
        "not a file",
    );
}

#[test]
fn unknown_peer_tls_field() {
    let pki = pki();
    let peer_tls = format!("b=ca={},sni=x", pki.ca);
    let msg = refused_in_a(
        &["--peer-etcd=b=https://b:1", "--peer-tls", &peer_tls],
        "--peer-tls",
        "unknown setting \"sni\"",
    );
    assert!(
        msg.contains("expected ca, cert, key or server-name"),
        "{msg}"
    );
    for bad in ["b=ca", "b=", "b", "b=ca=", "b=server-name=x,server-name=y"] {
        refused_in_a(
            &["--peer-etcd=b=https://b:1", "--peer-tls", bad],
            "--peer-tls",
            "",
        );
    }
}

#[test]
fn peer_tls_for_unknown_region() {
    let pki = pki();
    let peer_tls = format!("c=ca={}", pki.ca);
    assert_eq!(
        refused_in_a(
            &["--peer-etcd=b=https://b:1", "--peer-tls", &peer_tls],
            "--peer-tls",
            "no --peer-etcd"
        ),
        "--peer-tls c: there is no --peer-etcd for region \"c\""
    );
    refused_in_a(
        &["--peer-etcd=b=http://b:1", "--peer-auth=c=u:p"],
        "--peer-auth",
        "no --peer-etcd for region \"c\"",
    );
}

#[test]
fn duplicate_peer_tls() {
    let pki = pki();
    let peer_tls = format!("b=ca={}", pki.ca);
    refused_in_a(
        &[
            "--peer-etcd=b=https://b:1",
            "--peer-tls",
            &peer_tls,
            "--peer-tls",
            &peer_tls,
        ],
        "--peer-tls",
        "duplicate entry for peer region \"b\"",
    );
    let (one, two) = (
        format!("--peer-auth=b=u:@{}", pki.password),
        format!("--peer-auth=b=v:@{}", pki.password),
    );
    refused_in_a(
        &["--peer-etcd=b=http://b:1", &one, &two],
        "--peer-auth",
        "duplicate entry",
    );
}

#[test]
fn https_needs_a_ca() {
    assert_eq!(
        refused_in_a(&["--peer-etcd=b=https://b:1"], "--peer-etcd", "needs"),
        "--peer-etcd b: https endpoint needs --peer-tls b=ca=..."
    );
    refused_in_a(
        &["--local-etcd=https://x:1"],
        "--local-etcd",
        "needs --local-ca",
    );
    refused_in_a(
        &["--peer-etcd=b=https://b:1", "--peer-tls=b=server-name=x"],
        "--peer-etcd",
        "needs --peer-tls b=ca=",
    );
}

#[test]
fn tls_for_plain_http_is_refused() {
    let pki = pki();
    let ca = format!("--local-ca={}", pki.ca);
    refused_in_a(&[&ca], "--local-etcd", "no endpoint is https://");
    let peer_tls = format!("b=ca={}", pki.ca);
    refused_in_a(
        &["--peer-etcd=b=http://b:1", "--peer-tls", &peer_tls],
        "--peer-tls",
        "no --peer-etcd b endpoint is https://",
    );
}

#[test]
fn auth_errors() {
    let pki = pki();
    let password = format!("--local-password-file={}", pki.password);
    refused_in_a(
        &["--local-user=root"],
        "--local-user",
        "needs --local-password-file",
    );
    refused_in_a(&[&password], "--local-password-file", "needs --local-user");
    refused_in_a(&["--local-user=", &password], "--local-user", "empty");
    refused_in_a(
        &["--local-user=root", "--local-password-file=/nonexistent/pw"],
        "--local-password-file",
        "--local-password-file \"/nonexistent/pw\": ",
    );
    let peer = "--peer-etcd=b=http://b:1";
    for (auth, why) in [
        ("b=user", "missing ':'"),
        ("b=:@pw", "empty user"),
        ("b=user:", "files only"),
        ("b=user:pw", "files only"),
        ("b=user:@", "empty password file path"),
        ("b=user:@/nonexistent/pw", "\"/nonexistent/pw\": "),
        ("user:pw", "has no '='"),
        ("user:p=w", "does not start with a --peer-etcd region"),
    ] {
        let flag = format!("--peer-auth={auth}");
        let msg = refused_in_a(&[peer, &flag], "--peer-auth", why);
        assert!(!msg.contains(":pw") && !msg.contains("p=w"), "{msg}");
    }
}

/// The subcommand `name` with `args`, as clap parses it.
fn subcommand(name: &str, args: &[&str]) -> Option<Command> {
    let mut argv = vec![name];
    argv.extend_from_slice(args);
    parse(&argv).expect("clap accepts the args").command
}

fn endpoints_config(args: &[&str]) -> Result<EndpointsConfig, ConfigError> {
    match subcommand("endpoints", args) {
        Some(Command::Endpoints(a)) => a.validate(),
        other => panic!("not endpoints: {other:?}"),
    }
}

fn migrate_config(args: &[&str]) -> Result<MigrateConfig, ConfigError> {
    match subcommand("migrate", args) {
        Some(Command::Migrate(a)) => a.validate(),
        other => panic!("not migrate: {other:?}"),
    }
}

#[test]
fn endpoints_flags() {
    let c = endpoints_config(&[
        "--region=b",
        "--zone=b-1",
        "--service=checkout",
        "--watch",
        "--output=json",
        "--root=/t/aether/v1/regions/",
        "--local-etcd=http://e1:2379,http://e2:2379",
        "--page-size=7",
    ])
    .unwrap();
    assert_eq!(
        c.local,
        ClientConfig::new(["http://e1:2379", "http://e2:2379"])
    );
    let o = c.options;
    assert_eq!(o.view.region, "b");
    assert_eq!(o.view.zone.as_deref(), Some("b-1"));
    assert_eq!(o.view.schema.root(), "/t/aether/v1/regions/");
    assert_eq!(o.view.page_size, 7);
    assert_eq!(o.service.as_deref(), Some("checkout"));
    assert!(o.watch);
    assert_eq!(o.output, Output::Json);
    let d = endpoints_config(&["--region=b"]).unwrap().options;
    assert_eq!(
        (d.watch, d.output, d.view.zone),
        (false, Output::Table, None)
    );
    assert!(parse(&["endpoints"]).is_err(), "--region is required");
}

#[test]
fn endpoints_refusals() {
    for (args, flag, needle) in [
        (&["--region=a/b"][..], "--region", "'/'"),
        (&["--region="][..], "--region", "empty"),
        (&["--region=b", "--zone="][..], "--zone", "empty"),
        (&["--region=b", "--service=a/b"][..], "--service", "'/'"),
        (&["--region=b", "--root=/x"][..], "--root", "end with"),
        (&["--region=b", "--root=/aether/"][..], "--root", "overlaps"),
        (
            &["--region=b", "--page-size=0"][..],
            "--page-size",
            "at least 1",
        ),
        (
            &["--region=b", "--local-etcd=ftp://x"][..],
            "--local-etcd",
            "not a valid URL",
        ),
        (
            &["--region=b", "--local-etcd=https://x:1"][..],
            "--local-etcd",
            "--local-ca",
        ),
        (
            &["--region=b", "--local-user=u"][..],
            "--local-user",
            "--local-password",
        ),
    ] {
        refused_by(endpoints_config(args).unwrap_err(), flag, needle);
    }
}

#[test]
fn migrate_flags() {
    let c = migrate_config(&[
        "--region=a",
        "--cluster=c1",
        "--legacy-prefix=/old/services/",
        "--apply",
        "--delete-legacy",
        "--max-txn-ops=32",
        "--max-request-bytes=64KiB",
    ])
    .unwrap();
    let o = c.options;
    assert_eq!(o.region.as_deref(), Some("a"));
    assert_eq!(o.cluster.as_deref(), Some("c1"));
    assert_eq!(o.legacy_prefix, "/old/services/");
    assert!(o.apply && o.delete_legacy);
    assert_eq!(
        o.limits,
        TxnLimits {
            max_ops: 32,
            max_bytes: 65536
        }
    );
    let d = migrate_config(&[]).unwrap().options;
    assert_eq!(d, MigrateOptions::new(None, None), "a dry run by default");
}

#[test]
fn migrate_refusals() {
    for (args, flag, needle) in [
        (&["--region=a/b"][..], "--region", "'/'"),
        (&["--cluster="][..], "--cluster", "empty"),
        (
            &["--legacy-prefix=aether/"][..],
            "--legacy-prefix",
            "start with",
        ),
        (
            &["--legacy-prefix=/aether/"][..],
            "--legacy-prefix",
            "overlaps --root",
        ),
        (
            &["--legacy-prefix=/aether/v1/regions/x/"][..],
            "--legacy-prefix",
            "overlaps --root",
        ),
        (
            &["--legacy-prefix=/aether/v1/replication/"][..],
            "--legacy-prefix",
            "replication state",
        ),
        (&["--max-txn-ops=1"][..], "--max-txn-ops", "at least 2"),
        (
            &["--max-request-bytes=1MB"][..],
            "--max-request-bytes",
            "ambiguous",
        ),
        (&["--page-size=0"][..], "--page-size", "at least 1"),
        (
            &["--local-password=x"][..],
            "--local-password",
            "files only",
        ),
    ] {
        refused_by(migrate_config(args).unwrap_err(), flag, needle);
    }
}

#[test]
fn subcommand_flags_have_env_vars_except_the_destructive_ones() {
    let cli = Cli::command();
    for name in ["endpoints", "migrate"] {
        let cmd = cli.find_subcommand(name).unwrap();
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let env = arg.get_env().and_then(|e| e.to_str());
            if matches!(long, "apply" | "delete-legacy") {
                assert_eq!(env, None, "--{long}");
                continue;
            }
            let want = env_of(long);
            assert_eq!(env, Some(want.as_str()), "{name} --{long}");
        }
    }
}

/// A config file in a temp dir, with a password file beside it.
struct ConfigFile {
    dir: tempfile::TempDir,
    path: String,
}

impl ConfigFile {
    /// `text` with `{dir}` replaced by the temp dir.
    fn new(text: &str) -> ConfigFile {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("password"), "s3cret\n").unwrap();
        let path = dir.path().join("a.toml");
        let text = text.replace("{dir}", dir.path().to_str().unwrap());
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap().to_string();
        ConfigFile { dir, path }
    }

    fn flag(&self) -> String {
        format!("--config={}", self.path)
    }

    fn config(&self, more: &[&str]) -> Result<Config, ConfigError> {
        let flag = self.flag();
        let mut args = vec![flag.as_str()];
        args.extend_from_slice(more);
        config(&args)
    }
}

const FILE: &str = r#"
region = "a"
lease_ttl = "60s"
max_inflight = 3
peer_connections = 2
page_size = 500
max_txn_ops = 64
replica_id = "pod-a-1"
metrics_addr = "0.0.0.0:9464"
log_format = "json"
reload_interval = "2s"

[local]
endpoints = ["http://l1:2379", "http://l2:2379"]
username = "replicator"
password_file = "{dir}/password"

[peers.b]
endpoints = ["http://b:2379"]
max_txn_ops = 16
max_request_bytes = "64KiB"

[peers.c]
endpoints = ["http://c:2379"]
username = "mirror"
password_file = "{dir}/password"
"#;

#[test]
fn a_config_file_alone() {
    let f = ConfigFile::new(FILE);
    let c = f.config(&[]).unwrap();
    assert_eq!(c.region, "a");
    assert_eq!(c.mirror.lease_ttl, Duration::from_secs(60));
    assert_eq!(c.election_ttl, Duration::from_secs(20));
    assert_eq!((c.mirror.max_inflight, c.mirror.page_size), (3, 500));
    assert!(c.peers.iter().all(|p| p.client.connections == 2));
    assert_eq!(c.mirror.limits.max_ops, 64);
    assert_eq!(c.replica_id, "pod-a-1");
    assert_eq!(c.metrics_addr, "0.0.0.0:9464".parse().unwrap());
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.reload_interval, Some(Duration::from_secs(2)));
    assert_eq!(c.local.endpoints, ["http://l1:2379", "http://l2:2379"]);
    let creds = c.local.credentials.as_ref().unwrap();
    assert_eq!(
        (creds.user.as_str(), creds.password.as_str()),
        ("replicator", "s3cret"),
        "one trailing newline is not part of the password"
    );
    let pw = format!("{}/password", f.dir.path().display());
    assert_eq!(c.local_password_file.as_ref().unwrap().path, pw);
    let regions: Vec<_> = c.peers.iter().map(|p| p.region.as_str()).collect();
    assert_eq!(regions, ["b", "c"]);
    assert_eq!(
        c.peers[1].client.credentials.as_ref().unwrap().user,
        "mirror"
    );
    assert_eq!(c.peer_password_files["c"].user, "mirror");
    assert!(!c.peer_password_files.contains_key("b"));
    // b has limits of its own: its ops, and its bytes; c has none.
    assert_eq!(
        c.mirror.peer_limits.get("b"),
        Some(&TxnLimits {
            max_ops: 16,
            max_bytes: 65536
        })
    );
    assert_eq!(c.mirror.peer_limits.len(), 1);
    // Only the file's password file is read: no secret in the args.
    let shown = format!("{c:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
}

#[test]
fn flags_override_the_file() {
    let pki = pki();
    let f = ConfigFile::new(FILE);
    let c = f
        .config(&[
            "--region=x",
            "--lease-ttl=90s",
            "--max-txn-ops=32",
            "--local-etcd=http://other:2379",
            "--local-user=root",
            &format!("--local-password-file={}", pki.password),
            "--peer-etcd=b=http://b2:2379",
            "--peer-etcd=d=http://d:2379",
            &format!("--peer-auth=c=u:@{}", pki.password),
            "--replica-id=flag-id",
            "--reload-interval=off",
        ])
        .unwrap();
    assert_eq!(c.region, "x");
    assert_eq!(c.mirror.lease_ttl, Duration::from_secs(90));
    assert_eq!(c.mirror.limits.max_ops, 32);
    assert_eq!(c.local.endpoints, ["http://other:2379"]);
    assert_eq!(c.local.credentials.as_ref().unwrap().user, "root");
    assert_eq!(c.local_password_file.as_ref().unwrap().path, pki.password);
    let regions: Vec<_> = c.peers.iter().map(|p| p.region.as_str()).collect();
    assert_eq!(
        regions,
        ["b", "c", "d"],
        "the file's peers, then the flags' own"
    );
    assert_eq!(c.peers[0].client.endpoints, ["http://b2:2379"]);
    assert_eq!(c.peers[1].client.credentials.as_ref().unwrap().user, "u");
    assert_eq!(c.peer_password_files["c"].path, pki.password);
    assert_eq!(c.peers[2].client.endpoints, ["http://d:2379"]);
    // The file's per-peer limits stay (the flag sets the global default).
    assert_eq!(c.mirror.peer_limits["b"].max_ops, 16);
    assert_eq!(c.replica_id, "flag-id");
    assert_eq!(c.reload_interval, None);
    // The file still gives what no flag overrides.
    assert_eq!(c.mirror.max_inflight, 3);
}

#[test]
fn file_peer_tls_and_a_flag_replacing_it() {
    let pki = pki();
    let f = ConfigFile::new(&format!(
        r#"
region = "a"
[peers.b]
endpoints = ["https://b:2379"]
ca = "{ca}"
cert = "{cert}"
key = "{key}"
server_name = "etcd-b"
"#,
        ca = pki.ca,
        cert = pki.cert,
        key = pki.key
    ));
    let c = f.config(&[]).unwrap();
    let tls = c.peers[0].client.tls.as_ref().unwrap();
    assert_eq!(tls.ca_file.as_deref(), Some(pki.ca.as_str()));
    assert_eq!(tls.key_file.as_deref(), Some(pki.key.as_str()));
    assert_eq!(tls.server_name.as_deref(), Some("etcd-b"));
    let peer_tls = format!("--peer-tls=b=ca={}", pki.ca);
    let c = f.config(&[&peer_tls]).unwrap();
    let tls = c.peers[0].client.tls.as_ref().unwrap();
    assert_eq!(
        (tls.cert_file.as_ref(), tls.server_name.as_ref()),
        (None, None)
    );
}

/// Asserts that the file is refused with a one-line message starting with
/// `<file>: <want>`.
#[track_caller]
fn file_refused(text: &str, args: &[&str], want: &str) {
    let f = ConfigFile::new(text);
    let err = f.config(args).expect_err("refused");
    let msg = err.to_string();
    let want = format!(
        "{}: {}",
        f.path,
        want.replace("{dir}", f.dir.path().to_str().unwrap())
    );
    assert!(msg.starts_with(&want), "got  {msg:?}\nwant {want:?}");
    assert!(!msg.contains('\n'), "{msg:?}");
    assert!(!msg.contains("s3cret"), "{msg:?}");
    assert_eq!(err.flag(), "--config");
}

#[test]
fn file_errors_name_the_file_the_table_and_the_key() {
    let b = "region = 'a'\n[peers.b]\nendpoints = ['http://b:1']\n";
    for (extra, want) in [
        (
            "max_request_bytes = '12QB'\n",
            "[peers.b] max_request_bytes: invalid byte size \"12QB\": unknown unit",
        ),
        (
            "max_request_bytes = 100\n",
            "[peers.b] max_request_bytes: invalid byte size \"100\": must be at least 4096",
        ),
        (
            "max_txn_ops = 1\n",
            "[peers.b] max_txn_ops: invalid txn op limit 1: must be at least 2",
        ),
        (
            "password_file = '/nonexistent/pw'\nusername = 'u'\n",
            "[peers.b] password_file \"/nonexistent/pw\": No such file",
        ),
        (
            "username = 'u'\n",
            "[peers.b] username: needs password_file",
        ),
        (
            "password_file = '{dir}/password'\n",
            "[peers.b] password_file: needs username",
        ),
        (
            "pasword_file = 'x'\n",
            "[peers.b] pasword_file: unknown key",
        ),
        (
            "ca = '/nonexistent/ca.pem'\n",
            "[peers.b] ca \"/nonexistent/ca.pem\": ",
        ),
    ] {
        file_refused(&format!("{b}{extra}"), &[], want);
    }
    for (text, want) in [
        (
            "region = 'a'\nlease_ttl = '0s'\n",
            "lease_ttl: invalid duration \"0s\": must be greater than zero",
        ),
        (
            "region = 'a/b'\n",
            "region: invalid region \"a/b\": must not contain '/'",
        ),
        ("region = 'a'\nroot = 'x'\n", "root: invalid root \"x\""),
        (
            "region = 'a'\nmax_inflight = 0\n",
            "max_inflight: invalid number 0: must be at least 1",
        ),
        (
            "region = 'a'\nmetrics_addr = 'localhost'\n",
            "metrics_addr: invalid address \"localhost\"",
        ),
        (
            "region = 'a'\nlog_format = 'xml'\n",
            "log_format: invalid log format \"xml\"",
        ),
        (
            "region = 'a'\nreplica_id = ''\n",
            "replica_id: invalid replica id \"\"",
        ),
        (
            "region = 'a'\nreload_interval = 'soon'\n",
            "reload_interval: invalid duration \"soon\"",
        ),
        (
            "region = 'a'\n[local]\nendpoints = []\n",
            "[local] endpoints: empty endpoint list",
        ),
        (
            "region = 'a'\n[peers.b]\nendpoints = ['https://b:1']\n",
            "[peers.b]: an https:// endpoint needs ca",
        ),
        (
            "region = 'a'\n[peers.b]\nca = 'x'\n",
            "[peers.b]: missing key endpoints",
        ),
        (
            "region = 'a'\n[peers.a]\nendpoints = ['http://x:1']\n",
            "[peers.a]: peer region is this region",
        ),
        (
            "region = 'a'\n[local]\nendpoints = ['http://x:1']\n[peers.b]\nendpoints = ['http://x:1']\n",
            "[peers.b] endpoints: endpoint \"http://x:1\" is also in",
        ),
    ] {
        file_refused(text, &[], want);
    }
}

#[test]
fn a_missing_config_file_names_the_flag() {
    refused(
        &["--config=/nonexistent/a.toml"],
        "--config",
        "--config \"/nonexistent/a.toml\": No such file",
    );
}

#[test]
fn region_may_come_from_the_file_only() {
    assert!(
        parse(&[]).is_err(),
        "without a file, clap still asks for --region"
    );
    let f = ConfigFile::new("lease_ttl = '30s'\n");
    let err = f.config(&[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--region: required (or region in the config file)"
    );
}

#[test]
fn generated_replica_ids_differ() {
    let a = config(&["--region=a"]).unwrap().replica_id;
    let b = config(&["--region=a"]).unwrap().replica_id;
    assert_ne!(a, b);
    let pid = format!("-{}-", std::process::id());
    assert!(a.contains(&pid), "{a}");
}

#[test]
fn freshness_flags() {
    let base = ["--region=a", "--peer-etcd=b=http://10.0.0.2:2379"];
    let c = config(&base).unwrap();
    assert_eq!(
        c.mirror.heartbeat_interval,
        crate::mirror::DEFAULT_HEARTBEAT_INTERVAL
    );
    assert_eq!(
        c.mirror.lapse_after,
        Some(crate::mirror::DEFAULT_LAPSE_AFTER)
    );
    assert_eq!(
        c.mirror.verify_interval,
        Some(crate::mirror::DEFAULT_VERIFY_INTERVAL)
    );
    let mut args = base.to_vec();
    args.extend([
        "--heartbeat-interval=2s",
        "--lapse-after=off",
        "--verify-interval=1m",
        "--verify-rate=100",
    ]);
    let c = config(&args).unwrap();
    assert_eq!(c.mirror.heartbeat_interval, Duration::from_secs(2));
    assert_eq!(c.mirror.lapse_after, None);
    assert_eq!(c.mirror.verify_interval, Some(Duration::from_secs(60)));
    assert_eq!(c.mirror.verify_rate, 100);
    let mut bad = base.to_vec();
    bad.push("--lapse-after=soon");
    refused(&bad, "--lapse-after", "not a duration");
    let mut bad = base.to_vec();
    bad.push("--heartbeat-interval=10ms");
    refused(&bad, "--heartbeat-interval", "at least 100ms");
    let mut bad = base.to_vec();
    bad.push("--verify-rate=0");
    refused(&bad, "--verify-rate", "at least 1");
}

/// The keys a struct's derived `Deserialize` accepts, in its order.
fn file_keys<T: serde::de::DeserializeOwned>() -> Vec<&'static str> {
    use serde::de::{self, Visitor};
    /// A deserializer that only records the fields a struct asks for.
    struct Fields(Vec<&'static str>);
    impl<'de> de::Deserializer<'de> for &mut Fields {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0.extend_from_slice(fields);
            Err(de::Error::custom("fields recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields = Fields(Vec::new());
    let _ = T::deserialize(&mut fields);
    assert!(
        !fields.0.is_empty(),
        "{} has no fields",
        std::any::type_name::<T>()
    );
    fields.0
}

/// `--lease-ttl` is `AETHER_REPLICATOR_LEASE_TTL`.
fn env_of(long: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        long.to_ascii_uppercase().replace('-', "_")
    )
}

/// Every flag has its variable, and every flag of a run its key in the
/// config file; no variable and no file key belongs to no flag. A flag is
/// declared once (a field of `Settings`, or of `LocalEtcdArgs` and
/// `RunArgs` for the grouped ones): this holds its three names together.
#[test]
fn every_flag_has_its_variable_and_its_file_key_and_none_is_orphaned() {
    /// Flags without a variable, as `[<subcommand> ]--<flag>`: asked for
    /// on the command line only.
    const NO_VARIABLE: &[(&str, &str)] = &[
        ("--check-config", "an action, not a setting"),
        (
            "migrate --apply",
            "what writes is asked for on the command line",
        ),
        (
            "migrate --delete-legacy",
            "what deletes is asked for on the command line",
        ),
        ("status --output", "how to print this one call"),
        (
            "setup-auth --apply",
            "what writes is asked for on the command line",
        ),
        ("status --max-staleness", "how to judge this one call"),
    ];
    /// Flags of a run without a file key.
    const NO_FILE_KEY: &[(&str, &str)] = &[
        ("config", "names the file itself"),
        ("check-config", "an action, not a setting"),
        ("local-password", "refused: passwords come from files"),
    ];
    /// A run's flags whose file keys are not their own name at the top
    /// level: the `[local]` and `[peers.<region>]` tables group them, a
    /// flag replacing its group whole. The file holds no secret: where a
    /// flag gives a password, the table names a file holding it.
    const GROUPED: &[(&str, &[&str])] = &[
        ("local-etcd", &["local.endpoints"]),
        ("local-ca", &["local.ca"]),
        ("local-cert", &["local.cert"]),
        ("local-key", &["local.key"]),
        ("local-server-name", &["local.server_name"]),
        ("local-user", &["local.username"]),
        ("local-password-file", &["local.password_file"]),
        ("peer-etcd", &["peers.*.endpoints"]),
        (
            "peer-tls",
            &[
                "peers.*.ca",
                "peers.*.cert",
                "peers.*.key",
                "peers.*.server_name",
            ],
        ),
        ("peer-auth", &["peers.*.username", "peers.*.password_file"]),
        // A peer's own limits, in place of the top-level ones.
        ("max-txn-ops", &["max_txn_ops", "peers.*.max_txn_ops"]),
        (
            "max-request-bytes",
            &["max_request_bytes", "peers.*.max_request_bytes"],
        ),
    ];
    /// Variables that are not a flag's.
    const NOT_FLAGS: &[(&str, &str)] = &[
        (
            "AETHER_REPLICATOR_REVISION",
            "the build's revision, read at build time",
        ),
        (
            "AETHER_REPLICATOR_BUILD_DATE",
            "the build's date, written by build.rs",
        ),
        (
            "AETHER_REPLICATOR_LONG_VERSION",
            "--version's text, written by build.rs",
        ),
    ];
    let listed = |list: &[(&str, &str)], long: &str| list.iter().any(|(l, _)| *l == long);

    // Every flag of every command has its variable, or is an exception.
    let cli = Cli::command();
    let mut commands = vec![&cli];
    commands.extend(cli.get_subcommands());
    let mut flags = std::collections::BTreeSet::new();
    let mut variables = std::collections::BTreeSet::new();
    for cmd in commands {
        for arg in cmd.get_arguments() {
            // `completions`' shell: an argument, not a setting.
            if arg.is_positional() {
                continue;
            }
            let long = arg.get_long().expect("every argument is a long flag");
            let flag = match cmd.get_name() {
                "aether-replicator" => format!("--{long}"),
                sub => format!("{sub} --{long}"),
            };
            let env = arg.get_env().map(|e| e.to_str().unwrap().to_string());
            if listed(NO_VARIABLE, &flag) {
                assert_eq!(env, None, "{flag}");
            } else {
                assert_eq!(env, Some(env_of(long)), "{flag}");
                variables.insert(env_of(long));
            }
            flags.insert(flag);
        }
    }
    for (flag, _) in NO_VARIABLE {
        assert!(flags.contains(*flag), "an exception for no flag: {flag}");
    }
    for (long, _) in NO_FILE_KEY {
        assert!(flags.contains(&format!("--{long}")), "--{long}");
    }

    // The keys the file accepts, with the tables' as `local.ca`.
    let mut accepted = std::collections::BTreeSet::new();
    let mut tables = Vec::new();
    for key in file_keys::<Settings>() {
        match key {
            "local" => accepted.extend(
                file_keys::<super::file::EtcdTable>()
                    .iter()
                    .map(|k| format!("local.{k}")),
            ),
            "peers" => accepted.extend(
                file_keys::<super::file::PeerTable>()
                    .iter()
                    .map(|k| format!("peers.*.{k}")),
            ),
            _ => {
                accepted.insert(key.to_string());
                continue;
            }
        }
        tables.push(key);
    }
    assert_eq!(
        tables,
        ["local", "peers"],
        "a new table needs its flags here"
    );

    // Every flag of a run has its keys, and every key is some flag's. The
    // subcommands' own flags have none: endpoints and migrate are one-shot
    // and read no config file (nor do status's --output and
    // --max-staleness); check and status flatten a run's `RunArgs`.
    let mut owned = std::collections::BTreeSet::new();
    for arg in cli.get_arguments() {
        let long = arg.get_long().unwrap();
        if listed(NO_FILE_KEY, long) {
            continue;
        }
        let keys = match GROUPED.iter().find(|(l, _)| *l == long) {
            Some((_, keys)) => keys.iter().map(|k| k.to_string()).collect(),
            None => vec![long.replace('-', "_")],
        };
        for key in keys {
            assert!(accepted.contains(&key), "--{long}: no file key {key}");
            owned.insert(key);
        }
    }
    for (long, _) in GROUPED {
        assert!(
            cli.get_arguments().any(|a| a.get_long() == Some(*long)),
            "--{long}"
        );
    }
    let orphans: Vec<_> = accepted.difference(&owned).collect();
    assert!(orphans.is_empty(), "file keys of no flag: {orphans:?}");

    // Every variable the sources, manifests and docs name is a flag's.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut dirs: Vec<_> = ["src", "deploy", "docs", "e2e", "tests"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    let mut named = 0;
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (at, _) in text.match_indices(ENV_PREFIX) {
            let rest = &text[at + ENV_PREFIX.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            if end == 0 {
                continue; // the prefix itself: `AETHER_REPLICATOR_<FLAG>`
            }
            let variable = format!("{ENV_PREFIX}{}", &rest[..end]);
            assert!(
                variables.contains(&variable) || listed(NOT_FLAGS, &variable),
                "{}: {variable} is no flag's variable",
                path.display()
            );
            named += 1;
        }
    }
    assert!(named > 20, "the scan found the variables ({named})");
}
