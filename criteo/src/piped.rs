//! [`Piped`]: the lines of a byte stream read on a thread of its own: standard input (`trainer train
//! --train -`), or any [`Read`] (a socket, a pipe from another process).
//!
//! The thread reads pieces into a small bounded queue, so the source can wait for data with a timeout and
//! answer [`Next::Idle`] (a blocking read on a pipe cannot be interrupted). The end of the stream is the end
//! of the input: a last line without `\n` is a line, as in a file. The thread of a stream that never ends
//! stays blocked in its read until the process exits (it holds nothing but the stream).

use std::io::{self, Read};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::lines::{check_text, Next, Pieces, Source};

/// Bytes per read of the stream.
const PIECE: usize = 256 << 10;

/// A byte stream's lines.
#[derive(Debug)]
pub struct Piped {
    name: String,
    rx: Receiver<io::Result<Vec<u8>>>,
    pieces: Pieces,
    poll: Duration,
    /// Nothing has arrived yet (the first piece is checked for compressed data).
    fresh: bool,
    /// The stream ended; its partial last line was handed out.
    ended: bool,
}

impl Piped {
    /// Reads standard input, answering [`Next::Idle`] after `poll` without data.
    pub fn stdin(poll: Duration) -> io::Result<Piped> {
        Piped::spawn("stdin", io::stdin(), poll)
    }

    /// Reads `stream` on a thread named after `name`.
    pub fn spawn(
        name: &str,
        mut stream: impl Read + Send + 'static,
        poll: Duration,
    ) -> io::Result<Piped> {
        let (tx, rx) = crossbeam_channel::bounded(4);
        std::thread::Builder::new()
            .name(format!("criteo-pipe-{name}"))
            .spawn(move || loop {
                let mut piece = vec![0; PIECE];
                let item = match stream.read(&mut piece) {
                    Ok(0) => return,
                    Ok(n) => {
                        piece.truncate(n);
                        Ok(piece)
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let failed = item.is_err();
                if tx.send(item).is_err() || failed {
                    return;
                }
            })?;
        Ok(Piped {
            name: name.to_string(),
            rx,
            pieces: Pieces::default(),
            poll,
            fresh: true,
            ended: false,
        })
    }
}

impl Source for Piped {
    fn name(&self) -> &str {
        &self.name
    }

    fn next_line(&mut self) -> io::Result<Next<'_>> {
        loop {
            if let Some((range, cut)) = self.pieces.find() {
                return Ok(Next::Line(self.pieces.line(range), cut));
            }
            if self.ended {
                return Ok(Next::End);
            }
            match self.rx.recv_timeout(self.poll) {
                Ok(piece) => {
                    let piece = piece?;
                    if std::mem::take(&mut self.fresh) {
                        check_text(&self.name, &piece)?;
                    }
                    self.pieces.append(&piece);
                }
                Err(RecvTimeoutError::Timeout) => return Ok(Next::Idle),
                Err(RecvTimeoutError::Disconnected) => {
                    self.ended = true;
                    if let Some(rest) = self.pieces.take_rest() {
                        return Ok(Next::Line(self.pieces.line(rest), false));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// The next answer that is not `Idle` (idle answers come every poll while the writer is slow).
    fn next(p: &mut Piped) -> Option<String> {
        loop {
            match p.next_line().unwrap() {
                Next::Line(l, _) => return Some(String::from_utf8(l.to_vec()).unwrap()),
                Next::Idle => continue,
                Next::End => return None,
            }
        }
    }

    #[test]
    fn reads_a_pipe_in_pieces_to_its_end() {
        let (reader, mut writer) = io::pipe().unwrap();
        let mut p = Piped::spawn("test", reader, Duration::from_millis(1)).unwrap();
        assert_eq!(p.name(), "test");
        writer.write_all(b"l1\nl").unwrap();
        assert_eq!(next(&mut p).as_deref(), Some("l1"));
        // The partial line is not handed out while the writer may still complete it: only idle answers.
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let writer_thread = std::thread::spawn(move || {
            done_rx.recv().unwrap();
            writer.write_all(b"2\nlast").unwrap(); // dropped: the end of the stream
        });
        assert_eq!(p.next_line().unwrap(), Next::Idle);
        done_tx.send(()).unwrap();
        assert_eq!(next(&mut p).as_deref(), Some("l2"));
        assert_eq!(next(&mut p).as_deref(), Some("last"));
        assert_eq!(next(&mut p), None);
        assert_eq!(p.next_line().unwrap(), Next::End);
        writer_thread.join().unwrap();
    }

    #[test]
    fn refuses_compressed_input() {
        let data: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd, 0, 0];
        let mut p = Piped::spawn("stdin", data, Duration::from_millis(1)).unwrap();
        // The reader thread may not have looked at the bytes within the 1 ms wait (a busy machine): `Idle`
        // until it has, then the error.
        let err = loop {
            match p.next_line() {
                Ok(Next::Idle) => continue,
                Ok(other) => panic!("{other:?} from a zstd stream"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains("stdin holds zstd"), "{err}");
    }
}
