//! TLS material and configs: a cluster CA, server and client certificates, mutual authentication, roles.
//!
//! A TLS directory holds `ca.pem` (the cluster CA certificate), `ca.key` (only where certificates are
//! issued), `server.pem`/`server.key`, and one client certificate per role a process of that machine plays:
//! `trainer.pem`/`trainer.key`, `serving.pem`, `peer.pem`, `admin.pem` ([`files::role_cert`]). A client
//! presents the certificate of its role, or `client.pem`/`client.key` when the directory has no file for the
//! role (a Kubernetes pod mounts only its own). Each client certificate names its role in a SAN URI
//! (`pstrain:role/trainer`, [`crate::auth`]); servers authorize every request by it.
//!
//! [`init_dev_certs`] creates a development set with rcgen (server names `localhost`, `127.0.0.1`, `::1` plus
//! any given, every role, [`DEV_VALIDITY`]); production mounts real ones (cert-manager, `k8s/`). Servers
//! require a client certificate signed by the CA, and clients require the server's certificate to be signed
//! by the CA and to name the server (DESIGN.md, "Protocol"). Only TLS 1.3 is offered, and the ALPN protocol
//! [`crate::ALPN`] must match. Certificates and keys are loaded again when their files change ([`reload`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ProtocolError;

pub mod reload;

/// File names inside a TLS directory.
pub mod files {
    /// CA certificate.
    pub const CA_CERT: &str = "ca.pem";
    /// CA private key (only needed to issue certificates).
    pub const CA_KEY: &str = "ca.key";
    /// Server certificate chain.
    pub const SERVER_CERT: &str = "server.pem";
    /// Server private key.
    pub const SERVER_KEY: &str = "server.key";
    /// Client certificate chain used when the directory has none for the client's role.
    pub const CLIENT_CERT: &str = "client.pem";
    /// Private key of [`CLIENT_CERT`].
    pub const CLIENT_KEY: &str = "client.key";

    /// The certificate file of a client of `role`: `trainer.pem`, `serving.pem`, `peer.pem`, `admin.pem`.
    pub fn role_cert(role: crate::auth::Role) -> String {
        format!("{}.pem", role.name())
    }

    /// The private key file of a client of `role`: `trainer.key`, ...
    pub fn role_key(role: crate::auth::Role) -> String {
        format!("{}.key", role.name())
    }
}

/// How long certificates made by [`init_dev_certs`] are valid: 90 days, as cert-manager's default. A
/// development directory is renewed by [`init_dev_certs`] when a certificate has less than
/// [`DEV_RENEW_BEFORE`] left.
pub const DEV_VALIDITY: std::time::Duration = std::time::Duration::from_secs(90 * 24 * 3600);
/// [`init_dev_certs`] issues a certificate again when it expires within this (1 day).
pub const DEV_RENEW_BEFORE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// Validity of the CA [`init_ca`] creates: 10 years.
pub const CA_VALIDITY: std::time::Duration = std::time::Duration::from_secs(3650 * 24 * 3600);

/// Default server name clients verify when none is configured.
pub const DEFAULT_SERVER_NAME: &str = "localhost";

/// `name` as a TLS server name (a DNS name or an IP address), or why it is not one.
pub fn server_name(name: &str) -> Result<rustls::pki_types::ServerName<'static>, ProtocolError> {
    rustls::pki_types::ServerName::try_from(name.to_owned())
        .map_err(|e| tls_err(format!("server name {name:?}: {e}")))
}

/// The name a client verifies when it dials `host:port` without a configured server name: the host, as any
/// TLS client checks the name it dialed (`ps-0-1.ps` of `ps-0-1.ps:7000`, `127.0.0.1` of `127.0.0.1:7000`,
/// `::1` of `[::1]:7000`).
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

fn tls_err(what: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::Tls(what.to_string())
}

fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), ProtocolError> {
    std::fs::write(path, contents).map_err(|source| ProtocolError::Io {
        context: format!("write {}", path.display()),
        source,
    })?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
    Ok(())
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "ps cluster CA");
    dn.push(DnType::OrganizationName, "ps");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// Which end a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaf {
    /// A parameter server (server authentication, the names clients dial).
    Server,
    /// A client of a role (client authentication, the role's SAN URI).
    Client(crate::auth::Role),
}

impl Leaf {
    /// The certificate and key file names of this leaf in a TLS directory.
    pub fn files(self) -> (String, String) {
        match self {
            Leaf::Server => (files::SERVER_CERT.into(), files::SERVER_KEY.into()),
            Leaf::Client(role) => (files::role_cert(role), files::role_key(role)),
        }
    }
}

/// Creates a CA in `dir` unless `ca.pem` already exists there.
pub fn init_ca(dir: &Path) -> Result<(), ProtocolError> {
    std::fs::create_dir_all(dir).map_err(|source| ProtocolError::Io {
        context: format!("create tls dir {}", dir.display()),
        source,
    })?;
    if dir.join(files::CA_CERT).exists() {
        return Ok(());
    }
    let key = KeyPair::generate().map_err(tls_err)?;
    let mut params = ca_params();
    set_validity(&mut params, CA_VALIDITY);
    let cert = params.self_signed(&key).map_err(tls_err)?;
    write_file(&dir.join(files::CA_KEY), &key.serialize_pem(), true)?;
    write_file(&dir.join(files::CA_CERT), &cert.pem(), false)
}

fn set_validity(params: &mut CertificateParams, validity: std::time::Duration) {
    let now = time::OffsetDateTime::now_utc();
    // A minute back: a peer whose clock is slightly behind still accepts a certificate issued just now.
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + validity;
}

/// Issues a certificate signed by the CA in `dir`, valid for `validity` from now, and writes it under the
/// leaf's file names ([`Leaf::files`]). A server certificate names `names` (DNS names, wildcards such as
/// `*.ps`, or IP addresses); a client certificate carries its role's URI ([`crate::auth::Role::uri`]) and,
/// as subject, `names[0]` (default the role's name).
pub fn issue(
    dir: &Path,
    leaf: Leaf,
    names: &[String],
    validity: std::time::Duration,
) -> Result<(), ProtocolError> {
    let ca_key_path = dir.join(files::CA_KEY);
    let ca_key_pem = std::fs::read_to_string(&ca_key_path).map_err(|source| ProtocolError::Io {
        context: format!("read CA key {}", ca_key_path.display()),
        source,
    })?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)
        .map_err(|e| tls_err(format!("CA key {}: {e}", ca_key_path.display())))?;
    let issuer = Issuer::new(ca_params(), ca_key);
    let mut params = match leaf {
        Leaf::Server => CertificateParams::new(names.to_vec())
            .map_err(|e| tls_err(format!("names {names:?}: {e}")))?,
        Leaf::Client(role) => {
            let mut p = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
            let uri = rcgen::string::Ia5String::try_from(role.uri()).map_err(tls_err)?;
            p.subject_alt_names = vec![rcgen::SanType::URI(uri)];
            p
        }
    };
    let common_name = match leaf {
        Leaf::Server => names.first().cloned().unwrap_or_else(|| "ps".into()),
        Leaf::Client(role) => names
            .first()
            .cloned()
            .unwrap_or_else(|| format!("pstrain-{}", role.name())),
    };
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.extended_key_usages = vec![match leaf {
        Leaf::Server => ExtendedKeyUsagePurpose::ServerAuth,
        Leaf::Client(_) => ExtendedKeyUsagePurpose::ClientAuth,
    }];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    set_validity(&mut params, validity);
    let key = KeyPair::generate().map_err(tls_err)?;
    let cert = params.signed_by(&key, &issuer).map_err(tls_err)?;
    let (cert_name, key_name) = leaf.files();
    write_file(&dir.join(key_name), &key.serialize_pem(), true)?;
    write_file(&dir.join(cert_name), &cert.pem(), false)
}

