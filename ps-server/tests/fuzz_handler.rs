//! A structured fuzzer of the request handler ([`ps_server::shard::Shard::handle`]), sans-IO and deterministic
//! from a seed.
//!
//! Inputs: valid pulls and pushes against registered tables (owned and foreign ids), the same with mutated
//! headers (unknown tables, wrong counts and dims, other epochs and encodings, bad loss scales) and mutated
//! payloads (truncated, extended, bit flips: NaN gradients, foreign ids), registrations with random specs,
//! hellos with random versions, flushes, and frames of random or mutated bytes that decode to some request;
//! and every peer and admin request with random fields (joins, promotions forced or not, replicate and
//! moved-rows streams with rows, checkpoints to names and paths in and out of the root, reshard steps, shard
//! maps, dense publications). Each input comes on a connection of a random role (trainer, serving, peer,
//! admin, a certificate without a role, or an unauthenticated development server), through the one
//! authorization ([`ps_server::shard::handler::authorize`]).
//! Invariants checked on every input:
//! - no panic (a panic prints the seed, iteration and request);
//! - the reply is of the request's kind or a typed error with a message;
//! - a request the role may not send is answered `Forbidden`, and one it may send never is;
//! - a pull's reply payload has exactly the length its header announces;
//! - a push applies at most as many rows as it carries, and a refused push changes no row;
//! - no request changes rows it has no business writing: a `Replicate` to these primaries and a `MoveRows`
//!   with no reshard prepared are refused and change no row;
//! - these unreplicated shards stay the primary at shard epoch 1, whatever joins and promotions say.
//!
//! CI runs a few thousand inputs; `FUZZ_ITERS=1000000 FUZZ_SEED=n` runs more (BENCHMARKS.md records a run).

use std::sync::Arc;

use embedding::{Engine, MemStore};
use protocol::compression::codec;
use protocol::wire::frame::{decode_frame, encode_frame};
use protocol::wire::ids::{get_sections, put_ids, sort_for_wire, IdCoding};
use protocol::wire::layout::PayloadLayout;
use protocol::{
    Encoding, InitConfig, OptimizerConfig, Request, Response, ShardMap, TableConfig, TableCount,
};
use ps_server::config::Durability;
use ps_server::reply::Reply;
use ps_server::shard::Shard;

/// The fuzzer's generator: splitmix64, deterministic from the seed.
type Rng = base::rng::SplitMix64;

/// `u32` values a fuzzed field should hit often: zero, small counts, a page and one more, the top.
const U32_EDGES: [u32; 8] = [0, 1, 2, 4, 4096, 4097, u32::MAX - 1, u32::MAX];

use base::fuzz::{iters, seed, F32_EDGES};

/// A small gradient value, sometimes an edge case.
fn grad(r: &mut Rng) -> f32 {
    if r.chance(50) {
        r.f32_or_edge(&F32_EDGES)
    } else {
        (r.below(2001) as f32 - 1000.0) / 1000.0
    }
}

/// The time (Unix seconds) of the first input; each later input is a second later.
const START: u64 = 1_700_000_000;

/// The tables every fuzzed shard starts with: (id, dim).
const TABLES: [(u32, u32); 4] = [(1, 4), (2, 2), (3, 8), (4, 3)];

