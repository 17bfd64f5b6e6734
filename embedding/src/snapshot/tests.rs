//! Tests of snapshots: round trip, consistency under concurrent pushes, refusals, corruption.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::*;
use crate::batch::DirtyBatch;
use crate::config::OptimizerConfig;
use crate::mem_store::MemStore;

fn shard(index: u32, num_shards: u32) -> ShardInfo {
    ShardInfo {
        index,
        num_shards,
        epoch: 1,
        num_virtual_shards: 4096,
        routing_fingerprint: 0xfeed,
    }
}

fn cfg(id: u32, dim: usize) -> TableConfig {
    let mut c = TableConfig::new(id, format!("C{id}"), dim);
    c.seed = 7;
    c
}

/// Every row of every table of a snapshot, as f32 bits.
fn snapshot_rows(s: &Snapshot) -> BTreeMap<(u32, u64), Vec<u32>> {
    let mut out = BTreeMap::new();
    for t in &s.manifest().tables {
        s.for_each_row(t.id, &mut |id, bytes| {
            let bits = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            out.insert((t.id, id), bits);
            Ok(())
        })
        .unwrap();
    }
    out
}

fn engine_rows(e: &Engine, ids: &[u64]) -> BTreeMap<(u32, u64), Vec<u32>> {
    let mut out = BTreeMap::new();
    for cfg in e.tables() {
        let t = e.table(cfg.id).unwrap();
        for &id in ids {
            if let Some(row) = t.row(id) {
                out.insert((cfg.id, id), row.iter().map(|x| x.to_bits()).collect());
            }
        }
    }
    out
}

#[test]
fn checkpoint_holds_flushed_and_dirty_rows_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RocksStore::open(dir.path().join("live")).unwrap());
    let e = Engine::open(store).unwrap();
    e.register_table(cfg(1, 4)).unwrap();
    e.register_table(cfg(2, 8)).unwrap();
    let ids: Vec<u64> = (0..300).map(|i| i * 7_919 + 3).collect();
    e.apply(1, &ids, &vec![0.5; ids.len() * 4]).unwrap();
    e.flush_dirty().unwrap();
    // Dirty at checkpoint time: only the checkpoint's own write-back can put these in the snapshot.
    e.apply(1, &ids[..100], &vec![-0.25; 400]).unwrap();
    e.apply(2, &ids[50..], &vec![1.5; 250 * 8]).unwrap();
    let want = engine_rows(&e, &ids);

    let m = e
        .checkpoint(&dir.path().join("snap"), 12, shard(1, 3), 1_700_000_000)
        .unwrap();
    assert_eq!(
        (m.step, m.created_unix_secs, m.shard),
        (12, 1_700_000_000, shard(1, 3))
    );
    assert_eq!(
        m.tables.iter().map(|t| t.rows).collect::<Vec<_>>(),
        vec![300, 250]
    );
    assert_eq!(m.tables[1].config, cfg(2, 8));
    assert_eq!(
        m.tables[0].row_len, 5,
        "dim 4 + one row-wise Adagrad accumulator"
    );

    let s = Snapshot::open(&shard_dir(&dir.path().join("snap"), 1, 3)).unwrap();
    assert_eq!(s.manifest(), &m);
    assert_eq!(snapshot_rows(&s), want);
    // The checkpoint left nothing dirty behind and the engine keeps working.
    e.apply(1, &ids[..1], &[1.0; 4]).unwrap();
}

#[test]
fn mem_store_checkpoints_into_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Arc::new(MemStore::new())).unwrap();
    e.register_table(cfg(5, 3)).unwrap();
    let ids: Vec<u64> = (0..50).collect();
    e.apply(5, &ids, &vec![0.1; 150]).unwrap();
    let want = engine_rows(&e, &ids);
    e.checkpoint(dir.path(), 1, shard(0, 1), 0).unwrap();
    let s = Snapshot::open(&shard_dir(dir.path(), 0, 1)).unwrap();
    assert_eq!(snapshot_rows(&s), want);
    // The snapshot's database is a store an engine can open.
    drop(s);
    let back = Engine::open(Arc::new(
        RocksStore::open(shard_dir(dir.path(), 0, 1).join(DB_DIR)).unwrap(),
    ))
    .unwrap();
    assert_eq!(back.tables(), vec![cfg(5, 3)]);
    assert_eq!(engine_rows(&back, &ids), want);
}

