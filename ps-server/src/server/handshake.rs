//! Connections before they are authenticated (issue 40): each TLS handshake runs in its own task, bounded by
//! `handshake-timeout-secs`, and at most `max-handshakes` run at once. When one more connection arrives, the
//! oldest handshake is dropped rather than the new one refused: sockets that connect and never speak (or
//! speak slowly) cannot lock out clients that complete their handshake in a round trip. A connection slot
//! (`max-connections`, [`crate::load_limits`]) is taken only once the handshake is done.
//!
//! Call order: [`Handshakes::start`] when a connection is accepted (in the accept loop, so eviction follows
//! arrival order), then [`establish`] in the connection's task.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::transport::tcp;
use tokio_util::sync::CancellationToken;

use crate::config::ConnectionLimits;
use crate::metrics as m;

use super::listen::Accepted;

/// The handshakes under way, oldest first.
#[derive(Debug)]
pub(super) struct Handshakes {
    limits: ConnectionLimits,
    max_frame: u64,
    pending: Mutex<VecDeque<(u64, CancellationToken)>>,
    next_id: AtomicU64,
}

/// One handshake's place among those under way; dropping it (done, failed, timed out) frees the place.
#[derive(Debug)]
pub(super) struct Ticket {
    owner: Arc<Handshakes>,
    id: u64,
    evicted: CancellationToken,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut pending = self.owner.pending.lock().expect("not poisoned");
        if let Some(i) = pending.iter().position(|(id, _)| *id == self.id) {
            pending.remove(i);
        }
        metrics::gauge!(m::HANDSHAKES_IN_PROGRESS).set(pending.len() as f64);
    }
}

/// A connection whose handshake is done: its peer's certificate chain is known.
pub(super) enum Established {
    /// A QUIC connection.
    Quic(quinn::Connection),
    /// A TLS-over-TCP connection (boxed: it carries its read buffers).
    Tcp(Box<tcp::ServerConn>),
}

impl Established {
    /// Closes a connection refused after its handshake (`max-connections` open).
    pub(super) fn refuse(self) {
        match self {
            Established::Quic(conn) => conn.close(1u32.into(), b"too many connections"),
            // Dropping it closes the socket.
            Established::Tcp(conn) => drop(conn),
        }
    }
}

impl Handshakes {
    /// No handshake under way yet; `max_frame` and the stream idle bound are given to TCP connections.
    pub(super) fn new(limits: ConnectionLimits, max_frame: u64) -> Arc<Handshakes> {
        Arc::new(Handshakes {
            limits,
            max_frame,
            pending: Mutex::new(VecDeque::new()),
            next_id: AtomicU64::new(0),
        })
    }

    /// Registers a new handshake; with `max-handshakes` under way, the oldest is told to stop first.
    pub(super) fn start(self: &Arc<Self>) -> Ticket {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        let mut pending = self.pending.lock().expect("not poisoned");
        while pending.len() >= self.limits.max_handshakes {
            let Some((oldest, token)) = pending.pop_front() else {
                break;
            };
            tracing::debug!(
                handshake = oldest,
                max = self.limits.max_handshakes,
                "dropping the oldest handshake to make room"
            );
            token.cancel();
        }
        pending.push_back((id, evicted.clone()));
        metrics::gauge!(m::HANDSHAKES_IN_PROGRESS).set(pending.len() as f64);
        Ticket {
            owner: self.clone(),
            id,
            evicted,
        }
    }

    /// The stream idle bound handed to established connections.
    pub(super) fn stream_idle(&self) -> Option<Duration> {
        self.limits.stream_idle_timeout
    }
}

/// Why a handshake ended without a connection.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("tls handshake not done within {0:?}")]
    Timeout(Duration),
    #[error("dropped to make room for a newer handshake (max-handshakes)")]
    Evicted,
    #[error("server draining")]
    Draining,
    #[error("{0}")]
    Tls(String),
}

impl Failed {
    fn outcome(&self) -> &'static str {
        match self {
            Failed::Timeout(_) => "timeout",
            Failed::Evicted => "evicted",
            Failed::Draining => "draining",
            Failed::Tls(_) => "failed",
        }
    }
}

/// Completes the handshake of `accepted` within the handshake timeout, unless it is evicted ([`Ticket`]) or
/// the server starts draining; counts the outcome in [`m::HANDSHAKES_TOTAL`]. Dropping an unfinished QUIC
/// handshake closes the connection; dropping a TCP one closes the socket.
pub(super) async fn establish(
    accepted: Accepted,
    ticket: Ticket,
    draining: &CancellationToken,
) -> Option<Established> {
    let owner = ticket.owner.clone();
    let timeout = owner.limits.handshake_timeout;
    let peer = match &accepted {
        Accepted::Quic(incoming) => incoming.remote_address(),
        Accepted::Tcp(handshake) => handshake.peer(),
    };
    let handshake = async {
        match accepted {
            Accepted::Quic(incoming) => (*incoming)
                .await
                .map(Established::Quic)
                .map_err(|e| Failed::Tls(e.to_string())),
            Accepted::Tcp(handshake) => handshake
                .finish(owner.max_frame, owner.limits.stream_idle_timeout)
                .await
                .map(|c| Established::Tcp(Box::new(c)))
                .map_err(|e| Failed::Tls(e.to_string())),
        }
    };
    let result = tokio::select! {
        _ = ticket.evicted.cancelled() => Err(Failed::Evicted),
        _ = draining.cancelled() => Err(Failed::Draining),
        done = tokio::time::timeout(timeout, handshake) => done.unwrap_or(Err(Failed::Timeout(timeout))),
    };
    drop(ticket);
    match result {
        Ok(conn) => {
            metrics::counter!(m::HANDSHAKES_TOTAL, "outcome" => "ok").increment(1);
            Some(conn)
        }
        Err(e) => {
            metrics::counter!(m::HANDSHAKES_TOTAL, "outcome" => e.outcome()).increment(1);
            tracing::debug!(%peer, error = %e, "handshake ended without a connection");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_handshake_makes_room() {
        let limits = ConnectionLimits {
            max_handshakes: 2,
            ..ConnectionLimits::default()
        };
        let h = Handshakes::new(limits, 1 << 20);
        let first = h.start();
        let second = h.start();
        assert!(!first.evicted.is_cancelled());
        let third = h.start();
        assert!(first.evicted.is_cancelled(), "the oldest is dropped");
        assert!(!second.evicted.is_cancelled() && !third.evicted.is_cancelled());
        // A finished handshake frees its place: the next one evicts nobody.
        drop(second);
        let fourth = h.start();
        assert!(!third.evicted.is_cancelled() && !fourth.evicted.is_cancelled());
        drop(first);
        assert_eq!(h.pending.lock().unwrap().len(), 2);
    }
}
