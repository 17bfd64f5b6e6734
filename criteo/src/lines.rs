//! Where the reader's text lines come from: the [`Source`] trait, what it answers ([`Next`]), the handle that
//! ends a streaming read ([`StreamEnd`]), and the line splitter of byte streams that arrive in pieces.
//!
//! Three sources exist: a text file (plain, gzip or zstd) read to its end, [`crate::Follow`] (a file that
//! keeps growing, read as it grows) and [`crate::Piped`] (standard input, or any byte stream, read on a
//! thread of its own). Another transport (a Kafka partition, say) plugs in by implementing [`Source`]:
//! hand out the lines of its messages with [`Next::Line`], answer [`Next::Idle`] after waiting a little
//! when nothing new has arrived (so the reader hands out the rows it holds instead of waiting for a full
//! batch), and [`Next::End`] when the stream is closed.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use memchr::memchr;

/// Lines longer than this are returned cut, and flagged (a real line is under 1 KiB; a longer one is a
/// corrupt file, and buffering it whole could exhaust memory).
pub(crate) const MAX_LINE: usize = 64 << 10;

/// What a [`Source`] answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// A complete line without its `\n`, and whether it was cut at [`MAX_LINE`] bytes (a real line is
    /// under 1 KiB; the rest of a longer one is dropped).
    Line(&'a [u8], bool),
    /// No complete line arrived within the source's wait: the reader hands out its short batch (a stream's
    /// rows are trained as they come, not when a batch fills), checks whether it should end, and asks again.
    Idle,
    /// The stream is over.
    End,
}

/// Lines of text, one after the other.
///
/// A source may block while it waits for data, but not for long: it answers [`Next::Idle`] after a short
/// wait (tens of milliseconds), so that the reader can hand out what it holds and notice [`StreamEnd`].
/// A line is handed out only once its `\n` has arrived (or the stream has ended: a file's or a pipe's last
/// line needs none).
pub trait Source: Send {
    /// What the source reads, for messages: a path, `stdin`, a topic and partition.
    fn name(&self) -> &str;
    /// The next line, [`Next::Idle`] or [`Next::End`]; errors end the read.
    fn next_line(&mut self) -> io::Result<Next<'_>>;
}

/// Ends a read early and cleanly: the reader takes no more lines, hands out the rows it holds as a last
/// short batch, and ends as if the input had. Cloned handles end the same read. A stream that never ends
/// by itself (`--follow`) ends this way, on the binary's shutdown signal.
#[derive(Debug, Clone, Default)]
pub struct StreamEnd(Arc<AtomicBool>);

impl StreamEnd {
    /// A handle that has not ended.
    pub fn new() -> StreamEnd {
        StreamEnd::default()
    }

