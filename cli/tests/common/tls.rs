//! TLS for test upstreams: a certificate authority made at test time (rcgen), a server
//! certificate it signed, its certificate in a PEM file (for `--upstream-ca FILE`), and the
//! rustls configurations (ring) that serve and trust it. Two authorities know nothing of each
//! other: serve with one and trust the other for "refused when untrusted".

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The names the default server certificate is for: the fake provider's and a replica's host.
pub const NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

/// A certificate authority of the test's own and one server certificate it signed. Its CA file
/// is removed when it is dropped: keep it alive while anything may read the file.
pub struct Authority {
    ca: CertificateDer<'static>,
    ca_pem: String,
    ca_file: PathBuf,
    server: Arc<ServerConfig>,
}

impl Authority {
    /// A new authority and a server certificate for [`NAMES`] (`localhost`, `127.0.0.1`).
    pub fn new() -> Authority {
        Authority::for_names(&NAMES)
    }

    /// A new authority and a server certificate for `names` only (DNS names or IP addresses):
    /// a server reached by another name fails verification even with this CA trusted.
    pub fn for_names(names: &[&str]) -> Authority {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        // A name of its own: a verifier given another authority finds no issuer of that name.
        let (name, ca_file) = unique();
        ca.distinguished_name.push(rcgen::DnType::CommonName, name);
        let ca_key = KeyPair::generate().expect("a CA key");
        let ca_cert = ca.self_signed(&ca_key).expect("the CA certificate");
        let issuer = Issuer::new(ca, ca_key);

        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let mut leaf = CertificateParams::new(names).expect("valid names");
        leaf.use_authority_key_identifier_extension = true;
        let leaf_key = KeyPair::generate().expect("a server key");
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).expect("signed");

        let mut server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("TLS 1.2 and 1.3")
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf_cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
            )
            .expect("the server certificate and its key");
        server.alpn_protocols = vec![b"http/1.1".to_vec()];

        let ca_pem = ca_cert.pem();
        std::fs::write(&ca_file, &ca_pem).expect("write the CA file");
        Authority {
            ca: ca_cert.der().clone(),
            ca_pem,
            ca_file,
            server: Arc::new(server),
        }
    }

    /// The CA's certificate as a PEM file, for `--upstream-ca FILE`.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The CA's certificate, PEM (the file's contents).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Serves the authority's server certificate (ALPN `http/1.1`).
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.server.clone())
    }

    /// A client configuration that trusts this authority alone (ALPN `http/1.1`).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone()).expect("the CA certificate");
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("TLS 1.2 and 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A connector that trusts this authority alone.
    pub fn connector(&self) -> TlsConnector {
        TlsConnector::from(self.client_config())
    }
}

impl Drop for Authority {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ca_file);
    }
}

/// The crypto provider of every configuration here: ring, named rather than taken from the
/// process default (which is ambiguous when a build enables both ring and aws-lc-rs).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A name, and a path of the temporary directory, that no other authority of any process uses.
fn unique() -> (String, PathBuf) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("streamgate test CA {}-{n}", std::process::id());
    let file = format!("streamgate-test-ca-{}-{n}.pem", std::process::id());
    (name, std::env::temp_dir().join(file))
}
