//! The Criteo input pipeline against real files: plain, gzip, directories, rank splits, the error budget,
//! early drop (other formats: `criteo_formats.rs`). The read-rate measurement (TSV parsing against
//! preprocessed shards) is `#[ignore]`d; run it in release mode:
//! `cargo test --release -p trainer --test criteo_input -- --ignored --nocapture`.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{keys, line, lines, write, write_gz};
use trainer::criteo::{
    feature_id, parse_line, read_all, Batch, BatchReader, ReadError, ReadStats, ReaderConfig, Row,
};
use trainer::preprocess::{preprocess, PreprocessArgs};

/// Reads everything through the threaded reader.
fn read(cfg: ReaderConfig) -> Result<(Vec<Batch>, ReadStats), ReadError> {
    let mut reader = BatchReader::spawn(cfg)?;
    let batches = reader.by_ref().collect::<Result<Vec<_>, _>>()?;
    assert!(reader.next().is_none(), "the iterator stays ended");
    Ok((batches, reader.stats()))
}

#[test]
fn plain_file_in_batches_with_a_short_last_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir.path().join("day_0"), &lines(0..10));
    let (batches, stats) = read(ReaderConfig::new([&path], 4)).unwrap();
    assert_eq!(batches.iter().map(|b| b.len).collect::<Vec<_>>(), [4, 4, 2]);
    assert_eq!(keys(&batches), (0..10).collect::<Vec<_>>());
    assert_eq!(
        stats,
        ReadStats {
            lines: 10,
            rows: 10,
            ..ReadStats::default()
        }
    );
    // The parser's output, row for row.
    let mut row = Row::default();
    parse_line(line(5).as_bytes(), &mut row).unwrap();
    assert_eq!(batches[1].labels[1], row.label);
    assert_eq!(batches[1].dense_row(1), row.dense);
    assert_eq!(batches[1].sparse[7][1], feature_id(7, row.sparse[7]));
}

#[test]
fn gzip_detected_by_content_and_multi_member() {
    let dir = tempfile::tempdir().unwrap();
    // Two gzip members in one file (as `cat a.gz b.gz` or pigz make), with a misleading name.
    let a = write_gz(&dir.path().join("a"), &lines(0..50));
    let b = write_gz(&dir.path().join("b"), &lines(50..100));
    let mut both = fs::read(&a).unwrap();
    both.extend(fs::read(&b).unwrap());
    let path = dir.path().join("day_0.txt");
    fs::write(&path, both).unwrap();
    let (batches, stats) = read(ReaderConfig::new([&path], 32)).unwrap();
    assert_eq!(keys(&batches), (0..100).collect::<Vec<_>>());
    assert_eq!(stats.rows, 100);
}

#[test]
fn truncated_gzip_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let full = write_gz(&dir.path().join("full.gz"), &lines(0..2000));
    let bytes = fs::read(&full).unwrap();
    let path = dir.path().join("cut.gz");
    fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = read(ReaderConfig::new([&path], 100)).unwrap_err();
    assert!(matches!(err, ReadError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("cut.gz"), "{err}");
}

#[test]
fn directory_is_its_files_sorted_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("day_1"), &lines(10..20));
    write_gz(&dir.path().join("day_0"), &lines(0..10));
    write(&dir.path().join("day_2"), &lines(20..25));
    write(&dir.path().join(".hidden"), "garbage\n");
    fs::create_dir(dir.path().join("sub")).unwrap();
    let (batches, _) = read(ReaderConfig::new([dir.path()], 7)).unwrap();
    assert_eq!(keys(&batches), (0..25).collect::<Vec<_>>());
    // read_all gives the same on the calling thread.
    let (same, stats) = read_all(&ReaderConfig::new([dir.path()], 7)).unwrap();
    assert_eq!(same, batches);
    assert_eq!(stats.rows, 25);
}

#[test]
fn missing_and_empty_inputs_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no_such_day");
    let err = BatchReader::spawn(ReaderConfig::new([&missing], 4))
        .err()
        .unwrap();
    assert!(err.to_string().contains("no_such_day"), "{err}");
    let empty = dir.path().join("empty_dir");
    fs::create_dir(&empty).unwrap();
    let err = BatchReader::spawn(ReaderConfig::new([&empty], 4))
        .err()
        .unwrap();
    assert!(err.to_string().contains("empty_dir"), "{err}");
}

