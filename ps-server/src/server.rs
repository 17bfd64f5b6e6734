//! The serving loop: accept QUIC and TCP connections, one task per request, graceful shutdown.
//!
//! Thin by design: read a frame, call [`Shard::handle`], write the reply. QUIC requests arrive one per stream;
//! TCP requests arrive multiplexed on one connection ([`protocol::transport::tcp`]); both go through [`answer`]. Shutdown (SIGTERM, or the future
//! passed to [`run`]): readiness goes false, new connections and streams are refused, in-flight requests are
//! drained (bounded by the drain timeout), dirty rows are flushed (not with `durability = "none"`), RocksDB
//! is closed, and `run` returns.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use embedding::{Engine, RocksStore};
use protocol::transport::{stream, tcp};
use protocol::{ErrorCode, ProtocolError, Request, Response, ShardMap};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Durability, ServerConfig, ServerTransport};
use crate::handler::Shard;
use crate::load_limits::{self, Admitted, LoadLimits};
use crate::metrics as m;
use crate::writeback;
use ops::http::{self, Health};

/// Addresses a started server listens on (useful with port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// QUIC (UDP) address, if QUIC is served.
    pub quic: Option<SocketAddr>,
    /// TCP address, if the TCP transport is served (the same port as QUIC when both are).
    pub tcp: Option<SocketAddr>,
    /// HTTP address.
    pub metrics: SocketAddr,
}

