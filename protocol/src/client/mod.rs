//! [`PsClient`]: a trainer's connections to every parameter server, over QUIC or TCP ([`Transport`]).
//!
//! One connection per server; every request opens its own bidirectional stream (QUIC) or carries its own
//! stream id (TCP, [`crate::transport::mux`]), so any number of requests can be in flight on one connection without
//! head-of-line blocking between them. A request that fails with a
//! transient error (connection lost, server restarting) is retried after reconnecting, with exponential backoff
//! ([`INITIAL_BACKOFF`] doubling up to [`MAX_BACKOFF`]), until `retry_for` has passed. A retried push
//! carries the id of its first copy, and a server (or, after a failover, the backup that took over) that
//! applied it answers with its first answer instead of applying it again ([`wire::message::push`], "Exactly
//! once"). A request whose reply is overdue has
//! its connection probed ([`PROBE_AFTER`], [`PROBE_TIMEOUT`]).
//!
//! The client is generic over how it reaches servers ([`Dialer`]); `PsClient` alone names the real transports
//! ([`NetDialer`], built by [`PsClient::connect`]), and [`crate::transport::memory`] drives the same client
//! in memory for tests ([`PsClient::connect_with`]).

mod replicas;
mod requests;
mod reroute;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
// The tokio clock: the same as `std::time::Instant` in production, and the simulated one under tokio's paused
// time, so the retry deadline advances with the timers the client sleeps on.
use tokio::time::Instant;

use crate::auth::Role;
use crate::error::ProtocolError;
use crate::routing::ShardMap;
use crate::transport::tls;
use crate::transport::{Connection, Dialer, NetDialer, Transport};
use crate::wire::message::push::PushId;
use crate::wire::message::{Request, Response, TableConfig};
use replicas::ShardReplicas;
pub use replicas::FAILOVER_CALL_TIMEOUT;

/// How to reach the cluster.
#[derive(Debug, Clone)]
pub struct PsClientConfig {
    /// Server addresses; position `i` must be the server with shard index `i`.
    pub servers: Vec<SocketAddr>,
    /// TLS directory with `ca.pem` and the certificate of `role` (`<role>.pem`/`.key`, or `client.pem`).
    pub tls_dir: PathBuf,
    /// The role this client's certificate carries ([`crate::auth`]): which certificate of `tls_dir` it
    /// presents. Default [`Role::Trainer`].
    pub role: Role,
    /// Name the servers' certificates must carry.
    pub server_name: String,
    /// Cap on a response frame, bytes.
    pub max_frame: u64,
    /// Time allowed for one request, after which it fails with [`ProtocolError::Timeout`].
    pub request_timeout: Duration,
    /// How long transient failures are retried (reconnecting) before the error is returned.
    pub retry_for: Duration,
    /// QUIC or TCP.
    pub transport: Transport,
    /// The other replicas of each shard (`backups[i]` for shard `i`, in replica order after `servers[i]`);
    /// empty, or an empty list for a shard, when shards have one replica ([`PsClientConfig::replicated`]).
    pub backups: Vec<Vec<SocketAddr>>,
    /// Send pulls to an in-sync backup of a shard when it has one (pushes always go to the primary).
    pub read_from_backups: bool,
}

impl PsClientConfig {
    /// Defaults for `servers` and `tls_dir`.
    pub fn new(servers: Vec<SocketAddr>, tls_dir: PathBuf) -> PsClientConfig {
        PsClientConfig {
            servers,
            tls_dir,
            role: Role::Trainer,
            server_name: tls::DEFAULT_SERVER_NAME.into(),
            max_frame: crate::wire::frame::DEFAULT_MAX_FRAME,
            request_timeout: Duration::from_secs(30),
            retry_for: Duration::from_secs(20),
            transport: Transport::Quic,
            backups: Vec::new(),
            read_from_backups: false,
        }
    }

    /// Defaults for a cluster whose shard `i` runs on the replicas `shards[i]` (replica order; the first is
    /// the one tried first). Shards with one address have one replica.
    pub fn replicated(shards: Vec<Vec<SocketAddr>>, tls_dir: PathBuf) -> PsClientConfig {
        let servers = shards.iter().filter_map(|r| r.first().copied()).collect();
        let backups = shards
            .into_iter()
            .map(|r| r.into_iter().skip(1).collect())
            .collect();
        PsClientConfig {
            backups,
            ..PsClientConfig::new(servers, tls_dir)
        }
    }
}