fn base_spec(id: u32, dim: u32) -> TableConfig {
    let (optimizer, clip_norm) = match id {
        1 => (OptimizerConfig::Sgd { lr: 0.5 }, 0.0),
        2 => (
            OptimizerConfig::RowAdagrad {
                lr: 0.1,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            0.0,
        ),
        3 => (
            OptimizerConfig::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            1.0,
        ),
        _ => (
            OptimizerConfig::Ftrl {
                alpha: 0.1,
                beta: 1.0,
                l1: 0.01,
                l2: 0.01,
            },
            0.0,
        ),
    };
    TableConfig {
        optimizer,
        init: InitConfig::uniform(0.05),
        seed: 9,
        clip_norm,
        ..TableConfig::new(id, format!("C{id}"), dim as usize)
    }
}

fn random_spec(r: &mut Rng) -> TableConfig {
    let mut s = base_spec(r.below(6) as u32, r.below(10) as u32);
    if r.chance(2) {
        s.id = r.below(40) as u32;
    }
    if r.chance(3) {
        s.dim = r.u32_or_edge(&U32_EDGES) as usize;
    }
    let kind = r.below(5) as usize;
    let kinds = TableConfig::every_kind();
    if kind < 4 {
        s.optimizer = kinds[2 * kind].optimizer;
        for p in s.optimizer.params_mut() {
            *p = r.f32_or_edge(&F32_EDGES);
        }
    }
    if kind == 1 || kind == 3 {
        s.weight_decay = r.f32_or_edge(&F32_EDGES);
        s.clip_norm = r.f32_or_edge(&F32_EDGES);
    }
    if r.chance(2) {
        s.init = InitConfig::normal(r.f32_or_edge(&F32_EDGES));
    }
    if r.chance(8) {
        s.ttl_secs = Some(r.next_u64() >> r.below(64));
    }
    if r.chance(8) {
        s.eviction = Some(protocol::EvictionConfig {
            policy: if r.chance(2) {
                protocol::EvictionPolicy::Score
            } else {
                protocol::EvictionPolicy::Lfu
            },
            max_rows: Some(r.next_u64() >> r.below(64)),
            max_bytes: None,
            decay_secs: r.chance(2).then(|| r.below(100)),
        });
    }
    s
}

/// A shard of `num_servers`; with `budget`, its tables keep that many rows in memory (the capacity tier,
/// exercised by prefetches, read-backs and the loop's evictions).
fn new_shard(
    num_servers: u32,
    durability: Durability,
    budget: Option<u64>,
    checkpoint_root: &std::path::Path,
) -> Shard {
    let engine = Engine::open_with_budget(Arc::new(MemStore::new()), budget).unwrap();
    let shard = Shard::builder(engine, ShardMap::new(num_servers), 0)
        .durability(durability)
        .checkpoint_root(checkpoint_root)
        .build();
    let tables = TABLES.iter().map(|&(id, dim)| base_spec(id, dim)).collect();
    let r = shard.handle(Request::RegisterTables { tables }, &[], START);
    assert!(matches!(r.header, Response::Registered { .. }));
    shard
}

fn encoding(r: &mut Rng) -> Encoding {
    r.pick(&Encoding::ALL)
}

/// Distinct ids, mostly owned by shard 0, sometimes foreign, in wire order for `coding`.
fn ids(r: &mut Rng, shard: &Shard, n: usize, coding: IdCoding) -> Vec<u64> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let id = if r.chance(4) {
            r.next_u64()
        } else {
            r.below(1000)
        };
        let owned = shard.routing().map().server_of(id) == shard.shard_index();
        if !out.contains(&id) && (owned || r.chance(2000)) {
            out.push(id);
        }
    }
    sort_for_wire(coding, &mut out);
    out
}

/// A valid pull or push (header and payload).
fn valid(r: &mut Rng, shard: &Shard) -> (Request, Vec<u8>) {
    let entries: Vec<(u32, u32)> = (0..r.below(4))
        .map(|_| TABLES[r.below(TABLES.len() as u64) as usize])
        .collect();
    let counts: Vec<TableCount> = entries
        .iter()
        .map(|&(table, dim)| TableCount {
            table,
            count: if r.chance(8) { 0 } else { r.below(20) as u32 },
            dim,
        })
        .collect();
    let enc = encoding(r);
    let mut payload = Vec::new();
    for c in &counts {
        let coding = if r.chance(2) {
            IdCoding::Plain
        } else {
            IdCoding::Unmixed
        };
        let ids = ids(r, shard, c.count as usize, coding);
        put_ids(coding, &ids, &mut payload);
    }
    if r.chance(8) {
        // Scores: one f32 per id (header dim 1, or the table's now and then), edge values included.
        let mut counts = counts;
        for c in &mut counts {
            if !r.chance(8) {
                c.dim = 1;
            }
        }
        let n: u32 = counts.iter().map(|c| c.count).sum();
        for _ in 0..n {
            let v = if r.chance(4) {
                r.f32_or_edge(&F32_EDGES)
            } else {
                r.below(100) as f32
            };
            payload.extend_from_slice(&v.to_le_bytes());
        }
        let mode = if r.chance(2) {
            protocol::ScoreMode::Add
        } else {
            protocol::ScoreMode::Set
        };
        return (
            Request::Score {
                epoch: 1,
                mode,
                tables: counts,
            },
            payload,
        );
    }
    if r.chance(2) {
        let req = if r.chance(4) {
            Request::Prefetch {
                epoch: 1,
                owner: r.below(3),
                lease: r.below(8),
                release_below: r.below(9),
                tables: counts,
            }
        } else if r.chance(3) {
            Request::PullWithState {
                epoch: 1,
                encoding: enc,
                tables: counts,
            }
        } else {
            Request::Pull {
                epoch: 1,
                encoding: enc,
                tables: counts,
            }
        };
        return (req, payload);
    }
    for c in &counts {
        let grads: Vec<f32> = (0..c.count * c.dim).map(|_| grad(r)).collect();
        codec::encode_rows(&grads, c.dim as usize, enc, &mut payload);
    }
    let grad_scale = match r.below(10) {
        0 => r.f32_or_edge(&F32_EDGES),
        1 => 1024.0,
        _ => 1.0,
    };
    (
        Request::Push {
            lr_scale: 1.0,
            epoch: 1,
            encoding: enc,
            grad_scale,
            tables: counts,
            id: protocol::wire::message::push::PushId::NONE,
        },
        payload,
    )
}