/// Runs a server until `shutdown` resolves. `on_bound` is called once the ports are bound and rows recovered,
/// before the server reports ready.
pub async fn run(
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()>,
    on_bound: impl FnOnce(Bound),
) -> anyhow::Result<()> {
    let handle = http::install_recorder(m::LATENCY_BUCKETS);
    m::describe();
    let health = Arc::new(Health::default());

    let db_path = cfg.data_dir.join("rocksdb");
    let opened = Instant::now();
    let budget = cfg.memory_budget_rows;
    let (shard_index, num_shards) = (cfg.shard_index, cfg.num_shards);
    let engine = tokio::task::spawn_blocking(move || -> anyhow::Result<Engine> {
        let store = RocksStore::open(&db_path)
            .with_context(|| format!("open RocksDB at {}", db_path.display()))?;
        crate::restore::check_restored_shard(&store, shard_index, num_shards)?;
        Engine::open_with_budget(Arc::new(writeback::MeteredStore(store)), budget)
            .context("recover tables from RocksDB")
    })
    .await??;
    let recovered = engine.rows_total();
    metrics::counter!(m::ROWS_RECOVERED_TOTAL).increment(recovered as u64);
    tracing::info!(
        rows = recovered,
        tables = engine.tables().len(),
        secs = opened.elapsed().as_secs_f64(),
        "recovered from RocksDB"
    );
    writeback::update_gauges(&engine);
    engine.set_table_policy(cfg.admission, cfg.row_ttl_secs);
    let has_ttl =
        cfg.row_ttl_secs.is_some() || engine.tables().iter().any(|t| t.ttl_secs.is_some());
    let shard = Arc::new(Shard {
        engine,
        shard_map: ShardMap {
            epoch: cfg.epoch,
            ..ShardMap::new(cfg.num_shards)
        },
        shard_index: cfg.shard_index,
        durability: cfg.durability,
        writes: Default::default(),
    });

    if cfg.insecure_dev {
        tracing::warn!(
            "--insecure-dev: clients are NOT authenticated (any client may read and write every table); \
             never use this outside development"
        );
    }
    let tls = protocol::transport::tls::rustls_server_config(&cfg.tls_dir, !cfg.insecure_dev)
        .context("load TLS material")?;
    let mut limited =
        protocol::transport::tls::quic_server_config(tls.clone()).context("QUIC TLS config")?;
    // Stable across restarts of this server (same key, same address, same shard), so clients of the previous
    // process get a stateless reset instead of waiting for their idle timeout (protocol::transport::endpoint).
    let reset_secret = std::fs::read(
        cfg.tls_dir
            .join(protocol::transport::tls::files::SERVER_KEY),
    )
    .ok()
    .map(|mut key| {
        key.extend_from_slice(format!("{} {}", cfg.listen, cfg.shard_index).as_bytes());
        key
    });
    let (endpoint, tcp_listener) = bind(cfg.listen, cfg.transport, tls, reset_secret.as_deref())?;
    // Per-connection limits of admission control (crate::load_limits) on top of the shared transport tuning.
    let mut transport =
        load_limits::server_transport(cfg.max_streams_per_connection, cfg.connection_window_bytes);
    protocol::transport::endpoint::tune_path(
        &mut transport,
        protocol::transport::endpoint::PathKind::of(cfg.listen),
    );
    limited.transport_config(Arc::new(transport));
    if let Some(e) = &endpoint {
        e.set_server_config(Some(limited));
    }
    let admission = Arc::new(LoadLimits::new(cfg.max_inflight_bytes, cfg.max_connections));
    let quic_addr = endpoint
        .as_ref()
        .map(|e| e.local_addr().context("QUIC local address"))
        .transpose()?;
    let tcp_addr = tcp_listener
        .as_ref()
        .map(|l| l.local_addr().context("TCP local address"))
        .transpose()?;
    let (listener, metrics_addr) = http::bind(cfg.metrics_listen)
        .await
        .with_context(|| format!("bind metrics listener {}", cfg.metrics_listen))?;

    let stop = CancellationToken::new();
    let background = TaskTracker::new();
    background.spawn(http::serve(
        listener,
        handle,
        health.clone(),
        stop.clone().cancelled_owned(),
    ));
    // Durability `none`: the timer only refreshes gauges (a zero interval), and shutdown writes nothing.
    let write_back = cfg.durability != Durability::None;
    tracing::info!(durability = ?cfg.durability, flush_interval = ?cfg.flush_interval, "durability");
    background.spawn(writeback::run_timer(
        shard.clone(),
        if write_back {
            cfg.flush_interval
        } else {
            Duration::ZERO
        },
        stop.clone(),
    ));
    if has_ttl {
        tracing::info!(
            ttl_secs = ?cfg.row_ttl_secs,
            interval = ?cfg.expire_interval,
            admission = ?cfg.admission,
            "row expiry"
        );
        background.spawn(writeback::run_expiry_timer(
            shard.clone(),
            cfg.expire_interval,
            stop.clone(),
        ));
    }
    if let Some(rows) = cfg.memory_budget_rows {
        tracing::info!(rows, "memory budget per table");
        background.spawn(writeback::run_budget_timer(shard.clone(), stop.clone()));
    }

    on_bound(Bound {
        quic: quic_addr,
        tcp: tcp_addr,
        metrics: metrics_addr,
    });
    tracing::info!(?quic_addr, ?tcp_addr, %metrics_addr, shard = cfg.shard_index, of = cfg.num_shards, "serving");
    // Weak: the check must not keep the engine (and RocksDB) open past shutdown.
    let writes = Arc::downgrade(&shard);
    health.set_check(Box::new(move || {
        writes
            .upgrade()
            .and_then(|s| s.writes.failure())
            .map(|f| format!("storage writes failing: {f}"))
    }));
    health.set_ready(true);

    let requests = TaskTracker::new();
    let draining = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            incoming = accept_quic(endpoint.as_ref()) => match incoming {
                Some(i) => Accepted::Quic(Box::new(i)),
                None => break,
            },
            handshake = accept_tcp(tcp_listener.as_ref()) => match handshake {
                Ok(h) => Accepted::Tcp(h),
                Err(e) => {
                    // E.g. out of file descriptors: keep serving the connections we have.
                    tracing::warn!(error = %e, "tcp accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = admission.connection() else {
            if let Accepted::Quic(incoming) = accepted {
                incoming.refuse();
            }
            continue;
        };
        let shard = shard.clone();
        let tracker = requests.clone();
        let draining = draining.clone();
        let max_frame = cfg.max_frame;
        let admission = admission.clone();
        requests.spawn(async move {
            let _slot = slot;
            let ended = match accepted {
                Accepted::Quic(incoming) => {
                    serve_connection(*incoming, shard, tracker, draining, max_frame, admission)
                        .await
                        .map_err(|e| e.to_string())
                }
                Accepted::Tcp(handshake) => {
                    serve_tcp_connection(handshake, shard, tracker, draining, max_frame, admission)
                        .await
                        .map_err(|e| e.to_string())
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }

    tracing::info!("shutting down: draining requests");
    health.set_ready(false);
    drop(tcp_listener);
    if let Some(endpoint) = &endpoint {
        endpoint.set_server_config(None);
    }
    draining.cancel();
    requests.close();
    if tokio::time::timeout(cfg.drain_timeout, requests.wait())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?cfg.drain_timeout, "requests still in flight after the drain timeout");
    }
    if let Some(endpoint) = &endpoint {
        endpoint.close(0u32.into(), b"server shutting down");
    }
    if write_back {
        let shard_for_flush = shard.clone();
        let flushed =
            tokio::task::spawn_blocking(move || writeback::flush(&shard_for_flush.engine)).await?;
        let flushed = flushed.context("final write-back of dirty rows")?;
        tracing::info!(rows = flushed.rows, "final write-back done");
    } else {
        tracing::info!("durability none: no final write-back, dirty rows are dropped");
    }
    stop.cancel();
    background.close();
    background.wait().await;
    if let Some(endpoint) = &endpoint {
        let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    }
    drop(shard);
    Ok(())
}

async fn serve_connection(
    incoming: quinn::Incoming,
    shard: Arc<Shard>,
    tracker: TaskTracker,
    draining: CancellationToken,
    max_frame: u64,
    admission: Arc<LoadLimits>,
) -> Result<(), quinn::ConnectionError> {
    let conn = incoming.await?;
    let _open = ConnectionGauge::new();
    tracing::debug!(peer = %conn.remote_address(), "connection accepted");
    loop {
        let (send, recv) = tokio::select! {
            _ = draining.cancelled() => return Ok(()),
            stream = conn.accept_bi() => match stream {
                Ok(s) => s,
                Err(quinn::ConnectionError::ApplicationClosed(_)) | Err(quinn::ConnectionError::LocallyClosed) => return Ok(()),
                Err(e) => return Err(e),
            },
        };
        let shard = shard.clone();
        let admission = admission.clone();
        tracker.spawn(async move {
            if let Err(e) = serve_request(send, recv, &shard, max_frame, &admission).await {
                tracing::debug!(error = %e, "request stream failed");
            }
        });
    }
}

struct ConnectionGauge;
impl ConnectionGauge {
    fn new() -> ConnectionGauge {
        metrics::gauge!(m::CONNECTIONS).increment(1.0);
        ConnectionGauge
    }
}
impl Drop for ConnectionGauge {
    fn drop(&mut self) {
        metrics::gauge!(m::CONNECTIONS).decrement(1.0);
    }
}

fn kind(req: &Request) -> &'static str {
    match req {
        Request::Hello { .. } => "hello",
        Request::RegisterTables { .. } => "register",
        // A pull with state is a pull (dashboards and alerts select kind="pull").
        Request::Pull { .. } | Request::PullWithState { .. } => "pull",
        Request::Push { .. } => "push",
        Request::Flush => "flush",
        Request::Checkpoint { .. } => "checkpoint",
    }
}

async fn serve_request(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    shard: &Shard,
    max_frame: u64,
    admission: &LoadLimits,
) -> Result<(), ProtocolError> {
    let start = Instant::now();
    let (frame, mut admitted) = read_admitted(&mut recv, max_frame, admission).await;
    if frame.is_err() {
        // Refused before the whole request was read: the client may still be sending.
        let _ = recv.stop(0u32.into());
    }
    let answer = match admit_response(frame, max_frame, admission, &mut admitted).await {
        Ok(frame) => answer(shard, frame)?,
        Err(refusal) => refusal,
    };
    stream::write_frame(&mut send, &answer.header, answer.payload.clone()).await?;
    drop(admitted);
    answer.record(start);
    // Graceful shutdown waits for this task: wait until the client has the reply (acknowledged), so that
    // closing the endpoint after the drain cannot discard the reply of a request that was applied.
    let _ = send.stopped().await;
    Ok(())
}

/// Reads one request frame, admitting its body's bytes ([`LoadLimits::request`]) before reading it.
async fn read_admitted(
    recv: &mut quinn::RecvStream,
    max_frame: u64,
    admission: &LoadLimits,
) -> (Result<(Request, Bytes), ProtocolError>, Option<Admitted>) {
    use protocol::wire::frame::{decode_header, parse_prefix, PREFIX_LEN};
    let truncated = |e: quinn::ReadExactError, expected: usize| match e {
        quinn::ReadExactError::FinishedEarly(got) => ProtocolError::Truncated { got, expected },
        other => ProtocolError::Read(other),
    };
    let mut prefix = [0u8; PREFIX_LEN];
    if let Err(e) = recv.read_exact(&mut prefix).await {
        return (Err(truncated(e, PREFIX_LEN)), None);
    }
    let p = match parse_prefix(&prefix, max_frame) {
        Ok(p) => p,
        Err(e) => return (Err(e), None),
    };
    let admitted = admission.request(p.body_len()).await;
    let body = match stream::read_body(recv, p.body_len()).await {
        Ok(body) => body,
        Err(e) => return (Err(e), Some(admitted)),
    };
    let frame = decode_header(&body[..p.header_len as usize])
        .map(|h| (h, body.slice(p.header_len as usize..)));
    (frame, Some(admitted))
}

/// Admits the response bytes of a decoded request ([`LoadLimits::response`]), or refuses a pull whose response
/// would exceed the frame cap (no client could read it).
async fn admit_response(
    frame: Result<(Request, Bytes), ProtocolError>,
    max_frame: u64,
    admission: &LoadLimits,
    admitted: &mut Option<Admitted>,
) -> Result<Result<(Request, Bytes), ProtocolError>, Answer> {
    let Ok((req, _)) = &frame else {
        return Ok(frame);
    };
    let bytes = load_limits::response_bytes(req);
    if (bytes + protocol::wire::frame::PREFIX_LEN) as u64 > max_frame {
        let code = ErrorCode::FrameTooLarge;
        metrics::counter!(m::REQUEST_ERRORS_TOTAL, "code" => format!("{code:?}")).increment(1);
        return Err(Answer {
            header: Response::Error {
                code,
                message: format!(
                    "pull response of {bytes} bytes would exceed the frame cap of {max_frame} bytes: \
                     pull fewer ids per request"
                ),
            },
            payload: Bytes::new(),
            kind: Some(kind(req)),
        });
    }
    if let Some(admitted) = admitted {
        admission.response(req, admitted).await;
    }
    Ok(frame)
}

/// A reply ready to send, with what the request metrics need.
struct Answer {
    header: Response,
    payload: Bytes,
    /// The request kind; `None` for a request refused before it was decoded.
    kind: Option<&'static str>,
}

impl Answer {
    /// Counts the request once its reply is sent.
    fn record(&self, start: Instant) {
        metrics::counter!(m::BYTES_SENT_TOTAL)
            .increment((protocol::wire::frame::PREFIX_LEN + self.payload.len()) as u64);
        if let Some(kind) = self.kind {
            metrics::counter!(m::REQUESTS_TOTAL, "kind" => kind).increment(1);
            metrics::histogram!(m::REQUEST_SECONDS, "kind" => kind)
                .record(start.elapsed().as_secs_f64());
        }
    }
}

/// Answers one request, or the framing error that kept it from being read (a typed error reply). Errors that
/// leave nothing to answer (the connection is gone) are returned.
fn answer(
    shard: &Shard,
    frame: Result<(Request, Bytes), ProtocolError>,
) -> Result<Answer, ProtocolError> {
    let (req, payload) = match frame {
        Ok(frame) => frame,
        Err(e) => {
            let code = match &e {
                ProtocolError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
                ProtocolError::WrongVersion { .. } => ErrorCode::UnsupportedVersion,
                ProtocolError::BadMagic { .. }
                | ProtocolError::BadHeader(_)
                | ProtocolError::Truncated { .. } => ErrorCode::BadRequest,
                _ => return Err(e),
            };
            metrics::counter!(m::REQUEST_ERRORS_TOTAL, "code" => format!("{code:?}")).increment(1);
            return Ok(Answer {
                header: Response::Error {
                    code,
                    message: e.to_string(),
                },
                payload: Bytes::new(),
                kind: None,
            });
        }
    };
    let kind = kind(&req);
    metrics::counter!(m::BYTES_RECEIVED_TOTAL)
        .increment((protocol::wire::frame::PREFIX_LEN + payload.len()) as u64);
    let reply = match req {
        // Flushes touch the disk: keep them off the async workers.
        Request::Flush => tokio::task::block_in_place(|| shard.handle(Request::Flush, &[])),
        // A checkpoint writes back, flushes memtables and fsyncs: off the async workers too.
        req @ Request::Checkpoint { .. } => tokio::task::block_in_place(|| shard.handle(req, &[])),
        // With durability `sync`, a push waits for an fsync.
        req @ Request::Push { .. } if shard.durability == Durability::Sync => {
            tokio::task::block_in_place(|| shard.handle(req, &payload))
        }
        req => shard.handle(req, &payload),
    };
    Ok(Answer {
        header: reply.header,
        payload: Bytes::from(reply.payload),
        kind: Some(kind),
    })
}

/// Serves one TCP connection: requests multiplexed by id, one task each, answers queued on the connection's
/// writer. On drain, stops reading and waits until the answers of requests already read are written.
async fn serve_tcp_connection(
    handshake: tcp::Handshake,
    shard: Arc<Shard>,
    tracker: TaskTracker,
    draining: CancellationToken,
    max_frame: u64,
    admission: Arc<LoadLimits>,
) -> Result<(), ProtocolError> {
    let mut conn = handshake.finish(max_frame).await?;
    let _open = ConnectionGauge::new();
    tracing::debug!(peer = %conn.peer(), "tcp connection accepted");
    loop {
        let incoming = tokio::select! {
            _ = draining.cancelled() => break,
            next = conn.next() => match next? {
                Some(incoming) => incoming,
                None => break,
            },
        };
        let shard = shard.clone();
        let admission = admission.clone();
        // Admitted before the next request is read: past the cap, the connection stops being read and TCP
        // flow control holds the client back (the frame itself was read already).
        let bytes = incoming.request.as_ref().map(|(_, p)| p.len()).unwrap_or(0);
        let mut admitted = Some(admission.request(bytes).await);
        tracker.spawn(async move {
            let start = Instant::now();
            let tcp::Incoming { request, reply } = incoming;
            let request = match admit_response(request, max_frame, &admission, &mut admitted).await
            {
                Ok(request) => request,
                Err(refusal) => {
                    if let Err(e) = reply.send(&refusal.header, refusal.payload.clone()) {
                        tracing::debug!(error = %e, "tcp request failed");
                    }
                    return;
                }
            };
            let sent = answer(&shard, request).and_then(|a| {
                reply.send(&a.header, a.payload.clone())?;
                Ok(a)
            });
            match sent {
                Ok(a) => a.record(start),
                Err(e) => tracing::debug!(error = %e, "tcp request failed"),
            }
        });
    }
    conn.finish().await
}

/// A connection accepted on either transport.
enum Accepted {
    Quic(Box<quinn::Incoming>),
    Tcp(tcp::Handshake),
}

async fn accept_quic(endpoint: Option<&quinn::Endpoint>) -> Option<quinn::Incoming> {
    match endpoint {
        Some(e) => e.accept().await,
        None => std::future::pending().await,
    }
}

async fn accept_tcp(listener: Option<&tcp::Listener>) -> std::io::Result<tcp::Handshake> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Binds the transports `transport` asks for on `addr`: QUIC on UDP, TCP on the same port number. With port 0,
/// the TCP port is the one the kernel gave QUIC, retried with a fresh port if TCP has it taken.
fn bind(
    addr: SocketAddr,
    transport: ServerTransport,
    tls: quinn::rustls::ServerConfig,
    reset_secret: Option<&[u8]>,
) -> anyhow::Result<(Option<quinn::Endpoint>, Option<tcp::Listener>)> {
    let quic_tls =
        protocol::transport::tls::quic_server_config(tls.clone()).context("QUIC TLS config")?;
    for attempt in 0.. {
        let endpoint = if transport.quic() {
            Some(
                protocol::transport::endpoint::server_with_reset_secret(
                    addr,
                    quic_tls.clone(),
                    reset_secret,
                )
                .context("start QUIC endpoint")?,
            )
        } else {
            None
        };
        if !transport.tcp() {
            return Ok((endpoint, None));
        }
        let tcp_addr = match &endpoint {
            Some(e) => e.local_addr().context("QUIC local address")?,
            None => addr,
        };
        match std::net::TcpListener::bind(tcp_addr) {
            Ok(l) => return Ok((endpoint, Some(tcp::Listener::from_std(l, tls)?))),
            Err(e) if addr.port() == 0 && endpoint.is_some() && attempt < 20 => {
                tracing::debug!(%tcp_addr, error = %e, "tcp port of the quic port taken, trying another");
            }
            Err(e) => {
                return Err(e).with_context(|| format!("bind TCP {tcp_addr}"));
            }
        }
    }
    unreachable!("the loop returns")
}
