//! TLS interception for the hosts that carry a secret: a certificate authority made in
//! memory per proxy (its key never leaves this process), leaf certificates minted per
//! host on demand, the rustls server side the program talks to, and the fully verifying
//! client side to the upstream. Everything is rustls with the ring provider and rcgen.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::policy::Target;
use crate::secrets::Secrets;

/// Minted leaf configurations kept; past it the cache starts over (a wildcard secret host
/// could name many hosts).
const MAX_LEAVES: usize = 1024;

/// What the program and the upstream speak inside an intercepted connection.
const ALPN_HTTP11: &[u8] = b"http/1.1";

/// The interception cannot be set up (no roots, a certificate that cannot be made).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MitmError(pub String);

/// The certificate authorities upstreams are verified against: the host's (see
/// [`TrustRoots::system`]), or a bundle of one's own (tests, a private PKI).
#[derive(Clone)]
pub struct TrustRoots {
    certs: Vec<CertificateDer<'static>>,
}

impl fmt::Debug for TrustRoots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrustRoots({} certificates)", self.certs.len())
    }
}

impl TrustRoots {
    /// The roots the host's tools use: the PEM bundle `SSL_CERT_FILE` names in this
    /// process's environment when set (as curl, Python and Go do), else the system's
    /// store (rustls-native-certs: `SSL_CERT_DIR`, then the distribution's bundle). No
    /// compiled-in fallback: with no roots on the host, interception cannot be set up.
    pub fn system() -> Result<TrustRoots, MitmError> {
        if let Some(file) = std::env::var_os("SSL_CERT_FILE").filter(|f| !f.is_empty()) {
            return TrustRoots::from_file(std::path::Path::new(&file))
                .map_err(|e| MitmError(format!("SSL_CERT_FILE {e}")));
        }
        let found = rustls_native_certs::load_native_certs();
        if found.certs.is_empty() {
            let why = found
                .errors
                .first()
                .map_or_else(|| "none found".to_string(), ToString::to_string);
            return Err(MitmError(format!(
                "no trusted root certificates on this host ({why}); install the CA bundle or set SSL_CERT_FILE"
            )));
        }
        Ok(TrustRoots { certs: found.certs })
    }

    /// The certificates of the PEM bundle in `file`.
    pub fn from_file(file: &std::path::Path) -> Result<TrustRoots, MitmError> {
        let pem = std::fs::read(file).map_err(|e| MitmError(format!("{}: {e}", file.display())))?;
        TrustRoots::from_pem(&pem).map_err(|e| MitmError(format!("{}: {e}", file.display())))
    }

    /// The certificates of a PEM bundle (other PEM sections are skipped).
    pub fn from_pem(pem: &[u8]) -> Result<TrustRoots, MitmError> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| MitmError(format!("not a PEM bundle: {e}")))?;
        if certs.is_empty() {
            return Err(MitmError("no certificate in the PEM bundle".into()));
        }
        Ok(TrustRoots { certs })
    }

    /// The roots as a PEM bundle.
    pub fn pem(&self) -> String {
        self.certs.iter().map(|c| pem_cert(c)).collect()
    }
}

fn pem_cert(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + 80);
    out.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The interception state of one proxy: its secrets, its CA, the minted leaves.
pub(crate) struct Mitm {
    pub(crate) secrets: Secrets,
    ca_params: CertificateParams,
    ca_key: KeyPair,
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    roots_pem: String,
    client: Arc<ClientConfig>,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl fmt::Debug for Mitm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mitm")
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

fn cert_error(what: &str) -> impl Fn(rcgen::Error) -> MitmError + '_ {
    move |e| MitmError(format!("{what}: {e}"))
}

impl Mitm {
    /// A new CA (ECDSA P-256, valid from a day ago to 30 days ahead) for `secrets`,
    /// verifying upstreams against `roots`.
    pub(crate) fn new(secrets: Secrets, roots: &TrustRoots) -> Result<Mitm, MitmError> {
        let mut id = [0u8; 6];
        getrandom::fill(&mut id).map_err(|e| MitmError(format!("no randomness: {e}")))?;
        let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let now = time::OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("airlock sandbox {id} CA"));
        params
            .distinguished_name
            .push(DnType::OrganizationName, "airlock");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(30);
        let ca_key =
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(cert_error("the CA key"))?;
        let ca = params
            .self_signed(&ca_key)
            .map_err(cert_error("the CA certificate"))?;