fn mutate_counts(r: &mut Rng, tables: &mut Vec<TableCount>) {
    if tables.is_empty() || r.chance(6) {
        tables.push(TableCount {
            table: r.u32_or_edge(&U32_EDGES),
            count: r.u32_or_edge(&U32_EDGES),
            dim: r.u32_or_edge(&U32_EDGES),
        });
        return;
    }
    let i = r.below(tables.len() as u64) as usize;
    let t = &mut tables[i];
    match r.below(5) {
        0 => {
            t.table = if r.chance(2) {
                r.below(8) as u32
            } else {
                r.u32_or_edge(&U32_EDGES)
            }
        }
        1 => t.count = t.count.wrapping_add(r.below(3) as u32).wrapping_sub(1),
        2 => t.count = r.u32_or_edge(&U32_EDGES),
        3 => t.dim = t.dim.wrapping_add(r.below(3) as u32).wrapping_sub(1),
        _ => t.dim = r.u32_or_edge(&U32_EDGES),
    }
}

fn mutate(r: &mut Rng, req: &mut Request, payload: &mut Vec<u8>) {
    match r.below(6) {
        0 => match req {
            Request::Pull { tables, .. }
            | Request::PullWithState { tables, .. }
            | Request::Prefetch { tables, .. }
            | Request::Push { tables, .. } => mutate_counts(r, tables),
            _ => {}
        },
        1 => match req {
            Request::Pull { epoch, .. }
            | Request::PullWithState { epoch, .. }
            | Request::Prefetch { epoch, .. }
            | Request::Push { epoch, .. } => *epoch = r.next_u64() % 3,
            _ => {}
        },
        2 => match req {
            Request::Pull { encoding: e, .. }
            | Request::PullWithState { encoding: e, .. }
            | Request::Push { encoding: e, .. } => *e = encoding(r),
            _ => {}
        },
        3 if !payload.is_empty() => {
            let cut = r.below(payload.len() as u64) as usize;
            payload.truncate(cut);
        }
        4 if !payload.is_empty() => {
            for _ in 0..=r.below(4) {
                let bit = r.below(payload.len() as u64 * 8) as usize;
                payload[bit / 8] ^= 1 << (bit % 8);
            }
        }
        _ => {
            let n = r.below(24) as usize;
            payload.extend((0..n).map(|_| r.next_u64() as u8));
        }
    }
}