/// Development set-up: a CA, a server certificate for `localhost`, `127.0.0.1` and `::1` plus `extra_names`,
/// and a client certificate for every role, each valid for [`DEV_VALIDITY`]; a certificate is issued only if
/// missing or expiring within [`DEV_RENEW_BEFORE`] (a server certificate also when it lacks one of
/// `extra_names`).
pub fn init_dev_certs(dir: &Path, extra_names: &[String]) -> Result<(), ProtocolError> {
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    names.extend(extra_names.iter().cloned());
    init_certs(dir, &names)
}

/// [`init_dev_certs`] with a server certificate naming exactly `server_names`, as production certificates do
/// (no `localhost` unless given): clients must then dial with one of those names (`--server-name`).
pub fn init_certs(dir: &Path, server_names: &[String]) -> Result<(), ProtocolError> {
    if server_names.is_empty() {
        return Err(tls_err("a server certificate needs at least one name"));
    }
    init_ca(dir)?;
    let names = server_names;
    let server = dir.join(files::SERVER_CERT);
    let lacks_a_name = || {
        let have = certificate_names(&server).unwrap_or_default();
        names.iter().any(|n| !have.contains(n))
    };
    if needs_issuing(&server) || lacks_a_name() {
        issue(dir, Leaf::Server, names, DEV_VALIDITY)?;
    }
    for role in crate::auth::Role::ALL {
        if needs_issuing(&dir.join(files::role_cert(role))) {
            issue(dir, Leaf::Client(role), &[], DEV_VALIDITY)?;
        }
    }
    Ok(())
}

/// Whether the certificate at `path` is missing, unreadable or expires within [`DEV_RENEW_BEFORE`].
fn needs_issuing(path: &Path) -> bool {
    let Ok(certs) = load_certs(path) else {
        return true;
    };
    let Ok((_, cert)) =
        <x509_parser::certificate::X509Certificate as x509_parser::prelude::FromDer<_>>::from_der(
            &certs[0],
        )
    else {
        return true;
    };
    let renew_at = time::OffsetDateTime::now_utc() + DEV_RENEW_BEFORE;
    cert.validity().not_after.to_datetime() <= renew_at
}

/// The DNS names and IP addresses a certificate file's leaf names (its subject alternative names).
pub fn certificate_names(path: &Path) -> Result<Vec<String>, ProtocolError> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let certs = load_certs(path)?;
    let (_, cert) = X509Certificate::from_der(&certs[0])
        .map_err(|e| tls_err(format!("parse certificate {}: {e}", path.display())))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| tls_err(format!("certificate {}: {e}", path.display())))?;
    let mut names = Vec::new();
    for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
        match name {
            GeneralName::DNSName(d) => names.push((*d).to_owned()),
            GeneralName::IPAddress(ip) => match ip.len() {
                4 => names.push(
                    std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*ip).expect("4")).to_string(),
                ),
                16 => names.push(
                    std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*ip).expect("16")).to_string(),
                ),
                _ => {}
            },
            _ => {}
        }
    }
    Ok(names)
}

fn path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ProtocolError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err(format!("read certificates {}: {e}", path.display())))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_err(format!("parse certificates {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(tls_err(format!("no certificate in {}", path.display())));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, ProtocolError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| tls_err(format!("read private key {}: {e}", path.display())))
}

fn roots(dir: &Path) -> Result<rustls::RootCertStore, ProtocolError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(&path(dir, files::CA_CERT))? {
        roots
            .add(cert)
            .map_err(|e| tls_err(format!("CA certificate in {}: {e}", dir.display())))?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Server-side QUIC crypto config from a TLS directory: requires client certificates signed by the CA.
pub fn server_config(dir: &Path) -> Result<quinn::ServerConfig, ProtocolError> {
    quic_server_config(rustls_server_config(dir, true)?)
}

/// The rustls server config behind [`server_config`] (`client_auth`) or [`server_config_without_client_auth`],
/// shared by the QUIC and the TCP transport.
pub fn rustls_server_config(
    dir: &Path,
    client_auth: bool,
) -> Result<rustls::ServerConfig, ProtocolError> {
    if !client_auth {
        return finish_server_config(server_builder()?.with_no_client_auth(), dir);
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(dir)?),
        provider(),
    )
    .build()
    .map_err(|e| tls_err(format!("client verifier: {e}")))?;
    let builder = server_builder()?.with_client_cert_verifier(verifier);
    finish_server_config(builder, dir)
}

/// Wraps a rustls server config (from [`rustls_server_config`]) for QUIC.
pub fn quic_server_config(tls: rustls::ServerConfig) -> Result<quinn::ServerConfig, ProtocolError> {
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(tls_err)?;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(quic)))
}

