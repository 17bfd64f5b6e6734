//! An in-memory transport for tests: a [`MemoryServer`] is a closure from request to reply, reached through a
//! [`MemoryDialer`] without sockets, threads or TLS, and told to misbehave on command.
//!
//! Everything happens inside the caller's task and every wait is a tokio timer, so a test under
//! `#[tokio::test(start_paused = true)]` runs the client's retries, backoff and liveness probes in simulated
//! time: the runtime jumps straight to the next timer when every task is idle, and the outcome and the
//! (virtual) times do not depend on the machine's speed.
//!
//! Faults ([`MemoryServer`] methods; each applies to requests that arrive after it is set):
//! - [`MemoryServer::refuse_connections`]: the next `n` dials fail ([`ProtocolError::Connect`]).
//! - [`MemoryServer::fail_next`]: the next `n` requests fail with a [`Fault`]: the connection is lost, or the
//!   server answers a typed error.
//! - [`MemoryServer::drop_replies`]: the next `n` requests are handled (a push is applied) but their replies
//!   never arrive; the connection stays alive and answers later requests.
//! - [`MemoryServer::set_delay`]: every reply waits this long; the connection still acknowledges at once.
//! - [`MemoryServer::hang_connections`]: every connection open now becomes a black hole (no reply, no
//!   acknowledgement), as a QUIC connection to a server that was killed and restarted on the same port;
//!   connections dialed later work.
//!
//! [`MemoryServer::log`] tells what reached the server and when: dial attempts and requests (including the
//! ones a fault then swallowed).
//!
//! ```
//! # async fn demo() -> Result<(), protocol::ProtocolError> {
//! use protocol::transport::memory::{self, MemoryServer};
//! use protocol::{PsClient, PsClientConfig, Request, Response};
//!
//! let server = MemoryServer::new(|req, _payload| match req {
//!     Request::Hello { .. } => (memory::hello_reply(0, 1), bytes::Bytes::new()),
//!     _ => (Response::Flushed { rows: 0 }, bytes::Bytes::new()),
//! });
//! let cfg = PsClientConfig::new(vec!["10.0.0.1:7000".parse().unwrap()], Default::default());
//! let client = PsClient::connect_with(cfg, vec![server.dialer()]).await?;
//! assert_eq!(client.flush().await?, 0);
//! # Ok(()) }
//! ```

use std::future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::error::{ErrorCode, ProtocolError};
use crate::routing::ShardMap;
use crate::transport::{Connection, Dialer};
use crate::wire::message::{Request, Response};

/// The server side of a [`MemoryServer`]: answers one request (header and payload) with a reply header and
/// payload.
pub type Handler = dyn Fn(&Request, Bytes) -> Answering + Send + Sync;

/// What a [`Handler`] answers with: a future of the response header and payload (an async server, such as
/// ps-server's dispatcher, waits in it; a synchronous handler's is ready at once).
pub type Answering = std::pin::Pin<Box<dyn future::Future<Output = (Response, Bytes)> + Send>>;

/// How a request chosen by [`MemoryServer::fail_next`] fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The connection is lost: the request fails with [`ProtocolError::ConnectionLost`] (transient) and the
    /// connection reports it as its close reason from then on.
    Lost,
    /// The server answers [`Response::Error`] with this code (retried by the client if the code is transient).
    Answer(ErrorCode),
}

/// What reached a [`MemoryServer`], in arrival order, with the (tokio) time it arrived.
#[derive(Debug, Clone, Default)]
pub struct Log {
    /// Every dial attempt, refused or not.
    pub dials: Vec<Instant>,
    /// Every request that reached the server (liveness probes included), and the id of the connection it came
    /// on (connections are numbered from 0 in dial order).
    pub requests: Vec<(Instant, u64, Request)>,
}

impl Log {
    /// The requests that were not liveness probes or handshakes ([`Request::Hello`]).
    pub fn work(&self) -> Vec<(Instant, u64, Request)> {
        self.requests
            .iter()
            .filter(|(_, _, r)| !matches!(r, Request::Hello { .. }))
            .cloned()
            .collect()
    }
}