/// One fuzz input: a request and its payload.
fn input(r: &mut Rng, shard: &Shard) -> (Request, Vec<u8>) {
    match r.below(20) {
        0 => (
            Request::Hello {
                version: if r.chance(2) {
                    1
                } else {
                    r.u32_or_edge(&U32_EDGES)
                },
            },
            Vec::new(),
        ),
        1 => (
            Request::RegisterTables {
                tables: (0..=r.below(2)).map(|_| random_spec(r)).collect(),
            },
            Vec::new(),
        ),
        2 if r.chance(2) => (Request::Flush, Vec::new()),
        // Delta sync: a cursor of this or another incarnation, any encoding, row limit and dense version.
        2 if r.chance(2) => {
            // Pushes since the last sync request become a delta.
            shard.sync().cut(r.below(1 << 40));
            let cursor = protocol::wire::message::sync::SyncCursor {
                incarnation: if r.chance(2) {
                    shard.sync().incarnation
                } else {
                    r.next_u64()
                },
                seq: r.below(4),
                resume: None,
            };
            let encoding =
                [Encoding::F32, Encoding::F16, Encoding::Bf16, Encoding::Int8][r.below(4) as usize];
            let max_rows = r.u32_or_edge(&U32_EDGES);
            (
                protocol::wire::message::sync::request(cursor, encoding, max_rows, 0, r.next_u64()),
                Vec::new(),
            )
        }
        2 => {
            let len = r.below(4) as u32;
            let mut payload = Vec::new();
            protocol::wire::message::sync::put_dense(&vec![1.0; r.below(4) as usize], &mut payload);
            let version = match r.below(3) {
                0 => r.next_u64(),
                1 => u64::MAX,
                _ => (START + r.below(1 << 20)) * 1_000_000,
            };
            (
                protocol::wire::message::sync::publish_request(
                    r.below(3),
                    version,
                    r.next_u64(),
                    len,
                ),
                payload,
            )
        }
        10 | 11 => peer_or_admin(r),
        3 | 4 => {
            // Through the frame codec: a mutated frame that still decodes to some request.
            let (req, payload) = valid(r, shard);
            let mut frame = encode_frame(&req, &payload).unwrap();
            for _ in 0..=r.below(3) {
                let bit = r.below(frame.len() as u64 * 8) as usize;
                frame[bit / 8] ^= 1 << (bit % 8);
            }
            match decode_frame::<Request>(&frame, u64::MAX) {
                // A checkpoint writes into a directory the request names: not something to fuzz in a test.
                Ok(Some((Request::Checkpoint { .. }, _, _))) => (Request::Flush, Vec::new()),
                Ok(Some((req, range, _))) => (req, frame[range].to_vec()),
                _ => (req, payload),
            }
        }
        5..=9 => valid(r, shard),
        _ => {
            let (mut req, mut payload) = valid(r, shard);
            for _ in 0..=r.below(2) {
                mutate(r, &mut req, &mut payload);
            }
            (req, payload)
        }
    }
}

/// An epoch, sequence number or session a fuzzed peer request carries: small, or an edge.
fn counter(r: &mut Rng) -> u64 {
    match r.below(4) {
        0 => u64::MAX,
        1 => u64::MAX - 1,
        2 => 0,
        _ => r.below(8),
    }
}

/// Whole rows of the base tables (weights and optimizer state), some of them NaN, for a `Replicate` or a
/// `MoveRows` payload.
fn whole_rows(r: &mut Rng) -> (Vec<protocol::wire::message::replicate::RowsTable>, Vec<u8>) {
    let mut tables = Vec::new();
    let mut payload = Vec::new();
    for _ in 0..r.below(3) {
        let (table, dim) = TABLES[r.below(TABLES.len() as u64) as usize];
        let row_len = dim + if r.chance(2) { 0 } else { r.below(3) as u32 };
        let count = r.below(5) as u32;
        let ids: Vec<u64> = (0..count as u64).map(|_| r.below(1000)).collect();
        let rows: Vec<f32> = (0..count * row_len)
            .map(|_| r.f32_or_edge(&F32_EDGES))
            .collect();
        protocol::wire::message::replicate::put_rows(&ids, &rows, &mut payload);
        tables.push(protocol::wire::message::replicate::RowsTable {
            table,
            count,
            row_len,
        });
    }
    if r.chance(4) {
        payload.truncate(r.below(payload.len() as u64 + 1) as usize);
    }
    (tables, payload)
}