/// Pushes of SGD gradients of 1.0 to every row of two tables, each push one [`PushGuard`]: in a consistent
/// snapshot every row of both tables has seen the same number of pushes.
#[test]
fn checkpoint_never_holds_half_of_a_push() {
    let dir = tempfile::tempdir().unwrap();
    let e = Arc::new(
        Engine::open(Arc::new(RocksStore::open(dir.path().join("live")).unwrap())).unwrap(),
    );
    for id in [1, 2] {
        let mut c = cfg(id, 2);
        c.optimizer = OptimizerConfig::Sgd { lr: 1.0 };
        e.register_table(c).unwrap();
    }
    let ids: Vec<u64> = (0..2_000).collect();
    let initial = engine_rows(&e, &ids);
    assert!(initial.is_empty());
    let mut init = vec![0f32; ids.len() * 2];
    e.table(1).unwrap().gather(&ids, &mut init).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let pusher = {
        let (e, stop, ids) = (e.clone(), stop.clone(), ids.clone());
        std::thread::spawn(move || {
            let grads = vec![1.0f32; ids.len() * 2];
            let mut pushes = 0u32;
            while !stop.load(Ordering::Relaxed) || pushes < 3 {
                let push = e.begin_push();
                // Many small applies per push, so a checkpoint between them would show.
                for chunk in 0..10 {
                    let r = chunk * 200..(chunk + 1) * 200;
                    push.apply(1, &ids[r.clone()], &grads[..400]).unwrap();
                    push.apply(2, &ids[r], &grads[..400]).unwrap();
                }
                pushes += 1;
            }
            pushes
        })
    };
    let mut seen = Vec::new();
    for k in 0..3u32 {
        let m = e
            .checkpoint(dir.path(), u64::from(k), shard(k, 3), 0)
            .unwrap();
        let s = Snapshot::open(&shard_dir(dir.path(), k, 3)).unwrap();
        let rows = snapshot_rows(&s);
        let mut counts = std::collections::BTreeSet::new();
        for ((table, id), bits) in &rows {
            let t1_init = &init[*id as usize * 2..*id as usize * 2 + 2];
            // Table 2 shares table 1's seed, so its initial weights are the same.
            let w = f32::from_bits(bits[0]);
            counts.insert(((t1_init[0] - w).round() as i64, *table));
        }
        let pushes: std::collections::BTreeSet<i64> = counts.iter().map(|c| c.0).collect();
        assert!(
            pushes.len() <= 1,
            "snapshot {k} holds rows at different push counts: {pushes:?}"
        );
        assert!(m.rows() == 0 || m.rows() == 4_000, "{}", m.rows());
        seen.extend(pushes);
    }
    stop.store(true, Ordering::Relaxed);
    let total = pusher.join().unwrap();
    assert!(total >= 3, "{total}");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
}

#[test]
fn existing_target_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Arc::new(MemStore::new())).unwrap();
    e.register_table(cfg(1, 2)).unwrap();
    e.checkpoint(dir.path(), 1, shard(0, 2), 0).unwrap();
    let err = e.checkpoint(dir.path(), 2, shard(0, 2), 0).unwrap_err();
    assert!(matches!(err, SnapshotError::Exists { .. }), "{err}");
    assert!(
        err.to_string().contains("shard-0-of-2: already exists"),
        "{err}"
    );
    assert_eq!(read_manifest(&shard_dir(dir.path(), 0, 2)).unwrap().step, 1);
}

#[test]
fn a_retried_checkpoint_is_idempotent_and_an_incomplete_one_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Arc::new(MemStore::new())).unwrap();
    e.register_table(cfg(1, 2)).unwrap();
    let first = e.checkpoint(dir.path(), 5, shard(1, 2), 0).unwrap();
    // The same request again (its first answer was lost): the same snapshot, not an error.
    let again = e.checkpoint(dir.path(), 5, shard(1, 2), 99).unwrap();
    assert_eq!(again.created_unix_secs, first.created_unix_secs);
    // A checkpoint killed before its manifest leaves a directory that the next attempt replaces.
    let target = shard_dir(dir.path(), 0, 2);
    std::fs::create_dir_all(target.join("rocksdb")).unwrap();
    std::fs::write(target.join("rocksdb").join("junk"), b"half written").unwrap();
    let m = e.checkpoint(dir.path(), 5, shard(0, 2), 0).unwrap();
    assert_eq!(read_manifest(&target).unwrap().step, m.step);
    assert!(!target.join("rocksdb").join("junk").exists());
}

