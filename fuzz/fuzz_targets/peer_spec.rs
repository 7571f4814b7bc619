//! The peer flags (`--peer-etcd`, `--peer-tls`, `--peer-auth`) with an
//! arbitrary UTF-8 value, through clap and `RunArgs::validate`: never
//! panics (errors are fine).
#![no_main]

use aether_replicator::app::config::Cli;
use clap::Parser as _;
use libfuzzer_sys::fuzz_target;

const PEER: &str = "--peer-etcd=b=http://127.0.0.1:1";

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let etcd = format!("--peer-etcd={s}");
    let tls = format!("--peer-tls={s}");
    let auth = format!("--peer-auth={s}");
    for extra in [
        vec![etcd.as_str()],
        vec![PEER, tls.as_str()],
        vec![PEER, auth.as_str()],
    ] {
        let args = ["aether-replicator", "--region=a"].into_iter().chain(extra);
        if let Ok(cli) = Cli::try_parse_from(args) {
            let _ = cli.run_args().validate();
        }
    }
});
