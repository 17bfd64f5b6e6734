//! The serving loop: accept QUIC and TCP connections, one task per request, graceful shutdown.
//!
//! Thin by design: read a frame and the clock, call [`Shard::handle`], write the reply (module `connection`).
//! QUIC requests arrive one per stream; TCP requests arrive multiplexed on one connection
//! ([`protocol::transport::tcp`]). Shutdown (SIGTERM, or the future passed to [`run`]): readiness goes false,
//! new connections and streams are refused, in-flight requests are drained (bounded by the drain timeout),
//! dirty rows are flushed (not with `durability = "none"`), RocksDB is closed, and `run` returns.
//!
//! [`run`] in steps: `open_shard` (RocksDB, recovery), `listen::Endpoints::bind` and the HTTP listener, the
//! background tasks (module `tasks`), `accept_loop` until shutdown, then `shut_down`.

mod connection;
pub(crate) mod dispatch;
mod handshake;
mod listen;
mod reduce;
mod sync;
mod tasks;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use embedding::{Engine, RocksStore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Durability, ServerConfig};
use crate::load_limits::LoadLimits;
use crate::metrics as m;
use crate::shard::Shard;
use crate::writeback;
use listen::{accept_quic, accept_tcp, Accepted, Endpoints};
use ops::http::{self, Health};
use tasks::Background;

/// Addresses a started server listens on (useful with port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// QUIC (UDP) address, if QUIC is served.
    pub quic: Option<SocketAddr>,
    /// TCP address, if the TCP transport is served (the same port as QUIC when both are).
    pub tcp: Option<SocketAddr>,
    /// HTTP address.
    pub metrics: SocketAddr,
    /// The role the server settled on ([`crate::shard::replica::startup`]).
    pub role: protocol::wire::message::replicate::Role,
}

/// Microseconds since the Unix epoch, from the same clock as [`unix_secs`]: the time of a request for the
/// delta sync's change times.
pub fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Seconds since the Unix epoch: the server's one wall clock. The connection loop reads it once per request
/// and the timers once per tick, and pass it in: pushed rows are stamped with it for TTL expiry, and the expiry
/// timer compares the stamps with it.
pub fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs a server until `shutdown` resolves. `on_bound` is called once the ports are bound and rows recovered,
/// before the server reports ready.
pub async fn run(
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()>,
    on_bound: impl FnOnce(Bound),
) -> anyhow::Result<()> {
    let metrics_handle = http::install_recorder(m::LATENCY_BUCKETS);
    m::describe();
    let health = Arc::new(Health::default());
    let shard = open_shard(&cfg).await?;
    let endpoints = Endpoints::bind(&cfg)?;
    let admission = Arc::new(LoadLimits::new(cfg.max_inflight_bytes, cfg.max_connections));
    let (listener, metrics_addr) = http::bind(cfg.metrics_listen)
        .await
        .with_context(|| format!("bind metrics listener {}", cfg.metrics_listen))?;

    let background = Background::new();
    let serve_health = health.clone();
    background.spawn(|stop| {
        http::serve(
            listener,
            metrics_handle,
            serve_health,
            stop.cancelled_owned(),
        )
    });
    tasks::spawn_timers(&cfg, &shard, &background);

    let (quic_addr, tcp_addr) = (endpoints.quic_addr, endpoints.tcp_addr);
    let in_flight = InFlight {
        requests: TaskTracker::new(),
        draining: CancellationToken::new(),
    };
    {
        let accept = accept_loop(&cfg, &shard, &endpoints, &admission, &in_flight, shutdown);
        tokio::pin!(accept);
        // A replica settles its role while it already answers its peers' `Hello` (they settle theirs too).
        let role = tokio::select! {
            role = crate::shard::replica::startup::settle(&shard, cfg.replica_startup_wait) => Some(role),
            _ = &mut accept => None,
        };
        if let Some(role) = role {
            if shard.replica().replicated() {
                let follower = shard.clone();
                background.spawn(|stop| crate::shard::replica::backup::follow(follower, stop));
            }
            on_bound(Bound {
                quic: quic_addr,
                tcp: tcp_addr,
                metrics: metrics_addr,
                role,
            });
            tracing::info!(?quic_addr, ?tcp_addr, %metrics_addr, shard = cfg.shard_index, of = cfg.num_shards, replica = cfg.replica_index, role = role.name(), "serving");
            report_ready(&health, &shard);
            accept.await;
        }
    }
    shut_down(&cfg, shard, endpoints, &health, in_flight, background).await
}

