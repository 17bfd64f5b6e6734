//! Load limits (admission control of connections and bytes): what bounds the server's memory when more clients send more than it can serve.
//!
//! Three limits, each configurable ([`crate::config`]):
//! - **connections** (`max-connections`): a connection past the cap is refused at the handshake;
//! - **per connection**, QUIC flow control (`max-streams-per-connection`, `connection-window-bytes`): a client
//!   has at most that many requests open and that many unread bytes buffered in the server; past them, its
//!   sends block (backpressure), they are not dropped;
//! - **server-wide in-flight bytes** (`max-inflight-bytes`): a request's body is read only once its bytes are
//!   admitted (the prefix announces them), and a pull's response bytes are admitted (from a second pool of the
//!   same size) before it is built; both are released when the reply is written. Requests wait their turn
//!   (latency grows, `ps_inflight_wait_seconds`), none is dropped. Two pools acquired in a fixed order
//!   (request, then response) cannot deadlock; a single request larger than a pool takes the whole pool.
//!
//! On TCP, frames of many requests arrive interleaved on one connection, so their bodies cannot wait unread
//! the way a QUIC stream's do: the bytes a TCP connection buffers (frames still arriving) take permits of the
//! request pool before the connection reads more, and a completed frame's permits become its request's
//! ([`LoadLimits::receive_budget`]); a connection that cannot get them within the stream idle bound is dropped.
//!
//! So the bytes of requests and replies held by the server are at most
//! `max-connections x connection-window-bytes` (unread, in QUIC buffers) + `2 x max-inflight-bytes` (being
//! handled). A pull whose response would exceed the frame cap is refused (`FrameTooLarge`) before it is built.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use protocol::wire::layout::PayloadLayout;
use protocol::Request;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics as m;

/// The server's load limits, shared by every connection.
#[derive(Debug)]
pub struct LoadLimits {
    requests: Arc<Semaphore>,
    responses: Arc<Semaphore>,
    pool: u32,
    connections: Arc<AtomicUsize>,
    max_connections: usize,
}

/// Bytes admitted for one request (and its response); released on drop.
#[derive(Debug)]
pub struct Admitted {
    _permits: Vec<OwnedSemaphorePermit>,
    bytes: u64,
    /// Of `bytes`, those taken from the response pool.
    response_bytes: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        metrics::gauge!(m::INFLIGHT_BYTES).decrement(self.bytes as f64);
    }
}