struct ServerConn<D: Dialer> {
    addr: SocketAddr,
    dialer: D,
    conn: Mutex<Option<D::Conn>>,
}

impl<D: Dialer> ServerConn<D> {
    /// The open connection, or a new one; `true` with a new one. `None` instead of dialing once `retired` is
    /// set (the client followed a map without this server; set before its connection is closed).
    async fn connection(
        &self,
        cfg: &PsClientConfig,
        retired: &AtomicBool,
    ) -> Result<Option<(D::Conn, bool)>, ProtocolError> {
        if let Some(c) = self.conn.lock().expect("not poisoned").as_ref() {
            if c.close_reason(self.addr).is_none() {
                return Ok(Some((c.clone(), false)));
            }
        }
        if retired.load(Ordering::Acquire) {
            return Ok(None);
        }
        // A QUIC handshake with a server that is gone (or stopped accepting while it shuts down) gets no answer
        // at all and would otherwise wait for the request timeout; the caller retries the transient timeout.
        let conn = tokio::time::timeout(
            CONNECT_TIMEOUT,
            self.dialer
                .connect(self.addr, &cfg.server_name, cfg.max_frame),
        )
        .await
        .map_err(|_| ProtocolError::Timeout {
            server: self.addr.to_string(),
            secs: CONNECT_TIMEOUT.as_secs_f64(),
        })??;
        *self.conn.lock().expect("not poisoned") = Some(conn.clone());
        Ok(Some((conn, true)))
    }

    fn forget(&self) {
        *self.conn.lock().expect("not poisoned") = None;
    }
}

/// How long a connection's handshake may take (a data-centre handshake takes milliseconds).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(4);
/// How long a request waits for its reply before its connection is probed, and then between probes.
pub const PROBE_AFTER: Duration = Duration::from_secs(1);
/// How long a liveness probe may go unanswered, with nothing at all heard on the connection meanwhile, before
/// the connection is declared dead and the request fails with a transient [`ProtocolError::Timeout`].
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// [`PROBE_TIMEOUT`] on a replicated shard: a backup can take over, so a silent primary is given up sooner
/// (a live but busy one still acknowledges packets, and a failover that finds it answering keeps it).
pub const REPLICATED_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The wait before the first retry of a transient failure; each further retry waits twice as long as the one
/// before, up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(20);
/// The longest wait between two retries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Time a [`PsClient::sync_deltas`] long-poll is allowed beyond its `wait_ms`: gathering and sending the rows.
pub const SYNC_TIMEOUT_MARGIN: Duration = Duration::from_secs(10);

/// Sends one request on `conn`, and while its reply is outstanding, probes the connection every
/// [`PROBE_AFTER`] with a `Hello` on the same connection. A server killed and restarted on the same port never
/// answers on the old connection (QUIC: the new process does not know it and its stateless resets carry a
/// token the client does not accept), so without the probe a request would wait for the idle or request
/// timeout (30 s). A probe unanswered for [`PROBE_TIMEOUT`], while no datagram at all arrived on the connection
/// (an overloaded but live server still acknowledges packets), fails the request with a transient
/// [`ProtocolError::Timeout`], and the caller reconnects and retries it (a push under its first id).
async fn call_watched<C: Connection>(
    conn: &C,
    addr: SocketAddr,
    req: &Request,
    payload: &Bytes,
    probe_timeout: Duration,
) -> Result<(Response, Bytes), ProtocolError> {
    let call = conn.call(addr, req, payload);
    tokio::pin!(call);
    let hello = crate::wire::message::hello::request();
    let empty = Bytes::new();
    loop {
        tokio::select! {
            r = &mut call => return r,
            _ = tokio::time::sleep(PROBE_AFTER) => {}
        }
        let heard = conn.packets_received();
        let probe = tokio::time::timeout(probe_timeout, conn.call(addr, &hello, &empty));
        tokio::select! {
            r = &mut call => return r,
            p = probe => match p {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
                // A QUIC peer that still sends packets (acknowledgements) is alive, only slow: keep waiting.
                Err(_) if conn.packets_received() != heard => {}
                Err(_) => {
                    tracing::warn!(server = %addr, "no answer to a liveness probe: connection presumed dead");
                    return Err(ProtocolError::Timeout {
                        server: addr.to_string(),
                        secs: probe_timeout.as_secs_f64(),
                    });
                }
            },
        }
    }
}