#[derive(Default)]
struct State {
    refuse: u64,
    fail: u64,
    fault: Option<Fault>,
    /// Only requests of this kind count towards (and get) `fail`; `None`: every request.
    fail_only: Option<crate::RequestKind>,
    drop_replies: u64,
    delay: Duration,
    /// Connections with a smaller id are black holes.
    hung_below: u64,
    next_conn: u64,
    log: Log,
}

struct Inner {
    handler: Box<Handler>,
    state: Mutex<State>,
}

/// An in-memory parameter server: a [`Handler`] plus the faults it has been told to inject. Cheap to clone;
/// clones are the same server.
#[derive(Clone)]
pub struct MemoryServer {
    inner: Arc<Inner>,
}

impl MemoryServer {
    /// A server answering with `handler`. It must answer [`Request::Hello`] as a real server would for
    /// [`crate::PsClient::connect_with`] to accept it ([`hello_reply`]).
    pub fn new(
        handler: impl Fn(&Request, Bytes) -> (Response, Bytes) + Send + Sync + 'static,
    ) -> MemoryServer {
        Self::new_async(move |req, payload| {
            let reply = handler(req, payload);
            Box::pin(std::future::ready(reply))
        })
    }

    /// [`MemoryServer::new`] with a handler that answers asynchronously (it may wait, as a real server's long
    /// polls and reduces do, in the caller's simulated time).
    pub fn new_async(
        handler: impl Fn(&Request, Bytes) -> Answering + Send + Sync + 'static,
    ) -> MemoryServer {
        MemoryServer {
            inner: Arc::new(Inner {
                handler: Box::new(handler),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// A dialer reaching this server.
    pub fn dialer(&self) -> MemoryDialer {
        MemoryDialer {
            server: self.clone(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().expect("not poisoned")
    }

    /// Refuses the next `n` dials (`u64::MAX`: every one from now on; `0`: accept again).
    pub fn refuse_connections(&self, n: u64) {
        self.state().refuse = n;
    }

    /// Fails the next `n` requests with `fault` (`u64::MAX`: every one from now on).
    pub fn fail_next(&self, n: u64, fault: Fault) {
        let mut st = self.state();
        st.fail = n;
        st.fault = Some(fault);
        st.fail_only = None;
    }

    /// Fails the next `n` requests of kind `kind` with `fault` (`u64::MAX`: every one from now on); requests
    /// of other kinds are answered.
    pub fn fail_next_of(&self, kind: crate::RequestKind, n: u64, fault: Fault) {
        let mut st = self.state();
        st.fail = n;
        st.fault = Some(fault);
        st.fail_only = Some(kind);
    }

    /// Handles the next `n` requests but never delivers their replies.
    pub fn drop_replies(&self, n: u64) {
        self.state().drop_replies = n;
    }

    /// Delays every reply by `delay` (zero: answer at once).
    pub fn set_delay(&self, delay: Duration) {
        self.state().delay = delay;
    }

    /// Turns every connection open now into a black hole: requests on it get neither a reply nor an
    /// acknowledgement ([`Connection::packets_received`] stops moving). Connections dialed later work.
    pub fn hang_connections(&self) {
        let mut st = self.state();
        st.hung_below = st.next_conn;
    }

    /// What reached the server so far.
    pub fn log(&self) -> Log {
        self.state().log.clone()
    }
}

/// The client side of a [`MemoryServer`].
#[derive(Clone)]
pub struct MemoryDialer {
    server: MemoryServer,
}

impl Dialer for MemoryDialer {
    type Conn = MemoryConn;

    /// Succeeds at once unless [`MemoryServer::refuse_connections`] says otherwise; `server_name` and
    /// `max_frame` are not checked (there is no TLS and no framing).
    async fn connect(
        &self,
        addr: SocketAddr,
        _server_name: &str,
        _max_frame: u64,
    ) -> Result<MemoryConn, ProtocolError> {
        let mut st = self.server.state();
        st.log.dials.push(Instant::now());
        if st.refuse > 0 {
            st.refuse -= 1;
            return Err(ProtocolError::Connect {
                server: addr.to_string(),
                message: "connection refused (memory transport)".into(),
            });
        }
        let id = st.next_conn;
        st.next_conn += 1;
        Ok(MemoryConn {
            server: self.server.clone(),
            shared: Arc::new(ConnShared {
                id,
                heard: AtomicU64::new(0),
                closed: Mutex::new(None),
            }),
        })
    }

    async fn wait_idle(&self) {}
}

struct ConnShared {
    id: u64,
    heard: AtomicU64,
    closed: Mutex<Option<&'static str>>,
}

/// A connection to a [`MemoryServer`]; cheap to clone.
#[derive(Clone)]
pub struct MemoryConn {
    server: MemoryServer,
    shared: Arc<ConnShared>,
}

impl MemoryConn {
    fn closed(&self) -> Option<&'static str> {
        *self.shared.closed.lock().expect("not poisoned")
    }

    /// Logs a request's arrival and draws its faults: `None` on a hung connection, else (the [`Fault`] to
    /// apply, whether to drop the reply, the reply delay).
    fn arrive(&self, req: &Request) -> Option<(Option<Fault>, bool, Duration)> {
        let mut st = self.server.state();
        st.log
            .requests
            .push((Instant::now(), self.shared.id, req.clone()));
        if self.shared.id < st.hung_below {
            return None;
        }
        // The peer is alive: it acknowledges the request whatever becomes of its reply.
        self.shared.heard.fetch_add(1, Ordering::Relaxed);
        let chosen = st.fail_only.is_none_or(|k| k == req.kind());
        let fault = if st.fail > 0 && chosen {
            st.fail -= 1;
            st.fault
        } else {
            None
        };
        let drop_reply = fault.is_none() && st.drop_replies > 0;
        if drop_reply {
            st.drop_replies -= 1;
        }
        Some((fault, drop_reply, st.delay))
    }

    fn set_closed(&self, reason: &'static str) {
        self.shared
            .closed
            .lock()
            .expect("not poisoned")
            .get_or_insert(reason);
    }
}

fn lost(server: SocketAddr, reason: &str) -> ProtocolError {
    ProtocolError::ConnectionLost {
        server: server.to_string(),
        reason: reason.to_owned(),
    }
}

impl Connection for MemoryConn {
    /// Applies the server's faults in this order: hung connection, [`MemoryServer::fail_next`],
    /// [`MemoryServer::drop_replies`], then the delay and the handler.
    async fn call(
        &self,
        server: SocketAddr,
        req: &Request,
        payload: &Bytes,
    ) -> Result<(Response, Bytes), ProtocolError> {
        if let Some(reason) = self.closed() {
            return Err(lost(server, reason));
        }
        let Some((fault, drop_reply, delay)) = self.arrive(req) else {
            // A black hole: no reply, no acknowledgement, until the client gives up on the request.
            return future::pending().await;
        };
        match fault {
            Some(Fault::Lost) => {
                self.set_closed("connection lost (memory transport fault)");
                return Err(lost(server, "connection lost (memory transport fault)"));
            }
            Some(Fault::Answer(code)) => {
                let message = format!("{code:?} injected by the memory transport");
                return Ok((Response::Error { code, message }, Bytes::new()));
            }
            None => {}
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let reply = (self.server.inner.handler)(req, payload.clone()).await;
        if drop_reply {
            return future::pending().await;
        }
        Ok(reply)
    }

    fn close_reason(&self, server: SocketAddr) -> Option<ProtocolError> {
        self.closed().map(|r| lost(server, r))
    }

    /// Requests the server acknowledged on this connection (every one, except on a hung connection).
    fn packets_received(&self) -> Option<u64> {
        Some(self.shared.heard.load(Ordering::Relaxed))
    }

    fn close(&self) {
        self.set_closed("closed by the client");
    }
}

/// The [`Response::Hello`] a healthy server `shard_index` of `num_shards` answers: epoch 1, this crate's
/// routing fingerprint, no tables.
pub fn hello_reply(shard_index: u32, num_shards: u32) -> Response {
    Response::Hello {
        shard_index,
        num_shards,
        epoch: 1,
        routing: ShardMap::new(num_shards).routing_fingerprint(),
        tables: Vec::new(),
        replica: crate::wire::message::replicate::ReplicaInfo::SINGLE,
    }
}
