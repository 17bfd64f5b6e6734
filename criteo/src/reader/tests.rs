//! The reader on streams: a followed file read as it grows, split among ranks, ended by [`StreamEnd`].
//! Deadlines here are timeouts for a broken reader, never a stand-in for a condition.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

/// A full row whose label is `i % 2` and whose I1 is `i`.
fn line(i: u64) -> String {
    let ints = vec![i.to_string(); 13].join("\t");
    let cats = vec![format!("{:08x}", i % 7); 26].join("\t");
    format!("{}\t{ints}\t{cats}\n", i % 2)
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// The I1 values of `batch`'s rows (dense features are `ln(1 + x)`).
fn ids(batch: &Batch) -> Vec<u64> {
    (0..batch.len)
        .map(|r| (batch.dense_row(r)[0].exp() - 1.0).round() as u64)
        .collect()
}

/// Batches from `reader` until `want` rows came, within a generous deadline.
fn rows_until(reader: &mut BatchReader, want: usize) -> (Vec<u64>, Vec<usize>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut got, mut sizes) = (Vec::new(), Vec::new());
    while got.len() < want {
        assert!(Instant::now() < deadline, "only {got:?} of {want} rows");
        let batch = reader
            .next()
            .expect("a followed file does not end")
            .unwrap();
        sizes.push(batch.len);
        got.extend(ids(&batch));
    }
    (got, sizes)
}

fn follow_cfg(path: &Path, batch: usize) -> ReaderConfig {
    ReaderConfig {
        follow: true,
        poll: Duration::from_millis(2),
        ..ReaderConfig::new([path], batch)
    }
}

#[test]
fn a_followed_file_is_read_as_it_grows_and_ends_on_stream_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grow.tsv");
    std::fs::write(&path, "").unwrap();
    let cfg = follow_cfg(&path, 4);
    let end = cfg.stream_end.clone();
    let mut reader = BatchReader::spawn(cfg).unwrap();
    append(&path, &(0..6).map(line).collect::<String>());
    // Rows go out when the file has no more, without waiting for a full batch.
    let (got, sizes) = rows_until(&mut reader, 6);
    assert_eq!(got, (0..6).collect::<Vec<_>>());
    assert!(sizes.iter().all(|&s| (1..=4).contains(&s)), "{sizes:?}");
    // A line written in two pieces is parsed once whole (a piece alone would parse as a padded row).
    let six = line(6);
    let (head, tail) = six.split_at(30);
    append(&path, head);
    append(&path, &(tail.to_string() + &line(7)));
    let (got, _) = rows_until(&mut reader, 2);
    assert_eq!(got, [6, 7]);
    end.end();
    assert!(reader.next().is_none(), "the read ends");
    let stats = reader.stats();
    assert_eq!((stats.rows, stats.padded_lines, stats.bad_lines), (8, 0, 0));
}

#[test]
fn ranks_following_one_file_split_it_disjointly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grow.tsv");
    std::fs::write(&path, line(0)).unwrap();
    let spawn = |rank| {
        BatchReader::spawn(ReaderConfig {
            rank,
            world: 2,
            ..follow_cfg(&path, 3)
        })
        .unwrap()
    };
    let (mut r0, mut r1) = (spawn(0), spawn(1));
    for chunk in [1..4, 4..9, 9..10] {
        append(&path, &chunk.map(line).collect::<String>());
    }
    let (got0, _) = rows_until(&mut r0, 5);
    let (got1, _) = rows_until(&mut r1, 5);
    assert_eq!(got0, [0, 2, 4, 6, 8]);
    assert_eq!(got1, [1, 3, 5, 7, 9]);
}

#[test]
fn a_resumed_stream_skips_its_rows_and_an_ended_one_hands_out_its_short_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grow.tsv");
    std::fs::write(&path, (0..5).map(line).collect::<String>()).unwrap();
    let cfg = ReaderConfig {
        skip_rows: 3,
        ..follow_cfg(&path, 100)
    };
    let end = cfg.stream_end.clone();
    let mut reader = BatchReader::spawn(cfg).unwrap();
    let (got, _) = rows_until(&mut reader, 2);
    assert_eq!(got, [3, 4]);
    end.end();
    assert!(reader.next().is_none());
    assert_eq!(reader.stats().rows, 5);
}

#[test]
fn streams_refuse_what_they_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grow.tsv");
    std::fs::write(&path, line(0)).unwrap();
    let err = |cfg: ReaderConfig| BatchReader::spawn(cfg).err().unwrap().to_string();
    let two = ReaderConfig {
        follow: true,
        ..ReaderConfig::new([&path, &path], 4)
    };
    assert!(err(two).contains("--follow follows one file, got 2 paths"));
    let shuffled = ReaderConfig {
        shuffle_seed: Some(1),
        ..follow_cfg(&path, 4)
    };
    assert!(err(shuffled).contains("no shuffle"));
    assert!(err(follow_cfg(dir.path(), 4)).contains("not a regular file"));
    assert!(err(follow_cfg(&dir.path().join("missing"), 4)).contains("missing"));
    let stdin_and_file = ReaderConfig::new([Path::new(STDIN), &path], 4);
    assert!(err(stdin_and_file).contains("must be the only input"));
    let follow_stdin = follow_cfg(Path::new(STDIN), 4);
    assert!(err(follow_stdin).contains("until it closes"));
    let skip_file = ReaderConfig {
        skip_rows: 1,
        ..ReaderConfig::new([&path], 4)
    };
    assert!(err(skip_file).contains("streams"));
}
