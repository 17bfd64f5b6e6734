//! Connections from this replica to the other replicas of its shard: the primary's stream to each backup, a
//! backup's `Join`, and the census of roles at start. One [`NetDialer`] per peer (QUIC, with the client
//! certificate of the TLS directory), names resolved at each dial (a restarted pod may have a new address).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use protocol::transport::{Connection, Dialer, NetConn, NetDialer};
use protocol::wire::replicate::ReplicaInfo;
use protocol::{ProtocolError, Request, Response, Transport, PROTOCOL_VERSION};

/// Time allowed for one request to a peer (connecting included).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// A peer's resolved address, its dialer, and the open connection if any.
type Link = (SocketAddr, Arc<NetDialer>, Option<NetConn>);

/// One other replica.
struct Peer {
    /// `host:port` as configured.
    name: String,
    /// The dialer and the connection, made on first use.
    link: Mutex<Option<Link>>,
}

/// The other replicas of this server's shard, by replica index (this server's own slot is never dialed).
pub struct Peers {
    peers: Vec<Peer>,
    own: u32,
    tls_dir: PathBuf,
    server_name: String,
    max_frame: u64,
}

impl Peers {
    /// Peers at `names` (every replica, this one at `own`).
    pub fn new(
        names: &[String],
        own: u32,
        tls_dir: PathBuf,
        server_name: String,
        max_frame: u64,
    ) -> Peers {
        Peers {
            peers: names
                .iter()
                .map(|n| Peer {
                    name: n.clone(),
                    link: Mutex::new(None),
                })
                .collect(),
            own,
            tls_dir,
            server_name,
            max_frame,
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

    async fn connection(&self, r: u32) -> Result<(SocketAddr, NetConn), ProtocolError> {
        let peer = &self.peers[r as usize];
        let cached = peer.link.lock().as_ref().and_then(|(addr, _, conn)| {
            conn.as_ref()
                .filter(|c| c.close_reason(*addr).is_none())
                .map(|c| (*addr, c.clone()))
        });
        if let Some(found) = cached {
            return Ok(found);
        }
        let addr = resolve(&peer.name).await?;
        let dialer = {
            let mut link = peer.link.lock();
            match link.as_ref() {
                Some((a, d, _)) if *a == addr => d.clone(),
                _ => {
                    let d = Arc::new(NetDialer::new(Transport::Quic, addr, &self.tls_dir)?);
                    *link = Some((addr, d.clone(), None));
                    d
                }
            }
        };
        let conn = dialer
            .connect(addr, &self.server_name, self.max_frame)
            .await?;
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
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
        };
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