#[test]
fn invalid_configs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir.path().join("d"), &lines(0..3));
    let bad = [
        ReaderConfig::new([&path], 0),
        ReaderConfig {
            rank: 2,
            world: 2,
            ..ReaderConfig::new([&path], 4)
        },
        ReaderConfig::new(Vec::<PathBuf>::new(), 4),
    ];
    for cfg in bad {
        assert!(matches!(
            BatchReader::spawn(cfg),
            Err(ReadError::InvalidConfig(_))
        ));
    }
}

#[test]
fn rank_split_is_disjoint_and_covering() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&dir.path().join("a"), &lines(0..101));
    let b = write_gz(&dir.path().join("b"), &lines(101..150));
    for world in [1, 2, 3, 7] {
        let mut seen = Vec::new();
        for rank in 0..world {
            let cfg = ReaderConfig {
                rank,
                world,
                ..ReaderConfig::new([&a, &b], 8)
            };
            let (batches, stats) = read(cfg).unwrap();
            let part = keys(&batches);
            assert!(
                part.iter().all(|k| k % world as u64 == rank as u64),
                "world {world} rank {rank}"
            );
            assert_eq!(stats.lines, part.len() as u64);
            seen.extend(part);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..150).collect::<Vec<_>>(), "world {world}");
    }
}

/// Ten good lines with bad ones at lines 3, 6 and 9 (1-based), plus a padded, an empty and a CRLF line.
fn messy_file(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for k in 0..10 {
        match k {
            2 => text.push_str("2\tnot a label\n"),
            5 => text.push_str(&(line(99) + "\textra\n")),
            8 => text.push_str(&(line(98).replacen(&format!("{:08x}", 98), "zzzz1234", 1) + "\n")),
            _ => {}
        }
        match k {
            3 => text.push_str(&line(k).split('\t').take(20).collect::<Vec<_>>().join("\t")),
            4 => text.push_str(&(line(k) + "\r")),
            _ => text.push_str(&line(k)),
        }
        text.push('\n');
        if k == 6 {
            text.push('\n');
        }
    }
    write(&dir.join("messy"), &text)
}

#[test]
fn error_budget_exceeded_names_the_first_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = messy_file(dir.path());
    let cfg = ReaderConfig {
        max_bad_lines: 2,
        ..ReaderConfig::new([&path], 4)
    };
    let mut reader = BatchReader::spawn(cfg).unwrap();
    let results: Vec<_> = reader.by_ref().collect();
    let err = results.last().unwrap().as_ref().unwrap_err();
    let ReadError::ErrorBudgetExceeded {
        bad,
        budget,
        first_errors,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*bad, *budget, first_errors.len()), (3, 2, 3));
    let msg = err.to_string();
    assert!(msg.contains("budget of 2"), "{msg}");
    assert!(
        msg.contains(&format!(
            "{}:3: column label (field 1): \"2\" is not 0 or 1",
            path.display()
        )),
        "{msg}"
    );
    assert!(
        first_errors[1].ends_with(":7: 41 fields, expected at most 40"),
        "{first_errors:?}"
    );
    assert!(
        first_errors[2].ends_with(":12: column C1 (field 15): \"zzzz1234\" is not hex"),
        "{first_errors:?}"
    );
    assert!(reader.next().is_none());
    assert_eq!(reader.stats().bad_lines, 3);
}

