//! One connection's requests: read a frame, admit its bytes, authorize it by the connection's role, call
//! the dispatch ([`super::dispatch`]) with the time, write the reply. QUIC requests arrive one per stream
//! ([`serve_connection`]); TCP requests arrive multiplexed on one connection ([`protocol::transport::tcp`],
//! [`serve_tcp_connection`]); both go through [`answer`], which turns framing errors into typed replies and
//! reads the wall clock once per request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::transport::{stream, tcp};
use protocol::{Access, ErrorCode, ProtocolError, Request, Response};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::load_limits::{self, Admitted, LoadLimits};
use crate::metrics as m;
use crate::shard::Shard;

use super::handshake::Established;

/// The per-connection settings of the server's config.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Frame cap, bytes.
    pub(super) max_frame: u64,
    /// How long a request stream may make no progress (`stream-idle-timeout-secs`); `None`: no bound.
    pub(super) idle: Option<Duration>,
    /// Whether clients are authorized by their certificate's role (not with `insecure-dev`).
    pub(super) authenticate: bool,
}

/// Serves one established connection on its transport until it ends or the drain starts; logs why it ended.
pub(super) async fn serve(
    conn: Established,
    shard: Arc<Shard>,
    tracker: TaskTracker,
    draining: CancellationToken,
    limits: Limits,
    admission: Arc<LoadLimits>,
) {
    let ended = match conn {
        Established::Quic(conn) => {
            serve_connection(conn, shard, tracker, draining, limits, admission)
                .await
                .map_err(|e| e.to_string())
        }
        Established::Tcp(conn) => {
            serve_tcp_connection(*conn, shard, tracker, draining, limits, admission)
                .await
                .map_err(|e| e.to_string())
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended");
    }
}

/// Serves one QUIC connection: one task per request stream, tracked by `tracker`. On drain, stops accepting
/// streams.
async fn serve_connection(
    conn: quinn::Connection,
    shard: Arc<Shard>,
    tracker: TaskTracker,
    draining: CancellationToken,
    limits: Limits,
    admission: Arc<LoadLimits>,
) -> Result<(), quinn::ConnectionError> {
    let _open = ConnectionGauge::new();
    let access = Arc::new(if limits.authenticate {
        let chain = conn.peer_identity().and_then(|id| {
            id.downcast::<Vec<quinn::rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        });
        Access::of_chain(chain.as_deref().map(Vec::as_slice))
    } else {
        Access::Unauthenticated
    });
    tracing::debug!(peer = %conn.remote_address(), role = access.label(), "connection accepted");
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
        let access = access.clone();
        tracker.spawn(async move {
            if let Err(e) = serve_request(send, recv, &shard, &access, limits, &admission).await {
                count_idle(&e, "quic");
                tracing::debug!(error = %e, "request stream failed");
            }
        });
    }
}

/// Counts a stream dropped for making no progress in [`m::STREAM_IDLE_TIMEOUTS_TOTAL`].
fn count_idle(e: &ProtocolError, transport: &'static str) {
    if let ProtocolError::Idle { what, .. } = e {
        metrics::counter!(m::STREAM_IDLE_TIMEOUTS_TOTAL, "transport" => transport, "direction" => *what)
            .increment(1);
    }
}

/// Counts an open connection in [`m::CONNECTIONS`] while it lives.
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

/// Serves one QUIC request stream: admission, the request, the reply, its metrics.
async fn serve_request(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    shard: &Arc<Shard>,
    access: &Access,
    limits: Limits,
    admission: &LoadLimits,
) -> Result<(), ProtocolError> {
    let (max_frame, idle) = (limits.max_frame, limits.idle);
    let start = Instant::now();
    let (frame, mut admitted) = read_admitted(&mut recv, max_frame, idle, admission).await;
    if let Err(e @ ProtocolError::Idle { .. }) = frame {
        // A stalled sender gets no answer: its stream is reset and its admitted bytes released.
        let _ = recv.stop(0u32.into());
        let _ = send.reset(0u32.into());
        return Err(e);
    }
    if frame.is_err() {
        // Refused before the whole request was read: the client may still be sending.
        let _ = recv.stop(0u32.into());
    }
    let answer = match admit_response(frame, max_frame, admission, &mut admitted).await {
        Ok(frame) => answer(shard, access, frame).await?,
        Err(refusal) => refusal,
    };
    if let Err(e) =
        stream::write_frame_within(&mut send, &answer.header, answer.payload.clone(), idle).await
    {
        let _ = send.reset(0u32.into());
        return Err(e);
    }
    drop(admitted);
    answer.record(start);
    // Graceful shutdown waits for this task: wait until the client has the reply (acknowledged), so that
    // closing the endpoint after the drain cannot discard the reply of a request that was applied. A client
    // that never acknowledges holds the task for the idle bound at most (the reply's bytes are QUIC's).
    let _ = stream::within(idle, "write", send.stopped()).await;
    Ok(())
}