/// One open connection counted against the cap; released on drop.
#[derive(Debug)]
pub struct ConnectionSlot(Arc<AtomicUsize>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl LoadLimits {
    /// Pools of `max_inflight_bytes` each (clamped to `u32::MAX`) and a cap of `max_connections`.
    pub fn new(max_inflight_bytes: u64, max_connections: usize) -> LoadLimits {
        let pool = max_inflight_bytes.clamp(1, u32::MAX as u64) as u32;
        LoadLimits {
            requests: Arc::new(Semaphore::new(pool as usize)),
            responses: Arc::new(Semaphore::new(pool as usize)),
            pool,
            connections: Arc::new(AtomicUsize::new(0)),
            max_connections,
        }
    }

    /// Takes a connection slot, or `None` if `max_connections` are open.
    pub fn connection(&self) -> Option<ConnectionSlot> {
        let open = self.connections.fetch_add(1, Ordering::SeqCst);
        if open >= self.max_connections {
            self.connections.fetch_sub(1, Ordering::SeqCst);
            metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL).increment(1);
            tracing::warn!(
                open,
                max = self.max_connections,
                "connection refused: too many open"
            );
            return None;
        }
        Some(ConnectionSlot(self.connections.clone()))
    }

    async fn take(pool: &Arc<Semaphore>, cap: u32, bytes: usize) -> OwnedSemaphorePermit {
        let n = bytes.min(cap as usize).max(1) as u32;
        pool.clone()
            .acquire_many_owned(n)
            .await
            .expect("admission pools are never closed")
    }

    /// Waits until `bytes` of request body may be read.
    pub async fn request(&self, bytes: usize) -> Admitted {
        self.request_holding(bytes, None).await
    }

    /// [`LoadLimits::request`] for a request whose bytes were partly counted while it arrived (`held`, a TCP
    /// frame's permits from [`LoadLimits::receive_budget`]): only the rest is waited for.
    pub async fn request_holding(
        &self,
        bytes: usize,
        held: Option<OwnedSemaphorePermit>,
    ) -> Admitted {
        let start = Instant::now();
        let want = bytes.min(self.pool as usize).max(1);
        let mut held = held;
        if let Some(p) = &mut held {
            // The frame's prefix and header counted too: the request holds its body's bytes.
            if p.num_permits() > want {
                drop(p.split(p.num_permits() - want));
            }
        }
        let have = held.as_ref().map_or(0, |p| p.num_permits());
        let mut permits = Vec::from_iter(held);
        if want > have {
            permits.push(Self::take(&self.requests, self.pool, want - have).await);
        }
        metrics::histogram!(m::INFLIGHT_WAIT_SECONDS).record(start.elapsed().as_secs_f64());
        metrics::gauge!(m::INFLIGHT_BYTES).increment(bytes as f64);
        Admitted {
            _permits: permits,
            bytes: bytes as u64,
            response_bytes: 0,
        }
    }

    /// What a TCP connection counts the bytes of frames still arriving against: the request pool, in the
    /// in-flight gauge ([`protocol::transport::tcp::ServerConn::count_buffered_in`]).
    pub fn receive_budget(&self) -> protocol::transport::tcp::ReceiveBudget {
        protocol::transport::tcp::ReceiveBudget {
            pool: self.requests.clone(),
            cap: self.pool as usize,
            on_change: Arc::new(|delta| {
                metrics::gauge!(m::INFLIGHT_BYTES).increment(delta as f64);
            }),
        }
    }

    /// Waits until the response of `req` (a pull's rows; nothing for other requests) may be built, adding its
    /// bytes to `admitted`.
    pub async fn response(&self, req: &Request, admitted: &mut Admitted) {
        let bytes = response_bytes(req);
        if bytes == 0 {
            return;
        }
        let start = Instant::now();
        let permit = Self::take(&self.responses, self.pool, bytes).await;
        metrics::histogram!(m::INFLIGHT_WAIT_SECONDS).record(start.elapsed().as_secs_f64());
        metrics::gauge!(m::INFLIGHT_BYTES).increment(bytes as f64);
        admitted._permits.push(permit);
        admitted.bytes += bytes as u64;
        admitted.response_bytes += bytes as u64;
    }

    /// Waits until a reply payload of `bytes` may be queued, adding to `admitted` what its response
    /// admission ([`LoadLimits::response`]) did not cover: every reply byte a TCP connection queues counts
    /// against the response pool until it is written (a sync answer's rows are only known once built).
    ///
    /// A request that holds response bytes already (a pull, admitted by an upper bound of its reply) never
    /// waits here: holding some of a pool while waiting for more of it could deadlock with others doing the
    /// same. What it lacks is taken only if free at once.
    pub async fn reply(&self, bytes: usize, admitted: &mut Admitted) {
        let extra = (bytes as u64).saturating_sub(admitted.response_bytes) as usize;
        if extra == 0 {
            return;
        }
        let start = Instant::now();
        let permit = if admitted.response_bytes > 0 {
            let n = extra.min(self.pool as usize).max(1) as u32;
            match self.responses.clone().try_acquire_many_owned(n) {
                Ok(permit) => permit,
                Err(_) => return,
            }
        } else {
            Self::take(&self.responses, self.pool, extra).await
        };
        metrics::histogram!(m::INFLIGHT_WAIT_SECONDS).record(start.elapsed().as_secs_f64());
        metrics::gauge!(m::INFLIGHT_BYTES).increment(extra as f64);
        admitted._permits.push(permit);
        admitted.bytes += extra as u64;
        admitted.response_bytes += extra as u64;
    }
}