/// TLS 1.3 only, with the ring provider.
fn server_builder(
) -> Result<rustls::ConfigBuilder<rustls::ServerConfig, rustls::WantsVerifier>, ProtocolError> {
    rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)
}

/// Adds `server.pem`/`server.key`, the ALPN and no early data.
fn finish_server_config(
    builder: rustls::ConfigBuilder<rustls::ServerConfig, rustls::server::WantsServerCert>,
    dir: &Path,
) -> Result<rustls::ServerConfig, ProtocolError> {
    // Reloaded when cert-manager rewrites the files (`reload`).
    let key = reload::ReloadingKey::load(
        &path(dir, files::SERVER_CERT),
        &path(dir, files::SERVER_KEY),
        provider(),
    )?;
    let mut tls = builder.with_cert_resolver(Arc::new(key));
    tls.alpn_protocols = vec![crate::ALPN.to_vec()];
    tls.max_early_data_size = 0;
    Ok(tls)
}

/// Server-side QUIC crypto config that does not ask clients for certificates: development only (`ps-server
/// --insecure-dev`). The server still presents `server.pem`, so clients still verify it.
pub fn server_config_without_client_auth(dir: &Path) -> Result<quinn::ServerConfig, ProtocolError> {
    quic_server_config(rustls_server_config(dir, false)?)
}

