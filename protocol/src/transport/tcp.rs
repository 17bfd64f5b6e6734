//! The TCP transport: TLS 1.3 over TCP (tokio-rustls, the same mutual-TLS certificates and ALPN as QUIC), one
//! connection per server, many requests in flight on it.
//!
//! Frames are those of [`crate::wire::frame`], cut into chunks and interleaved by [`crate::transport::mux`], so a small request
//! is not stuck behind a multi-MB one on the same connection (TCP's own head-of-line blocking on packet loss
//! remains). Each connection has a reader task (reassembles frames, hands each to whoever waits for it) and a
//! writer task (chunks queued frames round-robin and writes them in batches of up to [`WRITE_BATCH`] bytes, so
//! TLS records are full-sized and syscalls few). A connection whose socket fails fails every request waiting on
//! it with [`ProtocolError::ConnectionLost`], naming the reason: a server that dies mid-request is reported as
//! soon as the kernel closes its socket.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::ProtocolError;
use crate::transport::mux::{self, Demux, Event, Outgoing, Scheduler, CHUNK_MAX};
use crate::wire::frame;
use crate::wire::message::{Request, Response};

/// Bytes of chunks gathered before one write (then encrypted into full 16 KiB TLS records).
pub const WRITE_BATCH: usize = 256 << 10;
/// Read buffer grown by this much when it runs low.
const READ_RESERVE: usize = 256 << 10;

type Waiter = oneshot::Sender<Result<Bytes, ProtocolError>>;

fn encode(
    id: u32,
    header: &impl serde::Serialize,
    payload: Bytes,
) -> Result<Outgoing, ProtocolError> {
    let mut head = Vec::with_capacity(128);
    frame::encode_head(header, payload.len(), &mut head)?;
    Ok(Outgoing::new(id, Bytes::from(head), payload))
}

/// Writes queued frames until every sender is gone, then flushes and closes the TLS session. With `idle`, a
/// batch (at most [`WRITE_BATCH`] bytes) the peer does not take within `idle` fails the connection: a client
/// that never reads its replies cannot hold them in the server's memory for ever.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    idle: Option<Duration>,
) -> io::Result<()> {
    let mut sched = Scheduler::default();
    let mut buf = Vec::with_capacity(WRITE_BATCH + CHUNK_MAX + 64);
    loop {
        if sched.is_empty() {
            match rx.recv().await {
                Some(f) => sched.push(f),
                None => break,
            }
        }
        while let Ok(f) = rx.try_recv() {
            sched.push(f);
        }
        buf.clear();
        sched.fill(&mut buf, WRITE_BATCH);
        let write = async {
            w.write_all(&buf).await?;
            w.flush().await
        };
        match idle {
            None => write.await?,
            Some(idle) => tokio::time::timeout(idle, write).await.map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the peer took no {} bytes of replies within {idle:?}",
                        buf.len()
                    ),
                )
            })??,
        }
    }
    w.shutdown().await
}

