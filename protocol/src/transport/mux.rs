//! Sans-IO multiplexing of many frames over one byte stream (the TCP transport).
//!
//! QUIC gives every request its own stream; TCP gives one ordered byte stream. To keep many requests in flight
//! on one TCP connection without a large frame blocking the small ones queued behind it, every frame of
//! [`crate::wire::frame`] travels as one or more *chunks*, and the sender interleaves the chunks of all frames it has
//! queued, round-robin:
//!
//! ```text
//! stream_id u32 LE | len u32 LE (bit 31: last chunk of the frame) | len bytes of the frame
//! ```
//!
//! A request and its response share the stream id the client picked. A frame of a few hundred bytes queued
//! behind a frame of several MB waits for at most one [`CHUNK_MAX`]-byte chunk of every other frame in the queue,
//! not for the whole of them. Reassembly hands a frame that arrived in one chunk out without copying it.

use std::collections::{HashMap, VecDeque};

use bytes::{Buf, Bytes, BytesMut};

use crate::error::ProtocolError;
use crate::wire::frame::{self, PREFIX_LEN};

/// Bytes of a chunk header.
pub const CHUNK_HEADER_LEN: usize = 8;
/// Largest chunk body: the interleaving granularity.
pub const CHUNK_MAX: usize = 64 << 10;
/// Frames being reassembled at once on one connection; more is a protocol violation.
pub const MAX_PARTIAL_STREAMS: usize = 4096;
const LAST: u32 = 1 << 31;

/// A frame queued for sending: prefix and header, then payload (kept apart so the payload is not copied
/// before it is chunked).
pub struct Outgoing {
    /// Stream id (request id).
    pub id: u32,
    /// Prefix and bincode header, possibly followed by a small payload.
    pub head: Bytes,
    /// The rest of the frame.
    pub payload: Bytes,
    sent: usize,
    /// Dropped once the last chunk is taken: what the frame's bytes were admitted with (a server's in-flight
    /// byte permits), so they count until the frame leaves the queue.
    hold: Option<Box<dyn Send + Sync>>,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("id", &self.id)
            .field("len", &self.len())
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

impl Outgoing {
    /// A frame for stream `id`.
    pub fn new(id: u32, head: Bytes, payload: Bytes) -> Outgoing {
        Outgoing {
            id,
            head,
            payload,
            sent: 0,
            hold: None,
        }
    }

    /// Keeps `hold` alive until the frame's last chunk is taken from the queue.
    pub fn holding(mut self, hold: Box<dyn Send + Sync>) -> Outgoing {
        self.hold = Some(hold);
        self
    }

    fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// Appends the next chunk (at most [`CHUNK_MAX`] bytes of frame) to `out`; returns whether the frame is done.
    fn next_chunk(&mut self, out: &mut Vec<u8>) -> bool {
        let n = (self.len() - self.sent).min(CHUNK_MAX);
        let last = self.sent + n == self.len();
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&(n as u32 | if last { LAST } else { 0 }).to_le_bytes());
        let (mut from, end) = (self.sent, self.sent + n);
        if from < self.head.len() {
            let upto = end.min(self.head.len());
            out.extend_from_slice(&self.head[from..upto]);
            from = upto;
        }
        if from < end {
            let h = self.head.len();
            out.extend_from_slice(&self.payload[from - h..end - h]);
        }
        self.sent = end;
        last
    }
}

/// The sender's queue: frames waiting to be chunked, served round-robin.
#[derive(Debug, Default)]
pub struct Scheduler {
    queue: VecDeque<Outgoing>,
}

impl Scheduler {
    /// Queues a frame behind the ones already queued.
    pub fn push(&mut self, frame: Outgoing) {
        self.queue.push_back(frame);
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Appends chunks to `out`, one per queued frame in turn, until `out` holds at least `budget` bytes or the
    /// queue is empty.
    pub fn fill(&mut self, out: &mut Vec<u8>, budget: usize) {
        while out.len() < budget {
            let Some(mut f) = self.queue.pop_front() else {
                return;
            };
            if !f.next_chunk(out) {
                self.queue.push_back(f);
            }
        }
    }
}

/// A complete frame received on stream `id`, or a frame refused while it was arriving.
#[derive(Debug)]
pub enum Event {
    /// The whole frame (prefix, header, payload).
    Frame {
        /// Stream id.
        id: u32,
        /// The frame bytes.
        bytes: Bytes,
    },
    /// The frame's prefix was bad or announced more than the cap; the rest of its chunks are discarded.
    Refused {
        /// Stream id.
        id: u32,
        /// Why.
        error: ProtocolError,
    },
}

enum Partial {
    Filling(BytesMut),
    Discarding,
}

/// The receiver's reassembly of chunks into frames.
pub struct Demux {
    streams: HashMap<u32, Partial>,
    max_frame: u64,
    /// Bytes the partial frames hold.
    held: usize,
}

impl Demux {
    /// A demultiplexer refusing frames over `max_frame` bytes.
    pub fn new(max_frame: u64) -> Demux {
        Demux {
            streams: HashMap::new(),
            max_frame,
            held: 0,
        }
    }