/// Client-side QUIC crypto config from a TLS directory: presents the certificate of `role` and trusts only
/// the CA.
pub fn client_config(
    dir: &Path,
    role: crate::auth::Role,
) -> Result<quinn::ClientConfig, ProtocolError> {
    let tls = rustls_client_config(dir, role)?;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(tls_err)?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// The certificate and key files a client of `role` presents from `dir`: the role's own
/// ([`files::role_cert`]), else `client.pem`/`client.key`.
pub fn client_files(
    dir: &Path,
    role: crate::auth::Role,
) -> Result<(PathBuf, PathBuf), ProtocolError> {
    let own = (
        path(dir, &files::role_cert(role)),
        path(dir, &files::role_key(role)),
    );
    if own.0.exists() {
        return Ok(own);
    }
    let fallback = (path(dir, files::CLIENT_CERT), path(dir, files::CLIENT_KEY));
    if fallback.0.exists() {
        return Ok(fallback);
    }
    Err(tls_err(format!(
        "no client certificate for role {role} in {}: expected {} (or {})",
        dir.display(),
        files::role_cert(role),
        files::CLIENT_CERT
    )))
}

/// The rustls client config behind [`client_config`], shared by the QUIC and the TCP transport.
pub fn rustls_client_config(
    dir: &Path,
    role: crate::auth::Role,
) -> Result<rustls::ClientConfig, ProtocolError> {
    let (cert, key) = client_files(dir, role)?;
    // Reloaded when cert-manager rewrites the files (`reload`).
    let key = reload::ReloadingKey::load(&cert, &key, provider())?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_root_certificates(roots(dir)?)
        .with_client_cert_resolver(Arc::new(key));
    tls.alpn_protocols = vec![crate::ALPN.to_vec()];
    Ok(tls)
}

/// Whether `err` is a TLS handshake failure over a certificate (not valid for the name dialed, expired, not
/// signed by the CA, or refused by the peer), with rustls' explanation: for a name mismatch it names the
/// name expected and the names the certificate carries. Such failures do not heal by retrying.
pub fn certificate_failure(err: &ProtocolError) -> Option<String> {
    let text = match err {
        ProtocolError::Connection {
            source: quinn::ConnectionError::TransportError(t),
            ..
        } if is_crypto_code(u64::from(t.code)) => t.to_string(),
        ProtocolError::Connection {
            source: quinn::ConnectionError::ConnectionClosed(c),
            ..
        } if is_crypto_code(u64::from(c.error_code)) => c.to_string(),
        other => other.to_string(),
    };
    let markers = [
        "invalid peer certificate",
        "certificate not valid for name",
        "peer sent no certificates",
        "BadCertificate",
        "UnknownCA",
        "CertificateExpired",
        "certificate expired",
        "received fatal alert",
    ];
    markers.iter().any(|m| text.contains(m)).then_some(text)
}

/// QUIC's CRYPTO_ERROR range (0x100..0x200): a TLS alert.
fn is_crypto_code(code: u64) -> bool {
    (0x100..0x200).contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::auth::{Access, Role};

    #[test]
    fn dev_certs_load_into_configs_and_are_reused() {
        let dir = tempfile::tempdir().unwrap();
        init_dev_certs(dir.path(), &["ps-0.ps".into()]).unwrap();
        let ca = std::fs::read(dir.path().join(files::CA_CERT)).unwrap();
        let server = std::fs::read(dir.path().join(files::SERVER_CERT)).unwrap();
        server_config(dir.path()).unwrap();
        for role in Role::ALL {
            client_config(dir.path(), role).unwrap();
            let (cert, _) = client_files(dir.path(), role).unwrap();
            let der = load_certs(&cert).unwrap();
            assert_eq!(Access::of_certificate(&der[0]), Access::Role(role));
        }
        init_dev_certs(dir.path(), &[]).unwrap();
        assert_eq!(ca, std::fs::read(dir.path().join(files::CA_CERT)).unwrap());
        assert_eq!(
            server,
            std::fs::read(dir.path().join(files::SERVER_CERT)).unwrap()
        );
        // A name the server certificate lacks is added.
        init_dev_certs(dir.path(), &["ps".into()]).unwrap();
        let names = certificate_names(&dir.path().join(files::SERVER_CERT)).unwrap();
        for n in ["localhost", "127.0.0.1", "::1", "ps"] {
            assert!(names.contains(&n.to_string()), "{names:?}");
        }
    }

    #[test]
    fn dev_certs_expire_and_are_renewed_when_close_to_it() {
        let dir = tempfile::tempdir().unwrap();
        init_dev_certs(dir.path(), &[]).unwrap();
        let trainer = dir.path().join(files::role_cert(Role::Trainer));
        assert!(!needs_issuing(&trainer));
        // A certificate with an hour left is issued again.
        issue(
            dir.path(),
            Leaf::Client(Role::Trainer),
            &[],
            std::time::Duration::from_secs(3600),
        )
        .unwrap();
        assert!(needs_issuing(&trainer));
        let short = std::fs::read(&trainer).unwrap();
        init_dev_certs(dir.path(), &[]).unwrap();
        assert_ne!(short, std::fs::read(&trainer).unwrap());
        assert!(!needs_issuing(&trainer));
    }

    #[test]
    fn a_client_without_its_role_file_uses_client_pem_or_names_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        let err = client_config(dir.path(), Role::Serving)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("serving.pem") && err.contains("client.pem"),
            "{err}"
        );
        issue(dir.path(), Leaf::Client(Role::Serving), &[], DEV_VALIDITY).unwrap();
        std::fs::rename(
            dir.path().join("serving.pem"),
            dir.path().join(files::CLIENT_CERT),
        )
        .unwrap();
        std::fs::rename(
            dir.path().join("serving.key"),
            dir.path().join(files::CLIENT_KEY),
        )
        .unwrap();
        client_config(dir.path(), Role::Serving).unwrap();
        assert_eq!(
            client_files(dir.path(), Role::Trainer).unwrap().0,
            dir.path().join(files::CLIENT_CERT)
        );
    }

    #[test]
    fn missing_files_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = server_config(dir.path()).unwrap_err().to_string();
        assert!(err.contains("ca.pem"), "{err}");
    }
}
