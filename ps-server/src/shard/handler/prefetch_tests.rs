//! Tests of [`super::Shard::handle`] for `Prefetch` (lookahead into the capacity tier): counts, pins under the
//! shard's deadline, and every refusal, without sockets.

use super::*;
use embedding::{Engine, MemStore};
use protocol::wire::layout::put_ids;
use protocol::{ShardMap, TableConfig};
use std::sync::Arc;

const NOW: u64 = 2_000_000;
const BUDGET: u64 = 64;

/// A shard of `num_servers` whose tables keep [`BUDGET`] rows in memory, with table 1 (dim 4) holding ids
/// `0..300` pushed once and evicted down to the budget.
fn spilled_shard(num_servers: u32) -> Shard {
    let s = Shard {
        engine: Engine::open_with_budget(Arc::new(MemStore::new()), Some(BUDGET)).unwrap(),
        pin_secs: 30,
        ..crate::testing::memory_shard(ShardMap::new(num_servers), 0)
    };
    let r = s.handle(
        Request::RegisterTables {
            tables: vec![TableConfig::counter(1, 4)],
        },
        &[],
        NOW,
    );
    assert!(
        matches!(r.header, Response::Registered { .. }),
        "{:?}",
        r.header
    );
    let ids: Vec<u64> = (0..300)
        .filter(|&id| s.routing.map().server_of(id) == 0)
        .collect();
    s.engine.apply(1, &ids, &vec![1.0; ids.len() * 4]).unwrap();
    s.engine.enforce_budget().unwrap();
    s
}

fn prefetch(s: &Shard, lease: u64, release_below: u64, tables: &[(u32, u32, &[u64])]) -> Reply {
    let mut payload = Vec::new();
    for (_, _, ids) in tables {
        put_ids(ids, &mut payload);
    }
    let counts = tables
        .iter()
        .map(|&(table, dim, ids)| TableCount {
            table,
            count: ids.len() as u32,
            dim,
        })
        .collect();
    s.handle(
        protocol::wire::message::prefetch::request(1, 77, lease, release_below, counts),
        &payload,
        NOW,
    )
}

fn error_of(r: Reply) -> (ErrorCode, String) {
    match r.header {
        Response::Error { code, message } => (code, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn prefetch_reads_back_and_pins_until_the_deadline() {
    let s = spilled_shard(1);
    let t = s.engine.table(1).unwrap();
    let evicted: Vec<u64> = (0..300)
        .filter(|&id| t.row(id).is_none())
        .take(10)
        .collect();
    let resident: Vec<u64> = (0..300).filter(|&id| t.row(id).is_some()).take(5).collect();
    let mut ids: Vec<u64> = evicted
        .iter()
        .chain(&resident)
        .copied()
        .chain([10_000])
        .collect();
    ids.sort_unstable();
    let r = prefetch(&s, 0, 0, &[(1, 4, &ids)]);
    let Response::Prefetched { stats } = r.header else {
        panic!("{:?}", r.header)
    };
    assert_eq!(
        (
            stats.rows.read_back,
            stats.rows.resident,
            stats.rows.absent,
            stats.rows.pinned
        ),
        (10, 5, 1, 10)
    );
    assert!(evicted.iter().all(|&id| t.row(id).is_some()));
    // Pins end `pin_secs` after the request at the latest.
    assert_eq!(s.engine.expire_leases(NOW + 29), 0);
    assert_eq!(s.engine.expire_leases(NOW + 30), 1);
    assert_eq!(t.pinned_rows(), 0);
}

#[test]
fn bad_prefetches_get_typed_errors() {
    let s = spilled_shard(2);
    let (code, msg) = error_of(prefetch(&s, 0, 0, &[(9, 4, &[1])]));
    assert_eq!(code, ErrorCode::UnknownTable, "{msg}");
    assert!(msg.contains("unknown table 9"), "{msg}");
    let (code, msg) = error_of(prefetch(&s, 0, 0, &[(1, 8, &[1])]));
    assert_eq!(code, ErrorCode::WrongDimension, "{msg}");
    let many: Vec<u64> = (0..1000)
        .filter(|&id| s.routing.map().server_of(id) == 0)
        .take(BUDGET as usize / 2 + 1)
        .collect();
    let (code, msg) = error_of(prefetch(&s, 0, 0, &[(1, 4, &many)]));
    assert_eq!(code, ErrorCode::BadRequest, "{msg}");
    assert!(msg.contains("exceeds its pin limit of 32"), "{msg}");
    let foreign = (0..1000)
        .find(|&id| s.routing.map().server_of(id) == 1)
        .unwrap();
    let (code, msg) = error_of(prefetch(&s, 0, 0, &[(1, 4, &[foreign])]));
    assert_eq!(code, ErrorCode::WrongShard, "{msg}");
    // A truncated id section.
    let r = s.handle(
        protocol::wire::message::prefetch::request(
            1,
            77,
            0,
            0,
            vec![TableCount {
                table: 1,
                count: 3,
                dim: 4,
            }],
        ),
        &[1],
        NOW,
    );
    let (code, msg) = error_of(r);
    assert_eq!(code, ErrorCode::BadRequest, "{msg}");
    assert!(msg.contains("prefetch"), "{msg}");
    // A stale epoch.
    let r = s.handle(
        protocol::wire::message::prefetch::request(0, 77, 0, 0, vec![]),
        &[],
        NOW,
    );
    assert_eq!(error_of(r).0, ErrorCode::WrongEpoch);
    assert_eq!((s.engine.pinned_rows(), s.engine.leases()), (0, 0));
}