    /// Bytes of frames partly received, held until they complete (discarded ones hold none).
    pub fn partial_bytes(&self) -> usize {
        self.held
    }

    /// Frames partly received (their chunks so far held, or discarded).
    pub fn partial_frames(&self) -> usize {
        self.streams.len()
    }

    /// Consumes every whole chunk at the front of `buf`, appending completed frames to `out`. Leaves a partial
    /// chunk in `buf`. Errors are connection-level protocol violations.
    pub fn feed(&mut self, buf: &mut BytesMut, out: &mut Vec<Event>) -> Result<(), ProtocolError> {
        while buf.len() >= CHUNK_HEADER_LEN {
            let id = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes"));
            let word = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
            let (len, last) = ((word & !LAST) as usize, word & LAST != 0);
            if len > CHUNK_MAX {
                return Err(ProtocolError::BadPayload(format!(
                    "tcp chunk of {len} bytes on stream {id}, the maximum is {CHUNK_MAX}"
                )));
            }
            if buf.len() < CHUNK_HEADER_LEN + len {
                buf.reserve(CHUNK_HEADER_LEN + len - buf.len());
                return Ok(());
            }
            buf.advance(CHUNK_HEADER_LEN);
            let body = buf.split_to(len);
            self.chunk(id, body, last, out)?;
        }
        Ok(())
    }

    fn chunk(
        &mut self,
        id: u32,
        body: BytesMut,
        last: bool,
        out: &mut Vec<Event>,
    ) -> Result<(), ProtocolError> {
        let partial = match self.streams.remove(&id) {
            Some(p) => {
                if let Partial::Filling(acc) = &p {
                    self.held -= acc.len();
                }
                p
            }
            None if last => {
                // The common case: a whole frame in one chunk, handed out without a copy.
                out.push(match self.check_prefix(&body) {
                    Err(error) => Event::Refused { id, error },
                    Ok(()) => Event::Frame {
                        id,
                        bytes: body.freeze(),
                    },
                });
                return Ok(());
            }
            None => {
                if self.streams.len() >= MAX_PARTIAL_STREAMS {
                    return Err(ProtocolError::BadPayload(format!(
                        "more than {MAX_PARTIAL_STREAMS} frames arriving at once on one tcp connection"
                    )));
                }
                Partial::Filling(BytesMut::new())
            }
        };
        let next = match partial {
            Partial::Discarding => Partial::Discarding,
            Partial::Filling(mut acc) => {
                let had_prefix = acc.len() >= PREFIX_LEN;
                if acc.is_empty() {
                    acc = body;
                } else {
                    acc.extend_from_slice(&body);
                }
                let checked = if had_prefix {
                    Ok(())
                } else {
                    self.check_prefix(&acc)
                };
                match checked {
                    Err(error) => {
                        out.push(Event::Refused { id, error });
                        Partial::Discarding
                    }
                    Ok(()) if acc.len() as u64 > self.max_frame => {
                        out.push(Event::Refused {
                            id,
                            error: ProtocolError::FrameTooLarge {
                                size: acc.len() as u64,
                                cap: self.max_frame,
                            },
                        });
                        Partial::Discarding
                    }
                    Ok(()) if last => {
                        out.push(Event::Frame {
                            id,
                            bytes: acc.freeze(),
                        });
                        return Ok(());
                    }
                    Ok(()) => Partial::Filling(acc),
                }
            }
        };
        if !last {
            if let Partial::Filling(acc) = &next {
                self.held += acc.len();
            }
            self.streams.insert(id, next);
        }
        Ok(())
    }

