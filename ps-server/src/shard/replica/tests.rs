//! The replica rules of one server without sockets: fencing by shard epoch, the order of a backup's stream,
//! what a backup refuses, and when it accepts a promotion.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use protocol::wire::layout::put_ids;
use protocol::wire::message::replicate::{self, ReplicateHeader, ReplicateKind, Role, RowsTable};
use protocol::{Encoding, ErrorCode, Request, Response, ShardMap, TableConfig, TableCount};

use super::Replica;
use crate::config::Durability;
use crate::reply::Reply;
use crate::shard::Shard;

const NOW: u64 = 1_000_000;

/// A backup at shard epoch 3 that joined under session 7, holding table 1 (dim 2, SGD: rows of 2 f32s).
fn backup() -> Shard {
    let s = Shard {
        durability: Durability::Replicated,
        replica: two_replicas(0),
        ..crate::testing::memory_shard(ShardMap::new(1), 0)
    };
    s.handle(
        Request::RegisterTables {
            tables: vec![TableConfig::counter(1, 2)],
        },
        &[],
        NOW,
    );
    s.replica.epoch.store(3, Ordering::Release);
    s.replica.step_down(None);
    s.replica.stream.lock().session = 7;
    s.replica.stream.lock().next_seq = 1;
    s
}

/// Replica `index` of a shard of two (its peer is never dialed here), primary at epoch 1.
fn two_replicas(index: u32) -> Replica {
    let names = ["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
    let peers = super::peer::Peers::new(&names, index, Default::default());
    Replica::build(index, peers, true, Role::Primary, 1)
}

fn header(epoch: u64, session: u64, seq: u64, kind: ReplicateKind, rows: u32) -> ReplicateHeader {
    ReplicateHeader {
        shard_epoch: epoch,
        session,
        seq,
        messages: 1,
        kind,
        new_tables: Vec::new(),
        tables: vec![RowsTable {
            table: 1,
            count: rows,
            row_len: 2,
        }],
        pushes: Vec::new(),
    }
}

fn rows_payload(ids: &[u64], value: f32) -> Vec<u8> {
    let mut p = Vec::new();
    replicate::put_rows(ids, &vec![value; ids.len() * 2], &mut p);
    p
}

fn code(r: Reply) -> (ErrorCode, String) {
    match r.header {
        Response::Error { code, message } => (code, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn replicate(s: &Shard, h: ReplicateHeader, payload: &[u8]) -> Reply {
    s.handle(Request::Replicate { header: h }, payload, NOW)
}

#[test]
fn an_older_epoch_is_refused_typed_and_a_gap_or_another_session_too() {
    let s = backup();
    let p = rows_payload(&[5, 9], 0.5);
    let (c, m) = code(replicate(&s, header(2, 7, 1, ReplicateKind::Stream, 2), &p));
    assert_eq!(c, ErrorCode::StaleEpoch, "{m}");
    assert!(m.contains("epoch 2") && m.contains("epoch 3"), "{m}");
    let (c, m) = code(replicate(&s, header(3, 8, 1, ReplicateKind::Stream, 2), &p));
    assert_eq!(c, ErrorCode::BadRequest);
    assert!(m.contains("session"), "{m}");
    let (c, m) = code(replicate(&s, header(3, 7, 2, ReplicateKind::Stream, 2), &p));
    assert_eq!(c, ErrorCode::BadRequest);
    assert!(m.contains("message 2, expected 1"), "{m}");
    let (c, m) = code(replicate(&s, header(3, 7, 1, ReplicateKind::Stream, 3), &p));
    assert_eq!(c, ErrorCode::BadRequest, "{m}");
    // Nothing refused was stored.
    assert_eq!(s.engine.table(1).unwrap().row(5), None);
}

#[test]
fn the_stream_is_stored_in_order_and_ends_the_catch_up() {
    let s = backup();
    let r = replicate(
        &s,
        header(3, 7, 1, ReplicateKind::CatchUp, 2),
        &rows_payload(&[5, 9], 0.5),
    );
    assert_eq!(r.header, Response::Replicated { seq: 1 });
    assert!(!s.replica.in_sync.load(Ordering::Acquire));
    let r = replicate(
        &s,
        header(3, 7, 2, ReplicateKind::CaughtUp, 1),
        &rows_payload(&[5], -1.0),
    );
    assert_eq!(r.header, Response::Replicated { seq: 2 });
    assert!(s.replica.info().in_sync);
    let t = s.engine.table(1).unwrap();
    assert_eq!(t.row(5).unwrap(), vec![-1.0, -1.0]);
    assert_eq!(t.row(9).unwrap(), vec![0.5, 0.5]);
    assert_eq!(t.dirty_len(), 2, "a backup writes back the rows it stores");
    // A newer epoch from the primary (it was promoted meanwhile) is taken.
    let r = replicate(
        &s,
        header(4, 7, 3, ReplicateKind::Stream, 1),
        &rows_payload(&[9], 2.0),
    );
    assert_eq!(r.header, Response::Replicated { seq: 3 });
    assert_eq!(s.replica.epoch(), 4);
}

#[test]
fn a_backup_refuses_pushes_and_reads_until_in_sync() {
    let s = backup();
    let mut ids = Vec::new();
    put_ids(&[5], &mut ids);
    let tables = vec![TableCount {
        table: 1,
        count: 1,
        dim: 2,
    }];
    let mut push = ids.clone();
    push.extend_from_slice(&[0u8; 8]);
    let (c, m) = code(s.handle(
        Request::Push {
            lr_scale: 1.0,
            epoch: 1,
            encoding: Encoding::F32,
            grad_scale: 1.0,
            tables: tables.clone(),
            id: protocol::wire::message::push::PushId::NONE,
        },
        &push,
        NOW,
    ));
    assert_eq!(c, ErrorCode::NotPrimary);
    assert!(m.contains("backup"), "{m}");
    let pull = || {
        s.handle(
            Request::Pull {
                epoch: 1,
                encoding: Encoding::F32,
                tables: tables.clone(),
            },
            &ids,
            NOW,
        )
    };
    assert_eq!(code(pull()).0, ErrorCode::NotPrimary);
    s.replica.in_sync.store(true, Ordering::Release);
    assert!(matches!(pull().header, Response::Pulled { .. }));
}

#[test]
fn promotion_needs_sync_and_silence_and_bumps_the_epoch_once() {
    let s = backup();
    let promote = |e| {
        s.handle(
            Request::Promote {
                shard_epoch: e,
                force: false,
            },
            &[],
            NOW,
        )
    };
    let (c, m) = code(promote(3));
    assert_eq!(c, ErrorCode::NotInSync);
    assert!(m.contains("catching up"), "{m}");
    s.replica.in_sync.store(true, Ordering::Release);
    s.replica.heard();
    let (c, m) = code(promote(3));
    assert_eq!(c, ErrorCode::NotInSync);
    assert!(m.contains("heard from its primary"), "{m}");
    s.replica.last_heard_ms.store(0, Ordering::Release);
    let (c, m) = code(promote(5));
    assert!(
        c == ErrorCode::NotInSync && m.contains("newer primary"),
        "{m}"
    );
    assert_eq!(promote(3).header, Response::Promoted { shard_epoch: 4 });
    assert_eq!(s.replica.role(), Role::Primary);
    assert_eq!(promote(3).header, Response::Promoted { shard_epoch: 4 });
    // Persisted: a restart reads it back.
    let restarted = Replica::new(
        &crate::config::FileConfig {
            data_dir: Some("/x".into()),
            tls_dir: Some("/x".into()),
            ..Default::default()
        }
        .validate()
        .unwrap(),
        &s.engine,
    );
    assert_eq!(restarted.epoch(), 4);
}

#[test]
fn a_backup_that_never_joined_refuses_replicate_of_session_0() {
    let s = backup();
    s.replica.stream.lock().session = 0;
    let r = s.handle(
        Request::Replicate {
            header: header(3, 0, 1, ReplicateKind::Stream, 0),
        },
        &[],
        NOW,
    );
    let (c, m) = code(r);
    assert_eq!(c, ErrorCode::BadRequest);
    assert!(m.contains("has not joined"), "{m}");
}

#[test]
fn epochs_never_wrap() {
    let s = backup();
    s.replica.in_sync.store(true, Ordering::Release);
    s.replica.epoch.store(u64::MAX, Ordering::Release);
    let r = s.handle(
        Request::Promote {
            shard_epoch: 0,
            force: false,
        },
        &[],
        NOW,
    );
    let (c, m) = code(r);
    assert_eq!(c, ErrorCode::BadRequest);
    assert!(m.contains("refusing to wrap"), "{m}");
    assert_eq!(s.replica.role(), Role::Backup);
    assert_eq!(s.replica.epoch(), u64::MAX);
}

#[test]
fn a_join_is_checked_whole_before_a_primary_steps_down() {
    let s = Arc::new(backup());
    s.replica.become_primary(&s.engine, 3);
    // Its own index, an index out of range, session 0: refused, still the primary at epoch 3.
    for (replica, session) in [(0, 9), (2, 9), (u32::MAX, 9), (1, 0)] {
        let (c, _) = code(s.join(u64::MAX, replica, session).unwrap_err().into_reply());
        assert_eq!(c, ErrorCode::BadRequest);
        assert_eq!(s.replica.role(), Role::Primary);
        assert_eq!(s.replica.epoch(), 3);
    }
    // An epoch no number of failovers reaches is refused; a newer one within reach deposes it.
    let (c, m) = code(s.join_checked(u64::MAX, 1, 9).unwrap_err().into_reply());
    assert_eq!(c, ErrorCode::BadRequest);
    assert!(m.contains("epochs grow by one"), "{m}");
    assert_eq!(s.replica.role(), Role::Primary);
    let (c, _) = code(s.join_checked(5, 1, 9).unwrap_err().into_reply());
    assert_eq!(c, ErrorCode::NotPrimary);
    assert_eq!((s.replica.role(), s.replica.epoch()), (Role::Backup, 5));
    // An unreplicated server never steps down.
    let single = Arc::new(Shard {
        replica: Replica::single(),
        ..backup()
    });
    let (c, m) = code(single.join(u64::MAX, 1, 9).unwrap_err().into_reply());
    assert_eq!(c, ErrorCode::BadRequest);
    assert!(m.contains("not replicated"), "{m}");
    assert_eq!(single.replica.role(), Role::Primary);
}

#[test]
fn a_forced_promotion_cold_starts_only_a_starting_replica() {
    let s = backup();
    let force = || {
        s.handle(
            Request::Promote {
                shard_epoch: 0,
                force: true,
            },
            &[],
            NOW,
        )
    };
    // A backup follows a primary: no forced takeover.
    let (c, m) = code(force());
    assert_eq!(c, ErrorCode::BadRequest);
    assert!(m.contains("still starting"), "{m}");
    s.replica.set_role(Role::Starting);
    s.replica.heard_of_epoch(6);
    assert_eq!(force().header, Response::Promoted { shard_epoch: 7 });
    assert_eq!(s.replica.role(), Role::Primary);
    assert_eq!(force().header, Response::Promoted { shard_epoch: 7 });
}