#[test]
fn within_budget_bad_lines_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = messy_file(dir.path());
    let cfg = ReaderConfig {
        max_bad_lines: 5,
        ..ReaderConfig::new([&path], 4)
    };
    let (batches, stats) = read(cfg.clone()).unwrap();
    assert_eq!(keys(&batches), (0..10).collect::<Vec<_>>());
    assert_eq!((stats.lines, stats.rows, stats.bad_lines), (14, 10, 3));
    assert_eq!(
        (
            stats.padded_lines,
            stats.empty_lines,
            stats.first_errors.len()
        ),
        (1, 1, 3)
    );
    assert_eq!(read_all(&cfg).unwrap().1, stats);
    // Budget 0: the first bad line fails.
    let err = read(ReaderConfig {
        max_bad_lines: 0,
        ..cfg
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            ReadError::ErrorBudgetExceeded {
                bad: 1,
                budget: 0,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn dropping_the_reader_early_does_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir.path().join("big"), &lines(0..20_000));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for batch_size in [1, 16, 10_000] {
            // Unconsumed: the thread is blocked on a full channel.
            let cfg = ReaderConfig {
                queue_depth: 1,
                ..ReaderConfig::new([&path], batch_size)
            };
            let reader = BatchReader::spawn(cfg).unwrap();
            // Two batches handed over: the first fills the channel, the send of the second blocks (the stats
            // are updated before each send).
            let deadline = Instant::now() + Duration::from_secs(30);
            while reader.stats().rows < 2 * batch_size as u64 {
                assert!(Instant::now() < deadline, "{:?}", reader.stats());
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(reader);
            // Partly consumed.
            let mut reader = BatchReader::spawn(ReaderConfig::new([&path], batch_size)).unwrap();
            assert_eq!(reader.next().unwrap().unwrap().len, batch_size);
            drop(reader);
        }
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("dropping a reader hung");
}

/// Measures the parse rate on one core: `cargo test --release -p trainer --test criteo_input -- --ignored
/// --nocapture parse_rate`.
#[test]
#[ignore = "a measurement; run in release mode"]
fn parse_rate() {
    const N: u64 = 1_000_000;
    let text = lines(0..N);
    println!("{N} synthetic lines, {:.1} MB", text.len() as f64 / 1e6);

    // Parsing and batching alone, in memory.
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let mut row = Row::default();
        let mut batch = Batch::with_capacity(4096);
        let mut rows = 0;
        for line in text.as_bytes().split(|&b| b == b'\n') {
            if parse_line(line, &mut row).unwrap() != trainer::criteo::LineKind::Empty {
                batch.push_row(&row);
                rows += 1;
                if batch.len == 4096 {
                    batch.clear();
                }
            }
        }
        assert_eq!(rows, N);
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!(
        "parse_line + push_row: {:.2} M lines/s",
        N as f64 / best / 1e6
    );

    // The whole reader: file, line splitting, parsing, batching, channel.
    let dir = tempfile::tempdir().unwrap();
    let plain = write(&dir.path().join("plain"), &text);
    let gz = write_gz(&dir.path().join("gz"), &text);
    let zst = common::write_zst(&dir.path().join("zst"), &text);
    let shards = dir.path().join("shards");
    let start = Instant::now();
    let summary = preprocess(
        &PreprocessArgs {
            input: vec![plain.clone()],
            out: shards.clone(),
            rows_per_shard: 1 << 18,
            max_bad_lines: 0,
            model_spec: None,
        },
        &Default::default(),
    )
    .unwrap();
    println!(
        "preprocess (plain file to {} shards): {:.2} M lines/s",
        summary.shards.len(),
        N as f64 / start.elapsed().as_secs_f64() / 1e6
    );
    for (name, path) in [
        ("plain", plain),
        ("gzip", gz),
        ("zstd", zst),
        ("preprocessed (mmap)", shards),
    ] {
        // Batches are dropped as they come, as training does.
        let start = Instant::now();
        let mut reader = BatchReader::spawn(ReaderConfig::new([&path], 4096)).unwrap();
        let rows: u64 = reader.by_ref().map(|b| b.unwrap().len as u64).sum();
        let secs = start.elapsed().as_secs_f64();
        assert_eq!((rows, reader.stats().rows), (N, N));
        println!(
            "BatchReader, {name} file: {:.2} M lines/s",
            N as f64 / secs / 1e6
        );
    }
}

#[test]
fn issue15_input_without_a_usable_row_is_an_error_with_its_counts() {
    let dir = tempfile::tempdir().unwrap();
    let blank = write(&dir.path().join("blank"), "\n\n");
    let bad = write(&dir.path().join("bad"), "x\ty\n\n");
    let err = read(ReaderConfig::new([&blank, &bad], 4)).unwrap_err();
    match &err {
        ReadError::NoRows {
            paths,
            lines,
            bad_lines,
            empty_lines,
            first_errors,
            ..
        } => {
            assert_eq!(paths, &[blank.clone(), bad.clone()]);
            assert_eq!((*lines, *bad_lines, *empty_lines), (4, 1, 3));
            assert!(first_errors[0].starts_with(&format!("{}:1:", bad.display())));
        }
        other => panic!("{other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("no usable rows"), "{message}");
    assert!(message.contains("1 malformed"), "{message}");
    // read_all (the evaluation path) says the same; a rank with no line of its own too.
    assert!(matches!(
        read_all(&ReaderConfig::new([&blank], 4)),
        Err(ReadError::NoRows { .. })
    ));
    let one = write(&dir.path().join("one"), &lines(0..1));
    let rank1 = ReaderConfig {
        rank: 1,
        world: 2,
        ..ReaderConfig::new([&one], 4)
    };
    let err = read(rank1).unwrap_err();
    assert!(err.to_string().contains("(rank 1 of 2)"), "{err}");
}