    /// Ends the read (idempotent; takes effect at the reader's next line or idle answer).
    pub fn end(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`end`](Self::end) was called.
    pub fn is_ended(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Two handles are equal when they end the same read.
impl PartialEq for StreamEnd {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StreamEnd {}

/// Splits bytes that arrive in pieces into lines: complete lines are handed out, a partial last line waits
/// for the rest. A line longer than [`MAX_LINE`] is handed out cut at that length (flagged), and its rest is
/// dropped as it arrives, so memory stays bounded whatever the input.
#[derive(Debug, Default)]
pub(crate) struct Pieces {
    /// Bytes `start..end` are pending; `end..` is room for the next read.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Pending bytes from `start` already searched for a `\n` (none there).
    scanned: usize,
    /// Dropping the rest of a cut line up to its `\n`.
    dropping: bool,
}

/// The room a read gets at least.
const READ_SIZE: usize = 256 << 10;

impl Pieces {
    /// The next complete line and whether it was cut; `None` until its `\n` arrives.
    #[cfg(test)]
    pub(crate) fn next_line(&mut self) -> Option<(&[u8], bool)> {
        let (range, cut) = self.find()?;
        Some((&self.buf[range], cut))
    }

    /// Like [`next_line`](Self::next_line), as the line's range in [`line`](Self::line) (valid until the
    /// next read), which a caller returning the line from a loop needs.
    pub(crate) fn find(&mut self) -> Option<(Range<usize>, bool)> {
        loop {
            let pending = &self.buf[self.start..self.end];
            if self.dropping {
                match memchr(b'\n', pending) {
                    Some(i) => {
                        self.start += i + 1;
                        self.dropping = false;
                        continue;
                    }
                    None => {
                        self.start = self.end;
                        return None;
                    }
                }
            }
            let line_start = self.start;
            if let Some(i) = memchr(b'\n', &pending[self.scanned..]) {
                let line_end = line_start + self.scanned + i;
                self.start = line_end + 1;
                self.scanned = 0;
                return Some((line_start..line_end, false));
            }
            self.scanned = pending.len();
            if pending.len() > MAX_LINE {
                // Longer than any line may be, whatever follows: hand out its head, drop the rest.
                self.start += MAX_LINE;
                self.scanned = 0;
                self.dropping = true;
                return Some((line_start..line_start + MAX_LINE, true));
            }
            return None;
        }
    }

    /// The bytes of a range [`find`](Self::find) returned.
    pub(crate) fn line(&self, range: Range<usize>) -> &[u8] {
        &self.buf[range]
    }

    /// The pending bytes (a partial line).
    pub(crate) fn pending_bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// The partial line waiting for its `\n` (for the end of a stream, whose last line needs none), as a
    /// range for [`line`](Self::line).
    pub(crate) fn take_rest(&mut self) -> Option<Range<usize>> {
        let (start, end) = (self.start, self.end);
        self.start = end;
        self.scanned = 0;
        let dropping = std::mem::take(&mut self.dropping);
        (end > start && !dropping).then_some(start..end)
    }

    /// Pending bytes (a partial line).
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.end - self.start
    }

    /// Reads once with `read` into the room after the pending bytes (compacting first); returns what `read`
    /// returned (0: nothing).
    pub(crate) fn read_with(
        &mut self,
        read: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < READ_SIZE {
            self.buf.resize(self.end + READ_SIZE, 0);
        }
        let n = read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }

    /// Appends `bytes`.
    pub(crate) fn append(&mut self, bytes: &[u8]) {
        self.read_with(|room| {
            let n = bytes.len().min(room.len());
            room[..n].copy_from_slice(&bytes[..n]);
            Ok(n)
        })
        .expect("copying cannot fail");
        if bytes.len() > READ_SIZE {
            // Rare (pieces are at most READ_SIZE): the rest in further rounds.
            let mut rest = &bytes[READ_SIZE..];
            while !rest.is_empty() {
                let take = rest.len().min(READ_SIZE);
                self.read_with(|room| {
                    room[..take].copy_from_slice(&rest[..take]);
                    Ok(take)
                })
                .expect("copying cannot fail");
                rest = &rest[take..];
            }
        }
    }
}

/// Refuses a stream's first bytes when they are not text: gzip, zstd or a columnar shard cannot be read as
/// they arrive.
pub(crate) fn check_text(name: &str, head: &[u8]) -> io::Result<()> {
    let kind = if head.starts_with(&[0x1f, 0x8b]) {
        "gzip"
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        "zstd"
    } else if head.starts_with(&super::columnar::MAGIC) {
        "a columnar shard"
    } else {
        return Ok(());
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{name} holds {kind}: a stream is read as plain text lines (decompress it into the stream)"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(p: &mut Pieces) -> Vec<(Vec<u8>, bool)> {
        std::iter::from_fn(|| p.next_line().map(|(l, c)| (l.to_vec(), c))).collect()
    }

    #[test]
    fn a_partial_line_waits_for_its_newline() {
        let mut p = Pieces::default();
        p.append(b"ab");
        assert_eq!(drain(&mut p), []);
        p.append(b"c\nde");
        assert_eq!(drain(&mut p), [(b"abc".to_vec(), false)]);
        assert_eq!(p.pending(), 2);
        p.append(b"f\n\ng\n");
        let got = drain(&mut p);
        assert_eq!(
            got,
            [
                (b"def".to_vec(), false),
                (vec![], false),
                (b"g".to_vec(), false)
            ]
        );
        p.append(b"tail");
        let rest = p.take_rest().unwrap();
        assert_eq!(p.line(rest), b"tail");
        assert_eq!(p.take_rest(), None);
    }

    #[test]
    fn an_overlong_line_is_cut_and_its_rest_dropped() {
        let mut p = Pieces::default();
        let exact = vec![b'z'; MAX_LINE];
        p.append(&exact);
        assert_eq!(drain(&mut p), []);
        p.append(b"\n");
        assert_eq!(drain(&mut p), [(exact, false)]);
        p.append(&vec![b'x'; MAX_LINE + 5]);
        let got = drain(&mut p);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0.len(), got[0].1), (MAX_LINE, true));
        p.append(&vec![b'x'; READ_SIZE + 10]);
        assert_eq!(drain(&mut p), []);
        p.append(b"xx\nok\n");
        assert_eq!(drain(&mut p), [(b"ok".to_vec(), false)]);
        assert!(p.buf.len() < 2 * (MAX_LINE + 2 * READ_SIZE), "bounded");
    }

    #[test]
    fn stream_ends_compare_by_identity() {
        let a = StreamEnd::new();
        let b = a.clone();
        assert_eq!(a, b);
        assert_ne!(a, StreamEnd::new());
        b.end();
        assert!(a.is_ended());
    }
}
