//! The HTTP/1.1 endpoint (docs/serving.md): `POST /v1/predict`, `GET /v1/model`, `GET /v1/embedding`, and
//! the operations routes `/metrics`, `/healthz`, `/readyz` on the same port. Every refusal is a 4xx JSON
//! `{"error": ...}` naming the problem; the connection and the process keep serving.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::batcher::{BatchError, Batcher};
use crate::metrics as m;
use crate::request::{parse_body, BodyFormat};
use crate::state::Loaded;

/// Request limits and access rules (docs/limits.md, "ps-serve").
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Largest body accepted, bytes.
    pub max_body_bytes: usize,
    /// Most rows in one request.
    pub max_rows: usize,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most connections open at once from one client address.
    pub max_connections_per_client: usize,
    /// Time to send a request's headers.
    pub header_timeout: Duration,
    /// Time to send a request's body.
    pub body_timeout: Duration,
    /// Bearer token every `/v1/` request must carry, if set.
    pub api_token: Option<String>,
    /// Whether `GET /v1/embedding` answers.
    pub embedding_api: bool,
}

/// Whether `req` carries `Authorization: Bearer <token>`; compared in time independent of where it differs.
fn authorized(req: &Request<Incoming>, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
    else {
        return false;
    };
    let want = token.as_bytes();
    given.len() == want.len() && given.iter().zip(want).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

/// What every connection shares.
pub struct Shared {
    /// Set once the export is loaded.
    pub loaded: OnceLock<Loaded>,
    /// The predicting thread's handle (set with `loaded`).
    pub batcher: OnceLock<Batcher>,
    /// Limits.
    pub limits: HttpLimits,
    /// The Prometheus handle.
    pub prometheus: PrometheusHandle,
    /// Readiness.
    pub health: Arc<ops::http::Health>,
}

type Reply = Response<Full<Bytes>>;

fn json(status: StatusCode, body: serde_json::Value) -> Reply {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("valid response")
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Reply {
    json(status, serde_json::json!({ "error": message.to_string() }))
}

/// Answers one request.
pub async fn handle(req: Request<Incoming>, shared: Arc<Shared>) -> Reply {
    let started = Instant::now();
    let path = req.uri().path().to_owned();
    let route = match path.as_str() {
        "/v1/predict" | "/v1/model" | "/v1/embedding" | "/metrics" | "/healthz" | "/readyz" => {
            path.clone()
        }
        _ => "other".to_owned(),
    };
    let reply = route_request(req, &path, &shared).await;
    let code = reply.status().as_u16().to_string();
    metrics::counter!(m::REQUESTS_TOTAL, "route" => route.clone(), "code" => code).increment(1);
    metrics::histogram!(m::REQUEST_SECONDS, "route" => route)
        .record(started.elapsed().as_secs_f64());
    reply
}

async fn route_request(req: Request<Incoming>, path: &str, shared: &Shared) -> Reply {
    let method = req.method().clone();
    let allowed = match path {
        "/v1/predict" => Method::POST,
        "/v1/model" | "/v1/embedding" | "/metrics" | "/healthz" | "/readyz" => Method::GET,
        other => {
            return error(
                StatusCode::NOT_FOUND,
                format!("no route {other} (POST /v1/predict, GET /v1/model, /v1/embedding, /metrics, /healthz, /readyz)"),
            )
        }
    };
    if method != allowed {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} {path}: use {allowed}"),
        );
    }
    if let Some(token) = &shared.limits.api_token {
        if path.starts_with("/v1/") && !authorized(&req, token) {
            let mut reply = error(
                StatusCode::UNAUTHORIZED,
                format!("{path} needs `Authorization: Bearer <token>` (this server has --api-token-file)"),
            );
            reply.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Bearer"),
            );
            return reply;
        }
    }
    if path == "/v1/embedding" && !shared.limits.embedding_api {
        return error(
            StatusCode::NOT_FOUND,
            "/v1/embedding is off: start ps-serve with --enable-embedding-api to answer it",
        );
    }
    match path {
        "/v1/predict" => predict(req, shared).await,
        "/v1/model" => match shared.loaded.get() {
            Some(l) => json(StatusCode::OK, l.describe()),
            None => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the export is still loading",
            ),
        },
        "/v1/embedding" => embedding(req.uri().query().unwrap_or(""), shared),
        _ => {
            let r = ops::http::route(path, &shared.prometheus, &shared.health);
            let (parts, body) = r.into_parts();
            Response::from_parts(parts, body)
        }
    }
}

