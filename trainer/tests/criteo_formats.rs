//! Input formats beyond plain and gzip TSV: zstd, the Kaggle CSV form, and preprocessed columnar shards
//! (`trainer preprocess`), each against reading the same rows as TSV.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{keys, line, lines, write, write_gz, write_zst};
use trainer::criteo::{read_all, Batch, BatchReader, ReadError, ReadStats, ReaderConfig};
use trainer::preprocess::{preprocess, PreprocessArgs};

fn read(cfg: &ReaderConfig) -> (Vec<Batch>, ReadStats) {
    read_all(cfg).unwrap()
}

/// The threaded reader, collected.
fn read_threaded(cfg: ReaderConfig) -> Result<Vec<Batch>, ReadError> {
    BatchReader::spawn(cfg)?.collect()
}

/// Lines `range` in the Kaggle CSV form, header first.
fn csv(range: std::ops::Range<u64>) -> String {
    let header =
        "Id,Label,I1,I2,I3,I4,I5,I6,I7,I8,I9,I10,I11,I12,I13,C1,C2,C3,C4,C5,C6,C7,C8,C9,C10,\
                  C11,C12,C13,C14,C15,C16,C17,C18,C19,C20,C21,C22,C23,C24,C25,C26\n";
    let body: String = range
        .map(|k| format!("{},{}\n", 10_000_000 + k, line(k).replace('\t', ",")))
        .collect();
    format!("{header}{body}")
}

#[test]
fn zstd_detected_by_content_and_multi_frame() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = write(&dir.path().join("tsv"), &lines(0..300));
    let a = write_zst(&dir.path().join("a"), &lines(0..100));
    let b = write_zst(&dir.path().join("b"), &lines(100..300));
    let mut both = fs::read(&a).unwrap();
    both.extend(fs::read(&b).unwrap());
    let path = dir.path().join("day_0.txt");
    fs::write(&path, both).unwrap();
    let (batches, stats) = read(&ReaderConfig::new([&path], 64));
    assert_eq!(keys(&batches), (0..300).collect::<Vec<_>>());
    assert_eq!(stats.rows, 300);
    assert_eq!(batches, read(&ReaderConfig::new([&tsv], 64)).0);
}

#[test]
fn truncated_zstd_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let full = write_zst(&dir.path().join("full.zst"), &lines(0..2000));
    let bytes = fs::read(&full).unwrap();
    let path = dir.path().join("cut.zst");
    fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = read_threaded(ReaderConfig::new([&path], 100)).unwrap_err();
    assert!(matches!(err, ReadError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("cut.zst"), "{err}");
}

#[test]
fn csv_reads_like_tsv_in_any_compression() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = write(&dir.path().join("tsv"), &lines(0..120));
    let want = read(&ReaderConfig::new([&tsv], 16));
    let text = csv(0..120);
    let plain = write(&dir.path().join("train.csv"), &text);
    let gz = write_gz(&dir.path().join("train.csv.gz"), &text);
    let zst = write_zst(&dir.path().join("train.csv.zst"), &text);
    for path in [plain, gz, zst] {
        assert_eq!(read(&ReaderConfig::new([&path], 16)), want, "{path:?}");
    }
    // Mixed with TSV files; the header takes no index in the rank split.
    let first = write(&dir.path().join("first"), &lines(0..7));
    let rest = write(&dir.path().join("rest.csv"), &csv(7..120));
    for (world, rank) in [(1, 0), (3, 1), (4, 3)] {
        let cfg = |paths: &[&PathBuf]| ReaderConfig {
            world,
            rank,
            ..ReaderConfig::new(paths.iter().copied(), 5)
        };
        assert_eq!(read(&cfg(&[&first, &rest])), read(&cfg(&[&tsv])));
    }
}

#[test]
fn bad_csv_row_is_reported_with_its_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = csv(0..5);
    // Line 7: the header, five rows, then this one with a bad I2.
    let bad = format!("99,{}", line(5).replace('\t', ","));
    let fields: Vec<&str> = bad.split(',').collect();
    let bad = [&fields[..3], &["x7"], &fields[4..]].concat().join(",");
    text.push_str(&bad);
    text.push('\n');
    let path = write(&dir.path().join("train.csv"), &text);
    let cfg = ReaderConfig {
        max_bad_lines: 0,
        ..ReaderConfig::new([&path], 4)
    };
    let err = read_threaded(cfg).unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "{}:7: column I2 (field 3): \"x7\" is not a 64-bit integer",
            path.display()
        )),
        "{err}"
    );
}

fn preprocess_into(inputs: &[&Path], out: &Path, rows_per_shard: usize) -> Vec<PathBuf> {
    let summary = preprocess(
        &PreprocessArgs {
            input: inputs.iter().map(|p| p.to_path_buf()).collect(),
            out: out.to_path_buf(),
            rows_per_shard,
            max_bad_lines: 0,
            model_spec: None,
        },
        &Default::default(),
    )
    .unwrap();
    summary.shards
}

