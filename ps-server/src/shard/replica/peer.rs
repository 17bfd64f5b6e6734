//! Connections from this server to the other servers: the primary's stream to each backup, a backup's
//! `Join`, the census of roles at start, and a reshard's moved rows. One [`NetDialer`] per peer (QUIC, with
//! the `peer` certificate of the TLS directory), names resolved at each dial (a restarted pod may have a new
//! address).
//!
//! A peer whose certificate this server cannot verify (or which refuses this server's) is a configuration
//! error that retrying does not heal: it is logged at error level with the name expected and the names the
//! certificate carries, counted in [`m::PEER_TLS_FAILURES_TOTAL`] and shown by
//! [`m::PEER_TLS_FAILING`] until a connection succeeds (alert `PstrainReplicaPeerTlsFailure`).
//!
//! With the `testing` feature, [`Peers::in_memory`] reaches the other replicas through protocol's memory
//! transport instead (`crate::testing::MemoryCluster::replicated`): the same calls, timeouts and reconnects.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use protocol::transport::{tls, Connection, Dialer, NetConn, NetDialer};
use protocol::wire::message::replicate::ReplicaInfo;
use protocol::{ProtocolError, Request, Response, Role, Transport};

use crate::metrics as m;

/// Time allowed for one request to a peer (connecting included).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// A peer's certificate failure is logged again at error level after this long.
const TLS_FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// How this server dials the others.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    /// TLS directory.
    pub tls_dir: PathBuf,
    /// Name the servers' certificates carry; `None`: the host of each one's address.
    pub server_name: Option<String>,
    /// Cap on a frame.
    pub max_frame: u64,
    /// The certificate presented: `peer` for a server, `admin` for the operator's tools.
    pub role: Role,
}

impl Default for PeerSettings {
    fn default() -> PeerSettings {
        PeerSettings {
            tls_dir: PathBuf::new(),
            server_name: None,
            max_frame: protocol::wire::frame::DEFAULT_MAX_FRAME,
            role: Role::Peer,
        }
    }
}

impl PeerSettings {
    /// The TLS name verified when dialing `addr` (`host:port`).
    pub fn name_for<'a>(&'a self, addr: &'a str) -> &'a str {
        self.server_name
            .as_deref()
            .unwrap_or_else(|| tls::host_of(addr))
    }
}

/// A peer's resolved address, its dialer (none in memory), and the open connection if any.
type Link = (SocketAddr, Option<Arc<NetDialer>>, Option<PeerConn>);

/// An open connection to a peer.
#[derive(Clone)]
enum PeerConn {
    /// QUIC with TLS.
    Net(NetConn),
    /// The memory transport (tests).
    #[cfg(feature = "testing")]
    Memory(protocol::transport::memory::MemoryConn),
}

impl PeerConn {
    async fn call(
        &self,
        addr: SocketAddr,
        req: &Request,
        payload: &Bytes,
    ) -> Result<(Response, Bytes), ProtocolError> {
        match self {
            PeerConn::Net(c) => c.call(addr, req, payload).await,
            #[cfg(feature = "testing")]
            PeerConn::Memory(c) => c.call(addr, req, payload).await,
        }
    }

    fn is_open(&self, addr: SocketAddr) -> bool {
        match self {
            PeerConn::Net(c) => c.close_reason(addr).is_none(),
            #[cfg(feature = "testing")]
            PeerConn::Memory(c) => c.close_reason(addr).is_none(),
        }
    }

    fn close(&self) {
        match self {
            PeerConn::Net(c) => c.close(),
            #[cfg(feature = "testing")]
            PeerConn::Memory(c) => c.close(),
        }
    }
}

/// One other server.
struct Peer {
    /// `host:port` as configured.
    name: String,
    /// The dialer and the connection, made on first use.
    link: Mutex<Option<Link>>,
    /// When a certificate failure was last logged at error level (`None`: the last dial worked).
    tls_failing_since_log: Mutex<Option<Instant>>,
}