/// Bytes of the response payload `req` asks for: a pull's rows as its header describes them, plus an upper
/// bound of the optimizer state for a pull with state (0 for other requests, and for headers whose counts
/// overflow, which the handler refuses).
pub fn response_bytes(req: &Request) -> usize {
    match req {
        Request::Pull {
            encoding, tables, ..
        } => PayloadLayout::of(tables)
            .map(|l| l.pull_response_bytes(*encoding))
            .unwrap_or(0),
        // Rows, then at most the largest optimizer state (Adam's `2 x dim + 1` f32) per row: the tables are not
        // looked up here, so this bounds the response from above.
        Request::PullWithState {
            encoding, tables, ..
        } => PayloadLayout::of(tables)
            .map(|l| {
                let state: usize = tables
                    .iter()
                    .map(|t| (t.count as usize).saturating_mul(2 * t.dim as usize + 1))
                    .fold(0, usize::saturating_add);
                l.pull_response_bytes(*encoding)
                    .saturating_add(state.saturating_mul(4))
            })
            .unwrap_or(0),
        // The sums, as many values as the contribution.
        Request::Reduce { header } => header.len as usize * header.encoding.bytes_per_element(),
        _ => 0,
    }
}

/// The QUIC transport of a server: the shared tuning ([`protocol::transport::endpoint::transport_config`]) with the
/// per-connection limits of this module.
pub fn server_transport(
    max_streams_per_connection: u32,
    connection_window_bytes: u64,
) -> quinn::TransportConfig {
    let window = connection_window_bytes.min(u32::MAX as u64) as u32;
    // Each stream's window is its share of the connection's: requests waiting for admission leave their bytes
    // unread, and if they could fill the connection window, the admitted request on the same connection could
    // never receive the rest of its body (a flow-control deadlock). Config validation keeps the share >= 4 KiB.
    let stream_window = (window / max_streams_per_connection.max(1)).max(4096);
    let mut t = protocol::transport::endpoint::transport_config();
    t.max_concurrent_bidi_streams(max_streams_per_connection.into())
        .stream_receive_window(stream_window.into())
        .receive_window(window.into());
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pools_block_until_bytes_are_released() {
        let a = LoadLimits::new(100, 2);
        let first = a.request(60).await;
        // 60 + 60 > 100: the second waits until the first is dropped.
        let second =
            tokio::time::timeout(std::time::Duration::from_millis(50), a.request(60)).await;
        assert!(second.is_err(), "admitted past the pool");
        drop(first);
        let _second = a.request(60).await;
        // Larger than the pool: takes all of it rather than waiting forever.
        drop(_second);
        let _big = a.request(1000).await;
    }

    #[tokio::test]
    async fn a_reply_takes_only_what_its_response_admission_did_not() {
        let a = LoadLimits::new(100, 2);
        let mut admitted = a.request(10).await;
        a.reply(70, &mut admitted).await;
        assert_eq!((admitted.bytes, admitted.response_bytes), (80, 70));
        a.reply(50, &mut admitted).await;
        assert_eq!(admitted.response_bytes, 70, "covered already");
        // Holding response bytes, a request does not wait for more (30 are free, 40 are lacking).
        a.reply(110, &mut admitted).await;
        assert_eq!(admitted.response_bytes, 70, "took nothing rather than wait");
        // 30 bytes of the response pool are left: a second reply of 60 waits until the first is released.
        let mut other = a.request(1).await;
        let waiting = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            a.reply(60, &mut other),
        )
        .await;
        assert!(waiting.is_err(), "admitted past the pool");
        drop(admitted);
        a.reply(60, &mut other).await;
    }

    #[test]
    fn response_bytes_count_rows_and_bound_the_state() {
        use protocol::{Encoding, TableCount};
        let tables = vec![TableCount {
            table: 0,
            count: 10,
            dim: 16,
        }];
        let pull = Request::Pull {
            epoch: 1,
            encoding: Encoding::F32,
            tables: tables.clone(),
        };
        assert_eq!(response_bytes(&pull), 10 * 16 * 4);
        let with_state = Request::PullWithState {
            epoch: 1,
            encoding: Encoding::F32,
            tables,
        };
        // Rows plus Adam's 33 f32 of state per row, the largest any optimizer keeps.
        assert_eq!(response_bytes(&with_state), 10 * 16 * 4 + 10 * 33 * 4);
        assert_eq!(response_bytes(&Request::Flush), 0);
    }

    #[test]
    fn connection_cap() {
        let a = LoadLimits::new(100, 2);
        let s1 = a.connection().unwrap();
        let _s2 = a.connection().unwrap();
        assert!(a.connection().is_none());
        drop(s1);
        assert!(a.connection().is_some());
    }
}
