//! Certificates reloaded when their files change: cert-manager renews a certificate at two thirds of its
//! lifetime by rewriting the mounted secret, and a process that read its files once would present the old one
//! until it expired, after which every new connection fails.
//!
//! A [`ReloadingKey`] is the certificate resolver of a rustls server config (the certificate presented to
//! clients) or client config (the client certificate presented to servers). At most once per [`CHECK_EVERY`],
//! at a handshake, it compares the files' modification times and lengths with those it last loaded; when they
//! changed it loads the pair again. A pair that does not load (half-written, a key that does not match the
//! certificate, garbage) is refused: the previous certificate stays in use, the failure is logged and counted,
//! and the pair is tried again when the files change again. Connections already open keep their session.
//!
//! The CA that verifies peers is read once: a new CA needs a restart (docs/security.md).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::sign::CertifiedKey;

use crate::error::ProtocolError;
use crate::metrics as m;

/// How often a handshake may look at the files (one `stat` of each).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What a pair of files looked like when last loaded: modification times and lengths.
type Stamp = [(Option<SystemTime>, u64); 2];

fn stamp(cert: &Path, key: &Path) -> Stamp {
    [cert, key].map(|p| {
        std::fs::metadata(p)
            .map(|m| (m.modified().ok(), m.len()))
            .unwrap_or((None, 0))
    })
}

/// A certificate and key from two files, loaded again when the files change.
#[derive(Debug)]
pub struct ReloadingKey {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    current: Arc<CertifiedKey>,
    /// The files as last tried (loaded or refused).
    stamp: Stamp,
    checked: Instant,
}

impl ReloadingKey {
    /// Loads `cert` (a PEM chain, leaf first) and `key`; fails naming the file if they do not load or match.
    pub fn load(
        cert: &Path,
        key: &Path,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<ReloadingKey, ProtocolError> {
        let stamp = stamp(cert, key);
        let current = Arc::new(load_pair(cert, key, &provider)?);
        record_loaded(cert, &current);
        Ok(ReloadingKey {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider,
            state: Mutex::new(State {
                current,
                stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// The certificate to present now, loaded again first if the files changed (checked at most once per
    /// [`CHECK_EVERY`]).
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current_at(Instant::now())
    }

    fn current_at(&self, now: Instant) -> Arc<CertifiedKey> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(state.checked) < CHECK_EVERY {
            return state.current.clone();
        }
        state.checked = now;
        let seen = stamp(&self.cert, &self.key);
        if seen == state.stamp {
            return state.current.clone();
        }
        state.stamp = seen;
        match load_pair(&self.cert, &self.key, &self.provider) {
            Ok(pair) => {
                state.current = Arc::new(pair);
                record_loaded(&self.cert, &state.current);
                metrics::counter!(m::TLS_RELOADS_TOTAL, "file" => file_label(&self.cert), "outcome" => "loaded")
                    .increment(1);
                tracing::info!(cert = %self.cert.display(), "certificate reloaded: new connections present it");
            }
            Err(e) => {
                metrics::counter!(m::TLS_RELOADS_TOTAL, "file" => file_label(&self.cert), "outcome" => "refused")
                    .increment(1);
                tracing::error!(
                    cert = %self.cert.display(),
                    error = %e,
                    "changed certificate files do not load: still presenting the previous certificate"
                );
            }
        }
        state.current.clone()
    }
}

impl rustls::server::ResolvesServerCert for ReloadingKey {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl rustls::client::ResolvesClientCert for ReloadingKey {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The pair, checked: the key must match the leaf certificate.
fn load_pair(
    cert: &Path,
    key: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, ProtocolError> {
    let chain = super::load_certs(cert)?;
    let private = super::load_key(key)?;
    CertifiedKey::from_der(chain, private, provider).map_err(|e| {
        super::tls_err(format!(
            "certificate {} with key {}: {e}",
            cert.display(),
            key.display()
        ))
    })
}

/// The file name, as the metrics' `file` label (`server.pem`, `trainer.pem`, ...).
fn file_label(cert: &Path) -> String {
    cert.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// Sets the leaf's expiry gauge.
fn record_loaded(cert: &Path, pair: &CertifiedKey) {
    use x509_parser::prelude::{FromDer, X509Certificate};
    if let Some(leaf) = pair.cert.first() {
        if let Ok((_, parsed)) = X509Certificate::from_der(leaf) {
            metrics::gauge!(m::TLS_CERTIFICATE_NOT_AFTER, "file" => file_label(cert))
                .set(parsed.validity().not_after.timestamp() as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tls::{files, init_certs, issue, Leaf};

    fn serial_of(k: &CertifiedKey) -> Vec<u8> {
        use x509_parser::prelude::{FromDer, X509Certificate};
        let (_, c) = X509Certificate::from_der(&k.cert[0]).unwrap();
        c.raw_serial().to_vec()
    }

    #[test]
    fn a_changed_pair_is_presented_and_a_broken_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        init_certs(dir.path(), &["ps".to_owned()]).unwrap();
        let cert = dir.path().join(files::SERVER_CERT);
        let key = dir.path().join(files::SERVER_KEY);
        let r = ReloadingKey::load(&cert, &key, super::super::provider()).unwrap();
        let t0 = Instant::now();
        let first = serial_of(&r.current_at(t0));
        // A new certificate for the same names (cert-manager's renewal).
        issue(
            dir.path(),
            Leaf::Server,
            &["ps".to_owned()],
            Duration::from_secs(3600),
        )
        .unwrap();
        assert_eq!(
            serial_of(&r.current_at(t0)),
            first,
            "not looked at within CHECK_EVERY"
        );
        let t1 = t0 + CHECK_EVERY;
        let second = serial_of(&r.current_at(t1));
        assert_ne!(second, first, "the renewed certificate is presented");
        // A half-written pair (the key of another certificate) is refused: the last good one stays.
        let other = tempfile::tempdir().unwrap();
        init_certs(other.path(), &["ps".to_owned()]).unwrap();
        std::fs::copy(other.path().join(files::SERVER_KEY), &key).unwrap();
        let t2 = t1 + CHECK_EVERY;
        assert_eq!(serial_of(&r.current_at(t2)), second);
        // Garbage too.
        std::fs::write(&cert, "not a certificate").unwrap();
        assert_eq!(serial_of(&r.current_at(t2 + CHECK_EVERY)), second);
        // Loading fails at start, naming the file.
        let err = ReloadingKey::load(&cert, &key, super::super::provider()).unwrap_err();
        assert!(err.to_string().contains("server.pem"), "{err}");
    }
}
