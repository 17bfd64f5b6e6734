//! A reshard's rules on one server without sockets: what a destination stores and refuses, the switch of
//! maps (persisted), requests of the old epoch refused with a typed error, and a source forwarding the rows
//! pushes change in moving virtual shards.

use std::sync::Arc;

use protocol::wire::layout::put_ids;
use protocol::wire::message::replicate::{self, RowsTable};
use protocol::wire::message::reshard::{MapInfo, MoveHeader, ReshardStep};
use protocol::{Encoding, ErrorCode, Request, Response, ShardMap, TableConfig, TableCount};

use super::mover::Mover;
use super::MAP_KEY;
use crate::reply::Reply;
use crate::shard::replica::peer::Peers;
use crate::shard::Shard;

const NOW: u64 = 1_000_000;

/// Server `index` of a cluster under `map`, holding table 1 (dim 2, SGD: rows of 2 f32s).
fn server(map: ShardMap, index: u32) -> Arc<Shard> {
    let s = crate::testing::memory_shard(map, index);
    s.handle(
        Request::RegisterTables {
            tables: vec![TableConfig::counter(1, 2)],
        },
        &[],
        NOW,
    );
    Arc::new(s)
}

fn error_of(r: Reply) -> (ErrorCode, String) {
    match r.header {
        Response::Error { code, message } => (code, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn servers(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("127.0.0.1:{}", 7000 + i)).collect()
}

fn move_header(epoch: u64, seq: u64, ids: usize) -> MoveHeader {
    MoveHeader {
        target_epoch: epoch,
        source: 0,
        seq,
        messages: 1,
        new_tables: Vec::new(),
        tables: vec![RowsTable {
            table: 1,
            count: ids as u32,
            row_len: 2,
        }],
    }
}

fn rows_payload(ids: &[u64], value: f32) -> Vec<u8> {
    let mut p = Vec::new();
    replicate::put_rows(ids, &vec![value; ids.len() * 2], &mut p);
    p
}

fn push_req(epoch: u64, ids: &[u64]) -> (Request, Vec<u8>) {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    protocol::compression::codec::encode_rows(
        &vec![1.0; ids.len() * 2],
        2,
        Encoding::F32,
        &mut payload,
    );
    (
        Request::Push {
            lr_scale: 1.0,
            epoch,
            encoding: Encoding::F32,
            grad_scale: 1.0,
            tables: vec![TableCount {
                table: 1,
                count: ids.len() as u32,
                dim: 2,
            }],
            id: protocol::wire::message::push::PushId::NONE,
        },
        payload,
    )
}

#[tokio::test]
async fn a_destination_stores_in_order_then_switches_and_persists_the_map() {
    let two = ShardMap::new(2);
    let three = two.resized(3).unwrap();
    // A standby added as server 2: no map yet (epoch 0).
    let dest = server(ShardMap::new(1).with_epoch(0), 2);
    assert!(dest.routing.standby());
    let moving: Vec<u64> = (0..10_000u64)
        .filter(|&id| three.server_of(id) == 2)
        .take(3)
        .collect();
    // Not prepared: refused with a typed error naming the epochs.
    let r = dest.handle_us(
        Request::MoveRows {
            header: move_header(2, 1, 3),
        },
        &rows_payload(&moving, 5.0),
        NOW,
    );
    let (code, msg) = error_of(r);
    assert_eq!(code, ErrorCode::WrongEpoch, "{msg}");
    assert!(msg.contains("epoch 2"), "{msg}");
    let target = MapInfo::of(&three, servers(3));
    let step = ReshardStep::Prepare {
        target: target.clone(),
    };
    // The standby gives nothing: prepared as a receiver only.
    let prep = super::receive::answer(&dest, step).await;
    assert!(
        matches!(prep.header, Response::Resharding { .. }),
        "{prep:?}"
    );
    let ok = dest.handle_us(
        Request::MoveRows {
            header: move_header(2, 1, 3),
        },
        &rows_payload(&moving, 5.0),
        NOW,
    );
    assert!(
        matches!(ok.header, Response::MovedRows { seq: 1 }),
        "{ok:?}"
    );
    // A retry of message 1 is stored again; a gap is refused.
    let gap = dest.handle_us(
        Request::MoveRows {
            header: move_header(2, 5, 3),
        },
        &rows_payload(&moving, 6.0),
        NOW,
    );
    assert_eq!(error_of(gap).0, ErrorCode::BadRequest);
    let mut row = vec![0f32; 2];
    dest.engine.gather(1, &moving[..1], &mut row).unwrap();
    assert_eq!(row, [5.0, 5.0]);
    // A commit of another epoch is refused; the right one switches and persists.
    let wrong = super::receive::answer(&dest, ReshardStep::Commit { epoch: 9 }).await;
    assert_eq!(error_of(wrong).0, ErrorCode::Resharding);
    let done = super::receive::answer(&dest, ReshardStep::Commit { epoch: 2 }).await;
    assert!(matches!(done.header, Response::Resharding { status } if status.epoch == 2));
    assert_eq!(dest.routing.map(), three);
    let bytes = dest.engine.store().get_meta(MAP_KEY).unwrap().unwrap();
    let (persisted, _): (MapInfo, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    assert_eq!(persisted, target);
    // Requests of the old epoch are refused now with WrongEpoch; the map is answered to clients.
    let (req, payload) = push_req(1, &moving);
    let (code, msg) = error_of(dest.handle_us(req, &payload, NOW));
    assert_eq!(code, ErrorCode::WrongEpoch, "{msg}");
    let map = dest.handle_us(Request::GetShardMap, &[], NOW);
    assert!(matches!(map.header, Response::ShardMap { map } if map == target));
    // Under the new epoch the moved rows are this server's: a push applies to the moved values.
    let (req, payload) = push_req(2, &moving);
    let r = dest.handle_us(req, &payload, NOW);
    assert!(
        matches!(r.header, Response::Pushed { rows: 3, .. }),
        "{r:?}"
    );
}

#[tokio::test]
async fn prepare_checks_the_target() {
    let two = ShardMap::new(2);
    let s = server(two.clone(), 0);
    // Skipping an epoch, or an address list of the wrong length, is refused.
    let skip = two.resized(3).unwrap().with_epoch(5);
    let r = super::receive::answer(
        &s,
        ReshardStep::Prepare {
            target: MapInfo::of(&skip, servers(3)),
        },
    )
    .await;
    let (code, msg) = error_of(r);
    assert_eq!(code, ErrorCode::WrongEpoch, "{msg}");
    let r = super::receive::answer(
        &s,
        ReshardStep::Prepare {
            target: MapInfo::of(&two.resized(3).unwrap(), servers(2)),
        },
    )
    .await;
    assert_eq!(error_of(r).0, ErrorCode::BadRequest);
    // Abort with nothing prepared keeps the map.
    super::receive::answer(&s, ReshardStep::Abort).await;
    assert_eq!(s.routing.map(), two);
}

#[test]
fn a_source_forwards_only_rows_of_moving_vshards() {
    let two = ShardMap::new(2);
    let three = two.resized(3).unwrap();
    let s = server(two.clone(), 0);
    let peers = Peers::new(&servers(3), 0, Default::default());
    let mover = Mover::new(&two, 0, (three.clone(), servers(3)), Vec::new(), peers)
        .expect("server 0 gives some");
    let ids: Vec<u64> = (0..2000u64).filter(|&id| two.server_of(id) == 0).collect();
    let moving = ids.iter().filter(|&&id| three.server_of(id) == 2).count() as u64;
    assert!(moving > 0 && moving < ids.len() as u64);
    s.engine.apply(1, &ids, &vec![0.5; ids.len() * 2]).unwrap();
    mover.forward(&s.engine, &[(1, &ids)]);
    assert_eq!(mover.progress(), (moving, 0, false));
    // In the shrink back, server 0 only receives: no mover.
    let back = three.resized(2).unwrap();
    let none = Peers::new(&[], 0, Default::default());
    assert!(Mover::new(&three, 0, (back, servers(2)), Vec::new(), none).is_none());
}