async fn predict(req: Request<Incoming>, shared: &Shared) -> Reply {
    let (Some(loaded), Some(batcher)) = (shared.loaded.get(), shared.batcher.get()) else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the export is still loading",
        );
    };
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("(not text)"));
    let Some(format) = BodyFormat::from_content_type(content_type) else {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "content type {:?}: use text/tab-separated-values or application/json",
                content_type.unwrap_or_default()
            ),
        );
    };
    let max = shared.limits.max_body_bytes;
    let announced = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = announced.filter(|&l| l > max as u64) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body of {len} bytes, more than --max-body-bytes {max}"),
        );
    }
    let timeout = shared.limits.body_timeout;
    let Ok(collected) =
        tokio::time::timeout(timeout, Limited::new(req.into_body(), max).collect()).await
    else {
        metrics::counter!(m::BODY_TIMEOUTS_TOTAL).increment(1);
        return error(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the body did not arrive within --body-timeout-secs {}",
                timeout.as_secs_f64()
            ),
        );
    };
    let body = match collected {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body over --max-body-bytes {max}"),
            )
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
    };
    let layout = &loaded.features;
    let max_rows = shared.limits.max_rows;
    let batch = match parse_body(&body, format, layout, max_rows) {
        Ok(b) => b,
        Err(e @ crate::request::RequestError::TooManyRows { .. }) => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, e)
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match batcher.predict(batch).await {
        Ok(p) => json(
            StatusCode::OK,
            serde_json::json!({
                "version": loaded.export_version,
                "dense_version": p.dense_version,
                "probabilities": p.probabilities,
            }),
        ),
        Err(e @ BatchError::Closed) => error(StatusCode::SERVICE_UNAVAILABLE, e),
        Err(e @ BatchError::Full { .. }) => {
            let mut reply = error(StatusCode::SERVICE_UNAVAILABLE, e);
            reply.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from_static("1"),
            );
            reply
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

fn embedding(query: &str, shared: &Shared) -> Reply {
    let Some(loaded) = shared.loaded.get() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the export is still loading",
        );
    };
    let (mut table, mut id) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "table" => table = Some(v),
            "id" => id = Some(v),
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown query parameter {other:?} (table, id)"),
                )
            }
        }
    }
    let (Some(table), Some(id)) = (table, id) else {
        return error(StatusCode::BAD_REQUEST, "give ?table=T&id=ID");
    };
    let Ok(table) = table.parse::<u32>() else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("table {table:?} is not a number"),
        );
    };
    let Ok(id) = id.parse::<u64>() else {
        return error(StatusCode::BAD_REQUEST, format!("id {id:?} is not a u64"));
    };
    let Some(dim) = loaded.store.dim(table) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no table {table} in the export"),
        );
    };
    let mut row = vec![0.0f32; dim];
    let mut scratch = crate::store::GatherScratch::default();
    match loaded.store.gather(table, &[id], &mut row, &mut scratch) {
        Ok(()) => json(
            StatusCode::OK,
            serde_json::json!({ "table": table, "id": id, "row": row }),
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// Serves `listener` until `shutdown` resolves; then stops accepting, lets every connection finish its
/// request in progress (up to `drain`), and returns.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    tokio::pin!(shutdown);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut conns = JoinSet::new();
    // Connections open per client address: one client cannot hold every slot (half-sent requests held
    // all 1024 until the body timeout, and locked everyone else out).
    let mut per_client: std::collections::HashMap<std::net::IpAddr, usize> = Default::default();
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            Some(ended) = conns.join_next(), if !conns.is_empty() => {
                if let Ok(ip) = ended {
                    if let std::collections::hash_map::Entry::Occupied(mut e) = per_client.entry(ip) {
                        *e.get_mut() -= 1;
                        if *e.get() == 0 {
                            e.remove();
                        }
                    }
                }
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if conns.len() >= shared.limits.max_connections {
            // Closed at once: a client over the cap sees its connection reset, never a hang.
            metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL).increment(1);
            drop(stream);
            continue;
        }
        let ip = peer.ip();
        let open = per_client.entry(ip).or_default();
        if *open >= shared.limits.max_connections_per_client {
            metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL).increment(1);
            metrics::counter!(m::CONNECTIONS_REFUSED_PER_CLIENT_TOTAL).increment(1);
            drop(stream);
            continue;
        }
        *open += 1;
        let _ = stream.set_nodelay(true);
        metrics::gauge!(m::CONNECTIONS_OPEN).increment(1.0);
        let header_timeout = shared.limits.header_timeout;
        let shared = shared.clone();
        let mut stop = stop_rx.clone();
        conns.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(req, shared).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            // The header timeout runs from a request's first byte (and for the first request from the
            // connection's start): idle or trickling clients cannot hold a connection slot.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(io, service);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            metrics::gauge!(m::CONNECTIONS_OPEN).decrement(1.0);
            if let Err(e) = result {
                if e.is_timeout() {
                    metrics::counter!(m::HEADER_TIMEOUTS_TOTAL).increment(1);
                }
                tracing::debug!(error = %e, "connection ended with an error");
            }
            ip
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let waited =
        tokio::time::timeout(drain, async { while conns.join_next().await.is_some() {} }).await;
    if waited.is_err() {
        tracing::warn!(
            connections = conns.len(),
            "connections still open after the drain timeout"
        );
    }
}
