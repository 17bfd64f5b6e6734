//! Tests of the delta sync through [`super::Shard::handle`]: pushes recorded, deltas answered with current
//! values, paging, scans, retention, dense publication, checkpoints and refusals. Cuts are called directly
//! (no timer), so nothing depends on time or machine speed.

use super::*;
use crate::sync::SyncState;
use protocol::wire::dense::{self, DENSE_TABLE};
use protocol::wire::layout::put_ids;
use protocol::wire::message::sync::{self, DeltaBatch, SyncCursor, SyncPoint, SYNC_FILE};
use protocol::ShardMap;

const NOW: u64 = 1_000_000;
const INC: u64 = 0xabc;

fn shard_with(retain_rows: usize) -> Shard {
    let s = Shard {
        sync: SyncState::new(true, retain_rows, INC),
        ..crate::testing::memory_shard(ShardMap::new(1), 0)
    };
    let r = s.handle(
        Request::RegisterTables {
            tables: vec![
                TableConfig::counter(1, 2),
                TableConfig::counter(2, 1),
                dense::table_config(),
            ],
        },
        &[],
        NOW,
    );
    assert!(matches!(r.header, Response::Registered { .. }), "{r:?}");
    s
}

fn shard() -> Shard {
    shard_with(1 << 20)
}

/// Pushes `grad` to every id of `ids` in `table` of dim `dim`.
fn push(s: &Shard, table: u32, dim: u32, ids: &[u64], grad: f32) {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    codec::encode(
        &vec![grad; ids.len() * dim as usize],
        Encoding::F32,
        &mut payload,
    );
    let r = s.handle(
        Request::Push {
            lr_scale: 1.0,
            epoch: 1,
            encoding: Encoding::F32,
            grad_scale: 1.0,
            tables: vec![TableCount {
                table,
                count: ids.len() as u32,
                dim,
            }],
            id: protocol::wire::message::push::PushId::NONE,
        },
        &payload,
        NOW,
    );
    assert!(matches!(r.header, Response::Pushed { .. }), "{r:?}");
}

fn ask(s: &Shard, cursor: SyncCursor, max_rows: u32, dense_version: u64) -> DeltaBatch {
    ask_in(s, cursor, Encoding::F32, max_rows, dense_version)
}

fn ask_in(
    s: &Shard,
    cursor: SyncCursor,
    encoding: Encoding,
    max_rows: u32,
    dense_version: u64,
) -> DeltaBatch {
    let r = s.handle(
        sync::request(cursor, encoding, max_rows, 0, dense_version),
        &[],
        NOW,
    );
    match r.header {
        Response::Deltas { header } => sync::decode(header, &r.payload).unwrap(),
        other => panic!("expected deltas, got {other:?}"),
    }
}

/// A (table, id, row) of an answer.
type SyncedRow = (u32, u64, Vec<f32>);

/// Every (table, id, row) of answers from `cursor` until one is complete; returns them and the last cursor.
fn drain(s: &Shard, mut cursor: SyncCursor, max_rows: u32) -> (Vec<SyncedRow>, SyncCursor, bool) {
    let mut rows = Vec::new();
    let mut scan = false;
    loop {
        let b = ask(s, cursor, max_rows, u64::MAX);
        scan |= b.header.scan;
        assert!(b.rows() <= max_rows as usize);
        for t in &b.tables {
            for (i, &id) in t.ids.iter().enumerate() {
                let d = t.dim as usize;
                rows.push((t.table, id, t.rows[i * d..(i + 1) * d].to_vec()));
            }
        }
        cursor = b.header.cursor;
        if b.header.complete {
            return (rows, cursor, scan);
        }
    }
}

