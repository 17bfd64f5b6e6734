//! A tiny in-process HTTP server answering `POST /v1/predict` as docs/serving.md says `ps-serve` does, for
//! testing the client loop and the AUC pass without `ps-serve`.
//!
//! The probability of a row is a function of its `I1` field alone ([`prob_of_i1`]), so a test knows the answer
//! of every row. [`Behaviour`] makes it answer wrongly on purpose.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// The export version the server answers.
pub const VERSION: u64 = 1234;
/// The dense version the server answers.
pub const DENSE_VERSION: u64 = 7;

/// How the server answers predictions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// As the contract says.
    Correct,
    /// `503 {"error": "not ready"}`.
    NotReady,
    /// `200` with a body that is not JSON.
    Garbage,
    /// One probability fewer than rows.
    Short,
}

/// What the server saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// Requests answered.
    pub requests: AtomicUsize,
}

/// The probability the server gives a row whose `I1` is `i1` (missing: 0.5).
pub fn prob_of_i1(i1: Option<i64>) -> f32 {
    i1.map_or(0.5, |v| 1.0 / (1.0 + (-(v as f32) / 10.0).exp()))
}

/// Starts the server on a free loopback port; it runs until the runtime ends.
pub async fn start(behaviour: Behaviour) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let counters = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            counters.connections.fetch_add(1, Ordering::Relaxed);
            let counters = counters.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let counters = counters.clone();
                    async move {
                        counters.requests.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, Infallible>(answer(req, behaviour).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn reply(status: u16, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn error(status: u16, msg: &str) -> Response<Full<Bytes>> {
    reply(status, json!({ "error": msg }))
}

async fn answer(req: Request<Incoming>, behaviour: Behaviour) -> Response<Full<Bytes>> {
    if req.uri().path() != "/v1/predict" {
        return error(404, "unknown route");
    }
    if req.method() != hyper::Method::POST {
        return error(405, "use POST");
    }
    let ct = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let i1s: Vec<Option<i64>> = match ct.as_str() {
        "text/tab-separated-values" => {
            let text = String::from_utf8(body.to_vec()).unwrap();
            let mut out = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let fields = line.split('\t').count();
                if fields > 39 {
                    return error(400, &format!("line {}: {fields} fields", n + 1));
                }
                let i1 = line.split('\t').next().unwrap_or("");
                out.push(match i1 {
                    "" => None,
                    t => match t.parse() {
                        Ok(v) => Some(v),
                        Err(_) => return error(400, &format!("line {}: I1 {t:?}", n + 1)),
                    },
                });
            }
            out
        }
        "application/json" => {
            let Ok(Value::Array(rows)) = serde_json::from_slice::<Value>(&body) else {
                return error(400, "not a JSON array");
            };
            let mut out = Vec::new();
            for row in rows {
                let Some(o) = row.as_object().filter(|o| o.len() == 39) else {
                    return error(400, "a row is not an object of 39 keys");
                };
                out.push(o["I1"].as_i64());
            }
            out
        }
        other => return error(415, &format!("content type {other:?}")),
    };
    let mut probs: Vec<f32> = i1s.into_iter().map(prob_of_i1).collect();
    match behaviour {
        Behaviour::Correct => {}
        Behaviour::NotReady => return error(503, "not ready: no export loaded"),
        Behaviour::Garbage => {
            return Response::new(Full::new(Bytes::from_static(b"<html>oops</html>")))
        }
        Behaviour::Short => {
            probs.pop();
        }
    }
    reply(
        200,
        json!({ "version": VERSION, "dense_version": DENSE_VERSION, "probabilities": probs }),
    )
}