/// A peer or admin request with random fields.
fn peer_or_admin(r: &mut Rng) -> (Request, Vec<u8>) {
    use protocol::wire::message::replicate::{ReplicateHeader, ReplicateKind};
    use protocol::wire::message::reshard::{MapInfo, MoveHeader, ReshardStep};
    match r.below(9) {
        0 => (
            Request::Join {
                shard_epoch: counter(r),
                replica_index: r.u32_or_edge(&U32_EDGES),
                session: counter(r),
            },
            Vec::new(),
        ),
        1 => (
            Request::Promote {
                shard_epoch: counter(r),
                force: r.chance(2),
            },
            Vec::new(),
        ),
        2 => {
            let (tables, payload) = whole_rows(r);
            let kind = if r.chance(2) {
                ReplicateKind::Stream
            } else {
                ReplicateKind::CaughtUp
            };
            let header = ReplicateHeader {
                shard_epoch: counter(r),
                session: counter(r),
                seq: counter(r),
                messages: r.u32_or_edge(&U32_EDGES),
                kind,
                new_tables: Vec::new(),
                tables,
                pushes: Vec::new(),
            };
            (Request::Replicate { header }, payload)
        }
        3 => {
            let (tables, payload) = whole_rows(r);
            let header = MoveHeader {
                target_epoch: counter(r),
                source: r.u32_or_edge(&U32_EDGES),
                seq: counter(r),
                messages: r.u32_or_edge(&U32_EDGES),
                new_tables: Vec::new(),
                tables,
            };
            (Request::MoveRows { header }, payload)
        }
        4 => {
            // Names under the root (a fresh one each time, so none exists yet), and paths out of it.
            let dir = match r.below(5) {
                0 => "/etc/pstrain-fuzz".to_owned(),
                1 => "../../escape".to_owned(),
                2 => String::new(),
                _ => format!("fuzz-{}", r.next_u64()),
            };
            (
                Request::Checkpoint {
                    dir,
                    step: r.next_u64(),
                    tensors: r.below(2) == 1,
                    prune: (r.below(2) == 1).then(|| embedding::ExportPrune {
                        max_age_secs: (r.below(2) == 1).then(|| r.next_u64() >> r.below(64)),
                        min_count: (r.below(2) == 1).then(|| r.below(4) as u32),
                        min_score: (r.below(2) == 1).then(|| r.below(4) as f32 - 1.0),
                    }),
                },
                Vec::new(),
            )
        }
        5 => (Request::GetShardMap, Vec::new()),
        6 => {
            let step = match r.below(4) {
                0 => ReshardStep::Status,
                1 => ReshardStep::Abort,
                2 => ReshardStep::Commit { epoch: counter(r) },
                _ => ReshardStep::Prepare {
                    target: MapInfo {
                        epoch: counter(r),
                        num_servers: r.u32_or_edge(&U32_EDGES),
                        owners: Vec::new(),
                        servers: Vec::new(),
                    },
                },
            };
            (Request::Reshard { step }, Vec::new())
        }
        7 => (
            Request::Reduce {
                header: protocol::wire::message::reduce::ReduceHeader {
                    group: r.next_u64(),
                    step: counter(r),
                    rank: r.u32_or_edge(&U32_EDGES),
                    world: r.u32_or_edge(&U32_EDGES),
                    samples: r.next_u64(),
                    done: r.chance(2),
                    timeout_ms: 0,
                    len: r.below(4) as u32,
                    encoding: Encoding::F32,
                },
            },
            vec![0; 4 * r.below(4) as usize],
        ),
        _ => (
            Request::SyncDeltas {
                cursor: protocol::wire::message::sync::SyncCursor::START,
                encoding: Encoding::F32,
                max_rows: r.u32_or_edge(&U32_EDGES),
                wait_ms: 0,
                dense_version: 0,
            },
            Vec::new(),
        ),
    }
}

/// A connection's access: a role, a certificate without one, or a development server without client
/// authentication.
fn access(r: &mut Rng) -> protocol::Access {
    use protocol::{Access, Role};
    match r.below(7) {
        0..=3 => Access::Role(Role::ALL[r.below(4) as usize]),
        4 => Access::Role(Role::Trainer),
        5 => Access::NoRole("the client certificate names no role".into()),
        _ => Access::Unauthenticated,
    }
}

/// The bits of every base table's rows of ids 0..1000 (the ids a fuzzed `Replicate` or `MoveRows` names).
fn all_rows(shard: &Shard) -> Vec<u32> {
    let ids: Vec<u64> = (0..1000).collect();
    let mut out = Vec::new();
    for &(table, dim) in &TABLES {
        let mut rows = vec![0.0; ids.len() * dim as usize];
        shard.engine().gather(table, &ids, &mut rows).unwrap();
        out.extend(rows.iter().map(|v| v.to_bits()));
    }
    out
}