/// Opens RocksDB under `cfg.data_dir` (refusing a restored store of another shard), recovers the tables and
/// applies the server's table policy (admission, TTL).
async fn open_shard(cfg: &ServerConfig) -> anyhow::Result<Arc<Shard>> {
    let db_path = cfg.data_dir.join("rocksdb");
    let opened = Instant::now();
    let budget = cfg.memory_budget_rows;
    let tier = cfg.tier;
    let (shard_index, num_shards) = (cfg.shard_index, cfg.num_shards);
    let engine = tokio::task::spawn_blocking(move || -> anyhow::Result<Engine> {
        let store = RocksStore::open_tuned(&db_path, tier.rocks)
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
    metrics::gauge!(m::TABLES).set(engine.table_count() as f64);
    engine.set_table_policy(cfg.admission, cfg.row_ttl_secs);
    // A trainer's dense parameters and counters: never expired nor refused admission by the server's policy.
    engine.exempt_from_table_policy(protocol::wire::dense::DENSE_TABLE);
    engine.set_weight_guard(cfg.weight_guard);
    Ok(Arc::new(Shard::open(cfg, engine)?))
}

/// Makes `/readyz` answer ready, unless storage writes fail ([`crate::write_health`]).
fn report_ready(health: &Health, shard: &Arc<Shard>) {
    // Weak: the check must not keep the engine (and RocksDB) open past shutdown.
    let writes = Arc::downgrade(shard);
    health.set_check(Box::new(move || {
        writes
            .upgrade()
            .and_then(|s| s.writes().failure())
            .map(|f| format!("storage writes failing: {f}"))
    }));
    health.set_ready(true);
}

/// The connection and request tasks, and the signal that makes them stop reading new requests.
struct InFlight {
    requests: TaskTracker,
    draining: CancellationToken,
}

/// Accepts connections on every endpoint until `shutdown` resolves (or the QUIC endpoint closes), one task per
/// connection: its handshake (bounded, module `handshake`), then, holding a connection slot of `admission`
/// (refused without one), its requests.
async fn accept_loop(
    cfg: &ServerConfig,
    shard: &Arc<Shard>,
    endpoints: &Endpoints,
    admission: &Arc<LoadLimits>,
    in_flight: &InFlight,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let handshakes = handshake::Handshakes::new(cfg.connection_limits, cfg.max_frame);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            incoming = accept_quic(endpoints.quic.as_ref()) => match incoming {
                Some(i) => Accepted::Quic(Box::new(i)),
                None => break,
            },
            handshake = accept_tcp(endpoints.tcp.as_ref()) => match handshake {
                Ok(h) => Accepted::Tcp(h),
                Err(e) => {
                    // E.g. out of file descriptors: keep serving the connections we have.
                    tracing::warn!(error = %e, "tcp accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Taken here, in arrival order, so that the oldest handshake is the one dropped to make room.
        let ticket = handshakes.start();
        let (shard, admission, draining) =
            (shard.clone(), admission.clone(), in_flight.draining.clone());
        let tracker = in_flight.requests.clone();
        let (max_frame, authenticate) = (cfg.max_frame, !cfg.insecure_dev);
        let idle = handshakes.stream_idle();
        in_flight.requests.spawn(async move {
            let Some(conn) = handshake::establish(accepted, ticket, &draining).await else {
                return;
            };
            // A slot is held only by a connection whose handshake is done (issue 40).
            let Some(_slot) = admission.connection() else {
                conn.refuse();
                return;
            };
            let limits = connection::Limits {
                max_frame,
                idle,
                authenticate,
            };
            connection::serve(conn, shard, tracker, draining, limits, admission).await;
        });
    }
}

/// Graceful shutdown: readiness false, no new connections, drain the requests in flight (at most
/// `cfg.drain_timeout`), close QUIC, write dirty rows back (not with `durability = "none"`), stop the
/// background tasks, and drop the last handle of the shard (closing RocksDB).
async fn shut_down(
    cfg: &ServerConfig,
    shard: Arc<Shard>,
    mut endpoints: Endpoints,
    health: &Health,
    in_flight: InFlight,
    background: Background,
) -> anyhow::Result<()> {
    tracing::info!("shutting down: draining requests");
    health.set_ready(false);
    endpoints.stop_accepting();
    in_flight.draining.cancel();
    // Sync long-polls answer now instead of at the end of their wait.
    shard.sync().close();
    in_flight.requests.close();
    if tokio::time::timeout(cfg.drain_timeout, in_flight.requests.wait())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?cfg.drain_timeout, "requests still in flight after the drain timeout");
    }
    endpoints.close();
    shard.replica().shut_down().await;
    shard.routing().shut_down().await;
    if cfg.durability != Durability::None {
        let shard_for_flush = shard.clone();
        let flushed =
            tokio::task::spawn_blocking(move || writeback::flush(shard_for_flush.engine())).await?;
        let flushed = flushed.context("final write-back of dirty rows")?;
        tracing::info!(rows = flushed.rows, "final write-back done");
    } else {
        tracing::info!("durability none: no final write-back, dirty rows are dropped");
    }
    background.stop().await;
    endpoints.wait_idle().await;
    drop(shard);
    Ok(())
}