    /// Checks the frame prefix once its 12 bytes are in, so an oversized frame is refused before it is buffered.
    fn check_prefix(&self, acc: &[u8]) -> Result<(), ProtocolError> {
        match acc.get(..PREFIX_LEN) {
            Some(p) => {
                frame::parse_prefix(p.try_into().expect("12 bytes"), self.max_frame).map(drop)
            }
            None => Ok(()),
        }
    }
}

/// Splits a complete frame into its decoded header and its payload (a slice of `bytes`, no copy).
pub fn split_frame<H: serde::de::DeserializeOwned>(
    bytes: Bytes,
    max_frame: u64,
) -> Result<(H, Bytes), ProtocolError> {
    match frame::decode_frame::<H>(&bytes, max_frame)? {
        Some((header, range, used)) if used == bytes.len() => Ok((header, bytes.slice(range))),
        Some((_, _, used)) => Err(ProtocolError::BadPayload(format!(
            "{} bytes after a {used}-byte frame",
            bytes.len() - used
        ))),
        None => {
            let expected = match bytes.get(..PREFIX_LEN) {
                Some(p) => {
                    frame::parse_prefix(p.try_into().expect("12 bytes"), max_frame)?.body_len()
                        + PREFIX_LEN
                }
                None => PREFIX_LEN,
            };
            Err(ProtocolError::Truncated {
                got: bytes.len(),
                expected,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::message::Request;
    use crate::Encoding;

    fn frame_of(n: usize) -> (Bytes, Bytes) {
        let req = Request::Pull {
            epoch: 1,
            encoding: Encoding::F16,
            tables: vec![],
        };
        let mut head = Vec::new();
        frame::encode_head(&req, n, &mut head).unwrap();
        let payload: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
        (Bytes::from(head), Bytes::from(payload))
    }

    fn roundtrip(sizes: &[usize], feed_step: usize) -> Vec<(u32, Bytes)> {
        let mut s = Scheduler::default();
        for (i, &n) in sizes.iter().enumerate() {
            let (h, p) = frame_of(n);
            s.push(Outgoing::new(i as u32 + 10, h, p));
        }
        let mut wire = Vec::new();
        while !s.is_empty() {
            let budget = wire.len() + 100_000;
            s.fill(&mut wire, budget);
        }
        let mut d = Demux::new(1 << 30);
        let (mut buf, mut events) = (BytesMut::new(), Vec::new());
        for piece in wire.chunks(feed_step) {
            buf.extend_from_slice(piece);
            d.feed(&mut buf, &mut events).unwrap();
        }
        assert!(buf.is_empty());
        events
            .into_iter()
            .map(|e| match e {
                Event::Frame { id, bytes } => (id, bytes),
                Event::Refused { error, .. } => panic!("{error}"),
            })
            .collect()
    }

    #[test]
    fn frames_survive_chunking_and_any_read_sizes() {
        let sizes = [0, 5, CHUNK_MAX, CHUNK_MAX * 3 + 17, 300];
        for step in [1, 7, 4096, 1 << 20] {
            let got = roundtrip(&sizes, step);
            assert_eq!(got.len(), sizes.len());
            for (id, bytes) in got {
                let n = sizes[(id - 10) as usize];
                let (h, p) = frame_of(n);
                let (_, payload) = split_frame::<Request>(bytes.clone(), 1 << 30).unwrap();
                assert_eq!(payload, p, "stream {id}");
                assert_eq!(&bytes[..h.len()], &h[..]);
            }
        }
    }

    /// The demultiplexer counts the bytes of frames still arriving (what a server holds for them), and
    /// none once they complete or are refused.
    #[test]
    fn partial_bytes_count_frames_still_arriving() {
        let mut s = Scheduler::default();
        for id in [1, 2] {
            let (h, p) = frame_of(3 * CHUNK_MAX);
            s.push(Outgoing::new(id, h, p));
        }
        let mut wire = Vec::new();
        s.fill(&mut wire, 1);
        let first = wire.len();
        s.fill(&mut wire, first + 1);
        let mut d = Demux::new(1 << 30);
        let (mut buf, mut events) = (BytesMut::from(&wire[..]), Vec::new());
        d.feed(&mut buf, &mut events).unwrap();
        assert!(events.is_empty());
        assert_eq!((d.partial_frames(), d.partial_bytes()), (2, 2 * CHUNK_MAX));
        while !s.is_empty() {
            let mut more = Vec::new();
            s.fill(&mut more, 1);
            buf.extend_from_slice(&more);
            d.feed(&mut buf, &mut events).unwrap();
        }
        assert_eq!(events.len(), 2);
        assert_eq!((d.partial_frames(), d.partial_bytes()), (0, 0));
    }

    #[test]
    fn a_small_frame_overtakes_a_large_one() {
        // A 1 MB frame queued first, then a small one: the small one completes after one chunk of the large.
        let got = roundtrip(&[1 << 20, 10], 1 << 16);
        assert_eq!(got[0].0, 11, "the small frame should complete first");
    }

    #[test]
    fn oversized_frame_is_refused_from_its_prefix_and_skipped() {
        let mut s = Scheduler::default();
        let (h, p) = frame_of(200_000);
        s.push(Outgoing::new(1, h, p));
        let (h, p) = frame_of(10);
        s.push(Outgoing::new(2, h, p));
        let mut wire = Vec::new();
        while !s.is_empty() {
            let budget = wire.len() + (1 << 20);
            s.fill(&mut wire, budget);
        }
        let mut d = Demux::new(100_000);
        let (mut buf, mut events) = (BytesMut::from(&wire[..]), Vec::new());
        d.feed(&mut buf, &mut events).unwrap();
        assert_eq!(events.len(), 2);
        assert!(
            matches!(
                &events[0],
                Event::Refused {
                    id: 1,
                    error: ProtocolError::FrameTooLarge { .. }
                }
            ),
            "{events:?}"
        );
        assert!(matches!(&events[1], Event::Frame { id: 2, .. }));
    }

    #[test]
    fn bad_chunk_length_is_a_connection_error() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&1u32.to_le_bytes());
        buf.extend_from_slice(&(CHUNK_MAX as u32 + 1).to_le_bytes());
        let err = Demux::new(1 << 20)
            .feed(&mut buf, &mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("65537"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut d = Demux::new(1 << 16);
            let mut buf = BytesMut::from(&bytes[..]);
            let _ = d.feed(&mut buf, &mut Vec::new());
        }
    }
}