/// The rows a push could touch (the ids of its sections, if they decode, in every base table), to check that
/// a refused push changed nothing.
fn snapshot(shard: &Shard, req: &Request, payload: &[u8]) -> Vec<f32> {
    let Request::Push { tables, .. } = req else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    let counts = tables.iter().map(|t| (t.count as usize).min(payload.len()));
    if get_sections(payload, counts, &mut ids).is_err() {
        return Vec::new();
    }
    ids.truncate(64);
    let mut out = Vec::new();
    for &(table, dim) in &TABLES {
        let mut rows = vec![0.0; ids.len() * dim as usize];
        shard.engine().gather(table, &ids, &mut rows).unwrap();
        out.extend(rows);
    }
    out
}

fn check(
    shard: &Shard,
    (access, req): (&protocol::Access, &Request),
    payload: &[u8],
    reply: &Reply,
    before: Option<&[f32]>,
) {
    let forbidden = matches!(
        &reply.header,
        Response::Error {
            code: protocol::ErrorCode::Forbidden,
            ..
        }
    );
    assert_eq!(
        forbidden,
        access.authorize_request(req).is_err(),
        "{access:?} sent {req:?}: {:?}",
        reply.header
    );
    if matches!(req, Request::Replicate { .. } | Request::MoveRows { .. }) {
        assert!(
            matches!(reply.header, Response::Error { .. }),
            "{req:?} was stored: {:?}",
            reply.header
        );
    }
    assert_eq!(
        shard.replica().role(),
        protocol::wire::message::replicate::Role::Primary,
        "{req:?} deposed the primary"
    );
    assert_eq!(shard.replica().epoch(), 1, "{req:?} moved the shard epoch");
    let kind_ok = matches!(
        (req, &reply.header),
        (_, Response::Error { .. })
            | (Request::Hello { .. }, Response::Hello { .. })
            | (Request::RegisterTables { .. }, Response::Registered { .. })
            | (Request::Pull { .. }, Response::Pulled { .. })
            | (
                Request::PullWithState { .. },
                Response::PulledWithState { .. }
            )
            | (Request::Push { .. }, Response::Pushed { .. })
            | (Request::Prefetch { .. }, Response::Prefetched { .. })
            | (Request::Flush, Response::Flushed { .. })
            | (Request::SyncDeltas { .. }, Response::Deltas { .. })
            | (Request::PublishDense { .. }, Response::Published { .. })
            | (Request::Promote { .. }, Response::Promoted { .. })
            | (Request::GetShardMap, Response::ShardMap { .. })
            | (Request::Checkpoint { .. }, Response::Checkpointed { .. })
            | (Request::Score { .. }, Response::Scored { .. })
    );
    assert!(kind_ok, "reply {:?} to {req:?}", reply.header);
    match (&reply.header, req) {
        // Every answer decodes, rows within the limit asked for.
        (Response::Deltas { header }, Request::SyncDeltas { max_rows, .. }) => {
            let batch =
                protocol::wire::message::sync::decode(header.clone(), &reply.payload).unwrap();
            assert!(batch.rows() <= *max_rows as usize);
        }
        (Response::Checkpointed { dir, .. }, Request::Checkpoint { .. }) => {
            assert!(
                std::path::Path::new(dir).starts_with(shard.checkpoint_root()),
                "a checkpoint outside the root: {dir}"
            );
        }
        (Response::Error { message, .. }, _) => {
            assert!(!message.is_empty());
            assert!(reply.payload.is_empty());
            if let Some(before) = before {
                assert_eq!(
                    snapshot(shard, req, payload)
                        .iter()
                        .map(|f| f.to_bits())
                        .collect::<Vec<_>>(),
                    before.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                    "a refused push changed rows: {:?}",
                    reply.header
                );
            }
        }
        (
            Response::Pulled {
                encoding: e,
                tables: t,
            },
            Request::Pull {
                encoding, tables, ..
            },
        ) => {
            assert_eq!((e, t), (encoding, tables));
            let layout = PayloadLayout::of(tables).unwrap();
            assert_eq!(reply.payload.len(), layout.pull_response_bytes(*encoding));
        }
        (
            Response::PulledWithState {
                encoding: e,
                tables: t,
                state_lens,
            },
            Request::PullWithState {
                encoding, tables, ..
            },
        ) => {
            assert_eq!((e, t), (encoding, tables));
            let layout = PayloadLayout::of(tables).unwrap();
            let state = PayloadLayout::state_bytes(tables, state_lens).unwrap();
            assert_eq!(
                reply.payload.len(),
                layout.pull_response_bytes(*encoding) + state
            );
        }
        (Response::Prefetched { stats }, Request::Prefetch { tables, .. }) => {
            let ids = PayloadLayout::of(tables).unwrap().ids;
            let rows = &stats.rows;
            assert!(
                rows.resident + rows.absent + rows.pinned + rows.over_pin_limit + rows.untiered
                    <= ids,
                "{stats:?} for {ids} ids"
            );
        }
        (
            Response::Pushed {
                rows,
                rejected_nonfinite,
            },
            Request::Push { tables, .. },
        ) => {
            let ids = PayloadLayout::of(tables).unwrap().ids as u64;
            assert!(
                rows + rejected_nonfinite <= ids,
                "{rows} + {rejected_nonfinite} > {ids}"
            );
        }
        _ => {}
    }
}

