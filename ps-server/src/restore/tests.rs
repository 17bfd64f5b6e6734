//! Tests of restore: N shards onto M (property test) and every refusal.

use std::collections::BTreeMap;

use embedding::snapshot::{shard_dir, MANIFEST_FILE};
use embedding::OptimizerConfig;
use proptest::prelude::*;

use super::*;
use crate::checkpoint::shard_info;

fn cfg(id: u32, dim: usize, optimizer: OptimizerConfig) -> TableConfig {
    let mut c = TableConfig::new(id, format!("C{id}"), dim);
    c.optimizer = optimizer;
    c.seed = u64::from(id) * 31;
    c
}

fn tables() -> Vec<TableConfig> {
    vec![
        cfg(
            1,
            3,
            OptimizerConfig::RowAdagrad {
                lr: 0.1,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
        ),
        cfg(
            7,
            2,
            OptimizerConfig::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        ),
    ]
}

/// Rows by (table, id), as f32 bits.
type Rows = BTreeMap<(u32, u64), Vec<u32>>;

/// One source server: its engine over RocksDB in `dir/src-<k>`.
fn source_engine(dir: &Path, k: u32, configs: &[TableConfig]) -> Engine {
    let store = Arc::new(RocksStore::open(dir.join(format!("src-{k}"))).unwrap());
    let e = Engine::open(store).unwrap();
    for c in configs {
        e.register_table(c.clone()).unwrap();
    }
    e
}

/// A snapshot of `n` servers in `dir/snap` holding `stored` (written to each server's store before it opens,
/// with arbitrary bits) plus pushes of `pushed` ids (dirty in memory at checkpoint time). Returns every row.
fn make_snapshot(
    dir: &Path,
    n: u32,
    stored: &[(u32, u64, Vec<f32>)],
    pushed: &[(u32, u64)],
) -> Rows {
    let map = ShardMap::new(n);
    let configs = tables();
    let mut want = Rows::new();
    for k in 0..n {
        {
            let e = source_engine(dir, k, &configs);
            for c in &configs {
                let mut b = DirtyBatch::new();
                b.reset(c.row_len() * 4);
                for (t, id, row) in stored {
                    if *t == c.id && map.server_of(*id) == k {
                        b.push_row(*id, &row[..c.row_len()]);
                    }
                }
                if !b.is_empty() {
                    e.store().write_rows(c.id, &b, false).unwrap();
                }
            }
        }
        // Reopen: the stored rows are recovered (clean), then pushes dirty some of them and create others.
        let store = Arc::new(RocksStore::open(dir.join(format!("src-{k}"))).unwrap());
        let e = Engine::open(store).unwrap();
        for c in &configs {
            let ids: Vec<u64> = pushed
                .iter()
                .filter(|(t, id)| *t == c.id && map.server_of(*id) == k)
                .map(|p| p.1)
                .collect();
            let grads: Vec<f32> = (0..ids.len() * c.dim)
                .map(|i| i as f32 * 0.01 - 0.3)
                .collect();
            e.apply(c.id, &ids, &grads).unwrap();
        }
        for c in &configs {
            let t = e.table(c.id).unwrap();
            for (tid, id) in stored
                .iter()
                .map(|s| (s.0, s.1))
                .chain(pushed.iter().copied())
            {
                if tid == c.id && map.server_of(id) == k {
                    let row = t.row(id).expect("row in memory");
                    want.insert((tid, id), row.iter().map(|x| x.to_bits()).collect());
                }
            }
        }
        e.checkpoint(&dir.join("snap"), 42, shard_info(&map, k), 0)
            .unwrap();
    }
    want
}

/// Restores onto `m` servers and returns each one's rows.
fn restore_all(dir: &Path, m: u32) -> Vec<Rows> {
    restore_all_with(dir, m, &dir.join("snap"), restore)
}

type RestoreFn = fn(&Path, u32, u32, &Path) -> Result<RestoreStats, RestoreError>;

/// Restores `from` onto `m` servers with `how` and returns each one's rows.
fn restore_all_with(dir: &Path, m: u32, from: &Path, how: RestoreFn) -> Vec<Rows> {
    (0..m)
        .map(|i| {
            let out = dir.join(format!("out-{m}-{i}-{}", from.display().to_string().len()));
            let stats = how(from, m, i, &out).unwrap();
            assert_eq!(stats.step, 42);
            let e = Engine::open(Arc::new(RocksStore::open(out.join("rocksdb")).unwrap())).unwrap();
            assert_eq!(e.tables(), tables());
            let mut rows = Rows::new();
            for c in tables() {
                let t = e.table(c.id).unwrap();
                // Engine::open loads every stored row; read them back through the store scan.
                e.store()
                    .scan_rows(c.id, &mut |id, _| {
                        let row = t.row(id).expect("recovered row");
                        rows.insert((c.id, id), row.iter().map(|x| x.to_bits()).collect());
                        Ok(())
                    })
                    .unwrap();
                assert_eq!(
                    t.len() as u64,
                    rows.keys().filter(|k| k.0 == c.id).count() as u64
                );
            }
            assert_eq!(stats.rows_written, rows.len() as u64);
            rows
        })
        .collect()
}

fn finite_row() -> impl Strategy<Value = Vec<f32>> {
    // Row length 13 covers the longest table (Adam, dim 2: 2 + 2 + 2 + 1 = 7); extra values are ignored.
    proptest::collection::vec(
        any::<u32>()
            .prop_map(f32::from_bits)
            .prop_filter("finite", |x| x.is_finite()),
        13,
    )
}

/// A temporary directory on tmpfs when there is one: each case opens up to 8 databases and fsyncs
/// manifests and metadata, which costs about 1.5 s per case on this machine's disk and ~0.1 s on tmpfs.
fn fast_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Every row (weights and optimizer state, bit for bit) of a snapshot of N servers lands on exactly the
    /// shard of M it routes to.
    #[test]
    fn n_shards_restore_onto_m_shards_bit_for_bit(
        n in 1u32..=4,
        m in 1u32..=4,
        stored in proptest::collection::vec((prop_oneof![Just(1u32), Just(7u32)], any::<u64>(), finite_row()), 0..60),
        pushed in proptest::collection::vec((prop_oneof![Just(1u32), Just(7u32)], any::<u64>()), 0..40),
    ) {
        let dir = fast_tempdir();
        let mut pushed = pushed;
        // Some pushes hit stored rows (dirty updates), others create rows.
        pushed.extend(stored.iter().step_by(3).map(|s| (s.0, s.1)));
        let want = make_snapshot(dir.path(), n, &stored, &pushed);
        let got = restore_all(dir.path(), m);
        let map = ShardMap::new(m);
        let mut all = Rows::new();
        for (i, rows) in got.iter().enumerate() {
            for (&(t, id), bits) in rows {
                prop_assert_eq!(map.server_of(id), i as u32, "table {} id {} on shard {} of {}", t, id, i, m);
                prop_assert!(all.insert((t, id), bits.clone()).is_none());
            }
        }
        prop_assert_eq!(all, want);
    }
}