/// Makes the dialer of a server the client learns of from a new shard map (a live reshard added it).
pub type DialFn<D> = Arc<dyn Fn(SocketAddr) -> Result<D, ProtocolError> + Send + Sync>;

/// Connections to every parameter server of a cluster, over the real transports ([`NetDialer`], the default) or
/// any other [`Dialer`].
///
/// The shard map can change while the client runs (a live reshard, [`crate::wire::message::reshard`]): a request
/// refused with `WrongEpoch` or `WrongShard` makes the client fetch the server's map, connect to servers it
/// did not know, and re-route the request's ids ([`reroute`]).
pub struct PsClient<D: Dialer = NetDialer> {
    cfg: PsClientConfig,
    /// Each shard's replicas (one without replication), by server index in the current map.
    shards: RwLock<Vec<Arc<ShardReplicas<D>>>>,
    shard_map: RwLock<ShardMap>,
    /// Dials servers of a new map; `None`: the client cannot follow a map that adds servers.
    dial: Option<DialFn<D>>,
    /// One map refresh at a time.
    refresh: tokio::sync::Mutex<()>,
    tables: Vec<TableConfig>,
    /// Times a shard moved to another replica ([`PsClient::failovers`]).
    failovers: AtomicU64,
    /// Times the client followed a new shard map ([`PsClient::map_changes`]).
    map_changes: AtomicU64,
    /// The job this client publishes dense parameters for ([`PsClient::publish_dense`]): drawn once.
    job: u64,
    /// This client's identity in its pushes' [`wire::message::push::PushId`]s: drawn once.
    push_client: u64,
    /// The number of the next push.
    push_seq: AtomicU64,
}

/// Rows and optimizer state answering [`PsClient::pull_with_state`].
#[derive(Debug, Clone)]
pub struct PulledState {
    /// Encoded rows of every table, in request order.
    pub rows: Bytes,
    /// Optimizer state of every table in request order: `count x state_lens[i]` f32 (LE) for table `i`.
    pub state: Bytes,
    /// f32s of state per row, per table.
    pub state_lens: Vec<u32>,
}

impl PsClient<NetDialer> {
    /// Connects to every server over `cfg.transport`, checks that server `i` serves shard `i` of
    /// `servers.len()` and that all agree on the epoch. With replicas (`cfg.backups`), each shard's primary
    /// is found first.
    pub async fn connect(cfg: PsClientConfig) -> Result<PsClient, ProtocolError> {
        let dialers = replica_addrs(&cfg)
            .into_iter()
            .flatten()
            .map(|addr| cfg.transport.dialer(addr, &cfg.tls_dir, cfg.role))
            .collect::<Result<Vec<_>, _>>()?;
        let (transport, tls_dir, role) = (cfg.transport, cfg.tls_dir.clone(), cfg.role);
        let dial: DialFn<NetDialer> = Arc::new(move |addr| transport.dialer(addr, &tls_dir, role));
        PsClient::connect_following(cfg, dialers, Some(dial)).await
    }
}