#[test]
fn request_handler_survives_structured_fuzzing() {
    let (n, seed) = (iters(50_000), seed());
    let mut r = Rng::new(seed);
    // Two servers with periodic write-back (ownership checks), one with synced push writes, one whose tables
    // keep 16 rows in memory (evicted every 64 inputs, prefetch leases expired at the inputs' time).
    let root = tempfile::tempdir().unwrap();
    let shards = [
        new_shard(2, Durability::Periodic, None, root.path()),
        new_shard(1, Durability::Sync, None, root.path()),
        new_shard(1, Durability::Periodic, Some(16), root.path()),
    ];
    let debug = std::env::var("FUZZ_DEBUG").is_ok();
    let started = std::time::Instant::now();
    let mut errors = 0u64;
    let mut codes = std::collections::BTreeMap::new();
    for i in 0..n {
        if i % 64 == 0 {
            shards[2].engine().enforce_budget().unwrap();
            shards[2].engine().expire_leases(START + i);
        }
        let shard = &shards[r.below(3) as usize];
        let (req, payload) = input(&mut r, shard);
        let access = access(&mut r);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let before =
                matches!(req, Request::Push { .. }).then(|| snapshot(shard, &req, &payload));
            let streamed = matches!(req, Request::Replicate { .. } | Request::MoveRows { .. });
            let rows_before = streamed.then(|| all_rows(shard));
            // One second per input, from a fixed start: TTL stamps are deterministic too.
            let now_us = (START + i) * 1_000_000;
            let reply = match &req {
                // Answered by the server loop, not by `Shard::handle`: called here as the loop does.
                Request::Join {
                    shard_epoch,
                    replica_index,
                    session,
                } => match ps_server::shard::handler::authorize(&access, &req) {
                    Err(refusal) => refusal.into_reply(),
                    Ok(()) => shard
                        .join_checked(*shard_epoch, *replica_index, *session)
                        .unwrap_or_else(ps_server::reply::Refusal::into_reply),
                },
                _ => shard.handle_as(&access, req.clone(), &payload, now_us),
            };
            if let (Response::Error { message, .. }, true) = (&reply.header, debug) {
                eprintln!("{message}");
            }
            check(shard, (&access, &req), &payload, &reply, before.as_deref());
            if let Some(rows_before) = rows_before {
                assert!(rows_before == all_rows(shard), "{req:?} changed rows");
            }
            match reply.header {
                Response::Error { code, .. } => Some(code),
                _ => None,
            }
        }));
        match result {
            Ok(code) => {
                if let Some(code) = code {
                    errors += 1;
                    *codes.entry(format!("{code:?}")).or_insert(0u64) += 1;
                }
            }
            Err(_) => panic!(
                "seed {seed} iteration {i}: request {req:?} payload {} bytes {:02x?}",
                payload.len(),
                payload
            ),
        }
    }
    eprintln!(
        "handler fuzz: {n} inputs (seed {seed}) in {:.2?}: {} served, {errors} refused {codes:?}",
        started.elapsed(),
        n - errors
    );
    if n >= 1000 {
        assert!(
            errors > n / 20 && errors < n - n / 20,
            "{errors} of {n} refused"
        );
    }
}
