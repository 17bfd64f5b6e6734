//! Multi-hot input end to end: text (TSV and CSV) and version 2 shards read with a [`FeatureLayout`] give the
//! same batches, in order and shuffled; a shard is refused by a reader of another layout.

use std::path::{Path, PathBuf};

use criteo::columnar::write_shard_for;
use criteo::{
    feature_id, read_all, Batch, FeatureInput, FeatureLayout, ReadStats, ReaderConfig, NUM_DENSE,
};

/// C1 one-hot capped at 10 in table 0; C2 multi-hot (4 tokens) sharing table 0; C26 multi-hot (2).
fn layout() -> FeatureLayout {
    let input = |column, table, hash_size, tokens| FeatureInput {
        ids: Default::default(),
        column,
        table,
        hash_size,
        tokens,
    };
    FeatureLayout {
        features: vec![input(0, 0, 10, 1), input(1, 0, 0, 4), input(25, 1, 0, 2)],
    }
}

/// Line `k`: label `k % 2`, I1 = k, C1 = k, C2 a bag of `k % 7` tokens, C26 a bag of `k % 3`, the rest
/// empty.
fn line(k: u32) -> String {
    let bag = |len: u32| {
        let tokens: Vec<String> = (0..len).map(|t| format!("{:x}", k * 10 + t)).collect();
        tokens.join("|")
    };
    let ints = format!("{k}{}", "\t".repeat(NUM_DENSE - 1));
    let middle = "\t".repeat(23);
    format!(
        "{}\t{ints}\t{k:x}\t{}{middle}\t{}",
        k % 2,
        bag(k % 7),
        bag(k % 3)
    )
}

fn text(n: u32) -> String {
    (0..n).map(|k| line(k) + "\n").collect()
}

fn cfg(paths: &[PathBuf], batch_size: usize) -> ReaderConfig {
    ReaderConfig {
        layout: layout(),
        ..ReaderConfig::new(paths, batch_size)
    }
}

/// Every row of `batches`, as (label, dense, per feature its bag).
fn rows(batches: &[Batch]) -> Vec<(f32, Vec<f32>, Vec<Vec<u64>>)> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.len {
            let bags = (0..b.sparse.len()).map(|f| b.bag(f, i).to_vec()).collect();
            out.push((b.labels[i], b.dense_row(i).to_vec(), bags));
        }
    }
    out
}

/// Writes the batches of `paths` read with `layout()` as shards of `rows_per_shard` rows into `dir`.
fn preprocess(paths: &[PathBuf], rows_per_shard: usize, dir: &Path) -> Vec<PathBuf> {
    let (batches, _) = read_all(&cfg(paths, rows_per_shard)).unwrap();
    let mut shards = Vec::new();
    for (n, batch) in batches.iter().enumerate() {
        let mut bytes = Vec::new();
        write_shard_for(batch, &layout(), &mut bytes).unwrap();
        let path = dir.join(format!("part-{n:05}.dlrmcol"));
        std::fs::write(&path, bytes).unwrap();
        shards.push(path);
    }
    shards
}

#[test]
fn text_bags_truncation_and_stats() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("day_0");
    std::fs::write(&path, text(20)).unwrap();
    let (batches, stats) = read_all(&cfg(std::slice::from_ref(&path), 8)).unwrap();
    assert_eq!(batches.iter().map(|b| b.len).collect::<Vec<_>>(), [8, 8, 4]);
    // C2 bags of k % 7 tokens keep at most 4: rows 5 and 6 (and 12, 13, 19) lose some.
    let dropped: u64 = (0..20u64).map(|k| (k % 7).saturating_sub(4)).sum();
    assert_eq!(
        stats,
        ReadStats {
            lines: 20,
            rows: 20,
            truncated_tokens: dropped,
            ..ReadStats::default()
        }
    );
    assert_eq!(batches.iter().map(|b| b.truncated).sum::<u64>(), dropped);
    let b = &batches[0];
    let id = |table: usize, t: u32| feature_id(table, Some(t));
    assert_eq!(b.sparse.len(), 3);
    assert!(b.offsets[0].is_empty() && b.offsets[1].len() == 9);
    assert_eq!(b.bag(0, 7), [id(0, 7)]);
    assert_eq!(b.bag(1, 0), [] as [u64; 0], "row 0: an empty C2 bag");
    assert_eq!(b.bag(1, 6), [id(0, 60), id(0, 61), id(0, 62), id(0, 63)]);
    assert_eq!(b.bag(2, 5), [id(1, 50), id(1, 51)]);
    // C1 is capped: row 15 holds 0xf, 15 % 10 = 5.
    assert_eq!(batches[1].bag(0, 7), [id(0, 5)]);
    // C1 and C2 share table 0, so a token gets one id in both (C2's ids above are table 0's too).
    assert_eq!(b.bag(0, 5), [id(0, 5)]);
}

