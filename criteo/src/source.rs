//! Input files: expanding directories, opening plain, gzip, zstd or columnar files, and splitting text into
//! lines.
//!
//! The format is detected by content, not by name: gzip by its magic bytes `1f 8b` (decoded with
//! `MultiGzDecoder`, since `pigz` and concatenated `day_N.gz` parts hold several members), zstd by
//! `28 b5 2f fd` (the streaming decoder, which reads concatenated frames too), preprocessed shards by
//! `DLRMCOL\0` (memory-mapped, see [`super::columnar`]), anything else is plain text.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::bufread::MultiGzDecoder;
use memchr::memchr;
use memmap2::Mmap;

use super::columnar::{Shard, MAGIC};
use super::error::ReadError;
use super::lines::{Next, Source, MAX_LINE};

/// Read buffer size, both for the file and for decompressed text.
const BUF_SIZE: usize = 1 << 20;

/// Expands `paths` into the files to read, in order: a file is itself, a directory is its files (not
/// subdirectories, not names starting with `.`) sorted by name.
///
/// Errors name the path that is missing or unreadable, or the directory that holds no files.
pub fn input_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ReadError> {
    let mut files = Vec::new();
    for path in paths {
        let open_err = |source| ReadError::Open {
            path: path.clone(),
            source,
        };
        if !fs::metadata(path).map_err(open_err)?.is_dir() {
            files.push(path.clone());
            continue;
        }
        let mut dir_files = Vec::new();
        for entry in fs::read_dir(path).map_err(open_err)? {
            let entry = entry.map_err(open_err)?;
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if !hidden && fs::metadata(entry.path()).map_err(open_err)?.is_file() {
                dir_files.push(entry.path());
            }
        }
        if dir_files.is_empty() {
            return Err(ReadError::EmptyDirectory { path: path.clone() });
        }
        dir_files.sort();
        files.extend(dir_files);
    }
    Ok(files)
}

/// An opened input file.
pub(crate) enum Input {
    /// Text (plain or decompressed on the fly), line by line.
    Text(LineReader),
    /// A preprocessed shard, mapped (not yet checked: see [`Shard::parse`]).
    Columnar(Mmap),
}

/// Opens `path`, detecting gzip, zstd and columnar shards by their first bytes.
pub(crate) fn open(path: &Path) -> Result<Input, ReadError> {
    let open_err = |source| ReadError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(open_err)?;
    let mut head = Vec::with_capacity(MAGIC.len());
    (&mut file)
        .take(MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(open_err)?;
    if Shard::is_shard(&head) {
        // SAFETY: the map is read-only and private to this reader; a shard changed or truncated by another
        // process while mapped is outside the contract (shards are written once, then renamed into place).
        let map = unsafe { Mmap::map(&file) }.map_err(open_err)?;
        return Ok(Input::Columnar(map));
    }
    // The bytes already read go in front of the rest instead of seeking back, so a pipe or FIFO (which
    // cannot seek) reads like a file.
    let (gzip, zstd) = (
        head.starts_with(&[0x1f, 0x8b]),
        head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]),
    );
    let stream = io::Cursor::new(head).chain(file);
    let inner: Box<dyn Read + Send> = if gzip {
        Box::new(MultiGzDecoder::new(BufReader::with_capacity(
            BUF_SIZE, stream,
        )))
    } else if zstd {
        let buffered = BufReader::with_capacity(BUF_SIZE, stream);
        Box::new(zstd::stream::read::Decoder::with_buffer(buffered).map_err(open_err)?)
    } else {
        Box::new(stream) // LineReader buffers it
    };
    Ok(Input::Text(LineReader::new(inner)))
}

/// The rows in `paths` (directories expanded): lines of text files (a CSV header counts as one; bad lines
/// count too), rows of columnar shards. For sizing a pass (the learning-rate schedule), not for parsing.
pub fn count_rows(paths: &[PathBuf]) -> Result<u64, ReadError> {
    let mut rows = 0;
    for path in input_files(paths)? {
        match open(&path)? {
            Input::Columnar(map) => {
                let shard = Shard::parse(&map).map_err(|reason| ReadError::Corrupt {
                    path: path.clone(),
                    reason,
                })?;
                rows += shard.rows() as u64;
            }
            Input::Text(mut lines) => {
                let mut n = 0;
                while lines
                    .next_line()
                    .map_err(|source| ReadError::Read {
                        path: path.clone(),
                        line: n,
                        source,
                    })?
                    .is_some()
                {
                    n += 1;
                }
                rows += n;
            }
        }
    }
    Ok(rows)
}

/// A text file (plain or decompressed) read to its end, as a [`Source`].
pub(crate) struct TextFile {
    name: String,
    lines: LineReader,
}

