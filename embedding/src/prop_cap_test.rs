//! Property test of the row caps (issue 43, `table/cap.rs`): random pushes of skewed ids, scores, clock moves and
//! expiry passes on an engine over a [`MemStore`], against a model of each policy (a map of id to count: +1 per
//! row update, or to a score: added or set by `Score`, untouched by updates; halved every `decay_secs`; the lowest
//! `(count or score, splitmix64(id))` deleted past the cap). After every pass the table holds exactly the
//! model's ids, and the store none of the deleted ones. Plus unit tests of the cap's settings and its refusals.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use proptest::prelude::*;

use crate::config::{EvictionConfig, EvictionPolicy, OptimizerConfig, ScoreMode, TableConfig};
use crate::engine::Engine;
use crate::mem_store::MemStore;
use crate::store::Store;
use base::hash::splitmix64;

const CAP: u64 = 12;
const DECAY: u64 = 5;

fn capped(id: u32, eviction: EvictionConfig) -> TableConfig {
    TableConfig {
        optimizer: OptimizerConfig::RowAdagrad {
            lr: 0.1,
            eps: 1e-8,
            initial_accumulator: 0.0,
        },
        eviction: Some(eviction),
        ..TableConfig::new(id, "capped", 2)
    }
}

fn lfu(max_rows: u64, decay_secs: Option<u64>) -> EvictionConfig {
    EvictionConfig {
        policy: EvictionPolicy::Lfu,
        max_rows: Some(max_rows),
        max_bytes: None,
        decay_secs,
    }
}

fn by_score(max_rows: u64, decay_secs: Option<u64>) -> EvictionConfig {
    EvictionConfig {
        policy: EvictionPolicy::Score,
        ..lfu(max_rows, decay_secs)
    }
}

/// The policy, plainly: `counts` are update counts (LFU) or scores (`scores`).
#[derive(Default)]
struct Model {
    counts: HashMap<u64, f32>,
    last_decay: Option<u64>,
    scores: bool,
}

impl Model {
    fn push(&mut self, ids: &[u64]) {
        for id in ids {
            let c = self.counts.entry(*id).or_default();
            if !self.scores {
                *c += 1.0;
            }
        }
    }

    fn score(&mut self, scored: &[(u64, f32)], set: bool) {
        for (id, s) in scored {
            if let Some(c) = self.counts.get_mut(id) {
                *c = if set { *s } else { *c + *s };
            }
        }
    }

