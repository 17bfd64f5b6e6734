//! How many rows a pass will train, for the progress lines' percentage and ETA: exact for columnar shards
//! (their headers count them), estimated for plain text (the files' sizes over the mean length of the first
//! MiB's lines), unknown for compressed text and streams. Costs a `stat` per file and one 1 MiB read.

use std::io::Read;
use std::path::Path;

use crate::criteo::{self, ReaderConfig, Shard};

/// Bytes of a text file sampled for its mean line length.
const SAMPLE: u64 = 1 << 20;

/// Rows this rank's pass will train: the rows of `cfg`'s data (this rank's share), less the `skip_batches`
/// a resumed run skips, at most `steps_left` batches when that is not 0; `None` when unknown.
pub(super) fn expected_rows(
    cfg: &ReaderConfig,
    skip_batches: u64,
    steps_left: u64,
    batch_size: usize,
) -> Option<u64> {
    if cfg.is_stream() {
        return None;
    }
    let mut rows = 0u64;
    for path in criteo::input_files(&cfg.paths).ok()? {
        rows += file_rows(&path)?;
    }
    let world = cfg.world.max(1) as u64;
    let mine = rows / world + u64::from((rows % world) > cfg.rank as u64);
    let batch = batch_size.max(1) as u64;
    let mut left = mine.saturating_sub(skip_batches * batch);
    if steps_left > 0 {
        left = left.min(steps_left * batch);
    }
    Some(left)
}

/// The rows of one input file: counted for a shard, estimated for plain text, `None` for compressed text and
/// for anything but a regular file (a FIFO or a device must not be read here: its bytes belong to the reader).
fn file_rows(path: &Path) -> Option<u64> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    let size = meta.len();
    let mut file = std::fs::File::open(path).ok()?;
    let mut head = Vec::new();
    (&mut file).take(SAMPLE).read_to_end(&mut head).ok()?;
    if Shard::is_shard(&head) {
        return criteo::count_rows(&[path.to_path_buf()]).ok();
    }
    let compressed = head.starts_with(&[0x1f, 0x8b]) || head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]);
    if compressed {
        return None;
    }
    let lines = head.iter().filter(|&&b| b == b'\n').count() as u64;
    if size <= head.len() as u64 {
        // Read whole: exact (a last line without a newline counts too).
        return Some(lines + u64::from(!head.is_empty() && head.last() != Some(&b'\n')));
    }
    if lines == 0 {
        return None;
    }
    Some((size as f64 * lines as f64 / head.len() as f64).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(i: usize) -> String {
        format!("{}\t{}\n", i % 2, vec![format!("{i:08x}"); 39].join("\t"))
    }

    #[test]
    fn text_rows_are_exact_when_small_and_close_when_large() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small.tsv");
        std::fs::write(&small, (0..10).map(line).collect::<String>()).unwrap();
        let cfg = ReaderConfig::new([&small], 4);
        assert_eq!(expected_rows(&cfg, 0, 0, 4), Some(10));
        // Rank 1 of 3 takes lines 1, 4, 7; a resumed run skips a batch; a step limit caps it.
        let ranked = ReaderConfig {
            rank: 1,
            world: 3,
            ..cfg.clone()
        };
        assert_eq!(expected_rows(&ranked, 0, 0, 4), Some(3));
        assert_eq!(expected_rows(&cfg, 1, 0, 4), Some(6));
        assert_eq!(expected_rows(&cfg, 0, 2, 4), Some(8));

        let large = dir.path().join("large.tsv");
        let text: String = (0..12_000).map(line).collect();
        assert!(text.len() as u64 > SAMPLE);
        std::fs::write(&large, text).unwrap();
        let n = expected_rows(&ReaderConfig::new([&large], 4), 0, 0, 4).unwrap();
        assert!((11_900..12_100).contains(&n), "{n}");
    }

    #[test]
    fn compressed_text_and_streams_are_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let gz = dir.path().join("a.tsv.gz");
        std::fs::write(&gz, [0x1f, 0x8b, 8, 0]).unwrap();
        assert_eq!(expected_rows(&ReaderConfig::new([&gz], 4), 0, 0, 4), None);
        let stdin = ReaderConfig::new([criteo::STDIN], 4);
        assert_eq!(expected_rows(&stdin, 0, 0, 4), None);
    }

    /// A FIFO's bytes belong to the reader: sampling it would take them (and closing it broke the writer's pipe,
    /// which is how `scripts/k8s/prometheus-check.sh` found this). Opening a FIFO with no writer blocks, so this test would
    /// hang rather than pass if the FIFO were opened.
    #[test]
    fn fifos_are_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("train.fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(expected_rows(&ReaderConfig::new([&fifo], 4), 0, 0, 4), None);
    }
}
