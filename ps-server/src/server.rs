//! The QUIC serving loop: accept connections, one task per request stream, graceful shutdown.
//!
//! Thin by design: read a frame, call [`Shard::handle`], write the reply. Shutdown (SIGTERM, or the future
//! passed to [`run`]): readiness goes false, new connections and streams are refused, in-flight requests are
//! drained (bounded by the drain timeout), dirty rows are flushed (not with `durability = "none"`), RocksDB
//! is closed, and `run` returns.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use embedding::{Engine, RocksStore};
use protocol::{stream, ErrorCode, ProtocolError, Request, Response, ShardMap};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Durability, ServerConfig};
use crate::handler::Shard;
use crate::http::{self, Health};
use crate::metrics as m;
use crate::writeback;

/// Addresses a started server listens on (useful with port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// QUIC (UDP) address.
    pub quic: SocketAddr,
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
    let engine = tokio::task::spawn_blocking(move || -> anyhow::Result<Engine> {
        let store = RocksStore::open(&db_path)
            .with_context(|| format!("open RocksDB at {}", db_path.display()))?;
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
    let shard = Arc::new(Shard {
        engine,
        shard_map: ShardMap {
            epoch: cfg.epoch,
            ..ShardMap::new(cfg.num_shards)
        },
        shard_index: cfg.shard_index,
        durability: cfg.durability,
    });

    let tls = if cfg.insecure_dev {
        tracing::warn!(
            "--insecure-dev: clients are NOT authenticated (any client may read and write every table); \
             never use this outside development"
        );
        protocol::tls::server_config_without_client_auth(&cfg.tls_dir)
    } else {
        protocol::tls::server_config(&cfg.tls_dir)
    }
    .context("load TLS material")?;
    let endpoint = protocol::endpoint::server(cfg.listen, tls).context("start QUIC endpoint")?;
    let quic_addr = endpoint.local_addr().context("QUIC local address")?;
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
    if let Some(rows) = cfg.memory_budget_rows {
        tracing::info!(rows, "memory budget per table");
        background.spawn(writeback::run_budget_timer(shard.clone(), stop.clone()));
    }

    on_bound(Bound {
        quic: quic_addr,
        metrics: metrics_addr,
    });
    tracing::info!(%quic_addr, %metrics_addr, shard = cfg.shard_index, of = cfg.num_shards, "serving");
    health.set_ready(true);

    let requests = TaskTracker::new();
    let draining = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        let incoming = tokio::select! {
            _ = &mut shutdown => break,
            incoming = endpoint.accept() => match incoming {
                Some(i) => i,
                None => break,
            },
        };
        let shard = shard.clone();
        let tracker = requests.clone();
        let draining = draining.clone();
        let max_frame = cfg.max_frame;
        requests.spawn(async move {
            if let Err(e) = serve_connection(incoming, shard, tracker, draining, max_frame).await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }

    tracing::info!("shutting down: draining requests");
    health.set_ready(false);
    endpoint.set_server_config(None);
    draining.cancel();
    requests.close();
    if tokio::time::timeout(cfg.drain_timeout, requests.wait())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?cfg.drain_timeout, "requests still in flight after the drain timeout");
    }
    endpoint.close(0u32.into(), b"server shutting down");
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
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), endpoint.wait_idle()).await;
    drop(shard);
    Ok(())
}

async fn serve_connection(
    incoming: quinn::Incoming,
    shard: Arc<Shard>,
    tracker: TaskTracker,
    draining: CancellationToken,
    max_frame: u64,
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
        tracker.spawn(async move {
            if let Err(e) = serve_request(send, recv, &shard, max_frame).await {
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
        Request::Pull { .. } => "pull",
        Request::Push { .. } => "push",
        Request::Flush => "flush",
    }
}

async fn serve_request(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    shard: &Shard,
    max_frame: u64,
) -> Result<(), ProtocolError> {
    let start = Instant::now();
    let (req, payload) = match stream::read_frame::<Request>(&mut recv, max_frame).await {
        Ok(frame) => frame,
        Err(e) => {
            let code = match &e {
                ProtocolError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
                ProtocolError::BadMagic { .. }
                | ProtocolError::BadHeader(_)
                | ProtocolError::Truncated { .. } => ErrorCode::BadRequest,
                _ => return Err(e),
            };
            metrics::counter!(m::REQUEST_ERRORS_TOTAL, "code" => format!("{code:?}")).increment(1);
            let _ = recv.stop(0u32.into());
            let reply = Response::Error {
                code,
                message: e.to_string(),
            };
            stream::write_frame(&mut send, &reply, &[]).await?;
            return Ok(());
        }
    };
    let kind = kind(&req);
    metrics::counter!(m::BYTES_RECEIVED_TOTAL)
        .increment((protocol::frame::PREFIX_LEN + payload.len()) as u64);
    let reply = match req {
        // Flushes touch the disk: keep them off the async workers.
        Request::Flush => tokio::task::block_in_place(|| shard.handle(Request::Flush, &[])),
        // With durability `sync`, a push waits for an fsync.
        req @ Request::Push { .. } if shard.durability == Durability::Sync => {
            tokio::task::block_in_place(|| shard.handle(req, &payload))
        }
        req => shard.handle(req, &payload),
    };
    stream::write_frame(&mut send, &reply.header, &reply.payload).await?;
    metrics::counter!(m::BYTES_SENT_TOTAL)
        .increment((protocol::frame::PREFIX_LEN + reply.payload.len()) as u64);
    metrics::counter!(m::REQUESTS_TOTAL, "kind" => kind).increment(1);
    metrics::histogram!(m::REQUEST_SECONDS, "kind" => kind).record(start.elapsed().as_secs_f64());
    Ok(())
}