        let mut store = RootCertStore::empty();
        let (added, _ignored) = store.add_parsable_certificates(roots.certs.iter().cloned());
        if added == 0 {
            return Err(MitmError("no usable root certificate to verify upstreams".into()));
        }
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| MitmError(format!("TLS client: {e}")))?
            .with_root_certificates(store)
            .with_no_client_auth();
        client.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        Ok(Mitm {
            secrets,
            ca_pem: ca.pem(),
            ca_der: ca.der().clone(),
            ca_params: params,
            ca_key,
            roots_pem: roots.pem(),
            client: Arc::new(client),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM: what the sandbox must trust.
    pub(crate) fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The sandbox's trust bundle: the roots upstreams are verified against, then the CA.
    pub(crate) fn bundle_pem(&self) -> String {
        format!("{}{}", self.roots_pem, self.ca_pem)
    }

    pub(crate) fn client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.client)
    }

    /// The server side for `target`: a leaf for it (minted once, then cached).
    pub(crate) fn server_config(&self, target: &Target) -> Result<Arc<ServerConfig>, MitmError> {
        let key = target_text(target);
        if let Some(config) = self.leaves.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(Arc::clone(config));
        }
        let config = Arc::new(self.mint(target, &key)?);
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(key, Arc::clone(&config));
        Ok(config)
    }

    fn mint(&self, target: &Target, name: &str) -> Result<ServerConfig, MitmError> {
        let mut params =
            CertificateParams::new(vec![name.to_string()]).map_err(cert_error("a leaf certificate"))?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        if let Target::Addr(a) = target {
            params.subject_alt_names = vec![rcgen::SanType::IpAddress(*a)];
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = self.ca_params.not_before;
        params.not_after = self.ca_params.not_after;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(cert_error("a leaf key"))?;
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let leaf = params
            .signed_by(&key, &issuer)
            .map_err(cert_error("a leaf certificate"))?;
        let chain = vec![leaf.der().clone(), self.ca_der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| MitmError(format!("TLS server: {e}")))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| MitmError(format!("TLS server: {e}")))?;
        config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        Ok(config)
    }
}

/// The name a leaf is minted for and the upstream is verified as.
pub(crate) fn target_text(target: &Target) -> String {
    match target {
        Target::Name(n) => n.clone(),
        Target::Addr(a) => a.to_string(),
    }
}

/// The SNI and verified identity of the upstream.
pub(crate) fn server_name(target: &Target) -> Result<ServerName<'static>, MitmError> {
    match target {
        Target::Addr(a) => Ok(ServerName::from(*a)),
        Target::Name(n) => ServerName::try_from(n.clone())
            .map_err(|e| MitmError(format!("{n:?} is not a TLS server name: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretConfig;

    pub(crate) fn test_roots() -> TrustRoots {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        TrustRoots::from_pem(ca.pem().as_bytes()).unwrap()
    }

    fn mitm() -> Mitm {
        let secrets = Secrets::new(&[SecretConfig {
            name: "T".into(),
            value: "v".into(),
            hosts: vec!["api.test".into()],
            query: false,
        }])
        .unwrap();
        Mitm::new(secrets, &test_roots()).unwrap()
    }

    #[test]
    fn the_ca_is_a_fresh_p256_ca_per_proxy() {
        let (a, b) = (mitm(), mitm());
        assert_ne!(a.ca_pem(), b.ca_pem());
        assert!(a.ca_pem().starts_with("-----BEGIN CERTIFICATE-----\n"));
        let ca = TrustRoots::from_pem(a.ca_pem().as_bytes()).unwrap();
        assert_eq!(ca.certs.len(), 1);
        // The bundle: the upstream roots, then the CA, all parseable.
        let bundle = TrustRoots::from_pem(a.bundle_pem().as_bytes()).unwrap();
        assert_eq!(bundle.certs.len(), 2);
        assert_eq!(bundle.certs[1], ca.certs[0]);
        // A leaf per host, cached.
        let t = Target::Name("api.test".into());
        let first = a.server_config(&t).unwrap();
        assert!(Arc::ptr_eq(&first, &a.server_config(&t).unwrap()));
        assert_eq!(first.alpn_protocols, [b"http/1.1".to_vec()]);
        let ip = Target::Addr("127.0.0.1".parse().unwrap());
        assert!(!Arc::ptr_eq(&first, &a.server_config(&ip).unwrap()));
    }

    #[test]
    fn roots_are_read_from_a_bundle_file() {
        let roots = test_roots();
        let file = std::env::temp_dir().join(format!("airlock-egress-roots-{}.pem", std::process::id()));
        std::fs::write(&file, format!("# a comment\n{}", roots.pem())).unwrap();
        let read = TrustRoots::from_file(&file);
        std::fs::remove_file(&file).unwrap();
        assert_eq!(read.unwrap().certs, roots.certs);
        let missing = TrustRoots::from_file(std::path::Path::new("/nonexistent/airlock-roots.pem"));
        assert!(
            missing
                .unwrap_err()
                .0
                .starts_with("/nonexistent/airlock-roots.pem: ")
        );
    }

    #[test]
    fn bad_bundles_are_errors() {
        assert!(TrustRoots::from_pem(b"").is_err());
        assert!(
            TrustRoots::from_pem(b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n").is_err()
        );
    }
}
