//! TLS material and configs: a cluster CA, server and client certificates, mutual authentication.
//!
//! A TLS directory holds `ca.pem` (the cluster CA certificate), `ca.key`, `server.pem`/`server.key` and
//! `client.pem`/`client.key`. [`init_dev_certs`] creates them with rcgen for development and tests; production
//! mounts real ones (a Kubernetes Secret). Servers require a client certificate signed by the CA, and clients
//! require the server's certificate to be signed by the CA and to name the server (DESIGN.md, "Protocol").
//! Only TLS 1.3 is offered, and the ALPN protocol [`crate::ALPN`] must match.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ProtocolError;

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
    /// Client certificate chain.
    pub const CLIENT_CERT: &str = "client.pem";
    /// Client private key.
    pub const CLIENT_KEY: &str = "client.key";
}

/// Default server name clients verify when none is configured.
pub const DEFAULT_SERVER_NAME: &str = "localhost";

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
pub enum Role {
    /// A parameter server.
    Server,
    /// A trainer or tool.
    Client,
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
    let cert = ca_params().self_signed(&key).map_err(tls_err)?;
    write_file(&dir.join(files::CA_KEY), &key.serialize_pem(), true)?;
    write_file(&dir.join(files::CA_CERT), &cert.pem(), false)
}

/// Issues a server or client certificate signed by the CA in `dir`, valid for `names` (DNS names or IP
/// addresses), and writes it as `server.pem`/`server.key` or `client.pem`/`client.key`.
pub fn issue(dir: &Path, role: Role, names: &[String]) -> Result<(), ProtocolError> {
    let ca_key_path = dir.join(files::CA_KEY);
    let ca_key_pem = std::fs::read_to_string(&ca_key_path).map_err(|source| ProtocolError::Io {
        context: format!("read CA key {}", ca_key_path.display()),
        source,
    })?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)
        .map_err(|e| tls_err(format!("CA key {}: {e}", ca_key_path.display())))?;
    let issuer = Issuer::new(ca_params(), ca_key);
    let mut params = CertificateParams::new(names.to_vec())
        .map_err(|e| tls_err(format!("names {names:?}: {e}")))?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_else(|| "ps".into()),
    );
    params.distinguished_name = dn;
    params.extended_key_usages = vec![match role {
        Role::Server => ExtendedKeyUsagePurpose::ServerAuth,
        Role::Client => ExtendedKeyUsagePurpose::ClientAuth,
    }];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate().map_err(tls_err)?;
    let cert = params.signed_by(&key, &issuer).map_err(tls_err)?;
    let (cert_name, key_name) = match role {
        Role::Server => (files::SERVER_CERT, files::SERVER_KEY),
        Role::Client => (files::CLIENT_CERT, files::CLIENT_KEY),
    };
    write_file(&dir.join(key_name), &key.serialize_pem(), true)?;
    write_file(&dir.join(cert_name), &cert.pem(), false)
}

/// Development set-up: a CA, a server certificate for `localhost`, `127.0.0.1` and `::1` plus `extra_names`, and
/// a client certificate, each created only if missing.
pub fn init_dev_certs(dir: &Path, extra_names: &[String]) -> Result<(), ProtocolError> {
    init_ca(dir)?;
    if !dir.join(files::SERVER_CERT).exists() {
        let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        names.extend(extra_names.iter().cloned());
        issue(dir, Role::Server, &names)?;
    }
    if !dir.join(files::CLIENT_CERT).exists() {
        issue(dir, Role::Client, &["ps-client".into()])?;
    }
    Ok(())
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
    let mut tls = builder
        .with_single_cert(
            load_certs(&path(dir, files::SERVER_CERT))?,
            load_key(&path(dir, files::SERVER_KEY))?,
        )
        .map_err(|e| tls_err(format!("server certificate in {}: {e}", dir.display())))?;
    tls.alpn_protocols = vec![crate::ALPN.to_vec()];
    tls.max_early_data_size = 0;
    Ok(tls)
}

/// Server-side QUIC crypto config that does not ask clients for certificates: development only (`ps-server
/// --insecure-dev`). The server still presents `server.pem`, so clients still verify it.
pub fn server_config_without_client_auth(dir: &Path) -> Result<quinn::ServerConfig, ProtocolError> {
    quic_server_config(rustls_server_config(dir, false)?)
}

/// Client-side QUIC crypto config from a TLS directory: presents `client.pem` and trusts only the CA.
pub fn client_config(dir: &Path) -> Result<quinn::ClientConfig, ProtocolError> {
    let tls = rustls_client_config(dir)?;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(tls_err)?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// The rustls client config behind [`client_config`], shared by the QUIC and the TCP transport.
pub fn rustls_client_config(dir: &Path) -> Result<rustls::ClientConfig, ProtocolError> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_root_certificates(roots(dir)?)
        .with_client_auth_cert(
            load_certs(&path(dir, files::CLIENT_CERT))?,
            load_key(&path(dir, files::CLIENT_KEY))?,
        )
        .map_err(|e| tls_err(format!("client certificate in {}: {e}", dir.display())))?;
    tls.alpn_protocols = vec![crate::ALPN.to_vec()];
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_certs_load_into_configs_and_are_reused() {
        let dir = tempfile::tempdir().unwrap();
        init_dev_certs(dir.path(), &["ps-0.ps".into()]).unwrap();
        let ca = std::fs::read(dir.path().join(files::CA_CERT)).unwrap();
        server_config(dir.path()).unwrap();
        client_config(dir.path()).unwrap();
        init_dev_certs(dir.path(), &[]).unwrap();
        assert_eq!(ca, std::fs::read(dir.path().join(files::CA_CERT)).unwrap());
    }

    #[test]
    fn missing_files_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = server_config(dir.path()).unwrap_err().to_string();
        assert!(err.contains("ca.pem"), "{err}");
    }
}
