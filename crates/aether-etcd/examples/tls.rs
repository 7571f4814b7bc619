//! Mutual TLS: the cluster's CA, and a client certificate and key.
//!
//! A configured CA is trusted alone (etcd clusters usually run on a private
//! CA). Without one, an `https://` endpoint is verified against the
//! system's roots (feature `tls-native-roots`, on by default). The files
//! are re-read by `Client::reload_tls` after a rotation; PEM already in
//! memory (from a secret store, say) goes in with `with_ca_pem` and
//! `with_client_pem` instead.
//!
//! ```sh
//! cargo run -p aether-etcd --example tls -- https://127.0.0.1:2379 ca.pem client.pem client-key.pem
//! ```
//!
//! With etcd's `--client-cert-auth`, the certificate's common name is the
//! etcd user the requests run as.

use aether_etcd::{Client, ClientConfig, Delete, Put, Range, TlsConfig};

#[tokio::main]
async fn main() -> aether_etcd::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [endpoint, ca, cert, key] = args.as_slice() else {
        eprintln!("usage: tls ENDPOINT CA_FILE CERT_FILE KEY_FILE");
        std::process::exit(2);
    };
    let tls = TlsConfig::new()
        .with_ca_file(ca)
        .with_client_files(cert, key);
    let client = Client::connect(ClientConfig::new([endpoint]).with_tls(tls))?;

    client
        .put(Put::new("/examples/tls/hello", "over TLS"))
        .await?;
    let got = client.range(Range::key("/examples/tls/hello")).await?;
    println!(
        "read /examples/tls/hello = {} from member {:x}",
        String::from_utf8_lossy(got.kvs()[0].value()),
        got.header.member_id
    );
    client.delete(Delete::prefix("/examples/tls/")).await?;
    Ok(())
}