impl TextFile {
    /// The lines of `lines`, read from `path`.
    pub(crate) fn new(path: &Path, lines: LineReader) -> TextFile {
        TextFile {
            name: path.display().to_string(),
            lines,
        }
    }
}

impl Source for TextFile {
    fn name(&self) -> &str {
        &self.name
    }

    fn next_line(&mut self) -> io::Result<Next<'_>> {
        Ok(match self.lines.next_line()? {
            Some((line, cut)) => Next::Line(line, cut),
            None => Next::End,
        })
    }
}

/// Splits a byte stream into lines without copying those that lie within one buffer fill.
pub(crate) struct LineReader {
    inner: BufReader<Box<dyn Read + Send>>,
    /// Bytes of the last returned line (and its `\n`) still to consume from `inner`.
    pending: usize,
    /// The line being assembled when it spans buffer fills.
    spill: Vec<u8>,
}

impl LineReader {
    /// Reads lines from `inner`.
    pub(crate) fn new(inner: Box<dyn Read + Send>) -> Self {
        LineReader {
            inner: BufReader::with_capacity(BUF_SIZE, inner),
            pending: 0,
            spill: Vec::new(),
        }
    }

    /// The next line without its `\n`, and whether it was cut at [`MAX_LINE`] bytes; `None` at the end.
    /// A last line without a `\n` is still a line.
    pub(crate) fn next_line(&mut self) -> io::Result<Option<(&[u8], bool)>> {
        self.inner.consume(std::mem::take(&mut self.pending));
        self.spill.clear();
        let mut cut = false;
        loop {
            let avail = self.inner.fill_buf()?;
            if avail.is_empty() {
                return Ok((!self.spill.is_empty() || cut).then_some((&self.spill[..], cut)));
            }
            let (end, found) = match memchr(b'\n', avail) {
                Some(i) => (i, true),
                None => (avail.len(), false),
            };
            if found && self.spill.is_empty() && !cut {
                // The common case: the whole line is in the buffer; consume it on the next call.
                self.pending = end + 1;
                return Ok(Some((&self.inner.buffer()[..end], false)));
            }
            let room = MAX_LINE.saturating_sub(self.spill.len());
            cut |= end > room;
            self.spill.extend_from_slice(&avail[..end.min(room)]);
            self.inner.consume(end + usize::from(found));
            if found {
                return Ok(Some((&self.spill[..], cut)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(data: &[u8], buf: usize) -> Vec<(Vec<u8>, bool)> {
        let inner: Box<dyn Read + Send> = Box::new(io::Cursor::new(data.to_vec()));
        let mut reader = LineReader {
            inner: BufReader::with_capacity(buf, inner),
            pending: 0,
            spill: Vec::new(),
        };
        let mut out = Vec::new();
        while let Some((line, cut)) = reader.next_line().unwrap() {
            out.push((line.to_vec(), cut));
        }
        out
    }

    #[test]
    fn splits_lines_across_buffer_fills() {
        let data = b"abc\n\nde\r\nfghijklmnop\nlast";
        let want: Vec<(Vec<u8>, bool)> = ["abc", "", "de\r", "fghijklmnop", "last"]
            .iter()
            .map(|s| (s.as_bytes().to_vec(), false))
            .collect();
        for buf in [1, 2, 3, 4, 7, 64] {
            assert_eq!(lines(data, buf), want, "buffer {buf}");
        }
        assert_eq!(lines(b"", 4), []);
        assert_eq!(lines(b"\n", 4), [(vec![], false)]);
    }

    #[test]
    fn cuts_overlong_lines() {
        let mut data = vec![b'x'; MAX_LINE + 10];
        data.extend_from_slice(b"\nok\n");
        data.extend(vec![b'y'; MAX_LINE + 1]);
        let got = lines(&data, 4096);
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].0.len(), got[0].1), (MAX_LINE, true));
        assert_eq!(got[1], (b"ok".to_vec(), false));
        assert_eq!((got[2].0.len(), got[2].1), (MAX_LINE, true));
        let exact = vec![b'z'; MAX_LINE];
        assert_eq!(lines(&exact, 4096), [(exact.clone(), false)]);
    }

    #[test]
    fn counts_rows_of_plain_and_gzip_files() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.tsv"), b"1\tx\n0\ty\n1\tz").unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"0\n1\n0\n1\n").unwrap();
        std::fs::write(dir.path().join("b.tsv.gz"), gz.finish().unwrap()).unwrap();
        assert_eq!(count_rows(&[dir.path().join("a.tsv")]).unwrap(), 3);
        assert_eq!(count_rows(&[dir.path().to_path_buf()]).unwrap(), 7);
        let missing = count_rows(&[dir.path().join("nope.tsv")]).unwrap_err();
        assert!(missing.to_string().contains("nope.tsv"), "{missing}");
    }
}