/// Reads one request frame, admitting its body's bytes ([`LoadLimits::request`]) before reading it. With
/// `idle`, a stream on which no byte arrives for that long (before the prefix, or in the body) fails with
/// [`ProtocolError::Idle`], releasing what it was admitted.
async fn read_admitted(
    recv: &mut quinn::RecvStream,
    max_frame: u64,
    idle: Option<Duration>,
    admission: &LoadLimits,
) -> (Result<(Request, Bytes), ProtocolError>, Option<Admitted>) {
    use protocol::wire::frame::{decode_header, parse_prefix, PREFIX_LEN};
    let truncated = |e: quinn::ReadExactError, expected: usize| match e {
        quinn::ReadExactError::FinishedEarly(got) => ProtocolError::Truncated { got, expected },
        other => ProtocolError::Read(other),
    };
    let mut prefix = [0u8; PREFIX_LEN];
    match stream::within(idle, "read", recv.read_exact(&mut prefix)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return (Err(truncated(e, PREFIX_LEN)), None),
        Err(e) => return (Err(e), None),
    }
    let p = match parse_prefix(&prefix, max_frame) {
        Ok(p) => p,
        Err(e) => return (Err(e), None),
    };
    let admitted = admission.request(p.body_len()).await;
    let body = match stream::read_body_within(recv, p.body_len(), idle).await {
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
            kind: Some(req.kind().label()),
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
async fn answer(
    shard: &Arc<Shard>,
    access: &Access,
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
    let kind = req.kind().label();
    metrics::counter!(m::BYTES_RECEIVED_TOTAL)
        .increment((protocol::wire::frame::PREFIX_LEN + payload.len()) as u64);
    // The handler reads no clock (STYLE.md, "Sans-IO cores"): the time of this request, read once.
    let (header, payload) =
        super::dispatch::answer(shard, access, req, payload, super::unix_us()).await;
    Ok(Answer {
        header,
        payload,
        kind: Some(kind),
    })
}

/// Serves one TCP connection: requests multiplexed by id, one task each, answers queued on the connection's
/// writer. On drain, stops reading and waits until the answers of requests already read are written.
async fn serve_tcp_connection(
    mut conn: tcp::ServerConn,
    shard: Arc<Shard>,
    tracker: TaskTracker,
    draining: CancellationToken,
    limits: Limits,
    admission: Arc<LoadLimits>,
) -> Result<(), ProtocolError> {
    let max_frame = limits.max_frame;
    let _open = ConnectionGauge::new();
    let access = Arc::new(if limits.authenticate {
        Access::of_chain(conn.peer_certificates())
    } else {
        Access::Unauthenticated
    });
    tracing::debug!(peer = %conn.peer(), role = access.label(), "tcp connection accepted");
    // Frames still arriving count against the in-flight bytes too (issue 40): a client that starts many frames
    // and finishes none waits for the pool instead of growing the server.
    conn.count_buffered_in(admission.receive_budget());
    let mut ended = Ok(());
    loop {
        let incoming = tokio::select! {
            _ = draining.cancelled() => break,
            next = conn.next() => match next {
                Ok(Some(incoming)) => incoming,
                Ok(None) => break,
                Err(e) => {
                    count_idle(&e, "tcp");
                    ended = Err(e);
                    break;
                }
            },
        };
        let shard = shard.clone();
        let admission = admission.clone();
        let access = access.clone();
        // Admitted before the next request is read: past the cap, the connection stops being read and TCP
        // flow control holds the client back (the frame itself was read already).
        let bytes = incoming.request.as_ref().map(|(_, p)| p.len()).unwrap_or(0);
        let tcp::Incoming {
            request,
            reply,
            permit,
        } = incoming;
        let mut admitted = Some(admission.request_holding(bytes, permit).await);
        tracker.spawn(async move {
            let start = Instant::now();
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
            let sent = match answer(&shard, &access, request).await {
                Ok(a) => {
                    // The reply's bytes count until the connection's writer takes them (issue 40): a client
                    // that reads slowly holds the server's in-flight bytes, not unbounded memory.
                    let mut held = admitted.take().expect("admitted above");
                    admission.reply(a.payload.len(), &mut held).await;
                    reply
                        .send_holding(&a.header, a.payload.clone(), Box::new(held))
                        .map(|()| a)
                }
                Err(e) => Err(e),
            };
            match sent {
                Ok(a) => a.record(start),
                Err(e) => tracing::debug!(error = %e, "tcp request failed"),
            }
        });
    }
    // Replies already queued are still written (bounded by the idle timeout when the client does not read).
    let finished = conn.finish().await;
    if let Err(e) = &finished {
        count_idle(e, "tcp");
    }
    ended.and(finished)
}
