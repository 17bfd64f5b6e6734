//! The capacity tier under concurrency: pushes, pulls, prefetches and evictions race on a table far over its
//! budget, and no update is lost and no pull goes back in time (`table/budget.rs`: the gate, one read per
//! row, the negative cache). A stale copy inserted after a newer one was evicted, a row recreated from the
//! initializer, a wrong "no stored row" record, or a pull answered from the initializer would show here (the
//! last one did: a pull whose read-back found its row already read back by another caller skipped the copy).
//!
//! SGD with learning rate 1 and gradient 1 from weights 0 makes every row's weight minus the number of pushes
//! it received, exactly in f32; weights only decrease, so one thread's successive pulls of a row never
//! increase.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::{InitConfig, OptimizerConfig, TableConfig};
use crate::engine::Engine;
use crate::mem_store::MemStore;
use base::rng::SplitMix64;

const IDS: u64 = 600;
const BUDGET: u64 = 40;

/// `n` ids, distinct or not, in `0..IDS`.
fn draw_ids(rng: &mut SplitMix64, n: usize) -> Vec<u64> {
    (0..n).map(|_| rng.below(IDS)).collect()
}

/// Sets its counter to `u64::MAX` when its thread ends, also by a panic, so the pushers (which run until the
/// other threads did enough rounds) stop instead of waiting forever for a thread that failed.
struct Finished(Arc<AtomicU64>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.store(u64::MAX, Ordering::Relaxed);
    }
}

#[test]
fn racing_pushes_pulls_prefetches_and_evictions_lose_nothing() {
    let engine =
        Arc::new(Engine::open_with_budget(Arc::new(MemStore::new()), Some(BUDGET)).unwrap());
    let mut cfg = TableConfig::new(1, "t", 2);
    cfg.optimizer = OptimizerConfig::Sgd { lr: 1.0 };
    cfg.init = InitConfig::uniform(0.0);
    engine.register_table(cfg).unwrap();
    // Spill first, so every miss looks in the store from the start.
    let all: Vec<u64> = (0..IDS).collect();
    engine.apply(1, &all, &vec![1.0; all.len() * 2]).unwrap();
    engine.enforce_budget().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Pushers run at least PUSHES pushes and until the others did ROUNDS rounds each (a condition, so the
    // threads overlap on any machine).
    const PUSHES: usize = 1500;
    const ROUNDS: u64 = 200;
    let (pulls, evictions) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));

    let pushers: Vec<_> = (0..2u64)
        .map(|t| {
            let (engine, pulls, evictions) = (engine.clone(), pulls.clone(), evictions.clone());
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(t + 1);
                let mut counts = vec![0u32; IDS as usize];
                let mut done = 0;
                while done < PUSHES
                    || pulls.load(Ordering::Relaxed) < ROUNDS
                    || evictions.load(Ordering::Relaxed) < ROUNDS
                {
                    done += 1;
                    let ids = draw_ids(&mut rng, 8);
                    engine.apply(1, &ids, &vec![1.0; ids.len() * 2]).unwrap();
                    for &id in &ids {
                        counts[id as usize] += 1;
                    }
                }
                counts
            })
        })
        .collect();
    let puller = {
        let (engine, stop, pulls) = (engine.clone(), stop.clone(), pulls.clone());
        std::thread::spawn(move || {
            let _finished = Finished(pulls.clone());
            let mut rng = SplitMix64::new(77);
            let mut seen = vec![f32::INFINITY; IDS as usize];
            let mut lease = 0;
            while !stop.load(Ordering::Relaxed) {
                let ids = draw_ids(&mut rng, 16);
                lease += 1;
                engine
                    .prefetch(3, lease, lease, &[(1, &ids)], 0, 60)
                    .unwrap();
                let mut out = vec![0.0; ids.len() * 2];
                engine.gather_stats(1, &ids, &mut out).unwrap();
                for (k, &id) in ids.iter().enumerate() {
                    let w = out[k * 2];
                    assert!(
                        w <= seen[id as usize],
                        "id {id}: pulled {w} after {}",
                        seen[id as usize]
                    );
                    assert!(
                        w <= -1.0,
                        "id {id}: pulled {w}, the initializer's value, not its row"
                    );
                    seen[id as usize] = w;
                }
                pulls.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let evictor = {
        let (engine, stop, evictions) = (engine.clone(), stop.clone(), evictions.clone());
        std::thread::spawn(move || {
            let _finished = Finished(evictions.clone());
            while !stop.load(Ordering::Relaxed) {
                engine.enforce_budget().unwrap();
                engine.expire_leases(u64::MAX);
                evictions.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        })
    };
    let mut expected = vec![1u32; IDS as usize];
    for p in pushers {
        for (e, c) in expected.iter_mut().zip(p.join().unwrap()) {
            *e += c;
        }
    }
    stop.store(true, Ordering::Relaxed);
    puller.join().unwrap();
    evictor.join().unwrap();
    let mut out = vec![0.0; all.len() * 2];
    engine.gather_stats(1, &all, &mut out).unwrap();
    for (id, &n) in expected.iter().enumerate() {
        assert_eq!(out[id * 2], -(n as f32), "id {id}: {n} pushes");
        assert_eq!(out[id * 2 + 1], -(n as f32), "id {id}: {n} pushes");
    }
    assert!(engine.rows_read_back() > 0);
}
