//! Tests of [`super::Shard::handle`]: every refusal and the push/pull arithmetic, without sockets, at fixed times.

use super::*;
use embedding::{Engine, MemStore};
use protocol::wire::layout::put_ids;
use protocol::{AdmissionConfig, OptimizerConfig, ShardMap, TableConfig};
use std::sync::Arc;

/// The time every request of these tests is handled at (Unix seconds), unless a test passes another.
const NOW: u64 = 1_000_000;

fn shard(num_servers: u32, index: u32) -> Shard {
    let s = crate::testing::memory_shard(ShardMap::new(num_servers), index);
    let r = s.handle(
        Request::RegisterTables {
            tables: vec![TableConfig::counter(1, 4), TableConfig::counter(2, 2)],
        },
        &[],
        NOW,
    );
    assert!(
        matches!(r.header, Response::Registered { tables: 2 }),
        "{:?}",
        r.header
    );
    s
}

fn error_of(r: Reply) -> (ErrorCode, String) {
    match r.header {
        Response::Error { code, message } => (code, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn pull(s: &Shard, table: u32, dim: u32, ids: &[u64]) -> Reply {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    let tables = vec![TableCount {
        table,
        count: ids.len() as u32,
        dim,
    }];
    s.handle(
        Request::Pull {
            epoch: 1,
            encoding: Encoding::F32,
            tables,
        },
        &payload,
        NOW,
    )
}

fn push(s: &Shard, tables: &[(u32, u32, &[u64], &[f32])]) -> Reply {
    push_at(s, tables, NOW)
}

fn push_at(s: &Shard, tables: &[(u32, u32, &[u64], &[f32])], now: u64) -> Reply {
    push_as(s, tables, now, protocol::wire::message::push::PushId::NONE)
}

fn push_as(
    s: &Shard,
    tables: &[(u32, u32, &[u64], &[f32])],
    now: u64,
    id: protocol::wire::message::push::PushId,
) -> Reply {
    push_scaled(s, tables, now, id, 1.0)
}

fn push_scaled(
    s: &Shard,
    tables: &[(u32, u32, &[u64], &[f32])],
    now: u64,
    id: protocol::wire::message::push::PushId,
    lr_scale: f32,
) -> Reply {
    let mut payload = Vec::new();
    for (_, _, ids, _) in tables {
        put_ids(ids, &mut payload);
    }
    for (_, _, _, g) in tables {
        codec::encode(g, Encoding::F32, &mut payload);
    }
    let counts = tables
        .iter()
        .map(|(t, d, ids, _)| TableCount {
            table: *t,
            count: ids.len() as u32,
            dim: *d,
        })
        .collect();
    s.handle(
        Request::Push {
            lr_scale,
            epoch: 1,
            encoding: Encoding::F32,
            grad_scale: 1.0,
            tables: counts,
            id,
        },
        &payload,
        now,
    )
}

fn rows(r: Reply, n: usize) -> Vec<f32> {
    assert!(
        matches!(r.header, Response::Pulled { .. }),
        "{:?}",
        r.header
    );
    let mut out = vec![0.0; n];
    codec::decode(&r.payload, Encoding::F32, &mut out).unwrap();
    out
}

#[test]
fn push_then_pull_applies_sgd() {
    let s = shard(1, 0);
    // Duplicate ids in one push are refused (protocol::wire::ids): the sender sums them first.
    let r = push(
        &s,
        &[(1, 4, &[7, 7], &[1.0, 2.0, 3.0, 4.0, 1.0, 1.0, 1.0, 1.0])],
    );
    let (code, msg) = error_of(r);
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(msg.contains("duplicate id 7 at position 1"), "{msg}");
    let r = push(&s, &[(1, 4, &[7], &[2.0, 3.0, 4.0, 5.0])]);
    assert!(
        matches!(
            r.header,
            Response::Pushed {
                rows: 1,
                rejected_nonfinite: 0
            }
        ),
        "{:?}",
        r.header
    );
    assert_eq!(
        rows(pull(&s, 1, 4, &[7, 8]), 8),
        [-2.0, -3.0, -4.0, -5.0, 0.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn pushed_rows_are_stamped_with_the_time_passed_in() {
    let s = crate::testing::memory_shard(ShardMap::new(1), 0);
    s.engine.set_table_policy(None, Some(10));
    let r = s.handle(
        Request::RegisterTables {
            tables: vec![TableConfig::counter(1, 4)],
        },
        &[],
        NOW,
    );
    assert!(matches!(r.header, Response::Registered { tables: 1 }));
    // Times far from the wall clock: the stamps can only come from `now`.
    let t0 = 1_234_567_000;
    for (id, at) in [(5, t0), (6, t0 + 5)] {
        let r = push_at(&s, &[(1, 4, &[id], &[1.0; 4])], at);
        assert!(
            matches!(r.header, Response::Pushed { rows: 1, .. }),
            "{:?}",
            r.header
        );
    }
    let table = s.engine.table(1).unwrap();
    assert_eq!(table.clock(), t0 + 5);
    // A TTL of 10 s: row 5 (stamped t0) expires at t0 + 10, row 6 (stamped t0 + 5) at t0 + 15.
    assert!(table.expired(t0 + 9).is_empty());
    assert_eq!(table.expired(t0 + 10), vec![5]);
    let mut both = table.expired(t0 + 15);
    both.sort_unstable();
    assert_eq!(both, vec![5, 6]);
}

#[test]
fn unknown_table_wrong_dim_wrong_epoch_bad_length() {
    let s = shard(1, 0);
    let (code, msg) = error_of(pull(&s, 42, 4, &[1]));
    assert_eq!(code, ErrorCode::UnknownTable);
    assert!(msg.contains("unknown table 42"), "{msg}");
    let (code, msg) = error_of(pull(&s, 1, 8, &[1]));
    assert_eq!(code, ErrorCode::WrongDimension);
    assert!(msg.contains("request dim 8, table dim 4"), "{msg}");
    let tables = vec![TableCount {
        table: 1,
        count: 1,
        dim: 4,
    }];
    let (code, msg) = error_of(s.handle(
        Request::Pull {
            epoch: 9,
            encoding: Encoding::F16,
            tables: tables.clone(),
        },
        &[0; 8],
        NOW,
    ));
    assert_eq!(code, ErrorCode::WrongEpoch);
    assert!(msg.contains("request epoch 9"), "{msg}");
    let (code, msg) = error_of(s.handle(
        Request::Pull {
            epoch: 1,
            encoding: Encoding::F16,
            tables,
        },
        &[0; 5],
        NOW,
    ));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(
        msg.contains("3 trailing bytes after the id sections"),
        "{msg}"
    );
    let (code, _) = error_of(s.handle(Request::Hello { version: 99 }, &[], NOW));
    assert_eq!(code, ErrorCode::UnsupportedVersion);
}

#[test]
fn bad_push_changes_nothing() {
    let s = shard(1, 0);
    // Table 2 has dim 2; claiming 4 refuses the whole push, including table 1's part.
    let r = push(&s, &[(1, 4, &[5], &[1.0; 4]), (2, 4, &[5], &[1.0; 4])]);
    assert_eq!(error_of(r).0, ErrorCode::WrongDimension);
    assert_eq!(rows(pull(&s, 1, 4, &[5]), 4), [0.0; 4]);
    assert_eq!(s.engine.rows_total(), 0);
}

#[test]
fn nonfinite_gradients_rejected() {
    let s = shard(1, 0);
    let r = push(&s, &[(2, 2, &[1, 2], &[f32::NAN, 0.0, 1.0, 1.0])]);
    assert!(
        matches!(
            r.header,
            Response::Pushed {
                rows: 1,
                rejected_nonfinite: 1
            }
        ),
        "{:?}",
        r.header
    );
    assert_eq!(rows(pull(&s, 2, 2, &[1, 2]), 4), [0.0, 0.0, -1.0, -1.0]);
}

#[test]
fn ids_of_other_shards_refused() {
    let s = shard(2, 0);
    let foreign = (0..100u64)
        .find(|&id| s.routing.map().server_of(id) == 1)
        .unwrap();
    let (code, msg) = error_of(pull(&s, 1, 4, &[foreign]));
    assert_eq!(code, ErrorCode::WrongShard);
    assert!(
        msg.contains(&format!("id {foreign} belongs to shard 1")),
        "{msg}"
    );
}

#[test]
fn conflicting_registration_refused() {
    let s = shard(1, 0);
    let (code, msg) = error_of(s.handle(
        Request::RegisterTables {
            tables: vec![TableConfig::counter(1, 8)],
        },
        &[],
        NOW,
    ));
    assert_eq!(code, ErrorCode::TableConflict);
    assert!(msg.contains("table 1"), "{msg}");
}

/// A shard holding no table, with small registration limits.
fn limited_shard() -> Shard {
    Shard {
        registration: crate::config::RegistrationLimits {
            max_tables: 3,
            max_table_dim: 8,
            max_tables_per_request: 4,
        },
        ..crate::testing::memory_shard(ShardMap::new(1), 0)
    }
}

fn register_as(s: &Shard, role: protocol::Role, tables: Vec<TableConfig>) -> Reply {
    s.handle_as(
        &protocol::Access::Role(role),
        Request::RegisterTables { tables },
        &[],
        NOW * 1_000_000,
    )
}

#[test]
fn registration_limits_refuse_whole_requests_and_admins_pass_count_and_dim() {
    use protocol::Role;
    let s = limited_shard();
    let counters = |ids: std::ops::Range<u32>, dim| -> Vec<TableConfig> {
        ids.map(|id| TableConfig::counter(id, dim)).collect()
    };
    // Too many in one request, from anyone: nothing registered.
    for role in [Role::Trainer, Role::Admin] {
        let (code, msg) = error_of(register_as(&s, role, counters(1..6, 2)));
        assert_eq!(code, ErrorCode::BadRequest);
        assert!(
            msg.contains("5 tables") && msg.contains("max-tables-per-request"),
            "{msg}"
        );
    }
    // A dimension past the trainer's limit.
    let (code, msg) = error_of(register_as(&s, Role::Trainer, counters(1..3, 9)));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(
        msg.contains("dim 9") && msg.contains("max-table-dim"),
        "{msg}"
    );
    assert_eq!(
        s.engine.table_count(),
        0,
        "a refused request registers nothing"
    );
    // Up to the count; re-registering held tables is never refused; one more is, whole.
    assert!(matches!(
        register_as(&s, Role::Trainer, counters(1..4, 2)).header,
        Response::Registered { tables: 3 }
    ));
    assert!(matches!(
        register_as(&s, Role::Trainer, counters(1..4, 2)).header,
        Response::Registered { tables: 3 }
    ));
    let (code, msg) = error_of(register_as(&s, Role::Trainer, counters(2..5, 2)));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(
        msg.contains("1 new tables on top of the 3") && msg.contains("max-tables"),
        "{msg}"
    );
    assert_eq!(s.engine.table_count(), 3);
    // Without a role (Shard::handle): a trainer's limits.
    let (code, _) = error_of(s.handle(
        Request::RegisterTables {
            tables: counters(4..5, 2),
        },
        &[],
        NOW,
    ));
    assert_eq!(code, ErrorCode::BadRequest);
    // An admin certificate passes the count and the trainer's dimension, not the engine's own bounds.
    assert!(matches!(
        register_as(
            &s,
            Role::Admin,
            vec![TableConfig::counter(4, 2), TableConfig::counter(5, 512)]
        )
        .header,
        Response::Registered { tables: 5 }
    ));
    let (code, msg) = error_of(register_as(&s, Role::Admin, counters(6..7, 5000)));
    assert_eq!(code, ErrorCode::WrongDimension);
    assert!(msg.contains("dim"), "{msg}");
}

#[test]
fn table_names_past_their_byte_limit_are_refused() {
    let s = limited_shard();
    let spec = TableConfig {
        name: "x".repeat(embedding::MAX_NAME_BYTES + 1),
        ..TableConfig::counter(1, 2)
    };
    let (_, msg) = error_of(register_as(&s, protocol::Role::Trainer, vec![spec]));
    assert!(msg.contains("257 bytes"), "{msg}");
    assert_eq!(s.engine.table_count(), 0);
}

#[test]
fn register_adam_table_over_the_wire() {
    let s = shard(1, 0);
    let spec = TableConfig {
        optimizer: OptimizerConfig::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        ..TableConfig::counter(7, 4)
    };
    let reply = s.handle(
        Request::RegisterTables {
            tables: vec![spec.clone()],
        },
        &[],
        NOW,
    );
    assert!(
        !matches!(reply.header, Response::Error { .. }),
        "{:?}",
        reply.header
    );
    let cfg = s.engine.table(7).unwrap().config().clone();
    assert_eq!(cfg, spec);
}

/// Admission and TTL travel with the table (protocol version 6): the server applies them as it would a config
/// file's, lists them in `Hello` (they are not its policy's), and refuses a request with an invalid config
/// whole, before any of its tables is registered.
#[test]
fn admission_and_ttl_over_the_wire() {
    let s = shard(1, 0);
    let spec = TableConfig {
        admission: Some(AdmissionConfig {
            min_count: 2,
            width: 1024,
            depth: 2,
        }),
        ttl_secs: Some(10),
        ..TableConfig::counter(7, 2)
    };
    let register =
        |tables: Vec<TableConfig>| s.handle(Request::RegisterTables { tables }, &[], NOW);
    let r = register(vec![spec.clone()]);
    assert!(
        matches!(r.header, Response::Registered { tables: 3 }),
        "{:?}",
        r.header
    );
    assert_eq!(*s.engine.table(7).unwrap().config(), spec);
    let hello = s.handle(
        Request::Hello {
            version: PROTOCOL_VERSION,
        },
        &[],
        NOW,
    );
    let Response::Hello { tables, .. } = hello.header else {
        panic!("{:?}", hello.header)
    };
    assert!(tables.contains(&spec), "{tables:?}");
    // Admitted at the second push of an id.
    let table = s.engine.table(7).unwrap();
    push_at(&s, &[(7, 2, &[5], &[1.0, 1.0])], NOW);
    assert_eq!(table.len(), 0);
    push_at(&s, &[(7, 2, &[5], &[1.0, 1.0])], NOW);
    assert_eq!(table.len(), 1);
    // Expires 10 s after its last push.
    assert!(table.expired(NOW + 9).is_empty());
    assert_eq!(table.expired(NOW + 10), vec![5]);
    // An invalid admission refuses the whole request, naming the field.
    let bad = TableConfig {
        admission: Some(AdmissionConfig {
            min_count: 0,
            width: 1024,
            depth: 2,
        }),
        ..TableConfig::counter(9, 2)
    };
    let (_, msg) = error_of(register(vec![TableConfig::counter(8, 2), bad]));
    assert!(
        msg.contains("table 9: invalid admission.min_count = 0"),
        "{msg}"
    );
    assert!(!s.engine.has_table(8) && !s.engine.has_table(9));
}

/// A [`MemStore`] whose row writes fail while `fail` is set.
struct FlakyStore {
    inner: MemStore,
    fail: std::sync::atomic::AtomicBool,
    synced_writes: std::sync::atomic::AtomicUsize,
}

impl embedding::Store for FlakyStore {
    fn ensure_table(&self, table: u32) -> Result<(), embedding::StoreError> {
        self.inner.ensure_table(table)
    }
    fn write_rows(
        &self,
        table: u32,
        rows: &embedding::DirtyBatch,
        sync: bool,
    ) -> Result<(), embedding::StoreError> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(embedding::StoreError::Backend {
                op: format!("write_rows table {table}"),
                detail: "disk full".into(),
            });
        }
        if sync {
            self.synced_writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.write_rows(table, rows, sync)
    }
    fn write_sorted(
        &self,
        table: u32,
        rows: &mut embedding::SortedRowsFn<'_>,
    ) -> Result<u64, embedding::StoreError> {
        embedding::write_sorted_in_batches(self, table, rows)
    }
    fn delete_rows(&self, table: u32, ids: &[u64]) -> Result<(), embedding::StoreError> {
        self.inner.delete_rows(table, ids)
    }
    fn scan_rows(
        &self,
        table: u32,
        f: &mut embedding::ScanFn<'_>,
    ) -> Result<(), embedding::StoreError> {
        self.inner.scan_rows(table, f)
    }
    fn get_rows(
        &self,
        table: u32,
        ids: &[u64],
        f: &mut embedding::GetFn<'_>,
    ) -> Result<(), embedding::StoreError> {
        self.inner.get_rows(table, ids, f)
    }
    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), embedding::StoreError> {
        self.inner.put_meta(key, value)
    }
    fn delete_meta(&self, key: &str) -> Result<(), embedding::StoreError> {
        self.inner.delete_meta(key)
    }
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, embedding::StoreError> {
        self.inner.get_meta(key)
    }
    fn list_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, embedding::StoreError> {
        self.inner.list_meta(prefix)
    }
    fn flush(&self) -> Result<(), embedding::StoreError> {
        self.inner.flush()
    }
    fn estimate_rows(&self, table: u32) -> Result<u64, embedding::StoreError> {
        self.inner.estimate_rows(table)
    }
}

#[test]
fn sync_push_is_stored_before_the_reply_and_a_store_error_is_a_storage_refusal() {
    use embedding::Store as _;
    use std::sync::atomic::Ordering;
    let store = Arc::new(FlakyStore {
        inner: MemStore::new(),
        fail: false.into(),
        synced_writes: 0.into(),
    });
    let s = Shard {
        engine: Engine::open(store.clone()).unwrap(),
        durability: Durability::Sync,
        ..crate::testing::memory_shard(ShardMap::new(1), 0)
    };
    let r = s.handle(
        Request::RegisterTables {
            tables: vec![TableConfig::counter(1, 4), TableConfig::counter(2, 2)],
        },
        &[],
        NOW,
    );
    assert!(matches!(r.header, Response::Registered { tables: 2 }));
    let stored = |table: u32, ids: &[u64]| {
        let mut n = 0;
        store
            .get_rows(table, ids, &mut |_, v| {
                n += v.is_some() as usize;
                Ok(())
            })
            .unwrap();
        n
    };
    let r = push(
        &s,
        &[
            (1, 4, &[10, 11], &[1.0; 8]),
            (2, 2, &[20, 21, 22], &[1.0; 6]),
        ],
    );
    assert!(
        matches!(r.header, Response::Pushed { rows: 5, .. }),
        "{:?}",
        r.header
    );
    assert_eq!((stored(1, &[10, 11]), stored(2, &[20, 21, 22])), (2, 3));
    // One synced write per push: the last table's batch.
    assert_eq!(store.synced_writes.load(Ordering::Relaxed), 1);

    store.fail.store(true, Ordering::Relaxed);
    let (code, message) = error_of(push(&s, &[(1, 4, &[12], &[1.0; 4])]));
    assert_eq!(code, ErrorCode::Storage);
    assert!(message.contains("disk full"), "{message}");
    // Applied in memory and still dirty: the periodic write-back retries it.
    assert_eq!(rows(pull(&s, 1, 4, &[12]), 4), vec![-1.0; 4]);
    assert_eq!(stored(1, &[12]), 0);
    store.fail.store(false, Ordering::Relaxed);
    s.engine.flush_dirty().unwrap();
    assert_eq!(stored(1, &[12]), 1);
}

#[test]
fn int8_rows_and_unmixed_id_sections_round_trip() {
    use protocol::wire::ids::{put_ids as put_section, sort_for_wire, IdCoding};
    let s = shard(1, 0);
    let mut ids = vec![protocol::routing::mix64(5), protocol::routing::mix64(6), 11];
    sort_for_wire(IdCoding::Unmixed, &mut ids);
    let mut payload = Vec::new();
    put_section(IdCoding::Unmixed, &ids, &mut payload);
    let grads: Vec<f32> = (0..12).map(|i| i as f32 - 6.0).collect();
    codec::encode_rows(&grads, 4, Encoding::Int8, &mut payload);
    let counts = vec![TableCount {
        table: 1,
        count: 3,
        dim: 4,
    }];
    let r = s.handle(
        Request::Push {
            lr_scale: 1.0,
            epoch: 1,
            encoding: Encoding::Int8,
            grad_scale: 2.0,
            tables: counts.clone(),
            id: protocol::wire::message::push::PushId::NONE,
        },
        &payload,
        NOW,
    );
    assert!(
        matches!(r.header, Response::Pushed { rows: 3, .. }),
        "{:?}",
        r.header
    );
    let mut pull = Vec::new();
    put_section(IdCoding::Unmixed, &ids, &mut pull);
    let r = s.handle(
        Request::Pull {
            epoch: 1,
            encoding: Encoding::Int8,
            tables: counts,
        },
        &pull,
        NOW,
    );
    assert_eq!(r.payload.len(), 3 * (4 + 4));
    let mut back = vec![0.0; 12];
    codec::decode_rows(&r.payload, 4, Encoding::Int8, &mut back).unwrap();
    // SGD with lr 1 from zero rows: -grads / grad_scale, within the int8 step of each row.
    for (b, g) in back.iter().zip(&grads) {
        assert!(
            (b + g / 2.0).abs() <= 6.0 / 254.0 + 1e-6,
            "{b} vs {}",
            -g / 2.0
        );
    }
}

#[test]
fn unsorted_ids_and_short_sections_refused() {
    let s = shard(1, 0);
    let (code, msg) = error_of(pull(&s, 1, 4, &[9, 3]));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(msg.contains("ids not ascending at position 1"), "{msg}");
    let r = s.handle(
        Request::Pull {
            epoch: 1,
            encoding: Encoding::F32,
            tables: vec![TableCount {
                table: 1,
                count: 3,
                dim: 4,
            }],
        },
        &[0, 1, 1],
        NOW,
    );
    let (code, msg) = error_of(r);
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(msg.contains("truncated: 2 of 3 ids"), "{msg}");
    // A push whose rows section is one byte short.
    let mut payload = Vec::new();
    put_ids(&[1], &mut payload);
    payload.extend_from_slice(&[0; 15]);
    let r = s.handle(
        Request::Push {
            lr_scale: 1.0,
            epoch: 1,
            encoding: Encoding::F32,
            grad_scale: 1.0,
            tables: vec![TableCount {
                table: 1,
                count: 1,
                dim: 4,
            }],
            id: protocol::wire::message::push::PushId::NONE,
        },
        &payload,
        NOW,
    );
    let (_, msg) = error_of(r);
    assert!(msg.contains("15 bytes, expected 16"), "{msg}");
}

#[test]
fn pull_with_state_returns_each_rows_accumulator_after_the_rows() {
    let s = shard(1, 0);
    let mut adagrad = TableConfig::counter(3, 2);
    adagrad.optimizer = OptimizerConfig::RowAdagrad {
        lr: 0.1,
        eps: 1e-8,
        initial_accumulator: 0.5,
    };
    let r = s.handle(
        Request::RegisterTables {
            tables: vec![adagrad],
        },
        &[],
        NOW,
    );
    assert!(matches!(r.header, Response::Registered { .. }), "{r:?}");
    assert!(matches!(
        push(&s, &[(3, 2, &[7], &[3.0, 4.0])]).header,
        Response::Pushed { rows: 1, .. }
    ));
    let with_state = |table: u32, dim: u32, ids: &[u64]| {
        let mut payload = Vec::new();
        put_ids(ids, &mut payload);
        let tables = vec![TableCount {
            table,
            count: ids.len() as u32,
            dim,
        }];
        s.handle(
            Request::PullWithState {
                epoch: 1,
                encoding: Encoding::F32,
                tables,
            },
            &payload,
            NOW,
        )
    };
    // Row 7 was pushed (acc 0.5 + mean(9, 16)); row 9 is new (the initial accumulator).
    let r = with_state(3, 2, &[7, 9]);
    let Response::PulledWithState { state_lens, .. } = &r.header else {
        panic!("{:?}", r.header)
    };
    assert_eq!(state_lens, &[1]);
    let mut weights = vec![0.0; 4];
    codec::decode_rows(&r.payload[..16], 2, Encoding::F32, &mut weights).unwrap();
    assert_eq!(&weights[..2], &rows(pull(&s, 3, 2, &[7]), 2)[..]);
    let state: Vec<f32> = r.payload[16..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(state, [13.0, 0.5]);
    // SGD tables carry no state; unknown tables and wrong dims are refused like plain pulls.
    let r = with_state(1, 4, &[5]);
    assert!(
        matches!(&r.header, Response::PulledWithState { state_lens, .. } if state_lens == &[0]),
        "{:?}",
        r.header
    );
    assert_eq!(r.payload.len(), 16);
    assert_eq!(error_of(with_state(99, 2, &[1])).0, ErrorCode::UnknownTable);
    let (code, msg) = error_of(with_state(3, 5, &[1]));
    assert_eq!(code, ErrorCode::WrongDimension, "{msg}");
    assert!(msg.contains("dim 5"), "{msg}");
}

fn write(s: &Shard, epoch: u64, table: u32, dim: u32, ids: &[u64], weights: &[f32]) -> Reply {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    codec::encode(weights, Encoding::F32, &mut payload);
    let tables = vec![TableCount {
        table,
        count: ids.len() as u32,
        dim,
    }];
    s.handle(
        protocol::wire::message::write_rows::request(epoch, tables),
        &payload,
        NOW,
    )
}

/// `WriteRows` sets weights (pulls then read them) and is checked as a push is: the epoch, the table's
/// dimension, ownership, and finite weights, each refused whole with nothing written.
#[test]
fn written_rows_are_pulled_and_bad_writes_change_nothing() {
    let s = shard(1, 0);
    let r = write(&s, 1, 2, 2, &[3, 8], &[1.5, -2.0, 0.25, 4.0]);
    assert!(
        matches!(r.header, Response::WroteRows { rows: 2 }),
        "{:?}",
        r.header
    );
    assert_eq!(rows(pull(&s, 2, 2, &[3, 8]), 4), [1.5, -2.0, 0.25, 4.0]);
    let (code, msg) = error_of(write(&s, 1, 2, 2, &[3], &[f32::NAN, 1.0]));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(
        msg.contains("table 2 id 3") && msg.contains("not finite"),
        "{msg}"
    );
    let (code, _) = error_of(write(&s, 7, 2, 2, &[3], &[9.0, 9.0]));
    assert_eq!(code, ErrorCode::WrongEpoch);
    let (code, _) = error_of(write(&s, 1, 2, 4, &[3], &[9.0; 4]));
    assert_eq!(code, ErrorCode::WrongDimension);
    assert_eq!(
        rows(pull(&s, 2, 2, &[3]), 2),
        [1.5, -2.0],
        "nothing written"
    );
    // Another server's ids are refused.
    let s = shard(2, 0);
    let map = ShardMap::new(2);
    let foreign = (0..).find(|&id| map.server_of(id) == 1).unwrap();
    let (code, _) = error_of(write(&s, 1, 2, 2, &[foreign], &[1.0, 1.0]));
    assert_eq!(code, ErrorCode::WrongShard);
}

/// Sync durability: a push's answer is stored with its rows, so a server restarted after that write answers
/// the retry instead of applying the push again. A push whose write failed is refused (transient) until a
/// retry writes it, then answered, applied once; if the server dies first, nothing of it survived, and its
/// retry after the restart is applied.
#[test]
fn a_sync_push_is_answered_once_across_a_restart() {
    use embedding::Store as _;
    use protocol::wire::message::push::PushId;
    use std::sync::atomic::Ordering;
    let store = Arc::new(FlakyStore {
        inner: MemStore::new(),
        fail: false.into(),
        synced_writes: 0.into(),
    });
    let open = || {
        let engine = Engine::open(store.clone()).unwrap();
        Shard::builder(engine, ShardMap::new(1), 0)
            .durability(Durability::Sync)
            .build()
    };
    let s = open();
    let r = s.handle(
        Request::RegisterTables {
            tables: vec![TableConfig::counter(1, 4)],
        },
        &[],
        NOW,
    );
    assert!(matches!(r.header, Response::Registered { tables: 1 }));
    let first = PushId { client: 9, seq: 1 };
    let r = push_as(&s, &[(1, 4, &[10, 11], &[1.0; 8])], NOW, first);
    assert!(
        matches!(r.header, Response::Pushed { rows: 2, .. }),
        "{:?}",
        r.header
    );
    // A push whose synced write fails: applied in memory, refused with the transient Storage; its retries
    // write it, and are refused while the writes fail.
    store.fail.store(true, Ordering::Relaxed);
    let late = PushId { client: 9, seq: 2 };
    for _ in 0..2 {
        let (code, _) = error_of(push_as(&s, &[(1, 4, &[14], &[1.0; 4])], NOW, late));
        assert_eq!(code, ErrorCode::Storage);
    }
    store.fail.store(false, Ordering::Relaxed);
    let r = push_as(&s, &[(1, 4, &[14], &[1.0; 4])], NOW, late);
    assert!(
        matches!(r.header, Response::Pushed { rows: 1, .. }),
        "the retry once written: {:?}",
        r.header
    );
    assert_eq!(
        rows(pull(&s, 1, 4, &[14]), 4),
        vec![-1.0; 4],
        "applied once"
    );
    let r = push_as(&s, &[(1, 4, &[14], &[1.0; 4])], NOW, late);
    assert!(matches!(r.header, Response::Pushed { rows: 1, .. }));
    // Another whose write fails, and the server is killed before any retry.
    store.fail.store(true, Ordering::Relaxed);
    let lost = PushId { client: 9, seq: 3 };
    let (code, _) = error_of(push_as(&s, &[(1, 4, &[12], &[1.0; 4])], NOW, lost));
    assert_eq!(code, ErrorCode::Storage);
    store.fail.store(false, Ordering::Relaxed);
    // Killed: nothing but the store survives.
    drop(s);
    let s = open();
    let r = push_as(&s, &[(1, 4, &[10, 11], &[1.0; 8])], NOW, first);
    assert!(
        matches!(r.header, Response::Pushed { rows: 2, .. }),
        "the retry gets the first answer: {:?}",
        r.header
    );
    assert_eq!(
        rows(pull(&s, 1, 4, &[10, 11]), 8),
        vec![-1.0; 8],
        "applied once"
    );
    let r = push_as(&s, &[(1, 4, &[12], &[1.0; 4])], NOW, lost);
    assert!(
        matches!(r.header, Response::Pushed { rows: 1, .. }),
        "{:?}",
        r.header
    );
    assert_eq!(rows(pull(&s, 1, 4, &[12]), 4), vec![-1.0; 4]);
    let r = push_as(&s, &[(1, 4, &[14], &[1.0; 4])], NOW, late);
    assert!(
        matches!(r.header, Response::Pushed { rows: 1, .. }),
        "{:?}",
        r.header
    );
    assert_eq!(rows(pull(&s, 1, 4, &[14]), 4), vec![-1.0; 4]);
    // Pushes without id, and WriteRows, store no answer.
    push(&s, &[(1, 4, &[13], &[1.0; 4])]);
    let stored = store
        .list_meta(crate::shard::push_window::DURABLE_PREFIX)
        .unwrap();
    assert_eq!(stored.len(), 3, "{stored:?}");
}

/// A push's `lr_scale` multiplies the tables' learning rates for that push; a scale that is not finite and
/// >= 0, or one an FTRL table cannot take, refuses the whole push before any row changes, naming the value.
#[test]
fn push_lr_scale_multiplies_the_rate_and_bad_scales_change_nothing() {
    let s = shard(1, 0);
    let mut ftrl = TableConfig::new(3, "ftrl", 2);
    ftrl.optimizer = OptimizerConfig::Ftrl {
        alpha: 0.1,
        beta: 1.0,
        l1: 0.0,
        l2: 0.0,
    };
    let r = s.handle(Request::RegisterTables { tables: vec![ftrl] }, &[], NOW);
    assert!(
        matches!(r.header, Response::Registered { .. }),
        "{:?}",
        r.header
    );
    let none = protocol::wire::message::push::PushId::NONE;
    let r = push_scaled(&s, &[(1, 4, &[7], &[2.0, 4.0, 6.0, 8.0])], NOW, none, 0.5);
    assert!(
        matches!(r.header, Response::Pushed { rows: 1, .. }),
        "{:?}",
        r.header
    );
    // The counter table is SGD at lr 1 from zero rows: half the gradient at lr_scale 0.5.
    assert_eq!(rows(pull(&s, 1, 4, &[7]), 4), [-1.0, -2.0, -3.0, -4.0]);
    for bad in [f32::NAN, -0.5, f32::INFINITY] {
        let (code, msg) = error_of(push_scaled(&s, &[(1, 4, &[7], &[1.0; 4])], NOW, none, bad));
        assert_eq!(code, ErrorCode::BadRequest, "{msg}");
        assert!(msg.contains("lr_scale"), "{msg}");
    }
    let (code, msg) = error_of(push_scaled(
        &s,
        &[(1, 4, &[7], &[1.0; 4]), (3, 2, &[7], &[1.0; 2])],
        NOW,
        none,
        0.5,
    ));
    assert!(
        msg.contains("table 3") && msg.contains("lr_scale = 0.5") && msg.contains("FTRL"),
        "{code:?} {msg}"
    );
    assert_eq!(
        rows(pull(&s, 1, 4, &[7]), 4),
        [-1.0, -2.0, -3.0, -4.0],
        "the refused push changed nothing, not even the table before the FTRL one"
    );
    let r = push_scaled(&s, &[(3, 2, &[7], &[1.0; 2])], NOW, none, 1.0);
    assert!(
        matches!(r.header, Response::Pushed { rows: 1, .. }),
        "{:?}",
        r.header
    );
}

fn score(s: &Shard, epoch: u64, table: u32, dim: u32, ids: &[u64], scores: &[f32]) -> Reply {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    for v in scores {
        payload.extend_from_slice(&v.to_le_bytes());
    }
    let tables = vec![TableCount {
        table,
        count: ids.len() as u32,
        dim,
    }];
    s.handle(
        protocol::wire::message::score::request(epoch, protocol::ScoreMode::Add, tables),
        &payload,
        NOW,
    )
}

/// Server 0 of `num_servers`, with table 9 (dim 2) evicting by score past 2 rows.
fn scored_shard(num_servers: u32) -> Shard {
    let s = shard(num_servers, 0);
    let scored = TableConfig {
        eviction: Some(protocol::EvictionConfig {
            policy: protocol::EvictionPolicy::Score,
            max_rows: Some(2),
            max_bytes: None,
            decay_secs: None,
        }),
        ..TableConfig::counter(9, 2)
    };
    let r = s.handle(
        Request::RegisterTables {
            tables: vec![scored],
        },
        &[],
        NOW,
    );
    assert!(
        matches!(r.header, Response::Registered { .. }),
        "{:?}",
        r.header
    );
    s
}

/// `Score` gives rows of a table evicting by score their scores (ids without a row are counted out), and the
/// next expiry pass deletes the lowest scored past the cap; a table keeping no scores, a negative or NaN score,
/// a header dim other than 1, a stale epoch and another server's ids are refused whole, changing no score.
#[test]
fn scores_choose_what_the_cap_deletes_and_bad_scores_change_nothing() {
    let s = scored_shard(1);
    push(&s, &[(9, 2, &[1, 2, 3], &[1.0; 6])]);
    let r = score(&s, 1, 9, 1, &[1, 3, 50], &[5.0, 2.0, 1.0]);
    assert!(
        matches!(r.header, Response::Scored { rows: 2 }),
        "{:?}",
        r.header
    );
    let refusals = [
        (score(&s, 1, 2, 1, &[2], &[9.0]), "keeps none"),
        (
            score(&s, 1, 9, 1, &[2, 3], &[9.0, -1.0]),
            "table 9 id 3: score -1",
        ),
        (score(&s, 1, 9, 1, &[2], &[f32::NAN]), "score NaN"),
        (score(&s, 1, 9, 2, &[2], &[9.0, 9.0]), "dim 2"),
    ];
    for (r, want) in refusals {
        let (code, msg) = error_of(r);
        assert_eq!(code, ErrorCode::BadRequest, "{msg}");
        assert!(msg.contains(want), "{msg}");
    }
    assert_eq!(
        error_of(score(&s, 7, 9, 1, &[2], &[9.0])).0,
        ErrorCode::WrongEpoch
    );
    // Row 2 kept its score of 0: the cap of 2 deletes it.
    let stats = s.engine.expire(NOW).unwrap();
    assert_eq!(stats.rows_capped, 1);
    let t = s.engine.table(9).unwrap();
    assert!(t.row(1).is_some() && t.row(2).is_none() && t.row(3).is_some());
    // Another server's ids are refused.
    let s = scored_shard(2);
    let map = ShardMap::new(2);
    let foreign = (0..).find(|&id| map.server_of(id) == 1).unwrap();
    let (code, _) = error_of(score(&s, 1, 9, 1, &[foreign], &[1.0]));
    assert_eq!(code, ErrorCode::WrongShard);
}

/// A pull in bf16 of a bf16 table (the stored halves, copied) answers the same bits as a pull in f32 of the
/// same rows, rounded to bf16 (exact: the rows hold bf16 values), for pushed and unknown ids alike.
#[test]
fn bf16_pulls_of_bf16_rows_answer_the_stored_bits() {
    let s = shard(1, 0);
    let half = TableConfig {
        precision: protocol::RowPrecision::Bf16,
        optimizer: OptimizerConfig::RowAdagrad {
            lr: 0.1,
            eps: 1e-8,
            initial_accumulator: 0.0,
        },
        ..TableConfig::new(8, "half", 5)
    };
    s.handle(Request::RegisterTables { tables: vec![half] }, &[], NOW);
    push(&s, &[(8, 5, &[3, 9], &[0.37; 10])]);
    let ids = [3u64, 9, 40];
    let pull_in = |encoding| {
        let mut payload = Vec::new();
        put_ids(&ids, &mut payload);
        let tables = vec![TableCount {
            table: 8,
            count: ids.len() as u32,
            dim: 5,
        }];
        s.handle(
            Request::Pull {
                epoch: 1,
                encoding,
                tables,
            },
            &payload,
            NOW,
        )
    };
    let f32_rows = rows(pull_in(Encoding::F32), 15);
    let r = pull_in(Encoding::Bf16);
    assert!(
        matches!(r.header, Response::Pulled { .. }),
        "{:?}",
        r.header
    );
    let want: Vec<u8> = f32_rows
        .iter()
        .flat_map(|w| ((w.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    assert_eq!(r.payload, want);
    assert!(f32_rows.iter().all(|w| w.to_bits() & 0xffff == 0));
}
