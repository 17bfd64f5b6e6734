//! A UDP socket for quinn that never hands the kernel a GSO batch larger than one UDP datagram.
//!
//! quinn 0.11 builds batches of up to 10 packets of the path MTU and sends each with one `sendmsg` (generic
//! segmentation offload). The kernel refuses a batch whose total exceeds what one UDP datagram can carry
//! ([`MAX_BATCH_BYTES`]) with `EMSGSIZE`, which quinn-udp treats as a lost MTU probe and drops silently: with
//! an MTU above about 6.5 KB every full batch was lost, and connections stalled. [`SplitGso`] sends such a
//! batch as several `sendmsg` calls of whole packets, each within the limit.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// Largest UDP payload one `sendmsg` may carry: an IPv4 datagram of 65,535 bytes minus the 20-byte IP and
/// 8-byte UDP headers (IPv6 allows 20 bytes more; the smaller bound serves both).
pub const MAX_BATCH_BYTES: usize = 65_507;

/// Wraps a quinn socket and splits oversized GSO batches (see the module documentation).
pub struct SplitGso {
    inner: Arc<dyn AsyncUdpSocket>,
}

impl SplitGso {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn AsyncUdpSocket>) -> SplitGso {
        SplitGso { inner }
    }
}

impl fmt::Debug for SplitGso {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SplitGso")
            .field("inner", &self.inner)
            .finish()
    }
}

/// The byte ranges of `len` bytes of packets of `segment` bytes (the last may be shorter) that go out in one
/// `sendmsg` each: as many whole packets as fit [`MAX_BATCH_BYTES`], at least one.
pub fn batch_ranges(len: usize, segment: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let step = (MAX_BATCH_BYTES / segment.max(1)).max(1) * segment.max(1);
    (0..len)
        .step_by(step)
        .map(move |start| start..(start + step).min(len))
}

impl AsyncUdpSocket for SplitGso {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let segment = match transmit.segment_size {
            Some(s) if transmit.contents.len() > MAX_BATCH_BYTES => s,
            _ => return self.inner.try_send(transmit),
        };
        // A `WouldBlock` after some parts were sent makes quinn retry the whole batch; the receiver discards
        // the duplicated packets by packet number.
        for range in batch_ranges(transmit.contents.len(), segment) {
            let contents = &transmit.contents[range];
            self.inner.try_send(&Transmit {
                destination: transmit.destination,
                ecn: transmit.ecn,
                contents,
                segment_size: (contents.len() > segment).then_some(segment),
                src_ip: transmit.src_ip,
            })?;
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_hold_whole_packets_within_the_limit() {
        // 10 packets of 16,000 bytes, the last 500 short: 4 packets per sendmsg.
        let len = 10 * 16_000 - 500;
        let ranges: Vec<_> = batch_ranges(len, 16_000).collect();
        assert_eq!(ranges, vec![0..64_000, 64_000..128_000, 128_000..len]);
        for r in &ranges {
            assert!(r.len() <= MAX_BATCH_BYTES && r.start % 16_000 == 0, "{r:?}");
        }
        // A packet larger than the limit still goes out alone (the kernel refuses it like an MTU probe).
        let ranges: Vec<_> = batch_ranges(2 * 65_527, 65_527).collect();
        assert_eq!(ranges, vec![0..65_527, 65_527..131_054]);
        // Small batches are one range.
        assert_eq!(
            batch_ranges(14_520, 1452).collect::<Vec<_>>(),
            vec![0..14_520]
        );
    }
}
