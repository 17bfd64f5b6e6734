//! The operations endpoint: `/metrics` (Prometheus text format), `/healthz` and `/readyz` over HTTP/1.1.
//!
//! Shared by every binary of the project: each installs the Prometheus recorder once ([`install_recorder`])
//! and serves it on its own TCP port, apart from the data port.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

/// A readiness condition beyond started/stopping: returns why the process is not ready, if it is not.
pub type ReadinessCheck = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// Liveness and readiness as the HTTP endpoint reports them.
#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    check: OnceLock<ReadinessCheck>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl Health {
    /// Marks the process ready (or not) to serve requests: `/readyz` answers 200 or 503.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether the process is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Adds a condition `/readyz` checks while the process is ready (a server whose storage writes fail, say):
    /// when it returns a reason, `/readyz` answers 503 with it. Set once; later calls are ignored.
    pub fn set_check(&self, check: ReadinessCheck) {
        let _ = self.check.set(check);
    }

    /// Why the process is not ready, or `None` if it is.
    pub fn not_ready_reason(&self) -> Option<String> {
        if !self.is_ready() {
            return Some("not ready".into());
        }
        self.check
            .get()
            .and_then(|c| c())
            .map(|reason| format!("not ready: {reason}"))
    }
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Histogram buckets for every `_batches` metric (small counts such as staleness): 0 .. 64.
pub const COUNT_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0];

/// Histogram buckets for every `_rows` metric (rows per delta, per micro-batch): powers of 4, 1 .. 16 Mi.
pub const ROW_COUNT_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0,
];

/// Installs the process-wide Prometheus recorder (once; later calls return the same handle) with explicit
/// histogram buckets for every `_seconds` metric (`buckets`), every `_batches` metric ([`COUNT_BUCKETS`]) and
/// every `_rows` metric ([`ROW_COUNT_BUCKETS`]), so histograms are rendered rather than summaries.
pub fn install_recorder(buckets: &[f64]) -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), buckets)
                .expect("non-empty bucket list")
                .set_buckets_for_metric(Matcher::Suffix("_batches".into()), COUNT_BUCKETS)
                .expect("non-empty bucket list")
                .set_buckets_for_metric(Matcher::Suffix("_rows".into()), ROW_COUNT_BUCKETS)
                .expect("non-empty bucket list")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics may be empty");
            }
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_secs(5));
                    upkeep.run_upkeep();
                })
                .expect("spawn metrics upkeep thread");
            handle
        })
        .clone()
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

/// The answer to a GET of `path`: `/metrics`, `/healthz`, `/readyz`, else 404. For binaries that serve these
/// beside routes of their own on one port (the serving process).
pub fn route(path: &str, handle: &PrometheusHandle, health: &Health) -> Response<Full<Bytes>> {
    match path {
        "/metrics" => reply(StatusCode::OK, "text/plain; version=0.0.4", handle.render()),
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match health.not_ready_reason() {
            None => reply(StatusCode::OK, "text/plain", "ready\n".into()),
            Some(reason) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("{reason}\n"),
            ),
        },
        other => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("no such path {other}\n"),
        ),
    }
}

/// Binds the HTTP listener (port 0 picks a free port) and returns it with its address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Bounds of the metrics endpoint (issue 40): scrapers and probes use a connection or two, so a client holding
/// more, or connecting without sending a request, cannot exhaust the process's file descriptors.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once; one more is closed at accept.
    pub max_connections: usize,
    /// Time to send a request's headers (from the connection's start, then from each request's first byte).
    pub header_timeout: Duration,
}

impl Default for Limits {
    /// 64 connections, 10 s for headers.
    fn default() -> Limits {
        Limits {
            max_connections: 64,
            header_timeout: Duration::from_secs(10),
        }
    }
}

/// Connections the metrics endpoint closed: `reason` is `connections` (over [`Limits::max_connections`]) or
/// `header_timeout`.
pub const METRICS_HTTP_CLOSED_TOTAL: &str = "metrics_http_connections_closed_total";

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `shutdown` resolves, within the default
/// [`Limits`].
pub async fn serve(
    listener: TcpListener,
    handle: PrometheusHandle,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, handle, health, shutdown, Limits::default()).await
}

/// [`serve`] within `limits`.
pub async fn serve_with(
    listener: TcpListener,
    handle: PrometheusHandle,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
) {
    tokio::pin!(shutdown);
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if open.load(Ordering::Acquire) >= limits.max_connections {
            metrics::counter!(METRICS_HTTP_CLOSED_TOTAL, "reason" => "connections").increment(1);
            drop(stream);
            continue;
        }
        open.fetch_add(1, Ordering::AcqRel);
        let open = open.clone();
        let handle = handle.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let resp = route(req.uri().path(), &handle, &health);
                async move { Ok::<_, Infallible>(resp) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let result = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(io, service)
                .await;
            open.fetch_sub(1, Ordering::AcqRel);
            if let Err(e) = result {
                if e.is_timeout() {
                    metrics::counter!(METRICS_HTTP_CLOSED_TOTAL, "reason" => "header_timeout")
                        .increment(1);
                }
                tracing::debug!(error = %e, "metrics connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Reads until the server closes `s`; panics if it answers or is still open after a minute.
    async fn closed(s: &mut TcpStream, what: &str) {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(n)) => panic!("{what}: answered {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(_) => panic!("{what}: still open after a minute"),
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    /// Issue 40: idle connections exhausted a process's file descriptors through its metrics port. Now one
    /// over the cap is closed at accept, and a connection that sends no request is closed after the header
    /// timeout, freeing its slot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_are_capped_and_timed_out() {
        let handle = PrometheusBuilder::new().build_recorder().handle();
        let health = Arc::new(Health::default());
        let (listener, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let limits = Limits {
            max_connections: 2,
            header_timeout: Duration::from_secs(600),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_with(
            listener,
            handle.clone(),
            health.clone(),
            async {
                let _ = stopped.await;
            },
            limits,
        ));
        let idle = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        let mut third = TcpStream::connect(addr).await.unwrap();
        closed(&mut third, "a connection over the cap of 2").await;
        drop(idle);
        // The slots free as the server sees the idle clients leave.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !get(addr, "/healthz").await.starts_with("HTTP/1.1 200") {
            assert!(
                std::time::Instant::now() < deadline,
                "no slot freed after the idle clients left"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop.send(());
        server.await.unwrap();

        let (listener, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let limits = Limits {
            max_connections: 2,
            header_timeout: Duration::from_millis(500),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_with(
            listener,
            handle,
            health,
            async {
                let _ = stopped.await;
            },
            limits,
        ));
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut trickle = TcpStream::connect(addr).await.unwrap();
        trickle
            .write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .unwrap();
        closed(&mut silent, "a connection that sends nothing").await;
        closed(&mut trickle, "a request whose headers never end").await;
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let _ = stop.send(());
        server.await.unwrap();
    }
}