#[test]
fn csv_reads_like_tsv() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("a.tsv");
    std::fs::write(&tsv, text(30)).unwrap();
    let csv = dir.path().join("a.csv");
    let mut body = String::from("Id,Label,I1\n");
    for k in 0..30 {
        body += &format!("{},{}\n", 1000 + k, line(k).replace('\t', ","));
    }
    std::fs::write(&csv, body).unwrap();
    let (a, _) = read_all(&cfg(&[tsv], 7)).unwrap();
    let (b, _) = read_all(&cfg(&[csv], 7)).unwrap();
    assert_eq!(a, b);
}

#[test]
fn shards_read_back_the_texts_batches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("day_0");
    std::fs::write(&path, text(100)).unwrap();
    let shard_dir = dir.path().join("shards");
    std::fs::create_dir(&shard_dir).unwrap();
    let shards = preprocess(std::slice::from_ref(&path), 32, &shard_dir);
    assert_eq!(shards.len(), 4);
    for (world, batch_size) in [(1, 10), (3, 7)] {
        for rank in 0..world {
            let read = |paths: &[PathBuf]| {
                let cfg = ReaderConfig {
                    rank,
                    world,
                    ..cfg(paths, batch_size)
                };
                let (mut batches, _) = read_all(&cfg).unwrap();
                // Shards do not record what parsing truncated.
                batches.iter_mut().for_each(|b| b.truncated = 0);
                batches
            };
            let from_text = read(std::slice::from_ref(&path));
            assert_eq!(read(&shards), from_text, "world {world} rank {rank}");
            assert_eq!(read(std::slice::from_ref(&shard_dir)), from_text);
        }
    }
    // A shuffled epoch: every rank's rows, each once, in another order.
    let mut all = Vec::new();
    for rank in 0..2 {
        let cfg = ReaderConfig {
            rank,
            world: 2,
            shuffle_seed: Some(7),
            ..cfg(&shards, 16)
        };
        let (batches, stats) = read_all(&cfg).unwrap();
        assert_eq!(stats.rows, 50);
        all.extend(rows(&batches));
    }
    let (in_order, _) = read_all(&cfg(std::slice::from_ref(&path), 100)).unwrap();
    let mut want = rows(&in_order);
    assert_ne!(all, want, "shuffled");
    let key = |r: &(f32, Vec<f32>, Vec<Vec<u64>>)| r.1[0].to_bits();
    all.sort_by_key(key);
    want.sort_by_key(key);
    assert_eq!(all, want);
}

#[test]
fn a_shard_of_another_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("day_0");
    std::fs::write(&path, text(10)).unwrap();
    let shards = preprocess(&[path], 10, dir.path());
    let err = read_all(&ReaderConfig::new(&shards, 4))
        .unwrap_err()
        .to_string();
    let (shard, reader) = (
        layout().fingerprint(),
        FeatureLayout::default().fingerprint(),
    );
    assert!(
        err.contains(&format!(
            "shard of feature layout {shard:#018x}, but the reader's layout is {reader:#018x}"
        )),
        "{err}"
    );
    assert!(err.contains("part-00000.dlrmcol"), "{err}");
    // And a version 1 shard by a multi-hot reader.
    let (batches, _) = read_all(&ReaderConfig::new([dir.path().join("day_0")], 10)).unwrap();
    let v1 = dir.path().join("v1.dlrmcol");
    let mut bytes = Vec::new();
    criteo::columnar::write_shard(&batches[0], &mut bytes).unwrap();
    std::fs::write(&v1, bytes).unwrap();
    let err = read_all(&cfg(&[v1], 4)).unwrap_err().to_string();
    assert!(
        err.contains(&format!("shard of feature layout {reader:#018x}")),
        "{err}"
    );
}

#[test]
fn an_invalid_layout_is_refused() {
    let mut bad = layout();
    bad.features[2].column = 1;
    let cfg = ReaderConfig {
        layout: bad,
        ..ReaderConfig::new(["unused"], 4)
    };
    let err = read_all(&cfg).unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid reader config: features 1 and 2 both read column C2"
    );
}