/// The other servers (a shard's replicas, or the cluster's servers), by index (this server's own slot is
/// never dialed).
pub struct Peers {
    peers: Vec<Peer>,
    own: u32,
    settings: PeerSettings,
    /// In memory: a dialer per replica, used instead of QUIC.
    #[cfg(feature = "testing")]
    memory: Option<Vec<protocol::transport::memory::MemoryDialer>>,
}

impl Peers {
    /// Peers at `names` (every server, this one at `own`), dialed with `settings`.
    pub fn new(names: &[String], own: u32, settings: PeerSettings) -> Peers {
        Peers {
            peers: names
                .iter()
                .map(|n| Peer {
                    name: n.clone(),
                    link: Mutex::new(None),
                    tls_failing_since_log: Mutex::new(None),
                })
                .collect(),
            own,
            settings,
            #[cfg(feature = "testing")]
            memory: None,
        }
    }

    /// Peers reached through the memory transport: `dialers[r]` reaches replica `r` (named `names[r]`, an
    /// address, in errors and logs); this server is `own`.
    #[cfg(feature = "testing")]
    pub fn in_memory(
        names: &[String],
        own: u32,
        dialers: Vec<protocol::transport::memory::MemoryDialer>,
    ) -> Peers {
        assert_eq!(names.len(), dialers.len(), "a dialer per replica");
        Peers {
            memory: Some(dialers),
            ..Peers::new(names, own, PeerSettings::default())
        }
    }

