//! Output encodings. Chunks are encoded on worker threads ([`Encoding::encode`]) and written in order by one
//! [`Sink`], so compression runs in parallel too.
//!
//! Gzip output is one gzip member, written the way pigz does it: each chunk is an independent raw deflate
//! stream ended with a sync flush (byte-aligned, not final), the member ends with an empty final block, and
//! the trailer CRC-32 is combined from the per-chunk CRCs. Readers see an ordinary single-member `.gz`
//! (`flate2::read::GzDecoder`, `gzip -d`), and the bytes depend only on the chunk contents, not on the
//! thread count.

use std::io::{self, Write};
use std::path::Path;

use flate2::{Compress, Compression, Crc, FlushCompress};

/// Gzip level used for `.gz` paths: fast, since the generator should not be bound by compression.
pub const DEFAULT_GZIP_LEVEL: u32 = 1;

/// How a stream of chunks is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Bytes as they are.
    Plain,
    /// One gzip member at the given level (0-9).
    Gzip {
        /// Deflate level.
        level: u32,
    },
}

impl Encoding {
    /// Gzip at [`DEFAULT_GZIP_LEVEL`] if `path` ends in `.gz`, plain otherwise.
    pub fn for_path(path: &Path) -> Self {
        if path.extension().is_some_and(|e| e == "gz") {
            Encoding::Gzip {
                level: DEFAULT_GZIP_LEVEL,
            }
        } else {
            Encoding::Plain
        }
    }

    /// Encodes one chunk; safe to call from any thread.
    pub fn encode(&self, bytes: Vec<u8>) -> io::Result<Piece> {
        match *self {
            Encoding::Plain => Ok(Piece { bytes, crc: None }),
            Encoding::Gzip { level } => {
                let mut crc = Crc::new();
                crc.update(&bytes);
                let deflated = deflate(&bytes, level, FlushCompress::Sync)?;
                Ok(Piece {
                    bytes: deflated,
                    crc: Some(crc),
                })
            }
        }
    }
}

/// One encoded chunk, ready for [`Sink::write_piece`].
#[derive(Debug)]
pub struct Piece {
    bytes: Vec<u8>,
    /// CRC of the uncompressed bytes, for gzip.
    crc: Option<Crc>,
}

/// Writes encoded pieces in order to `W`, with the gzip header and trailer when needed. Call
/// [`Sink::finish`] at the end: dropping a gzip sink leaves a truncated file.
#[derive(Debug)]
pub struct Sink<W: Write> {
    inner: W,
    encoding: Encoding,
    crc: Crc,
}

impl<W: Write> Sink<W> {
    /// A sink over `inner`; writes the gzip header now if gzip.
    pub fn new(mut inner: W, encoding: Encoding) -> io::Result<Self> {
        if let Encoding::Gzip { level } = encoding {
            // RFC 1952: magic, deflate, no flags, mtime 0 (keeps output reproducible), extra flags, OS unknown.
            let xfl = match level {
                0..=1 => 4,
                9 => 2,
                _ => 0,
            };
            inner.write_all(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, xfl, 255])?;
        }
        Ok(Sink {
            inner,
            encoding,
            crc: Crc::new(),
        })
    }

    /// The encoding pieces for this sink must be made with.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// Appends one piece made by this sink's [`Encoding`].
    pub fn write_piece(&mut self, piece: &Piece) -> io::Result<()> {
        self.inner.write_all(&piece.bytes)?;
        if let Some(crc) = &piece.crc {
            self.crc.combine(crc);
        }
        Ok(())
    }

    /// Ends the stream (final deflate block and gzip trailer), flushes and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        if let Encoding::Gzip { level } = self.encoding {
            let end = deflate(&[], level, FlushCompress::Finish)?;
            self.inner.write_all(&end)?;
            self.inner.write_all(&self.crc.sum().to_le_bytes())?;
            // ISIZE is the length modulo 2^32, which is what `amount` holds.
            self.inner.write_all(&self.crc.amount().to_le_bytes())?;
        }
        self.inner.flush()?;
        Ok(self.inner)
    }
}

/// Raw deflate of `input` as an independent stream ended by `flush`.
fn deflate(input: &[u8], level: u32, flush: FlushCompress) -> io::Result<Vec<u8>> {
    let mut c = Compress::new(Compression::new(level), false);
    let mut out = Vec::with_capacity(input.len() / 2 + 1024);
    loop {
        let consumed = c.total_in() as usize;
        c.compress_vec(&input[consumed..], &mut out, flush)
            .map_err(io::Error::other)?;
        // zlib semantics: the flush is complete once all input is taken and output space is left over.
        if c.total_in() as usize == input.len() && out.len() < out.capacity() {
            return Ok(out);
        }
        out.reserve(out.capacity().max(1024));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn encode_all(chunks: &[&[u8]], encoding: Encoding) -> Vec<u8> {
        let mut sink = Sink::new(Vec::new(), encoding).unwrap();
        for c in chunks {
            sink.write_piece(&encoding.encode(c.to_vec()).unwrap())
                .unwrap();
        }
        sink.finish().unwrap()
    }

    #[test]
    fn gzip_pieces_form_one_member() {
        let big: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let chunks: [&[u8]; 4] = [b"hello\t", b"", &big, b"world\n"];
        for level in [0, 1, 6, 9] {
            let gz = encode_all(&chunks, Encoding::Gzip { level });
            // GzDecoder reads only the first member, so this checks there is exactly one.
            let mut text = Vec::new();
            flate2::read::GzDecoder::new(&gz[..])
                .read_to_end(&mut text)
                .unwrap();
            assert_eq!(text, chunks.concat());
        }
    }

    #[test]
    fn empty_gzip_is_valid() {
        let gz = encode_all(&[], Encoding::Gzip { level: 1 });
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut text)
            .unwrap();
        assert!(text.is_empty());
    }

    #[test]
    fn plain_is_identity_and_path_picks_encoding() {
        assert_eq!(encode_all(&[b"ab", b"c"], Encoding::Plain), b"abc");
        assert_eq!(
            Encoding::for_path(Path::new("x/train.txt")),
            Encoding::Plain
        );
        assert!(matches!(
            Encoding::for_path(Path::new("train.txt.gz")),
            Encoding::Gzip { .. }
        ));
    }
}