#[test]
fn preprocessed_shards_read_like_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = write(&dir.path().join("day_0"), &lines(0..1000));
    let csv_zst = write_zst(&dir.path().join("day_1.csv.zst"), &csv(1000..1500));
    let out = dir.path().join("shards");
    let shards = preprocess_into(&[&tsv, &csv_zst], &out, 301);
    assert_eq!(shards.len(), 5);
    for batch_size in [1, 7, 300, 4096] {
        for world in [1, 2, 3] {
            for rank in 0..world {
                let cfg = |paths: Vec<&Path>| ReaderConfig {
                    world,
                    rank,
                    ..ReaderConfig::new(paths, batch_size)
                };
                let want = read(&cfg(vec![&tsv, &csv_zst]));
                // The directory, and the shards named one by one.
                assert_eq!(read(&cfg(vec![&out])), want, "{batch_size} {world} {rank}");
                let named: Vec<&Path> = shards.iter().map(PathBuf::as_path).collect();
                assert_eq!(read(&cfg(named)), want);
            }
        }
    }
    // The threaded reader too, and shards mixed with text.
    let cfg = ReaderConfig::new([&out, &tsv], 64);
    let mut want = read(&ReaderConfig::new([&tsv, &csv_zst, &tsv], 64)).0;
    assert_eq!(read_threaded(cfg).unwrap(), want);
    want.truncate(3);
    let mut reader = BatchReader::spawn(ReaderConfig::new([&out], 64)).unwrap();
    let first: Vec<Batch> = reader.by_ref().take(3).map(Result::unwrap).collect();
    assert_eq!(first, want);
    drop(reader);
}

#[test]
fn preprocess_refuses_a_non_empty_output_directory() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = write(&dir.path().join("day_0"), &lines(0..10));
    let out = dir.path().join("out");
    preprocess_into(&[&tsv], &out, 4);
    let err = preprocess(
        &PreprocessArgs {
            input: vec![tsv],
            out: out.clone(),
            rows_per_shard: 4,
            max_bad_lines: 0,
            model_spec: None,
        },
        &Default::default(),
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("is not empty"), "{err:#}");
}

#[test]
fn truncated_or_corrupt_shard_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = write(&dir.path().join("day_0"), &lines(0..50));
    let shards = preprocess_into(&[&tsv], &dir.path().join("out"), 100);
    let bytes = fs::read(&shards[0]).unwrap();
    let cut = dir.path().join("cut.dlrmcol");
    fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let err = read_threaded(ReaderConfig::new([&cut], 8)).unwrap_err();
    assert!(matches!(err, ReadError::Corrupt { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: bad columnar shard: header says 50 rows, so {} bytes, but the file has {} (truncated?)",
            cut.display(),
            bytes.len(),
            bytes.len() - 100
        )
    );
    // Cut inside the header (the magic is still there).
    fs::write(&cut, &bytes[..12]).unwrap();
    let err = read_threaded(ReaderConfig::new([&cut], 8)).unwrap_err();
    assert!(
        err.to_string().ends_with(
            "cut.dlrmcol: bad columnar shard: 12 bytes, shorter than the 32-byte header"
        ),
        "{err}"
    );
    // A flipped label byte.
    let mut bad = bytes.clone();
    *bad.last_mut().unwrap() = 9;
    fs::write(&cut, &bad).unwrap();
    let err = read_threaded(ReaderConfig::new([&cut], 8)).unwrap_err();
    assert!(err.to_string().contains("row 49: label byte 9"), "{err}");
}

#[test]
fn shuffled_epochs_permute_the_rows_and_split_them_the_same_disjoint_way() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = write(&dir.path().join("day_0"), &lines(0..1000));
    let out = dir.path().join("shards");
    preprocess_into(&[&tsv], &out, 301);
    let cfg = |seed, world, rank| ReaderConfig {
        world,
        rank,
        shuffle_seed: seed,
        ..ReaderConfig::new([&out], 64)
    };
    let in_order = keys(&read(&cfg(None, 1, 0)).0);
    assert_eq!(in_order, (0..1000).collect::<Vec<_>>());
    let epoch = |seed, world, rank| keys(&read(&cfg(Some(seed), world, rank)).0);
    // A seed permutes (every row once), the same seed draws the same order (threaded reader too), another
    // seed another order.
    let a = epoch(1, 1, 0);
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, in_order);
    assert_ne!(a, in_order);
    assert_eq!(a, epoch(1, 1, 0));
    let threaded: Vec<Batch> = read_threaded(cfg(Some(1), 1, 0)).unwrap();
    assert_eq!(keys(&threaded), a);
    assert_ne!(epoch(2, 1, 0), a);
    // Batches stay full but for the last; three ranks split the rows disjointly and completely.
    let batches = read(&cfg(Some(1), 1, 0)).0;
    assert!(batches[..batches.len() - 1].iter().all(|b| b.len == 64));
    let mut all: Vec<u64> = (0..3).flat_map(|rank| epoch(7, 3, rank)).collect();
    all.sort();
    assert_eq!(all, in_order);
    // Rows move across shard boundaries only with the shard order: each shard's rows stay together.
    let shard_of: Vec<u64> = a.iter().map(|k| k / 301).collect();
    let changes = shard_of.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(changes, 3, "{shard_of:?}");
}