    /// Number of replicas, this one included (0 without replication).
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether the shard has no replicas list.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The other replicas' indices.
    pub fn others(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.peers.len() as u32).filter(move |&r| r != self.own)
    }

    /// The configured name of replica `r`.
    pub fn name(&self, r: u32) -> &str {
        &self.peers[r as usize].name
    }

    async fn connection(&self, r: u32) -> Result<(SocketAddr, PeerConn), ProtocolError> {
        let peer = &self.peers[r as usize];
        let cached = peer.link.lock().as_ref().and_then(|(addr, _, conn)| {
            conn.as_ref()
                .filter(|c| c.is_open(*addr))
                .map(|c| (*addr, c.clone()))
        });
        if let Some(found) = cached {
            return Ok(found);
        }
        let addr = resolve(&peer.name).await?;
        #[cfg(feature = "testing")]
        if let Some(dialers) = &self.memory {
            let conn = PeerConn::Memory(dialers[r as usize].connect(addr, "", 0).await?);
            *peer.link.lock() = Some((addr, None, Some(conn.clone())));
            return Ok((addr, conn));
        }
        let dialer = {
            let mut link = peer.link.lock();
            match link.as_ref() {
                Some((a, Some(d), _)) if *a == addr => d.clone(),
                _ => {
                    let d = Arc::new(NetDialer::new(
                        Transport::Quic,
                        addr,
                        &self.settings.tls_dir,
                        self.settings.role,
                    )?);
                    *link = Some((addr, Some(d.clone()), None));
                    d
                }
            }
        };
        let expected = self.settings.name_for(&peer.name);
        let conn = match dialer
            .connect(addr, expected, self.settings.max_frame)
            .await
        {
            Ok(conn) => {
                self.tls_healed(r);
                conn
            }
            Err(e) => {
                if let Some(why) = tls::certificate_failure(&e) {
                    self.tls_failed(r, expected, &why);
                }
                return Err(e);
            }
        };
        let conn = PeerConn::Net(conn);
        if let Some((a, _, c)) = peer.link.lock().as_mut() {
            if *a == addr {
                *c = Some(conn.clone());
            }
        }
        Ok((addr, conn))
    }

    /// Sends `req` to replica `r` once, within `timeout`; a failure drops the connection (the next call
    /// dials again).
    pub async fn call(
        &self,
        r: u32,
        req: &Request,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Response, ProtocolError> {
        let attempt = async {
            let (addr, conn) = self.connection(r).await?;
            conn.call(addr, req, &payload).await.map(|(resp, _)| resp)
        };
        let result = match tokio::time::timeout(timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(ProtocolError::Timeout {
                server: self.name(r).to_owned(),
                secs: timeout.as_secs_f64(),
            }),
        };
        if result.is_err() {
            self.forget(r);
        }
        result
    }

    /// Records a certificate failure dialing peer `r` (verified against `expected`): an error-level log
    /// once a minute per peer, the counter and the gauge.
    fn tls_failed(&self, r: u32, expected: &str, why: &str) {
        let peer = &self.peers[r as usize];
        let replica = r.to_string();
        metrics::counter!(m::PEER_TLS_FAILURES_TOTAL, "peer" => replica.clone()).increment(1);
        metrics::gauge!(m::PEER_TLS_FAILING, "peer" => replica).set(1.0);
        let mut last = peer.tls_failing_since_log.lock();
        if last.is_none_or(|t| t.elapsed() >= TLS_FAILURE_LOG_EVERY) {
            *last = Some(Instant::now());
            tracing::error!(
                peer = %peer.name,
                expected_name = expected,
                error = %why,
                "TLS with a peer server failed: its certificate does not carry the name this server \
                 verifies (set replica-server-name, or give --replicas the names the certificates carry), \
                 or it is not signed by this cluster's CA; replication to it is stopped"
            );
        }
    }

    /// A connection to peer `r` succeeded: its certificate failure, if any, is over.
    fn tls_healed(&self, r: u32) {
        let peer = &self.peers[r as usize];
        if peer.tls_failing_since_log.lock().take().is_some() {
            metrics::gauge!(m::PEER_TLS_FAILING, "peer" => r.to_string()).set(0.0);
            tracing::info!(peer = %peer.name, "TLS with the peer server works again");
        }
    }

    /// Drops the connection to replica `r` (it restarted: the next call dials the new process instead of
    /// waiting on a connection to the old one).
    pub fn forget(&self, r: u32) {
        if let Some((_, _, c)) = self.peers[r as usize].link.lock().as_mut() {
            if let Some(conn) = c.take() {
                conn.close();
            }
        }
    }

    /// Replica `r`'s answer to `Hello`.
    pub async fn info(&self, r: u32) -> Result<ReplicaInfo, ProtocolError> {
        let hello = protocol::wire::message::hello::request();
        match self.call(r, &hello, Bytes::new(), PEER_TIMEOUT).await? {
            Response::Hello { replica, .. } => Ok(replica),
            other => Err(ProtocolError::UnexpectedResponse {
                server: self.name(r).to_owned(),
                got: other.kind().into(),
                expected: "Hello",
            }),
        }
    }

    /// Every other replica's answer to `Hello`, asked concurrently: `(replica, info)` of those that answered.
    pub async fn census(&self) -> Vec<(u32, ReplicaInfo)> {
        let asks = self
            .others()
            .map(|r| async move { (r, self.info(r).await) });
        let mut out = Vec::new();
        for (r, answer) in futures_util::future::join_all(asks).await {
            match answer {
                Ok(info) => out.push((r, info)),
                Err(e) => tracing::debug!(replica = r, error = %e, "replica did not answer Hello"),
            }
        }
        out
    }

    /// Closes every connection.
    pub fn close(&self) {
        for p in &self.peers {
            if let Some((_, _, Some(conn))) =
                p.link.lock().as_mut().map(|(a, d, c)| (a, d, c.take()))
            {
                conn.close();
            }
        }
    }
}

/// `host:port` to its first address.
async fn resolve(name: &str) -> Result<SocketAddr, ProtocolError> {
    if let Ok(a) = name.parse() {
        return Ok(a);
    }
    tokio::net::lookup_host(name)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ProtocolError::Connect {
            server: name.to_owned(),
            message: "replica address does not resolve".into(),
        })
}