/// Reads chunks into `buf` and reassembles frames into `events`; `Ok(false)` at a clean end of stream.
async fn read_some<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    demux: &mut Demux,
    events: &mut Vec<Event>,
) -> Result<bool, String> {
    if buf.capacity() - buf.len() < CHUNK_MAX / 4 {
        buf.reserve(READ_RESERVE);
    }
    match r.read_buf(buf).await {
        Ok(0) if buf.is_empty() => return Ok(false),
        Ok(0) => {
            return Err(format!(
                "connection closed inside a chunk ({} bytes left over)",
                buf.len()
            ))
        }
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    demux.feed(buf, events).map_err(|e| e.to_string())?;
    Ok(true)
}

/// Connects to servers over TCP with the client's TLS config.
#[derive(Clone)]
pub struct Dialer {
    connector: TlsConnector,
}

impl Dialer {
    /// A dialer presenting the client certificate of `tls` (see [`crate::transport::tls::rustls_client_config`]).
    pub fn new(tls: rustls::ClientConfig) -> Dialer {
        Dialer {
            connector: TlsConnector::from(Arc::new(tls)),
        }
    }

    /// Opens a connection to `addr` and completes the TLS handshake, checking the certificate names
    /// `server_name`. Responses over `max_frame` bytes are refused.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        server_name: &str,
        max_frame: u64,
    ) -> Result<ClientConn, ProtocolError> {
        let connect_err = |message: String| ProtocolError::Connect {
            server: addr.to_string(),
            message,
        };
        let name = rustls_pki_types::ServerName::try_from(server_name.to_owned())
            .map_err(|e| connect_err(format!("server name {server_name:?}: {e}")))?;
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| connect_err(format!("tcp: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let tls = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| connect_err(format!("tls handshake: {e}")))?;
        let (r, w) = tokio::io::split(tls);
        let shared = Arc::new(Shared {
            server: addr.to_string(),
            state: Mutex::new(State::default()),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = {
            let shared = shared.clone();
            tokio::spawn(async move {
                if let Err(e) = write_loop(w, rx, None).await {
                    shared.fail(format!("write: {e}"));
                }
            })
        };
        let reader = tokio::spawn(client_read_loop(r, shared.clone(), max_frame));
        Ok(ClientConn {
            shared,
            next_id: AtomicU32::new(1),
            out: tx,
            reader,
            writer,
            max_frame,
        })
    }
}

#[derive(Default)]
struct State {
    pending: HashMap<u32, Waiter>,
    closed: Option<String>,
}

struct Shared {
    server: String,
    state: Mutex<State>,
}

impl Shared {
    fn lost(&self, reason: &str) -> ProtocolError {
        ProtocolError::ConnectionLost {
            server: self.server.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Marks the connection closed and fails every waiting request.
    fn fail(&self, reason: String) {
        let mut st = self.state.lock().expect("not poisoned");
        let reason = st.closed.get_or_insert(reason).clone();
        for (_, tx) in st.pending.drain() {
            let _ = tx.send(Err(self.lost(&reason)));
        }
    }

    fn deliver(&self, id: u32, result: Result<Bytes, ProtocolError>) {
        let waiter = self.state.lock().expect("not poisoned").pending.remove(&id);
        if let Some(tx) = waiter {
            let _ = tx.send(result);
        }
    }
}

async fn client_read_loop<R: AsyncRead + Unpin>(mut r: R, shared: Arc<Shared>, max_frame: u64) {
    let mut demux = Demux::new(max_frame);
    let mut buf = BytesMut::with_capacity(READ_RESERVE);
    let mut events = Vec::new();
    let reason = loop {
        match read_some(&mut r, &mut buf, &mut demux, &mut events).await {
            Ok(true) => {}
            Ok(false) => break "the server closed the connection".to_string(),
            Err(e) => break e,
        }
        for ev in events.drain(..) {
            match ev {
                Event::Frame { id, bytes } => shared.deliver(id, Ok(bytes)),
                Event::Refused { id, error } => shared.deliver(id, Err(error)),
            }
        }
    };
    shared.fail(reason);
}

/// A client's TLS-over-TCP connection to one server.
pub struct ClientConn {
    shared: Arc<Shared>,
    next_id: AtomicU32,
    out: mpsc::UnboundedSender<Outgoing>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
    max_frame: u64,
}

/// Removes a request's waiter if the request is dropped (e.g. timed out) before its answer arrives.
struct PendingGuard<'a> {
    shared: &'a Shared,
    id: u32,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .expect("not poisoned")
            .pending
            .remove(&self.id);
    }
}

impl ClientConn {
    /// Why the connection is closed, if it is.
    pub fn close_reason(&self) -> Option<ProtocolError> {
        let st = self.shared.state.lock().expect("not poisoned");
        st.closed.as_deref().map(|r| self.shared.lost(r))
    }

    /// Sends one request and waits for its response.
    pub async fn call(
        &self,
        req: &Request,
        payload: Bytes,
    ) -> Result<(Response, Bytes), ProtocolError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.state.lock().expect("not poisoned");
            if let Some(reason) = &st.closed {
                return Err(self.shared.lost(reason));
            }
            st.pending.insert(id, tx);
        }
        let _guard = PendingGuard {
            shared: &self.shared,
            id,
        };
        self.out
            .send(encode(id, req, payload)?)
            .map_err(|_| self.shared.lost("writer stopped"))?;
        let bytes = rx.await.map_err(|_| self.shared.lost("reader stopped"))??;
        mux::split_frame(bytes, self.max_frame)
    }

    /// Closes the connection; requests still waiting fail.
    pub fn close(&self) {
        self.reader.abort();
        self.writer.abort();
        self.shared.fail("closed by the client".into());
    }
}

impl Drop for ClientConn {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

/// A server's TCP listening socket with its TLS config.
pub struct Listener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl Listener {
    /// Wraps a bound (non-blocking or not) standard listener; `tls` from [`crate::transport::tls::rustls_server_config`].
    pub fn from_std(
        listener: std::net::TcpListener,
        tls: rustls::ServerConfig,
    ) -> Result<Listener, ProtocolError> {
        let addr = listener.local_addr().ok();
        let io = |source| ProtocolError::Io {
            context: format!("tcp listener {addr:?}"),
            source,
        };
        listener.set_nonblocking(true).map_err(io)?;
        Ok(Listener {
            tcp: TcpListener::from_std(listener).map_err(io)?,
            acceptor: TlsAcceptor::from(Arc::new(tls)),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Accepts the next TCP connection; the TLS handshake is left to [`Handshake::finish`], so a slow client
    /// does not hold up the accept loop.
    pub async fn accept(&self) -> io::Result<Handshake> {
        let (stream, peer) = self.tcp.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok(Handshake {
            stream,
            peer,
            acceptor: self.acceptor.clone(),
        })
    }
}

/// An accepted TCP connection before its TLS handshake.
pub struct Handshake {
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
}

impl Handshake {
    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Completes the TLS handshake (checking the client certificate if the config asks for one). The
    /// connection refuses frames over `max_frame` bytes and, with `idle`, fails when a frame stalls: no byte
    /// arrives for `idle` while a frame is partly received, or the client takes no reply bytes for `idle`
    /// ([`ProtocolError::Idle`]). The caller bounds the handshake itself (a client that never sends a
    /// `ClientHello` is never done).
    pub async fn finish(
        self,
        max_frame: u64,
        idle: Option<Duration>,
    ) -> Result<ServerConn, ProtocolError> {
        let peer = self.peer;
        let tls = self
            .acceptor
            .accept(self.stream)
            .await
            .map_err(|e| ProtocolError::Connect {
                server: peer.to_string(),
                message: format!("tls handshake with client: {e}"),
            })?;
        let peer_certificates = tls
            .get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect());
        let (r, w) = tokio::io::split(tls);
        let (tx, rx) = mpsc::unbounded_channel();
        let writer_failed = Arc::new(Notify::new());
        let writer = {
            let failed = writer_failed.clone();
            tokio::spawn(async move {
                let written = write_loop(w, rx, idle).await;
                if written.is_err() {
                    // The reader stops too: a client that does not take its replies gets no more served.
                    failed.notify_one();
                }
                written
            })
        };
        Ok(ServerConn {
            budget: None,
            idle,
            writer_failed,
            peer_certificates,
            reader: Box::new(r),
            buf: BytesMut::with_capacity(READ_RESERVE),
            demux: Demux::new(max_frame),
            events: Vec::new(),
            ready: VecDeque::new(),
            out: tx,
            writer,
            max_frame,
            peer,
        })
    }
}

/// A server's side of one TCP connection: yields requests, each with a [`Responder`] for its answer.
pub struct ServerConn {
    /// What the bytes of frames still arriving are counted against ([`ServerConn::count_buffered_in`]).
    budget: Option<Held>,
    /// The client's verified certificate chain, leaf first (none without client authentication).
    peer_certificates: Option<Vec<rustls::pki_types::CertificateDer<'static>>>,
    reader: Box<dyn AsyncRead + Send + Unpin>,
    buf: BytesMut,
    demux: Demux,
    events: Vec<Event>,
    ready: VecDeque<Event>,
    out: mpsc::UnboundedSender<Outgoing>,
    writer: JoinHandle<io::Result<()>>,
    max_frame: u64,
    peer: SocketAddr,
    idle: Option<Duration>,
    writer_failed: Arc<Notify>,
}

/// One request received on a TCP connection: the decoded frame (or why it could not be) and where to answer.
pub struct Incoming {
    /// The request header and payload, or the framing error to answer with.
    pub request: Result<(Request, Bytes), ProtocolError>,
    /// Sends the answer.
    pub reply: Responder,
    /// With a [`ReceiveBudget`]: the permits that counted this frame's bytes while it arrived (at most its
    /// length; fewer when its last bytes came in the read that completed it), handed to whoever handles it.
    pub permit: Option<OwnedSemaphorePermit>,
}

/// The server-wide pool the bytes of frames still arriving on TCP connections are counted against, one permit
/// per byte: a connection takes permits for what it holds before it reads more (so a sender that starts many
/// frames and finishes none waits for the pool instead of growing the server), and hands a frame's permits
/// to its request when it completes.
#[derive(Clone)]
pub struct ReceiveBudget {
    /// The pool (ps-server's request pool of `max-inflight-bytes`).
    pub pool: Arc<Semaphore>,
    /// Most permits one connection holds (the pool's size: a connection holding the whole pool reads on).
    pub cap: usize,
    /// Told the change of the permits connections hold (+ taken, - released or handed to a request): a gauge.
    pub on_change: Arc<dyn Fn(i64) + Send + Sync>,
}

/// The permits a connection holds for its buffered bytes; released (and reported) on drop.
struct Held {
    budget: ReceiveBudget,
    permit: Option<OwnedSemaphorePermit>,
}

impl Held {
    fn count(&self) -> usize {
        self.permit.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Takes permits until `bytes` are covered (at most the cap).
    async fn cover(&mut self, bytes: usize) {
        let want = bytes.min(self.budget.cap);
        let have = self.count();
        if want <= have {
            return;
        }
        let more = self
            .budget
            .pool
            .clone()
            .acquire_many_owned((want - have) as u32)
            .await
            .expect("the receive pool is never closed");
        (self.budget.on_change)((want - have) as i64);
        match &mut self.permit {
            Some(p) => p.merge(more),
            None => self.permit = Some(more),
        }
    }

    /// Hands up to `bytes` permits to a completed frame.
    fn hand_over(&mut self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let n = bytes.min(self.count());
        if n == 0 {
            return None;
        }
        let permit = self.permit.as_mut()?;
        let out = if n == permit.num_permits() {
            self.permit.take()
        } else {
            permit.split(n)
        };
        (self.budget.on_change)(-(n as i64));
        out
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let n = self.count();
        if n > 0 {
            (self.budget.on_change)(-(n as i64));
        }
    }
}

/// Answers one request.
pub struct Responder {
    id: u32,
    out: mpsc::UnboundedSender<Outgoing>,
}

impl Responder {
    /// Queues the response frame; fails if the connection's writer has stopped.
    pub fn send(self, header: &Response, payload: Bytes) -> Result<(), ProtocolError> {
        self.send_holding(header, payload, Box::new(()))
    }

    /// [`Responder::send`], keeping `hold` (the reply's admitted bytes) alive until the frame has left the
    /// connection's queue: a reply queued behind a slow reader still counts against the server's limits.
    pub fn send_holding(
        self,
        header: &Response,
        payload: Bytes,
        hold: Box<dyn Send + Sync>,
    ) -> Result<(), ProtocolError> {
        self.out
            .send(encode(self.id, header, payload)?.holding(hold))
            .map_err(|_| ProtocolError::ConnectionLost {
                server: "-".into(),
                reason: "the connection's writer stopped".into(),
            })
    }
}

impl ServerConn {
    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The client's verified certificate chain, leaf first; `None` when the server does not ask for one.
    pub fn peer_certificates(&self) -> Option<&[rustls::pki_types::CertificateDer<'static>]> {
        self.peer_certificates.as_deref()
    }

    /// Counts the bytes this connection buffers (frames still arriving, and read bytes not yet reassembled)
    /// against `budget` from now on: before each read, the connection holds permits for them, waiting for the
    /// pool when it is short (within the idle bound: a connection that cannot get them for that long is
    /// dropped, [`ProtocolError::Idle`], freeing what it held, so connections holding partial frames cannot
    /// starve each other for ever). Each completed frame's permits go with it ([`Incoming::permit`]).
    pub fn count_buffered_in(&mut self, budget: ReceiveBudget) {
        self.budget = Some(Held {
            budget,
            permit: None,
        });
    }

    /// The next request; `Ok(None)` when the client closed the connection cleanly.
    pub async fn next(&mut self) -> Result<Option<Incoming>, ProtocolError> {
        loop {
            if let Some(ev) = self.ready.pop_front() {
                let (id, request, permit) = match ev {
                    Event::Frame { id, bytes } => {
                        let permit = self.budget.as_mut().and_then(|b| b.hand_over(bytes.len()));
                        (id, mux::split_frame(bytes, self.max_frame), permit)
                    }
                    Event::Refused { id, error } => (id, Err(error), None),
                };
                return Ok(Some(Incoming {
                    request,
                    reply: Responder {
                        id,
                        out: self.out.clone(),
                    },
                    permit,
                }));
            }
            // Between frames a connection may idle (QUIC keep-alives stand for it); in the middle of one, the
            // bytes received so far are held in memory and a stalled sender is dropped after `idle`.
            let mid_frame = !self.buf.is_empty() || self.demux.partial_frames() > 0;
            if let Some(held) = &mut self.budget {
                let buffered = self.buf.len() + self.demux.partial_bytes();
                crate::transport::stream::within(self.idle, "read", held.cover(buffered)).await?;
                if buffered > held.budget.cap && self.demux.partial_frames() > 1 {
                    // Frames holding the whole pool and wanting more: only one frame larger than the pool is
                    // read on (as on QUIC); several are a sender that finishes none. Nothing frees the pool
                    // but this connection's end.
                    crate::transport::stream::within(
                        self.idle,
                        "read",
                        std::future::pending::<()>(),
                    )
                    .await?;
                }
            }
            let read = read_some(
                &mut self.reader,
                &mut self.buf,
                &mut self.demux,
                &mut self.events,
            );
            let idle = self.idle.filter(|_| mid_frame);
            let read = tokio::select! {
                read = crate::transport::stream::within(idle, "read", read) => read?,
                _ = self.writer_failed.notified() => {
                    return Err(ProtocolError::ConnectionLost {
                        server: self.peer.to_string(),
                        reason: "writing replies failed; see the connection's end".into(),
                    })
                }
            };
            match read {
                Ok(true) => self.ready.extend(self.events.drain(..)),
                Ok(false) => return Ok(None),
                Err(reason) => {
                    return Err(ProtocolError::ConnectionLost {
                        server: self.peer.to_string(),
                        reason,
                    })
                }
            }
        }
    }

    /// Stops reading; waits until every response already handed to a [`Responder`] is written. A client that
    /// took no reply bytes for the idle bound is [`ProtocolError::Idle`].
    pub async fn finish(self) -> Result<(), ProtocolError> {
        let ServerConn {
            out,
            writer,
            peer,
            idle,
            ..
        } = self;
        drop(out);
        let lost = |reason: String| ProtocolError::ConnectionLost {
            server: peer.to_string(),
            reason,
        };
        writer
            .await
            .map_err(|e| lost(e.to_string()))?
            .map_err(|e| match idle {
                Some(idle) if e.kind() == io::ErrorKind::TimedOut => ProtocolError::Idle {
                    what: "write",
                    idle,
                },
                _ => lost(e.to_string()),
            })
    }
}