#[test]
fn restore_onto_the_same_count_keeps_every_shard() {
    let dir = fast_tempdir();
    let stored: Vec<(u32, u64, Vec<f32>)> = (0..100u64)
        .map(|i| (1, i * 977, vec![i as f32; 13]))
        .collect();
    let want = make_snapshot(dir.path(), 2, &stored, &[(7, 5), (7, 6)]);
    let got = restore_all(dir.path(), 2);
    assert_eq!(got.iter().map(Rows::len).sum::<usize>(), want.len());
    assert_eq!(got.into_iter().flatten().collect::<Rows>(), want);
}

fn snapshot_of_two(dir: &Path) {
    make_snapshot(
        dir,
        2,
        &[(1, 1, vec![0.5; 13]), (1, 2, vec![0.25; 13])],
        &[(7, 9)],
    );
}

fn restore_err(dir: &Path) -> RestoreError {
    restore(&dir.join("snap"), 3, 0, &dir.join("out")).unwrap_err()
}

#[test]
fn missing_manifest_is_refused() {
    let dir = fast_tempdir();
    snapshot_of_two(dir.path());
    std::fs::remove_file(shard_dir(&dir.path().join("snap"), 1, 2).join(MANIFEST_FILE)).unwrap();
    let e = restore_err(dir.path());
    assert!(
        matches!(
            e,
            RestoreError::Snapshot(SnapshotError::MissingManifest { .. })
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("shard-1-of-2: no manifest.json"),
        "{e}"
    );
    assert!(!dir.path().join("out").exists(), "nothing written");
}

#[test]
fn format_version_mismatch_is_refused() {
    let dir = fast_tempdir();
    snapshot_of_two(dir.path());
    let path = shard_dir(&dir.path().join("snap"), 0, 2).join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("\"format_version\": 1,", "\"format_version\": 2,"),
    )
    .unwrap();
    let e = restore_err(dir.path());
    assert!(
        e.to_string()
            .ends_with("snapshot format version 2, this build reads version 1"),
        "{e}"
    );
}