    fn expire(&mut self, now: u64) {
        match self.last_decay {
            Some(last) if now >= last => {
                let periods = (now - last) / DECAY;
                self.last_decay = Some(last + periods * DECAY);
                for c in self.counts.values_mut() {
                    for _ in 0..periods.min(32) {
                        *c = if self.scores {
                            *c * 0.5
                        } else {
                            (*c * 0.5).floor()
                        };
                    }
                }
            }
            _ => self.last_decay = Some(now),
        }
        let excess = self.counts.len().saturating_sub(CAP as usize);
        // Counts and non-negative scores order as their values: compare them as such.
        let mut by_rank: Vec<(u64, u64, u64)> = self
            .counts
            .iter()
            .map(|(&id, &c)| ((c * 1024.0) as u64, splitmix64(id), id))
            .collect();
        by_rank.sort_unstable();
        for &(_, _, id) in &by_rank[..excess] {
            self.counts.remove(&id);
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Push these ids (duplicates count twice).
    Push(Vec<u64>),
    /// Score these ids (added, or set if the flag is on; ids without a row are not scored).
    Score(Vec<(u64, f32)>, bool),
    /// Move the clock forward by this many seconds.
    Wait(u64),
    /// An expiry pass.
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    // Skewed ids: low ids far more often (ids 0..40, squared uniform).
    let id = (0u64..1600).prop_map(|x| (x as f64).sqrt() as u64);
    // Scores in quarters up to 8: sums and halvings stay exact in f32 and in the model's ranks (x 1024).
    let scored = (id.clone(), (0u32..32).prop_map(|q| q as f32 * 0.25));
    prop_oneof![
        5 => prop::collection::vec(id, 1..12).prop_map(Op::Push),
        3 => (prop::collection::vec(scored, 1..12), any::<bool>()).prop_map(|(s, set)| Op::Score(s, set)),
        2 => (0u64..4).prop_map(Op::Wait),
        2 => Just(Op::Expire),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn the_cap_keeps_what_the_policy_keeps(ops in prop::collection::vec(op(), 1..80), scores in any::<bool>()) {
        let store = Arc::new(MemStore::new());
        let e = Engine::open(store.clone()).unwrap();
        let policy = if scores { by_score(CAP, Some(DECAY)) } else { lfu(CAP, Some(DECAY)) };
        e.register_table(capped(1, policy)).unwrap();
        let mut model = Model { scores, ..Model::default() };
        let mut now = 100u64;
        let mut deleted = BTreeSet::new();
        for op in ops {
            match op {
                Op::Push(ids) => {
                    e.apply_at(1, &ids, &vec![0.25; ids.len() * 2], now).unwrap();
                    model.push(&ids);
                    e.flush_dirty().unwrap();
                }
                Op::Score(scored, set) => {
                    let (ids, values): (Vec<u64>, Vec<f32>) = scored.iter().copied().unzip();
                    let mode = if set { ScoreMode::Set } else { ScoreMode::Add };
                    // Ids in one request are scored in order, as the model does.
                    let r = e.score(1, &ids, &values, mode);
                    if scores {
                        let found = ids.iter().filter(|id| model.counts.contains_key(id)).count();
                        prop_assert_eq!(r.unwrap(), found);
                        model.score(&scored, set);
                    } else {
                        prop_assert!(r.unwrap_err().to_string().contains("keeps none"));
                    }
                }
                Op::Wait(s) => now += s,
                Op::Expire => {
                    let before: BTreeSet<u64> = model.counts.keys().copied().collect();
                    let stats = e.expire(now).unwrap();
                    model.expire(now);
                    let after: BTreeSet<u64> = model.counts.keys().copied().collect();
                    prop_assert_eq!(stats.rows_capped, before.len() - after.len());
                    deleted.extend(before.difference(&after).copied());
                    deleted.retain(|id| !after.contains(id));
                    let t = e.table(1).unwrap();
                    let held: BTreeSet<u64> = (0..64).filter(|&id| t.row(id).is_some()).collect();
                    prop_assert_eq!(&held, &after);
                    prop_assert!(t.len() as u64 <= CAP);
                    // Deleted rows left the store too.
                    let mut stored = Vec::new();
                    store.scan_ids(1, None, 1000, &mut stored).unwrap();
                    let stored: BTreeSet<u64> = stored.into_iter().collect();
                    prop_assert!(stored.is_disjoint(&deleted), "{:?} still stored", stored.intersection(&deleted).collect::<Vec<_>>());
                }
            }
        }
    }
}

#[test]
fn settings_that_cannot_be_met_are_refused_naming_them() {
    let refused = |e: EvictionConfig| {
        Engine::open(Arc::new(MemStore::new()))
            .unwrap()
            .register_table(capped(1, e))
            .unwrap_err()
            .to_string()
    };
    let none = EvictionConfig {
        max_rows: None,
        ..lfu(1, None)
    };
    assert!(refused(none).contains("max_rows or max_bytes"));
    assert!(refused(lfu(0, None)).contains("eviction.max_rows"));
    assert!(refused(lfu(5, Some(0))).contains("eviction.decay_secs"));
    let tiny = EvictionConfig {
        max_bytes: Some(1000),
        ..lfu(5, None)
    };
    assert!(refused(tiny).contains("eviction.max_bytes"));
    // A server keeping rows past a memory budget on disk cannot also delete rows past a cap.
    let e = Engine::open_with_budget(Arc::new(MemStore::new()), Some(100)).unwrap();
    let err = e
        .register_table(capped(1, lfu(50, None)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("memory budget") && err.contains("eviction"),
        "{err}"
    );
    // Configs differing only in their cap conflict, naming it.
    let e = Engine::open(Arc::new(MemStore::new())).unwrap();
    e.register_table(capped(1, lfu(50, None))).unwrap();
    let err = e
        .register_table(capped(1, lfu(60, None)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("eviction: registered"), "{err}");
}

#[test]
fn a_memory_cap_deletes_down_to_what_its_bytes_hold_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || Arc::new(crate::RocksStore::open(dir.path()).unwrap());
    let cap = EvictionConfig {
        max_rows: None,
        max_bytes: Some(2 << 20),
        ..lfu(1, None)
    };
    let ids: Vec<u64> = (0..200_000).collect();
    {
        let e = Engine::open(open()).unwrap();
        e.register_table(capped(1, cap)).unwrap();
        // Ids below 1000 are pushed three times, the rest once: the cap keeps the hot ones.
        e.apply_at(1, &ids, &vec![0.5; ids.len() * 2], 10).unwrap();
        for _ in 0..2 {
            e.apply_at(1, &ids[..1000], &vec![0.5; 2000], 10).unwrap();
        }
        e.flush_dirty().unwrap();
        let stats = e.expire(10).unwrap();
        let t = e.table(1).unwrap();
        // 2 MiB at about 31 bytes a row (3 words, id, count, index, bitsets).
        let cap_rows = t.cap_rows().unwrap();
        assert!((50_000..80_000).contains(&cap_rows), "{cap_rows}");
        assert_eq!(
            (t.len() as u64, stats.rows_capped),
            (cap_rows, 200_000 - cap_rows as usize)
        );
        // A second pass deletes nothing more: the cap does not shrink with the allocation.
        assert_eq!(e.expire(11).unwrap().rows_capped, 0);
        assert!(
            ids[..1000].iter().all(|&id| t.row(id).is_some()),
            "a hot row was deleted"
        );
        e.flush_dirty().unwrap();
    }
    // After a restart the deleted rows are gone from RocksDB too: the table recovers only what it kept.
    let e = Engine::open(open()).unwrap();
    let t = e.table(1).unwrap();
    assert_eq!(t.eviction(), Some(cap));
    assert!(t.len() < 80_000 && ids[..1000].iter().all(|&id| t.row(id).is_some()));
}
