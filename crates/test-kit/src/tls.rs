//! Throw-away PKI for TLS / mTLS etcd tests (rcgen 0.14).

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// DNS name (besides `localhost` and IP 127.0.0.1) in the server certificate's
/// SANs; use it as the TLS domain name override when dialing 127.0.0.1.
pub const SERVER_DNS_NAME: &str = "etcd.test";

/// Common name of the default client certificate. etcd maps the CN of a
/// verified client certificate to the user name when auth is enabled.
pub const CLIENT_CN: &str = "root";

/// Paths of PEM files written by [`generate_tls`].
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// Directory the files live in (owned by the caller, e.g. a `TempDir`).
    pub dir: PathBuf,
    /// `ca.pem`: the CA certificate.
    pub ca: PathBuf,
    /// `ca-key.pem`: the CA private key (for [`TlsFiles::issue_client_cert`]).
    pub ca_key: PathBuf,
    /// `server.pem`: SANs `localhost`, `127.0.0.1`, `etcd.test`; EKU serverAuth + clientAuth.
    pub server_cert: PathBuf,
    /// `server-key.pem`
    pub server_key: PathBuf,
    /// `client.pem`: CN `root`, EKU clientAuth.
    pub client_cert: PathBuf,
    /// `client-key.pem`
    pub client_key: PathBuf,
    /// Whether etcd is started with `--client-cert-auth --trusted-ca-file`.
    pub client_cert_auth: bool,
}

impl TlsFiles {
    /// Sets whether the server requires (and verifies) client certificates.
    pub fn with_client_cert_auth(mut self, on: bool) -> Self {
        self.client_cert_auth = on;
        self
    }

    /// The CA certificate's PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        read(&self.ca)
    }

    /// The `root` client certificate's PEM.
    pub fn client_cert_pem(&self) -> Vec<u8> {
        read(&self.client_cert)
    }

    /// The `root` client key's PEM.
    pub fn client_key_pem(&self) -> Vec<u8> {
        read(&self.client_key)
    }

    /// Issues another client certificate signed by the same CA with common
    /// name `cn`, written to `client-<cn>.pem` / `client-<cn>-key.pem` in
    /// [`TlsFiles::dir`]. Returns `(cert_path, key_path)`.
    pub fn issue_client_cert(&self, cn: &str) -> (PathBuf, PathBuf) {
        assert!(
            cn.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'),
            "client CN {cn:?} must be a simple file-name-safe string"
        );
        let ca_key_pem = fs::read_to_string(&self.ca_key).expect("read CA key");
        let ca_key = KeyPair::from_pem(&ca_key_pem).expect("parse CA key");
        let issuer = Issuer::new(ca_params(), ca_key);
        let cert = self.dir.join(format!("client-{cn}.pem"));
        let key = self.dir.join(format!("client-{cn}-key.pem"));
        write_client_cert(&issuer, cn, &cert, &key, None);
        (cert, key)
    }

    /// [`TlsFiles::issue_client_cert`], valid from `from` to `to` (Unix
    /// seconds), written to `client-<cn>.pem` / `client-<cn>-key.pem`.
    pub fn issue_client_cert_valid(&self, cn: &str, from: i64, to: i64) -> (PathBuf, PathBuf) {
        let ca_key_pem = fs::read_to_string(&self.ca_key).expect("read CA key");
        let ca_key = KeyPair::from_pem(&ca_key_pem).expect("parse CA key");
        let issuer = Issuer::new(ca_params(), ca_key);
        let cert = self.dir.join(format!("client-{cn}.pem"));
        let key = self.dir.join(format!("client-{cn}-key.pem"));
        write_client_cert(&issuer, cn, &cert, &key, Some((from, to)));
        (cert, key)
    }
}

/// Generates a CA, a server certificate and a `root` client certificate in
/// `dir` (which must exist). The returned files do not require client
/// certificates; see [`TlsFiles::with_client_cert_auth`] or [`generate_mtls`].
pub fn generate_tls(dir: &Path) -> TlsFiles {
    fs::create_dir_all(dir).expect("create TLS dir");

    // CA
    let ca_key = KeyPair::generate().expect("generate CA key");
    let ca_params = ca_params();
    let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign CA");
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);

    // Server
    let mut server = CertificateParams::new(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        SERVER_DNS_NAME.to_string(),
    ])
    .expect("server SANs");
    server.distinguished_name = dn("etcd-server");
    server.use_authority_key_identifier_extension = true;
    server.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    // clientAuth too: with --client-cert-auth, etcd 3.4's embedded gRPC
    // gateway dials its own gRPC server presenting the *server* certificate.
    server.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let server_key = KeyPair::generate().expect("generate server key");
    let server_cert = server
        .signed_by(&server_key, &issuer)
        .expect("sign server cert");

    let files = TlsFiles {
        dir: dir.to_path_buf(),
        ca: dir.join("ca.pem"),
        ca_key: dir.join("ca-key.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server-key.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client-key.pem"),
        client_cert_auth: false,
    };
    write(&files.ca, ca_cert.pem());
    write(&files.ca_key, ca_key_pem);
    write(&files.server_cert, server_cert.pem());
    write(&files.server_key, server_key.serialize_pem());
    write_client_cert(
        &issuer,
        CLIENT_CN,
        &files.client_cert,
        &files.client_key,
        None,
    );
    files
}

/// [`generate_tls`] with client-certificate authentication required.
pub fn generate_mtls(dir: &Path) -> TlsFiles {
    generate_tls(dir).with_client_cert_auth(true)
}

/// Deterministic CA parameters, so the issuer can be rebuilt from the key alone.
fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    p.distinguished_name = dn("aether-replicator test CA");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p
}

fn write_client_cert(
    issuer: &Issuer<'_, KeyPair>,
    cn: &str,
    cert_path: &Path,
    key_path: &Path,
    valid: Option<(i64, i64)>,
) {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("client params");
    if let Some((from, to)) = valid {
        let at = |t| {
            x509_parser::time::ASN1Time::from_timestamp(t)
                .expect("a date")
                .to_datetime()
        };
        p.not_before = at(from);
        p.not_after = at(to);
    }
    p.distinguished_name = dn(cn);
    p.use_authority_key_identifier_extension = true;
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().expect("generate client key");
    let cert = p.signed_by(&key, issuer).expect("sign client cert");
    write(cert_path, cert.pem());
    write(key_path, key.serialize_pem());
}

fn dn(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

fn write(path: &Path, contents: String) {
    fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}