#[test]
fn missing_or_foreign_manifests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = Snapshot::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, SnapshotError::MissingManifest { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .ends_with("no manifest.json (not a snapshot, or an incomplete one)"),
        "{err}"
    );

    let e = Engine::open(Arc::new(MemStore::new())).unwrap();
    e.register_table(cfg(1, 2)).unwrap();
    e.checkpoint(dir.path(), 1, shard(0, 1), 0).unwrap();
    let sd = shard_dir(dir.path(), 0, 1);
    let path = sd.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("\"format_version\": 1", "\"format_version\": 9"),
    )
    .unwrap();
    let err = Snapshot::open(&sd).unwrap_err();
    assert!(
        matches!(
            err,
            SnapshotError::FormatVersion {
                found: 9,
                expected: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("snapshot format version 9, this build reads version 1"),
        "{err}"
    );
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    let err = Snapshot::open(&sd).unwrap_err();
    assert!(matches!(err, SnapshotError::BadManifest { .. }), "{err}");
}

#[test]
fn shard_dir_names_round_trip() {
    assert_eq!(parse_shard_dir_name("shard-2-of-5"), Some((2, 5)));
    assert_eq!(
        shard_dir(Path::new("/s"), 2, 5),
        Path::new("/s/shard-2-of-5")
    );
    for bad in [
        "shard-5-of-5",
        "shard-x-of-2",
        "shard-1",
        "manifest.json",
        "shard--1-of-2",
    ] {
        assert_eq!(parse_shard_dir_name(bad), None, "{bad}");
    }
}

/// A truncated value in a snapshot's database is a typed error naming table and id, not a panic.
#[test]
fn truncated_value_in_a_snapshot_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Arc::new(MemStore::new())).unwrap();
    e.register_table(cfg(3, 4)).unwrap();
    e.apply(3, &[10, 11, 12], &[0.5; 12]).unwrap();
    e.checkpoint(dir.path(), 1, shard(0, 1), 0).unwrap();
    let sd = shard_dir(dir.path(), 0, 1);
    {
        // Damage one value behind the snapshot's back.
        let db = RocksStore::open(sd.join(DB_DIR)).unwrap();
        let mut b = DirtyBatch::new();
        b.reset(7);
        b.push_bytes(11, &[1, 2, 3, 4, 5, 6, 7]);
        db.write_rows(3, &b, true).unwrap();
    }
    let s = Snapshot::open(&sd).unwrap();
    let err = s.for_each_row(3, &mut |_, _| Ok(())).unwrap_err();
    assert!(
        matches!(
            &err,
            SnapshotError::Store {
                source: StoreError::CorruptValue {
                    table: 3,
                    id: 11,
                    len: 7,
                    expected: 20
                },
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .ends_with("table 3 id 11: corrupt row value of 7 bytes, expected 20"),
        "{err}"
    );
}

/// A snapshot whose SST file was cut short fails to open or to scan with an error, never a panic.
#[test]
fn truncated_sst_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Arc::new(MemStore::new())).unwrap();
    e.register_table(cfg(3, 16)).unwrap();
    let ids: Vec<u64> = (0..2_000).collect();
    e.apply(3, &ids, &vec![0.5; ids.len() * 16]).unwrap();
    e.checkpoint(dir.path(), 1, shard(0, 1), 0).unwrap();
    let sd = shard_dir(dir.path(), 0, 1);
    {
        // Force the rows into an SST file (a MemStore checkpoint may leave them in the WAL).
        let db = RocksStore::open(sd.join(DB_DIR)).unwrap();
        drop(db);
    }
    let mut ssts: Vec<_> = std::fs::read_dir(sd.join(DB_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sst" || x == "log"))
        .collect();
    ssts.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let biggest = ssts.last().expect("an sst or log file");
    let len = std::fs::metadata(biggest).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(biggest)
        .unwrap();
    f.set_len(len / 2).unwrap();
    drop(f);
    let result = Snapshot::open(&sd).and_then(|s| s.for_each_row(3, &mut |_, _| Ok(())));
    let err = result.expect_err("a snapshot cut in half must not read as whole");
    let msg = err.to_string();
    assert!(msg.starts_with("snapshot "), "{msg}");
}

#[test]
fn tables_file_holds_the_snapshot_rows_and_refuses_what_does_not_fit() {
    use super::tensors::{read_tables, write_tables, TABLES_FILE};
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RocksStore::open(dir.path().join("live")).unwrap());
    let e = Engine::open(store).unwrap();
    e.register_table(cfg(1, 4)).unwrap();
    let mut sgd = cfg(2, 3);
    sgd.optimizer = OptimizerConfig::Sgd { lr: 0.1 };
    e.register_table(sgd).unwrap();
    // A second table named like the first: its tensors get the id in their names.
    let mut twin = cfg(3, 2);
    twin.name = "C1".into();
    e.register_table(twin).unwrap();
    let ids: Vec<u64> = (0..200).map(|i| i * 104_729 + 11).collect();
    e.apply(1, &ids, &vec![0.5; ids.len() * 4]).unwrap();
    e.flush_dirty().unwrap();
    e.apply(1, &ids[..60], &vec![-0.25; 240]).unwrap();
    e.apply(2, &ids[20..], &vec![1.5; 180 * 3]).unwrap();
    e.apply(3, &ids[..5], &[0.125; 10]).unwrap();
    e.checkpoint(&dir.path().join("snap"), 9, shard(0, 1), 0)
        .unwrap();
    let shard_dir = shard_dir(&dir.path().join("snap"), 0, 1);
    let size = write_tables(&shard_dir).unwrap();
    let path = shard_dir.join(TABLES_FILE);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);

    let s = Snapshot::open(&shard_dir).unwrap();
    let want = snapshot_rows(&s);
    let tables = read_tables(&path).unwrap();
    let names: Vec<&str> = tables.iter().map(|t| t.prefix.as_str()).collect();
    assert_eq!(names, ["C1@1", "C1@3", "C2"]);
    let mut got = BTreeMap::new();
    for t in &tables {
        let (dim, sl) = (t.config.dim, t.config.state_len());
        for (i, &id) in t.ids.iter().enumerate() {
            let mut row: Vec<u32> = t.weights[i * dim..(i + 1) * dim]
                .iter()
                .map(|x| x.to_bits())
                .collect();
            row.extend(t.state[i * sl..(i + 1) * sl].iter().map(|x| x.to_bits()));
            got.insert((t.config.id, id), row);
        }
    }
    assert_eq!(got, want, "every row of the snapshot, bit for bit");
    assert!(tables
        .iter()
        .any(|t| t.config.id == 2 && t.state.is_empty()));

    // A truncated file and a file of another layout are refused, naming the file or the tensor.
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e1 = read_tables(&cut).unwrap_err().to_string();
    assert!(
        e1.contains("cut.safetensors") && e1.contains("not a valid SafeTensors"),
        "{e1}"
    );
    let foreign = dir.path().join("foreign.safetensors");
    crate::tensors::write_file(
        &foreign,
        &[crate::tensors::TensorSpec {
            name: "C2.ids".into(),
            dtype: crate::tensors::Dtype::F32,
            shape: vec![2],
        }],
        &BTreeMap::from([
            (
                "format".to_string(),
                super::tensors::TABLES_FORMAT.to_string(),
            ),
            (
                "C2.config".to_string(),
                serde_json::to_string(&tables[2].config).unwrap(),
            ),
        ]),
        &mut |_, out| {
            out.write_all(&[0u8; 8])
                .map_err(|e| crate::tensors::TensorsError::Io {
                    path: "mem".into(),
                    source: e,
                })
        },
    )
    .unwrap();
    let e2 = read_tables(&foreign).unwrap_err().to_string();
    assert!(
        e2.contains("\"C2.ids\"") && e2.contains("dtype F32, expected U64"),
        "{e2}"
    );
}