impl<D: Dialer> PsClient<D> {
    /// The id of this client's next push ([`wire::message::push`], "Exactly once").
    fn next_push_id(&self) -> PushId {
        PushId {
            client: self.push_client,
            seq: self.push_seq.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl<D: Dialer> PsClient<D> {
    /// [`PsClient::connect`] with a dialer per replica: `dialers` reach, in order, the replicas of shard 0
    /// (`cfg.servers[0]`, then `cfg.backups[0]`), then those of shard 1, ... (the addresses then only name the
    /// replicas in errors and logs); `cfg.transport` and `cfg.tls_dir` are not used.
    pub async fn connect_with(
        cfg: PsClientConfig,
        dialers: Vec<D>,
    ) -> Result<PsClient<D>, ProtocolError> {
        PsClient::connect_following(cfg, dialers, None).await
    }

    /// [`PsClient::connect_with`], with `dial` making the dialers of servers a new shard map adds. When the
    /// servers hold a map changed live (a reshard) whose server list differs from `cfg.servers`, the client
    /// takes the servers' list (it needs `dial` for the ones it was not given).
    pub async fn connect_following(
        cfg: PsClientConfig,
        dialers: Vec<D>,
        dial: Option<DialFn<D>>,
    ) -> Result<PsClient<D>, ProtocolError> {
        if cfg.servers.is_empty() {
            return Err(ProtocolError::Connect {
                server: "-".into(),
                message: "no parameter server addresses given".into(),
            });
        }
        let addrs = replica_addrs(&cfg);
        let total: usize = addrs.iter().map(Vec::len).sum();
        if dialers.len() != total {
            return Err(ProtocolError::Connect {
                server: "-".into(),
                message: format!("{} dialers for {total} server addresses", dialers.len(),),
            });
        }
        let mut dialers = dialers.into_iter();
        let shards = addrs
            .into_iter()
            .map(|replicas| {
                ShardReplicas::new(
                    replicas
                        .into_iter()
                        .map(|addr| ServerConn {
                            addr,
                            dialer: dialers.next().expect("counted"),
                            conn: Mutex::new(None),
                        })
                        .collect(),
                )
            })
            .map(Arc::new)
            .collect::<Vec<_>>();
        let replicated = shards.iter().any(|s| s.replicated());
        let mut client = PsClient {
            shard_map: RwLock::new(ShardMap::new(cfg.servers.len() as u32)),
            cfg,
            shards: RwLock::new(shards),
            dial,
            refresh: tokio::sync::Mutex::new(()),
            tables: Vec::new(),
            failovers: AtomicU64::new(0),
            map_changes: AtomicU64::new(0),
            job: base::rng::unique_u64(),
            push_client: base::rng::unique_u64(),
            push_seq: AtomicU64::new(1),
        };
        if replicated {
            client.find_primaries().await?;
        }
        let mut epoch = None;
        let given = client.num_servers();
        for i in 0..given {
            let (resp, _) = client
                .call(i, &crate::wire::message::hello::request(), Bytes::new())
                .await?;
            let Response::Hello {
                shard_index,
                num_shards,
                epoch: e,
                routing,
                tables,
                replica: _,
            } = resp
            else {
                return Err(client.unexpected(i, &resp, "Hello"));
            };
            let addr = client.addr(i);
            let fingerprint = client.shard_map().routing_fingerprint();
            if routing != fingerprint {
                return Err(ProtocolError::Connect {
                    server: addr.to_string(),
                    message: format!(
                        "server routes ids to shards differently (fingerprint {routing:#x}, this client {fingerprint:#x}): \
                         client and server are different versions",
                    ),
                });
            }
            if i == 0 && e > 1 && client.follow_map_at_connect(i).await? {
                // The servers' map (changed live) names the servers: connected through it.
                return Ok(client);
            }
            if shard_index as usize != i || num_shards as usize != given {
                return Err(ProtocolError::Connect {
                    server: addr.to_string(),
                    message: format!(
                        "server is shard {shard_index} of {num_shards}, but it is listed at position {i} of {given}"
                    ),
                });
            }
            if *epoch.get_or_insert(e) != e {
                return Err(ProtocolError::Connect {
                    server: addr.to_string(),
                    message: format!(
                        "server has shard-map epoch {e}, others have {}",
                        epoch.unwrap_or(0)
                    ),
                });
            }
            if i == 0 {
                client.tables = tables;
            }
        }
        let map = client.shard_map.get_mut().expect("not poisoned");
        if map.epoch != epoch.unwrap_or(1) {
            map.epoch = epoch.unwrap_or(1);
        }
        Ok(client)
    }

    /// The cluster's shard map (the newest the client has followed).
    pub fn shard_map(&self) -> ShardMap {
        self.shard_map.read().expect("not poisoned").clone()
    }

    /// Number of servers in the current shard map (shards; a shard's replicas count once).
    pub fn num_servers(&self) -> usize {
        self.shards.read().expect("not poisoned").len()
    }

    /// Server `i`'s replicas, or [`ProtocolError::NotInMap`] when the current map has no server `i`.
    fn shard(&self, i: usize) -> Result<Arc<ShardReplicas<D>>, ProtocolError> {
        let shards = self.shards.read().expect("not poisoned");
        shards.get(i).cloned().ok_or(ProtocolError::NotInMap {
            server: i,
            servers: shards.len(),
        })
    }

    /// Address of server `i`: the replica of shard `i` taken as primary (`0.0.0.0:0` for a server the
    /// current map no longer has).
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.shard(i)
            .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |s| {
                s.conns[s.primary()].addr
            })
    }

    /// Times a shard moved to another replica (a failover) since connecting.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Times the client followed a new shard map (a live reshard) since connecting.
    pub fn map_changes(&self) -> u64 {
        self.map_changes.load(Ordering::Relaxed)
    }

    /// The shard epoch the client holds for shard `i` (the highest its replicas reported; 1 without
    /// replication).
    pub fn shard_epoch(&self, i: usize) -> u64 {
        self.shard(i).map_or(1, |s| s.epoch().max(1))
    }

    /// Tables server 0 knew at connect time.
    pub fn known_tables(&self) -> &[TableConfig] {
        &self.tables
    }

    fn unexpected(&self, server: usize, got: &Response, expected: &'static str) -> ProtocolError {
        let r = self.shard(server).map_or(0, |s| s.primary());
        self.unexpected_at(server, r, got, expected)
    }

    fn unexpected_at(
        &self,
        shard: usize,
        r: usize,
        got: &Response,
        expected: &'static str,
    ) -> ProtocolError {
        let server = self.shard(shard).map_or_else(
            |_| format!("server {shard}"),
            |s| s.conns[r].addr.to_string(),
        );
        if let Response::Error { code, message } = got {
            return ProtocolError::Remote {
                server,
                code: *code,
                message: message.clone(),
            };
        }
        ProtocolError::UnexpectedResponse {
            server,
            got: got.kind().into(),
            expected,
        }
    }

    /// One attempt of `req` on replica `r` of shard `shard`. On a freshly dialed connection to a replicated
    /// shard, the replica is first asked who it is: one that is not what the client uses it for (the
    /// primary, or an in-sync backup for `read_from_backups` pulls), or reports an older shard epoch than the
    /// client has seen, fails the attempt with a transient [`ProtocolError::NotPrimary`].
    async fn call_replica(
        &self,
        shard: usize,
        r: usize,
        req: &Request,
        payload: &Bytes,
        timeout: Duration,
    ) -> Result<(Response, Bytes), ProtocolError> {
        let replicas = self.shard(shard)?;
        if replicas.retired.load(Ordering::Acquire) {
            return Err(ProtocolError::NotInMap {
                server: shard,
                servers: self.num_servers(),
            });
        }
        let s = &replicas.conns[r];
        let probe_timeout = if replicas.replicated() {
            REPLICATED_PROBE_TIMEOUT
        } else {
            PROBE_TIMEOUT
        };
        // Connecting is inside the timeout: a handshake with a dead server must not wait for the idle timeout.
        let result = async {
            let Some((conn, fresh)) = s.connection(&self.cfg, &replicas.retired).await? else {
                return Err(ProtocolError::NotInMap {
                    server: shard,
                    servers: self.num_servers(),
                });
            };
            let hello = matches!(req, Request::Hello { .. } | Request::Promote { .. });
            if fresh && replicas.replicated() && !hello {
                let probe = crate::wire::message::hello::request();
                if let (Response::Hello { replica, .. }, _) =
                    call_watched(&conn, s.addr, &probe, &Bytes::new(), probe_timeout).await?
                {
                    let as_reader = r != replicas.primary();
                    if let Err(why) = replicas.check(r, &replica, as_reader) {
                        s.forget();
                        return Err(ProtocolError::NotPrimary {
                            server: s.addr.to_string(),
                            why,
                        });
                    }
                }
            }
            call_watched(&conn, s.addr, req, payload, probe_timeout)
                .await
                .map_err(|e| {
                    // A request that failed because its connection closed: report why the connection closed (e.g.
                    // the server refused our certificate), not just "connection lost".
                    match conn.close_reason(s.addr) {
                        Some(why) if !matches!(e, ProtocolError::Connection { .. }) => why,
                        _ => e,
                    }
                })
        };
        match tokio::time::timeout(timeout, result).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                if e.is_transient() {
                    s.forget();
                }
                Err(e)
            }
            Err(_) => {
                s.forget();
                Err(ProtocolError::Timeout {
                    server: s.addr.to_string(),
                    secs: timeout.as_secs_f64(),
                })
            }
        }
    }

    /// Sends one request to server `server` and returns its response, retrying transient failures.
    /// A [`Response::Error`] with a transient code is retried too; other error responses are returned as
    /// responses for the caller to interpret.
    ///
    /// Retries wait [`INITIAL_BACKOFF`], then twice as long each time up to [`MAX_BACKOFF`]; a retry that would
    /// start more than `retry_for` after the first attempt is not made, and the last attempt's result is
    /// returned. A transient error drops the server's connection, so the retry dials a fresh one. On a
    /// replicated shard, a transient failure or a `NotPrimary` answer first looks for the shard's primary
    /// (a failover, [`replicas`]).
    pub async fn call(
        &self,
        server: usize,
        req: &Request,
        payload: Bytes,
    ) -> Result<(Response, Bytes), ProtocolError> {
        self.call_within(server, req, payload, self.cfg.request_timeout)
            .await
    }

    /// [`PsClient::call`] allowing each attempt `timeout` instead of the configured request timeout (a
    /// long-poll waits on the server longer than an ordinary request may take).
    pub async fn call_within(
        &self,
        server: usize,
        req: &Request,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<(Response, Bytes), ProtocolError> {
        let start = Instant::now();
        let mut backoff = INITIAL_BACKOFF;
        let shard = self.shard(server)?;
        let reads = self.cfg.read_from_backups
            && matches!(req, Request::Pull { .. } | Request::PullWithState { .. });
        loop {
            let r = if reads {
                shard.reader()
            } else {
                shard.primary()
            };
            let result = self.call_replica(server, r, req, &payload, timeout).await;
            let retry = match &result {
                Err(e) => e.is_transient(),
                Ok((Response::Error { code, .. }, _)) => code.is_transient(),
                Ok(_) => false,
            };
            if retry && shard.replicated() {
                if r != shard.primary() {
                    // A backup that pulls went to failed: read from the primary.
                    shard.read_from(shard.primary());
                    continue;
                }
                if self.failover(server, r).await {
                    continue;
                }
            }
            if !retry || start.elapsed() + backoff > self.cfg.retry_for {
                return result;
            }
            if shard.retired.load(Ordering::Acquire)
                || !self
                    .shard(server)
                    .is_ok_and(|now| Arc::ptr_eq(&now, &shard))
            {
                // The client followed a map without this server (a reshard removed or replaced it while it
                // failed): the caller re-routes instead of waiting for it.
                return Err(ProtocolError::NotInMap {
                    server,
                    servers: self.num_servers(),
                });
            }
            tracing::debug!(server = %shard.conns[r].addr, ?backoff, "retrying request after a transient failure");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Closes every connection gracefully.
    pub async fn close(&self) {
        let shards = self.shards.read().expect("not poisoned").clone();
        let all = || shards.iter().flat_map(|s| s.conns.iter());
        for s in all() {
            if let Some(c) = s.conn.lock().expect("not poisoned").take() {
                c.close();
            }
        }
        for s in all() {
            s.dialer.wait_idle().await;
        }
    }
}

/// Every shard's replica addresses: `cfg.servers[i]` then `cfg.backups[i]`.
fn replica_addrs(cfg: &PsClientConfig) -> Vec<Vec<SocketAddr>> {
    cfg.servers
        .iter()
        .enumerate()
        .map(|(i, &primary)| {
            std::iter::once(primary)
                .chain(cfg.backups.get(i).into_iter().flatten().copied())
                .collect()
        })
        .collect()
}