#[test]
fn dim_mismatch_across_shards_is_refused() {
    let dir = fast_tempdir();
    let map = ShardMap::new(2);
    for (k, dim) in [(0u32, 3usize), (1, 4)] {
        let mut c = tables()[0].clone();
        c.dim = dim;
        let e = source_engine(dir.path(), k, &[c]);
        e.checkpoint(&dir.path().join("snap"), 1, shard_info(&map, k), 0)
            .unwrap();
    }
    let e = restore_err(dir.path());
    assert!(
        matches!(e, RestoreError::TableMismatch { table: 1, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("table 1: dim: registered 3, requested 4 (in "),
        "{e}"
    );
}

#[test]
fn missing_shard_is_refused() {
    let dir = fast_tempdir();
    snapshot_of_two(dir.path());
    std::fs::remove_dir_all(shard_dir(&dir.path().join("snap"), 0, 2)).unwrap();
    let e = restore_err(dir.path());
    assert!(
        e.to_string().ends_with("snap: shard-0-of-2 is missing"),
        "{e}"
    );
}

#[test]
fn non_empty_output_is_refused_and_untouched() {
    let dir = fast_tempdir();
    snapshot_of_two(dir.path());
    std::fs::create_dir(dir.path().join("out")).unwrap();
    std::fs::write(dir.path().join("out/keep"), b"x").unwrap();
    let e = restore_err(dir.path());
    assert!(
        e.to_string()
            .ends_with("out: exists and is not empty; restore into a new directory"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("out")).unwrap().count(),
        1
    );
    // An empty directory is fine.
    std::fs::remove_file(dir.path().join("out/keep")).unwrap();
    restore(&dir.path().join("snap"), 3, 0, &dir.path().join("out")).unwrap();
}

#[test]
fn other_refusals_name_the_problem() {
    let dir = fast_tempdir();
    let e = restore(dir.path(), 2, 2, &dir.path().join("out")).unwrap_err();
    assert_eq!(e.to_string(), "--shard-index 2 is not below --num-shards 2");
    let e = restore(dir.path(), 2, 0, &dir.path().join("out")).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("no shard-<k>-of-<n> directories, not a snapshot"),
        "{e}"
    );

    snapshot_of_two(dir.path());
    // A shard of another checkpoint (different step) mixed in.
    let snap = dir.path().join("snap");
    std::fs::remove_dir_all(shard_dir(&snap, 1, 2)).unwrap();
    let e1 = source_engine(dir.path(), 9, &tables());
    e1.checkpoint(&snap, 43, shard_info(&ShardMap::new(2), 1), 0)
        .unwrap();
    let e = restore_err(dir.path());
    assert!(
        e.to_string().contains("shards of different checkpoints"),
        "{e}"
    );
    // A snapshot of another server count in the same directory.
    e1.checkpoint(&snap, 43, shard_info(&ShardMap::new(3), 0), 0)
        .unwrap();
    let e = restore_err(dir.path());
    assert!(matches!(e, RestoreError::MixedShardCounts { .. }), "{e}");
}

#[test]
fn a_restored_directory_refuses_to_serve_as_another_shard() {
    let store = embedding::MemStore::new();
    // Not built by restore: any shard may serve it.
    check_restored_shard(&store, 3, 4).unwrap();
    let record = r#"{"from":"/snap","step":7,"from_shards":2,"num_shards":3,"shard_index":1}"#;
    embedding::Store::put_meta(&store, RESTORED_FROM_META, record.as_bytes()).unwrap();
    check_restored_shard(&store, 1, 3).unwrap();
    let e = check_restored_shard(&store, 0, 3).unwrap_err().to_string();
    assert!(
        e.contains("restored for shard 1 of 3") && e.contains("shard 0 of 3"),
        "{e}"
    );
    let e = check_restored_shard(&store, 1, 2).unwrap_err().to_string();
    assert!(e.contains("--shard-index 1 --num-shards 3"), "{e}");
    embedding::Store::put_meta(&store, RESTORED_FROM_META, b"garbage").unwrap();
    let e = check_restored_shard(&store, 1, 3).unwrap_err().to_string();
    assert!(e.contains("unreadable"), "{e}");
}

/// The SafeTensors files of a snapshot restore onto any server count exactly as its RocksDB does; a file made
/// by another tool restores too; bad files are refused naming what is wrong, before anything is written.
#[test]
fn tensors_restore_as_the_snapshot_does() {
    use embedding::snapshot::tensors::{write_tables, TABLES_FILE};
    use embedding::tensors::{write_file, Dtype, TensorSpec};
    let dir = fast_tempdir();
    let stored: Vec<(u32, u64, Vec<f32>)> = (0..120u64)
        .map(|i| {
            (
                if i % 3 == 0 { 7 } else { 1 },
                i * 7_919 + 5,
                vec![i as f32 * 0.25 - 3.0; 13],
            )
        })
        .collect();
    let pushed: Vec<(u32, u64)> = (0..40u64).map(|i| (1, i * 104_729)).collect();
    let want = make_snapshot(dir.path(), 3, &stored, &pushed);
    for k in 0..3 {
        write_tables(&shard_dir(&dir.path().join("snap"), k, 3)).unwrap();
    }
    for m in [1u32, 2, 4] {
        let from_db = restore_all_with(dir.path(), m, &dir.path().join("snap"), restore);
        let from_tensors =
            restore_all_with(dir.path(), m, &dir.path().join("snap/"), restore_tensors);
        assert_eq!(from_tensors, from_db, "onto {m} servers");
        let all: Rows = from_tensors.into_iter().flatten().collect();
        assert_eq!(all, want);
    }

    // A table made by another tool: one file, its config in the metadata.
    let mut c = cfg(9, 2, OptimizerConfig::Sgd { lr: 0.5 });
    c.name = "items".into();
    let file = dir.path().join("items.safetensors");
    let make = |weights: [f32; 6], config: &TableConfig, path: &Path| {
        let specs = [
            TensorSpec {
                name: "items.ids".into(),
                dtype: Dtype::U64,
                shape: vec![3],
            },
            TensorSpec {
                name: "items.weight".into(),
                dtype: Dtype::F32,
                shape: vec![3, 2],
            },
        ];
        let meta = BTreeMap::from([
            (
                "format".to_string(),
                embedding::snapshot::tensors::TABLES_FORMAT.to_string(),
            ),
            (
                "items.config".to_string(),
                serde_json::to_string(config).unwrap(),
            ),
        ]);
        write_file(path, &specs, &meta, &mut |k, out| {
            let bytes: Vec<u8> = if k == 0 {
                [3u64, 10, 99]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect()
            } else {
                weights.iter().flat_map(|v| v.to_le_bytes()).collect()
            };
            out.write_all(&bytes)
                .map_err(|e| embedding::tensors::TensorsError::Io {
                    path: path.into(),
                    source: e,
                })
        })
        .unwrap();
    };
    make([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &c, &file);
    let out = dir.path().join("items-out");
    let stats = restore_tensors(&file, 1, 0, &out).unwrap();
    assert_eq!(
        (stats.rows_read, stats.rows_written, stats.tables),
        (3, 3, 1)
    );
    let e = Engine::open(Arc::new(RocksStore::open(out.join("rocksdb")).unwrap())).unwrap();
    assert_eq!(e.table(9).unwrap().row(10).unwrap(), vec![3.0, 4.0]);

    // Refusals, nothing written.
    make([1.0, f32::NAN, 3.0, 4.0, 5.0, 6.0], &c, &file);
    let out = dir.path().join("bad-out");
    let err = restore_tensors(&file, 1, 0, &out).unwrap_err().to_string();
    assert!(
        err.contains("\"items\"") && err.contains("weight 1 of id 3 is NaN"),
        "{err}"
    );
    assert!(!out.join("rocksdb").exists());
    let mut other = c.clone();
    other.dim = 3;
    make([0.0; 6], &other, &file);
    let err = restore_tensors(&file, 1, 0, &out).unwrap_err().to_string();
    assert!(
        err.contains("\"items.weight\"") && err.contains("shape [3, 2], expected [3, 3]"),
        "{err}"
    );
    let shard0 = shard_dir(&dir.path().join("snap"), 0, 3).join(TABLES_FILE);
    let bytes = std::fs::read(&shard0).unwrap();
    std::fs::write(&shard0, &bytes[..bytes.len() - 3]).unwrap();
    let err = restore_tensors(&dir.path().join("snap"), 2, 0, &out)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not a valid SafeTensors file") && err.contains("shard-0-of-3"),
        "{err}"
    );
}