/// Publish-time pruning: an export snapshot leaves out the rows of a TTL table untouched for `max_age_secs`
/// and the rows of a capped table counted fewer than `min_count` updates (manifest counts and the SafeTensors
/// file agree); tables keeping neither stamps nor counts are whole, and the live tables keep every row.
#[test]
fn a_pruned_checkpoint_leaves_out_old_and_rare_rows() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Arc::new(RocksStore::open(dir.path().join("live")).unwrap())).unwrap();
    let ttl = TableConfig {
        ttl_secs: Some(1_000_000),
        ..cfg(1, 2)
    };
    let capped = TableConfig {
        eviction: Some(crate::EvictionConfig {
            policy: crate::EvictionPolicy::Lfu,
            max_rows: Some(1_000),
            max_bytes: None,
            decay_secs: None,
        }),
        ..cfg(2, 2)
    };
    let scored = TableConfig {
        eviction: Some(crate::EvictionConfig {
            policy: crate::EvictionPolicy::Score,
            max_rows: Some(1_000),
            max_bytes: None,
            decay_secs: None,
        }),
        ..cfg(4, 2)
    };
    for c in [ttl, capped, cfg(3, 2), scored] {
        e.register_table(c).unwrap();
    }
    // Table 1: ids 0..10 last updated at t=100, 10..20 at t=500. Table 2: ids 0..5 updated three times,
    // 5..10 once. Table 3: no stamps, no counts.
    let g = |n: usize| vec![0.5f32; n * 2];
    let old: Vec<u64> = (0..10).collect();
    let new: Vec<u64> = (10..20).collect();
    e.apply_at(1, &old, &g(10), 100).unwrap();
    e.apply_at(1, &new, &g(10), 500).unwrap();
    let (hot, rare): (Vec<u64>, Vec<u64>) = ((0..5).collect(), (5..10).collect());
    for _ in 0..3 {
        e.apply_at(2, &hot, &g(5), 500).unwrap();
    }
    e.apply_at(2, &rare, &g(5), 500).unwrap();
    e.apply_at(3, &old, &g(10), 100).unwrap();
    // Table 4: pushed equally; ids 0..5 scored 3 (1 + 2 added), 5..10 scored 0.5 (set after 9).
    for _ in 0..3 {
        e.apply_at(4, &old, &g(10), 500).unwrap();
    }
    e.score(4, &hot, &[1.0; 5], crate::ScoreMode::Add).unwrap();
    e.score(4, &hot, &[2.0; 5], crate::ScoreMode::Add).unwrap();
    e.score(4, &rare, &[9.0; 5], crate::ScoreMode::Add).unwrap();
    e.score(4, &rare, &[0.5; 5], crate::ScoreMode::Set).unwrap();
    let prune = ExportPrune {
        max_age_secs: Some(300),
        min_count: Some(2),
        min_score: Some(1.0),
    };
    let snap = dir.path().join("snap");
    let m = e
        .checkpoint_with(&snap, 1, shard(0, 1), 600, &mut Vec::new, Some(&prune))
        .unwrap();
    assert_eq!(
        m.tables.iter().map(|t| (t.id, t.rows)).collect::<Vec<_>>(),
        [(1, 10), (2, 5), (3, 10), (4, 5)]
    );
    let s = Snapshot::open(&shard_dir(&snap, 0, 1)).unwrap();
    let held: Vec<(u32, u64)> = snapshot_rows(&s).into_keys().collect();
    let want: Vec<(u32, u64)> = new
        .iter()
        .map(|&i| (1, i))
        .chain(hot.iter().map(|&i| (2, i)))
        .chain(old.iter().map(|&i| (3, i)))
        .chain(hot.iter().map(|&i| (4, i)))
        .collect();
    assert_eq!(held, want);
    tensors::write_tables(&shard_dir(&snap, 0, 1)).unwrap();
    let file = tensors::read_tables(&shard_dir(&snap, 0, 1).join(tensors::TABLES_FILE)).unwrap();
    assert_eq!(file[0].ids, new);
    assert_eq!(file[1].ids, hot);
    assert_eq!(file[3].ids, hot);
    // The training tables keep every row.
    assert_eq!(
        (
            e.table(1).unwrap().len(),
            e.table(2).unwrap().len(),
            e.table(3).unwrap().len()
        ),
        (20, 10, 10)
    );
    assert!(ExportPrune {
        max_age_secs: None,
        min_count: None,
        min_score: None,
    }
    .validate()
    .unwrap_err()
    .contains("give max_age_secs"));
}