fn error_of(r: Reply) -> (ErrorCode, String) {
    match r.header {
        Response::Error { code, message } => (code, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn the_next_delta_holds_exactly_the_pushed_ids_with_current_values() {
    let s = shard();
    // A subscriber starting from nothing scans: nothing yet.
    let (rows, cursor, scan) = drain(&s, SyncCursor::START, 100);
    assert!(rows.is_empty() && scan);
    assert_eq!((cursor.incarnation, cursor.seq), (INC, 0));
    push(&s, 1, 2, &[5, 9], 1.0);
    push(&s, 2, 1, &[7], 2.0);
    push(&s, 1, 2, &[9], 1.0);
    push(&s, DENSE_TABLE, 64, &[0], 1.0);
    assert_eq!(s.sync.cut(NOW * 1_000_000 + 5), 1);
    let b = ask(&s, cursor, 100, 0);
    assert!(b.header.complete && !b.header.scan);
    assert_eq!(b.header.cursor.seq, 1);
    assert_eq!(b.header.cut_unix_us, NOW * 1_000_000 + 5);
    assert_eq!(b.header.oldest_change_unix_us, NOW * 1_000_000);
    assert_eq!(b.tables.len(), 2, "the dense table is not synced");
    assert_eq!((b.tables[0].table, &b.tables[0].ids), (1, &vec![5, 9]));
    // Counter tables are SGD with lr 1: the row is minus the summed gradients.
    assert_eq!(b.tables[0].rows, [-1.0, -1.0, -2.0, -2.0]);
    assert_eq!(
        (b.tables[1].table, &b.tables[1].ids, &b.tables[1].rows),
        (2, &vec![7], &vec![-2.0])
    );
    // Up to date: an empty, complete answer (no wait through `handle`).
    let b = ask(&s, b.header.cursor, 100, 0);
    assert!(b.tables.is_empty() && b.header.complete);
    assert_eq!(b.header.cursor.seq, 1);
    // F16 answers carry the same ids.
    push(&s, 1, 2, &[3], 0.5);
    s.sync.cut(NOW * 1_000_000 + 9);
    let b = ask_in(&s, b.header.cursor, Encoding::F16, 10, 0);
    assert_eq!(
        (b.tables[0].ids.as_slice(), b.tables[0].rows.as_slice()),
        (&[3u64][..], &[-0.5f32, -0.5][..])
    );
}

#[test]
fn pages_deliver_the_union_once_with_later_values() {
    let s = shard();
    let (_, start, _) = drain(&s, SyncCursor::START, 10);
    let ids: Vec<u64> = (0..25).collect();
    push(&s, 1, 2, &ids, 1.0);
    s.sync.cut(1);
    push(&s, 2, 1, &[100, 200], 1.0);
    push(&s, 1, 2, &[3], 1.0);
    s.sync.cut(2);
    let (rows, cursor, scan) = drain(&s, start, 4);
    assert!(!scan);
    assert_eq!(cursor.seq, 2);
    let got: Vec<(u32, u64)> = rows.iter().map(|(t, id, _)| (*t, *id)).collect();
    let mut want: Vec<(u32, u64)> = ids.iter().map(|&i| (1, i)).collect();
    want.extend([(2, 100), (2, 200)]);
    assert_eq!(got, want);
    // Id 3 was pushed twice: its current value.
    assert_eq!(rows[3].2, [-2.0, -2.0]);
}

#[test]
fn another_incarnation_gets_a_full_scan_then_the_deltas_after_it() {
    let s = shard();
    push(&s, 1, 2, &[1, 2, 3], 1.0);
    push(&s, 2, 1, &[4], 1.0);
    push(&s, DENSE_TABLE, 64, &[0], 1.0);
    s.sync.cut(1);
    let stale = SyncCursor {
        incarnation: INC + 1,
        seq: 7,
        resume: None,
    };
    let (rows, cursor, scan) = drain(&s, stale, 2);
    assert!(scan);
    let got: Vec<(u32, u64)> = rows.iter().map(|(t, id, _)| (*t, *id)).collect();
    assert_eq!(got, [(1, 1), (1, 2), (1, 3), (2, 4)]);
    assert_eq!((cursor.incarnation, cursor.seq), (INC, 1));
    // A change during or after the scan arrives as a delta.
    push(&s, 2, 1, &[4], 1.0);
    s.sync.cut(2);
    let (rows, _, scan) = drain(&s, cursor, 2);
    assert!(!scan);
    assert_eq!(rows, [(2, 4, vec![-2.0])]);
}

#[test]
fn dropped_deltas_fall_back_to_a_scan() {
    let s = shard_with(2);
    let (_, start, _) = drain(&s, SyncCursor::START, 10);
    push(&s, 1, 2, &[1, 2], 1.0);
    s.sync.cut(1);
    push(&s, 1, 2, &[3, 4], 1.0);
    s.sync.cut(2);
    // Delta 1 was dropped: a subscriber at seq 0 scans every row.
    let (rows, cursor, scan) = drain(&s, start, 10);
    assert!(scan);
    assert_eq!(rows.len(), 4);
    assert_eq!(cursor.seq, 2);
    // One at seq 1 still gets delta 2.
    let (rows, _, scan) = drain(&s, SyncCursor { seq: 1, ..cursor }, 10);
    assert!(!scan);
    assert_eq!(rows.iter().map(|r| r.1).collect::<Vec<_>>(), [3, 4]);
}

#[test]
fn the_newest_dense_version_is_appended_for_older_subscribers() {
    let s = shard();
    let publish_by = |job: u64, version: u64, values: &[f32]| {
        let mut p = Vec::new();
        sync::put_dense(values, &mut p);
        s.handle(
            sync::publish_request(job, version, version.wrapping_mul(10), values.len() as u32),
            &p,
            NOW,
        )
    };
    let publish = |version: u64, values: &[f32]| publish_by(7, version, values);
    assert!(matches!(
        publish(2, &[1.0, 2.0]).header,
        Response::Published { version: 2 }
    ));
    // An older version of another job is not kept: the answer names the newer one held.
    assert!(matches!(
        publish_by(8, 1, &[9.0]).header,
        Response::Published { version: 2 }
    ));
    // Within a job, versions grow.
    let (code, msg) = error_of(publish(2, &[9.0]));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(msg.contains("versions grow within a job"), "{msg}");
    // A version past the server's clock plus the skew allowed cannot pin later publications.
    let now_us = NOW * 1_000_000;
    for version in [u64::MAX, now_us + sync::MAX_DENSE_CLOCK_SKEW_US + 1] {
        let (code, msg) = error_of(publish_by(9, version, &[9.0]));
        assert_eq!(code, ErrorCode::BadRequest);
        assert!(msg.contains("ahead of this server's clock"), "{msg}");
    }
    let (_, cursor, _) = drain(&s, SyncCursor::START, 10);
    let b = ask(&s, cursor, 10, 0);
    let d = b.header.dense.unwrap();
    assert_eq!(
        (d.version, d.step, d.published_unix_us, d.len),
        (2, 20, NOW * 1_000_000, 2)
    );
    assert_eq!(b.dense.unwrap(), [1.0, 2.0]);
    assert!(ask(&s, cursor, 10, 2).dense.is_none());
    let (code, msg) = error_of(publish(0, &[1.0]));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(msg.contains("version 0"), "{msg}");
    let r = s.handle(sync::publish_request(7, 3, 1, 4), &[0; 8], NOW);
    let (code, msg) = error_of(r);
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(msg.contains("8 bytes, expected 16"), "{msg}");
}

#[test]
fn bad_sync_requests_get_typed_errors() {
    let s = shard();
    for (req, needle) in [
        (
            sync::request(SyncCursor::START, Encoding::Int8, 10, 0, 0),
            "encoding int8",
        ),
        (
            sync::request(SyncCursor::START, Encoding::F32, 0, 0, 0),
            "max_rows 0",
        ),
    ] {
        let (code, msg) = error_of(s.handle(req, &[], NOW));
        assert_eq!(code, ErrorCode::BadRequest);
        assert!(msg.contains(needle), "{msg} lacks {needle}");
    }
    let off = Shard {
        sync: SyncState::new(false, 10, INC),
        ..shard()
    };
    push(&off, 1, 2, &[1], 1.0);
    assert_eq!(off.sync.cut(1), 0);
    let (code, msg) = error_of(off.handle(
        sync::request(SyncCursor::START, Encoding::F32, 10, 0, 0),
        &[],
        NOW,
    ));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(msg.contains("sync-interval"), "{msg}");
}

#[test]
fn a_checkpoint_records_the_seq_its_snapshot_holds() {
    let s = shard();
    let dir = tempfile::tempdir().unwrap();
    push(&s, 1, 2, &[1], 1.0);
    s.sync.cut(1);
    push(&s, 1, 2, &[2], 1.0);
    let r = s.handle(
        Request::Checkpoint {
            dir: dir.path().join("snap").display().to_string(),
            step: 5,
            tensors: false,
            prune: None,
        },
        &[],
        NOW,
    );
    let Response::Checkpointed {
        rows,
        dir: shard_dir,
    } = r.header
    else {
        panic!("{r:?}")
    };
    assert_eq!(rows, 2, "both pushes are in the snapshot");
    let point = SyncPoint::read(std::path::Path::new(&shard_dir)).unwrap();
    assert_eq!(
        point,
        SyncPoint {
            incarnation: INC,
            seq: 2
        },
        "the checkpoint cut the pending push"
    );
    assert!(std::path::Path::new(&shard_dir).join(SYNC_FILE).exists());
    // A push after the checkpoint is in the next delta, and only it.
    push(&s, 2, 1, &[8], 1.0);
    s.sync.cut(3);
    let (rows, _, scan) = drain(&s, SyncCursor::at(point), 10);
    assert!(!scan);
    assert_eq!(rows, [(2, 8, vec![-1.0])]);
}

/// Answers one sync request at `s`, checking its frame fits `s.max_frame`; returns the decoded batch.
fn ask_within_frame(s: &Shard, cursor: SyncCursor, dense_version: u64) -> DeltaBatch {
    let r = s.handle(
        sync::request(cursor, Encoding::F32, sync::MAX_ROWS, 0, dense_version),
        &[],
        NOW,
    );
    let frame = protocol::wire::frame::encode_frame(&r.header, &r.payload).unwrap();
    assert!(
        frame.len() as u64 <= s.max_frame,
        "an answer of {} bytes, the frame cap is {}",
        frame.len(),
        s.max_frame
    );
    match r.header {
        Response::Deltas { header } => sync::decode(header, &r.payload).unwrap(),
        other => panic!("expected deltas, got {other:?}"),
    }
}

#[test]
fn answers_fit_the_frame_cap_with_dense_values_and_wide_rows() {
    // A 256 KiB frame cap: ~950 rows of dim 64 (f32) a page, and dense values of 200 KiB.
    let s = Shard {
        max_frame: 256 << 10,
        ..shard()
    };
    let r = s.handle(
        Request::RegisterTables {
            tables: vec![TableConfig::counter(3, 64)],
        },
        &[],
        NOW,
    );
    assert!(matches!(r.header, Response::Registered { .. }), "{r:?}");
    let ids: Vec<u64> = (1..=5000).collect();
    push(&s, 3, 64, &ids, -1.0);
    let dense: Vec<f32> = (0..50_000).map(|i| i as f32).collect();
    let mut p = Vec::new();
    sync::put_dense(&dense, &mut p);
    let r = s.handle(sync::publish_request(7, 5, 1, dense.len() as u32), &p, NOW);
    assert!(matches!(r.header, Response::Published { .. }), "{r:?}");
    // A new subscriber: a scan (another incarnation), the dense values first, alone; then pages of rows.
    let mut cursor = SyncCursor::START;
    let (mut seen, mut dense_version, mut answers) = (Vec::new(), 0, 0);
    loop {
        let b = ask_within_frame(&s, cursor, dense_version);
        answers += 1;
        if let (Some(info), Some(values)) = (&b.header.dense, &b.dense) {
            assert_eq!(values, &dense);
            assert!(
                b.tables.is_empty(),
                "the dense values leave no room for rows"
            );
            dense_version = info.version;
        }
        for t in b.tables.iter().filter(|t| t.table == 3) {
            assert!(t.rows.iter().all(|&v| v == 1.0));
            seen.extend_from_slice(&t.ids);
        }
        cursor = b.header.cursor;
        if b.header.complete {
            break;
        }
        assert!(answers < 100, "the scan never completes");
    }
    assert_eq!(dense_version, 5);
    assert_eq!(seen, ids, "every row once, in order");
    assert!(
        answers > 5,
        "{answers} answers: pages were not cut by bytes"
    );
    // A delta of every row: pages within the cap too.
    push(&s, 3, 64, &ids, -1.0);
    s.sync.cut(NOW * 1_000_000 + 1);
    let mut seen = Vec::new();
    loop {
        let b = ask_within_frame(&s, cursor, dense_version);
        for t in b.tables.iter().filter(|t| t.table == 3) {
            assert!(t.rows.iter().all(|&v| v == 2.0));
            seen.extend_from_slice(&t.ids);
        }
        cursor = b.header.cursor;
        if b.header.complete {
            break;
        }
    }
    assert_eq!(seen, ids);
}

#[test]
fn rows_expired_or_not_admitted_reach_subscribers_as_deletions_ordered_with_pushes() {
    let s = shard();
    let ttl = TableConfig {
        admission: Some(embedding::AdmissionConfig {
            min_count: 2,
            width: 1024,
            depth: 2,
        }),
        ttl_secs: Some(10),
        ..TableConfig::counter(3, 1)
    };
    let r = s.handle(Request::RegisterTables { tables: vec![ttl] }, &[], NOW);
    assert!(matches!(r.header, Response::Registered { .. }), "{r:?}");
    // Ids 1..=3 pushed twice (admitted), id 9 once (not admitted: no row).
    push(&s, 3, 1, &[1, 2, 3], 1.0);
    push(&s, 3, 1, &[1, 2, 3, 9], 1.0);
    s.sync.cut(NOW * 1_000_000 + 1);
    let at_zero = SyncCursor {
        incarnation: INC,
        seq: 0,
        resume: None,
    };
    let b = ask(&s, at_zero, 100, 0);
    assert_eq!(b.tables[0].ids, [1, 2, 3]);
    assert_eq!(b.tables[0].rows, [-1.0, -1.0, -1.0], "the second push");
    assert_eq!(
        b.deleted,
        [sync::DeletedIds {
            table: 3,
            ids: vec![9]
        }],
        "an id without a row is a deletion, not its initializer"
    );
    // The expiry timer's pass, 11 s later: every row of table 3 goes, and the sync records them.
    let stats = crate::writeback::expire(&s.engine, NOW + 11, &mut |t, ids| {
        s.sync.record([(t, ids)], NOW * 1_000_000 + 2)
    })
    .unwrap();
    assert_eq!(stats.rows_deleted, 3);
    // Id 2 comes back before the next cut (admitted at once: the sketch still counts it): its new row.
    push(&s, 3, 1, &[2], 1.0);
    push(&s, 3, 1, &[2], 1.0);
    s.sync.cut(NOW * 1_000_000 + 3);
    let b = ask(&s, b.header.cursor, 100, 0);
    assert_eq!(
        (b.tables.len(), b.tables[0].ids.as_slice()),
        (1, &[2u64][..])
    );
    assert_eq!(
        b.tables[0].rows,
        [-2.0],
        "a fresh row, not the expired one (-1)"
    );
    assert_eq!(
        b.deleted,
        [sync::DeletedIds {
            table: 3,
            ids: vec![1, 3]
        }]
    );
    assert_eq!((b.rows(), b.deletions()), (1, 2));
    // A scan lists only rows: the subscriber deletes what a page's range leaves out.
    let (rows, _, scan) = drain(&s, SyncCursor::START, 1);
    assert!(scan);
    assert_eq!(
        rows.iter()
            .filter(|r| r.0 == 3)
            .map(|r| r.1)
            .collect::<Vec<_>>(),
        [2]
    );
}

#[test]
fn an_export_prune_that_would_prune_nothing_is_refused_naming_what_is_missing() {
    let s = shard();
    let dir = tempfile::tempdir().unwrap();
    let ask = |prune: embedding::ExportPrune| {
        error_of(s.handle(
            Request::Checkpoint {
                dir: dir.path().join("snap").display().to_string(),
                step: 1,
                tensors: true,
                prune: Some(prune),
            },
            &[],
            NOW,
        ))
    };
    let (code, message) = ask(embedding::ExportPrune {
        max_age_secs: Some(60),
        min_count: None,
        min_score: None,
    });
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(
        message.contains("max_age_secs 60 needs last-update stamps"),
        "{message}"
    );
    let (_, message) = ask(embedding::ExportPrune {
        max_age_secs: None,
        min_count: Some(3),
        min_score: None,
    });
    assert!(
        message.contains("min_count 3 needs update counts"),
        "{message}"
    );
    let (_, message) = ask(embedding::ExportPrune {
        max_age_secs: Some(0),
        min_count: None,
        min_score: None,
    });
    assert!(message.contains("max_age_secs 0"), "{message}");
    let (_, message) = ask(embedding::ExportPrune {
        max_age_secs: None,
        min_count: None,
        min_score: Some(0.5),
    });
    assert!(message.contains("min_score 0.5 needs scores"), "{message}");
    let (_, message) = ask(embedding::ExportPrune {
        max_age_secs: None,
        min_count: None,
        min_score: Some(f32::NAN),
    });
    assert!(message.contains("min_score NaN"), "{message}");
    assert!(!dir.path().join("snap").exists(), "nothing written");
}

/// An expiry tells the sync only once the rows are gone: a delta cut and answered the moment the ids are
/// recorded already sends them as deletions (told before the deletion, such an answer sent them as rows, and
/// nothing sent their deletion later).
#[test]
fn an_expiry_is_recorded_only_once_its_rows_are_gone() {
    let s = shard();
    let ttl = TableConfig {
        ttl_secs: Some(10),
        ..TableConfig::counter(3, 1)
    };
    let r = s.handle(Request::RegisterTables { tables: vec![ttl] }, &[], NOW);
    assert!(matches!(r.header, Response::Registered { .. }), "{r:?}");
    push(&s, 3, 1, &[4, 8], 1.0);
    s.sync.cut(NOW * 1_000_000 + 1);
    let cursor = ask(
        &s,
        SyncCursor {
            incarnation: INC,
            seq: 0,
            resume: None,
        },
        100,
        0,
    )
    .header
    .cursor;
    let mut seen = Vec::new();
    crate::writeback::expire(&s.engine, NOW + 11, &mut |t, ids| {
        s.sync.record([(t, ids)], NOW * 1_000_000 + 2);
        s.sync.cut(NOW * 1_000_000 + 3);
        seen.push(ask(&s, cursor, 100, 0));
    })
    .unwrap();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].tables.is_empty(), "{:?}", seen[0].tables);
    assert_eq!(
        seen[0].deleted,
        [sync::DeletedIds {
            table: 3,
            ids: vec![4, 8]
        }]
    );
}
