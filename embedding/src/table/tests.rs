//! Unit tests of [`Table`].

use std::sync::Arc;

use super::*;
use crate::batch::DirtyBatch;
use crate::config::{InitConfig, OptimizerConfig};

fn sgd(dim: usize, lr: f32) -> TableConfig {
    let mut cfg = TableConfig::new(3, "t", dim);
    cfg.optimizer = OptimizerConfig::Sgd { lr };
    cfg.seed = 11;
    cfg
}

fn init_of(cfg: &TableConfig, id: u64) -> Vec<f32> {
    let mut w = vec![0.0; cfg.dim];
    init::fill_weights(cfg, id, &mut w);
    w
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn gather_of_unseen_ids_is_the_initializer_and_inserts_nothing() {
    let cfg = TableConfig::new(3, "t", 4);
    let t = Table::new(cfg.clone()).unwrap();
    let ids = [5u64, 1 << 60, 5];
    let mut out = vec![0.0; 12];
    t.gather(&ids, &mut out).unwrap();
    assert_eq!(bits(&out[0..4]), bits(&init_of(&cfg, 5)));
    assert_eq!(bits(&out[4..8]), bits(&init_of(&cfg, 1 << 60)));
    assert_eq!(bits(&out[8..12]), bits(&init_of(&cfg, 5)));
    assert!(t.is_empty());
    assert_eq!(t.row(5), None);
    assert_eq!(t.dirty_len(), 0);
}

#[test]
fn apply_then_gather() {
    let cfg = sgd(4, 0.5);
    let t = Table::new(cfg.clone()).unwrap();
    let stats = t
        .apply(&[9, 10], &[1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0])
        .unwrap();
    assert_eq!(
        stats,
        ApplyStats {
            applied: 2,
            created: 2,
            rejected_nonfinite: 0,
            rejected_admission: 0,
            rows_read_back: 0,
            rows_waited: 0,
            ..ApplyStats::default()
        }
    );
    let mut want = init_of(&cfg, 9);
    optimizer::apply(&cfg.optimizer, &mut want, &mut [], &[1.0, 2.0, 3.0, 4.0]);
    let mut out = vec![0.0; 8];
    t.gather(&[9, 10], &mut out).unwrap();
    assert_eq!(bits(&out[..4]), bits(&want));
    assert_eq!(bits(&out[4..]), bits(&init_of(&cfg, 10)));
    assert_eq!(t.len(), 2);
    assert_eq!(t.dirty_len(), 2);
    // Second apply updates in place, creates nothing.
    let stats = t.apply(&[9], &[1.0; 4]).unwrap();
    assert_eq!((stats.applied, stats.created), (1, 0));
    assert_eq!(t.len(), 2);
}

#[test]
fn row_adagrad_row_holds_state() {
    let mut cfg = TableConfig::new(3, "t", 2);
    cfg.optimizer = OptimizerConfig::RowAdagrad {
        lr: 0.1,
        eps: 1e-8,
        initial_accumulator: 0.0,
    };
    let t = Table::new(cfg).unwrap();
    t.apply(&[1], &[3.0, 4.0]).unwrap();
    let row = t.row(1).unwrap();
    assert_eq!(row.len(), 3);
    assert_eq!(row[2], 12.5);
}

#[test]
fn gather_with_state_returns_whole_rows_and_initial_state() {
    let mut cfg = TableConfig::new(3, "t", 2);
    cfg.optimizer = OptimizerConfig::RowAdagrad {
        lr: 0.1,
        eps: 1e-8,
        initial_accumulator: 0.25,
    };
    let t = Table::new(cfg.clone()).unwrap();
    t.apply(&[1], &[3.0, 4.0]).unwrap();
    let mut out = vec![0.0; 2 * 3];
    t.gather_with_state(&[1, 9], &mut out).unwrap();
    assert_eq!(bits(&out[..3]), bits(&t.row(1).unwrap()));
    let mut fresh = vec![0.0; 3];
    crate::init::fill_row(&cfg, 9, &mut fresh);
    assert_eq!(bits(&out[3..]), bits(&fresh));
    assert_eq!(out[5], 0.25);
    assert_eq!(t.len(), 1, "gathering creates no row");
    let err = t.gather_with_state(&[1], &mut out[..2]).unwrap_err();
    assert!(err.to_string().contains('2'), "{err}");
}

#[test]
fn duplicate_ids_apply_in_order() {
    let mut cfg = sgd(2, 1.0);
    cfg.init = InitConfig::uniform(0.0);
    let t = Table::new(cfg).unwrap();
    let stats = t
        .apply(&[7, 8, 7], &[1.0, 2.0, 0.5, 0.5, 4.0, 8.0])
        .unwrap();
    assert_eq!((stats.applied, stats.created), (3, 2));
    assert_eq!(t.row(7).unwrap(), vec![-5.0, -10.0]);
    assert_eq!(t.row(8).unwrap(), vec![-0.5, -0.5]);
}

#[test]
fn nonfinite_gradient_rejected_and_row_unchanged() {
    let cfg = sgd(2, 1.0);
    let t = Table::new(cfg.clone()).unwrap();
    t.apply(&[1], &[1.0, 1.0]).unwrap();
    let before = t.row(1).unwrap();
    let stats = t
        .apply(&[1, 2, 3], &[f32::NAN, 0.0, 1.0, f32::INFINITY, 1.0, 1.0])
        .unwrap();
    assert_eq!(
        stats,
        ApplyStats {
            applied: 1,
            created: 1,
            rejected_nonfinite: 2,
            rejected_admission: 0,
            rows_read_back: 0,
            rows_waited: 0,
            ..ApplyStats::default()
        }
    );
    assert_eq!(bits(&t.row(1).unwrap()), bits(&before));
    assert_eq!(t.row(2), None, "a rejected gradient never creates a row");
    assert!(t.row(3).is_some());
}

#[test]
fn wrong_lengths_name_the_numbers() {
    let t = Table::new(sgd(16, 1.0)).unwrap();
    let e = t.apply(&[1, 2, 3, 4, 5, 6], &[0.0; 100]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "table 3: gradient length 100, expected 96 (6 ids x dim 16)"
    );
    let e = t.gather(&[1], &mut [0.0; 15]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "table 3: output length 15, expected 16 (1 ids x dim 16)"
    );
    let e = t.load_row(9, &[0.0; 3]).unwrap_err();
    assert!(
        e.to_string().contains("id 9: row length 3, expected 16"),
        "{e}"
    );
    // Empty calls are fine.
    t.gather(&[], &mut []).unwrap();
    assert_eq!(t.apply(&[], &[]).unwrap(), ApplyStats::default());
}

#[test]
fn concurrent_sgd_updates_to_one_row_sum_exactly() {
    let mut cfg = sgd(4, 1.0);
    cfg.init = InitConfig::uniform(0.0);
    let t = Arc::new(Table::new(cfg).unwrap());
    const STEPS: usize = 2000;
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                for _ in 0..STEPS {
                    // Also touch other rows so both threads contend on several stripes.
                    t.apply(&[42, 1, 2, 3], &[1.0; 16]).unwrap();
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(t.row(42).unwrap(), vec![-((2 * STEPS) as f32); 4]);
    assert_eq!(t.len(), 4);
}

#[test]
fn take_dirty_ids_takes_at_most_max_rows_each_once() {
    let t = Table::new(sgd(2, 1.0)).unwrap();
    let ids: Vec<u64> = (0..1000).map(|i| i * 7 + 3).collect();
    t.apply(&ids, &vec![1.0; 2000]).unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut out = vec![u64::MAX];
    for want in [300, 300, 300, 100, 0] {
        let before = out.len();
        assert_eq!(t.take_dirty_ids(300, &mut out), want);
        assert_eq!(out.len() - before, want, "appends after what out held");
        for &id in &out[before..] {
            assert!(seen.insert(id), "id {id} taken twice");
        }
    }
    assert_eq!(out[0], u64::MAX);
    assert_eq!(seen.len(), 1000);
    assert!(ids.iter().all(|id| seen.contains(id)));
    assert_eq!(t.dirty_len(), 0);
    // Updated again: dirty again; given back: dirty again.
    t.apply(&[3], &[1.0; 2]).unwrap();
    t.mark_dirty(&[10]);
    let mut again = Vec::new();
    assert_eq!(t.take_dirty_ids(10, &mut again), 2);
    again.sort_unstable();
    assert_eq!(again, [3, 10]);
}

#[test]
fn take_dirty_drains_and_then_returns_zero() {
    let t = Table::new(sgd(3, 1.0)).unwrap();
    let ids: Vec<u64> = (0..1000).collect();
    t.apply(&ids, &vec![1.0; 3000]).unwrap();
    assert_eq!(t.dirty_len(), 1000);
    let mut batch = DirtyBatch::new();
    let mut seen = std::collections::HashSet::new();
    loop {
        let n = t.take_dirty(300, &mut batch);
        if n == 0 {
            break;
        }
        assert!(n <= 300);
        assert_eq!(batch.len(), n);
        assert_eq!(batch.row_bytes(), 12);
        for (id, bytes) in batch.iter() {
            let mut row = [0f32; 3];
            crate::batch::decode_row(bytes, &mut row);
            assert_eq!(bits(&row), bits(&t.row(id).unwrap()));
            assert!(seen.insert(id), "id {id} taken twice");
        }
    }
    assert_eq!(seen.len(), 1000);
    assert_eq!(t.dirty_len(), 0);
    assert_eq!(t.take_dirty(10, &mut batch), 0);
    assert!(batch.is_empty());
    // Updating again makes the row dirty again; mark_dirty gives rows back.
    t.apply(&[5], &[1.0; 3]).unwrap();
    assert_eq!(t.take_dirty(10, &mut batch), 1);
    t.mark_dirty(&[5, 6, 123_456]);
    assert_eq!(t.dirty_len(), 2);
}

#[test]
fn load_row_inserts_clean_rows() {
    let t = Table::new(TableConfig::new(3, "t", 2)).unwrap();
    t.load_row(1, &[1.0, 2.0, 3.0]).unwrap();
    t.load_row(1, &[4.0, 5.0, 6.0]).unwrap();
    assert_eq!(t.row(1).unwrap(), vec![4.0, 5.0, 6.0]);
    assert_eq!(t.len(), 1);
    assert_eq!(t.dirty_len(), 0);
    let mut out = [0.0; 2];
    t.gather(&[1], &mut out).unwrap();
    assert_eq!(out, [4.0, 5.0]);
}

#[test]
fn many_rows_survive_index_growth() {
    let t = Table::new(sgd(1, 1.0)).unwrap();
    let ids: Vec<u64> = (0..50_000u64)
        .map(|i| i.wrapping_mul(0x1_0000_0001))
        .collect();
    t.apply(&ids, &vec![1.0; ids.len()]).unwrap();
    assert_eq!(t.len(), ids.len());
    let mut out = vec![0.0; ids.len()];
    t.gather(&ids, &mut out).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(out[i], t.row(id).unwrap()[0]);
    }
    let payload = ids.len() * 4;
    assert!(t.memory_bytes() > payload);
}

#[test]
fn invalid_config_is_refused() {
    assert!(Table::new(TableConfig::new(1, "t", 0)).is_err());
}

fn admitted(min_count: u32) -> TableConfig {
    let mut cfg = sgd(2, 1.0);
    cfg.admission = Some(crate::config::AdmissionConfig {
        min_count,
        width: 1024,
        depth: 4,
    });
    cfg
}

#[test]
fn admission_creates_a_row_at_the_min_count_th_push() {
    let cfg = admitted(3);
    let t = Table::new(cfg.clone()).unwrap();
    let init = init_of(&cfg, 5);
    for push in 1..=2 {
        let stats = t.apply(&[5], &[1.0, 1.0]).unwrap();
        assert_eq!(
            (stats.applied, stats.created, stats.rejected_admission),
            (0, 0, 1),
            "push {push}"
        );
        assert_eq!(t.row(5), None);
        let mut out = [0.0; 2];
        t.gather(&[5], &mut out).unwrap();
        assert_eq!(
            bits(&out),
            bits(&init),
            "a pull of an unadmitted id is the initializer"
        );
    }
    assert_eq!(t.dirty_len(), 0);
    // The third push creates the row and applies its gradient.
    let stats = t.apply(&[5], &[1.0, 1.0]).unwrap();
    assert_eq!(
        (stats.applied, stats.created, stats.rejected_admission),
        (1, 1, 0)
    );
    let mut want = init.clone();
    optimizer::apply(&cfg.optimizer, &mut want, &mut [], &[1.0, 1.0]);
    assert_eq!(bits(&t.row(5).unwrap()), bits(&want));
    // Duplicates in one call count one by one: ids 6 and 7 pushed 3 times in a single call are admitted at
    // the third occurrence; non-finite rows are not counted.
    let stats = t.apply(&[6, 6, 7, 6, 7, 7], &[0.5; 12]).unwrap();
    assert_eq!(
        (stats.applied, stats.created, stats.rejected_admission),
        (2, 2, 4)
    );
    let stats = t
        .apply(&[8, 8, 8], &[f32::NAN, 0.0, 1.0, 1.0, 1.0, 1.0])
        .unwrap();
    assert_eq!((stats.rejected_nonfinite, stats.rejected_admission), (1, 2));
    assert_eq!(t.len(), 3);
}

#[test]
fn admission_min_count_one_is_no_filter() {
    let t = Table::new(admitted(1)).unwrap();
    let stats = t.apply(&[1, 2], &[0.0; 4]).unwrap();
    assert_eq!((stats.created, stats.rejected_admission), (2, 0));
}

proptest::proptest! {
    /// With min_count k, an id pushed k times has a row whatever other ids were pushed before (a narrow sketch
    /// forces collisions, which can only admit early, never late).
    #[test]
    fn admission_after_exactly_k_pushes_at_most(
        k in 1u32..6,
        width in 1usize..64,
        others in proptest::collection::vec(0u64..1000, 0..50),
        target in 1000u64..2000,
    ) {
        let mut cfg = admitted(k);
        cfg.admission.as_mut().unwrap().width = width;
        let t = Table::new(cfg).unwrap();
        t.apply(&others, &vec![0.1; others.len() * 2]).unwrap();
        for _ in 0..k - 1 {
            t.apply(&[target], &[1.0, 1.0]).unwrap();
        }
        let sketch = t.sketch.as_ref().unwrap();
        proptest::prop_assert!(sketch.estimate(target) >= k - 1, "the sketch never undercounts");
        // Collisions may admit `target` early (overcounting), never late.
        t.apply(&[target], &[1.0, 1.0]).unwrap();
        proptest::prop_assert!(t.row(target).is_some());
    }

    /// Without collisions (a wide sketch, one id), k - 1 pushes never admit.
    #[test]
    fn no_row_before_k_pushes(k in 1u32..8, id in proptest::prelude::any::<u64>()) {
        let t = Table::new(admitted(k)).unwrap();
        for _ in 0..k - 1 {
            t.apply(&[id], &[1.0, 1.0]).unwrap();
        }
        proptest::prop_assert!(t.row(id).is_none());
        proptest::prop_assert_eq!(t.sketch.as_ref().unwrap().estimate(id), k - 1);
        t.apply(&[id], &[1.0, 1.0]).unwrap();
        proptest::prop_assert!(t.row(id).is_some());
    }
}

fn with_ttl(ttl: u64) -> TableConfig {
    let mut cfg = sgd(2, 1.0);
    cfg.ttl_secs = Some(ttl);
    cfg
}

#[test]
fn ttl_expires_untouched_rows_and_reuses_slots() {
    let t = Table::new(with_ttl(10)).unwrap();
    t.apply_at(&[1, 2], &[1.0; 4], 0).unwrap();
    t.apply_at(&[3], &[1.0; 2], 5).unwrap();
    assert_eq!(t.clock(), 5);
    assert!(t.expired(9).is_empty());
    let mut ids = t.expired(10);
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2]);
    // Row 2 is touched between `expired` and `remove_expired`: it stays.
    t.apply_at(&[2], &[1.0; 2], 10).unwrap();
    assert_eq!(t.remove_expired(&ids, 10), 1);
    assert_eq!(t.row(1), None);
    assert!(t.row(2).is_some() && t.row(3).is_some());
    assert_eq!(t.len(), 2);
    assert_eq!(t.dirty_len(), 2, "the deleted row's dirty bit is cleared");
    // Row 1 comes back from the initializer, into the freed slot (no arena growth).
    let slots: usize = t.stripes.iter().map(|p| p.0.lock().arena.slots()).sum();
    t.apply_at(&[1], &[0.0; 2], 11).unwrap();
    let after: usize = t.stripes.iter().map(|p| p.0.lock().arena.slots()).sum();
    assert_eq!(slots, after);
    let cfg = with_ttl(10);
    assert_eq!(bits(&t.row(1).unwrap()), bits(&init_of(&cfg, 1)));
    let mut ids = t.expired(100);
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3]);
}

#[test]
fn apply_without_time_uses_the_logical_clock() {
    let t = Table::new(with_ttl(10)).unwrap();
    assert!(t.expired(50).is_empty());
    t.apply(&[1], &[1.0; 2]).unwrap(); // stamped 50
    assert!(t.expired(59).is_empty());
    assert_eq!(t.expired(60), vec![1]);
    // The clock never goes back.
    t.advance_clock(3);
    assert_eq!(t.clock(), 60);
}

#[test]
fn loaded_rows_start_their_ttl_at_the_next_expiry() {
    let t = Table::new(with_ttl(10)).unwrap();
    t.load_row(4, &[1.0, 2.0]).unwrap();
    assert!(
        t.expired(1000).is_empty(),
        "unknown last touch: the TTL starts now"
    );
    assert!(t.expired(1009).is_empty());
    assert_eq!(t.expired(1010), vec![4]);
}

#[test]
fn tables_without_ttl_expire_nothing_and_keep_no_stamps() {
    let t = Table::new(sgd(2, 1.0)).unwrap();
    t.apply_at(&[1], &[1.0; 2], 0).unwrap();
    assert!(t.expired(u64::MAX).is_empty());
    assert_eq!(t.remove_expired(&[1], u64::MAX), 0);
    assert!(t.row(1).is_some());
    // The TTL stamp costs 4 bytes per row (per slot of arena capacity, so up to 8 with a stripe's last chunk
    // half full): compare the same rows with and without a TTL.
    let ttl = Table::new(with_ttl(10)).unwrap();
    let ids: Vec<u64> = (0..10_000).collect();
    t.apply(&ids, &vec![0.0; 20_000]).unwrap();
    ttl.apply(&ids, &vec![0.0; 20_000]).unwrap();
    let extra = ttl.memory_bytes() - t.memory_bytes();
    assert!((40_000..=80_000).contains(&extra), "{extra}");
}

#[test]
fn an_update_to_infinity_is_refused_and_counted() {
    // Issue 40: two pushes of -3e38 to an SGD table (rate 1) once left the row at +inf.
    let cfg = TableConfig {
        optimizer: OptimizerConfig::Sgd { lr: 1.0 },
        ..TableConfig::new(1, "t", 2)
    };
    let t = Table::new(cfg).unwrap();
    t.load_row(7, &[0.0, 0.0]).unwrap();
    let first = t.apply(&[7], &[-3e38, -1.0]).unwrap();
    assert_eq!((first.applied, first.refused_nonfinite_weights), (1, 0));
    let second = t.apply(&[7], &[-3e38, -1.0]).unwrap();
    assert_eq!((second.applied, second.refused_nonfinite_weights), (0, 1));
    assert_eq!(
        t.row(7).unwrap(),
        vec![3e38, 1.0],
        "the row is as before the refused update"
    );
    t.set_weight_guard(crate::WeightGuard::Clamp { max_abs: 1e38 });
    let clamped = t.apply(&[7], &[-3e38, -1.0]).unwrap();
    assert_eq!((clamped.applied, clamped.clamped_weights), (1, 1));
    assert_eq!(t.row(7).unwrap(), vec![1e38, 2.0]);
}

/// A push's `lr_scale` is the table's learning rate times the scale for that call, for every optimizer that
/// has one (the same rows, bit for bit, as a table registered at the scaled rate; later calls at scale 1 go
/// back to the registered rate with the state the scaled call left); FTRL and bad scales are refused before
/// any row changes, naming the table and the value.
#[test]
fn lr_scale_multiplies_the_learning_rate_for_one_call() {
    let optimizers = [
        OptimizerConfig::Sgd { lr: 0.3 },
        OptimizerConfig::RowAdagrad {
            lr: 0.3,
            eps: 1e-8,
            initial_accumulator: 0.0,
        },
        OptimizerConfig::Adagrad {
            lr: 0.3,
            eps: 1e-8,
            initial_accumulator: 0.1,
        },
        OptimizerConfig::Adam {
            lr: 0.3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    ];
    let (ids, grads) = ([4u64, 9, 4], [0.5f32, -1.0, 2.0, 0.25, -0.75, 1.5]);
    for opt in optimizers {
        let mut cfg = sgd(2, 1.0);
        cfg.optimizer = opt;
        let scaled = Table::new(cfg.clone()).unwrap();
        let mut at_rate = cfg.clone();
        at_rate.optimizer = opt.with_lr_scale(0.25).unwrap();
        let reference = Table::new(at_rate).unwrap();
        scaled.apply_scaled(&ids, &grads, 0, 0.25).unwrap();
        reference.apply(&ids, &grads).unwrap();
        for id in [4, 9] {
            assert_eq!(
                bits(&scaled.row(id).unwrap()),
                bits(&reference.row(id).unwrap()),
                "{opt:?} id {id}"
            );
        }
        // Back at the registered rate: the next update uses it (and the state the scaled one left).
        let plain = Table::new(cfg.clone()).unwrap();
        plain.apply(&ids, &grads).unwrap();
        scaled.apply_scaled(&ids, &grads, 0, 1.0).unwrap();
        plain.apply(&ids, &grads).unwrap();
        assert_ne!(
            bits(&scaled.row(4).unwrap()),
            bits(&plain.row(4).unwrap()),
            "{opt:?}: the scaled first step must leave a different row"
        );
    }
    let mut ftrl = sgd(2, 1.0);
    ftrl.optimizer = OptimizerConfig::Ftrl {
        alpha: 0.1,
        beta: 1.0,
        l1: 0.0,
        l2: 0.0,
    };
    let t = Table::new(ftrl).unwrap();
    let err = t.apply_scaled(&[1], &[1.0, 1.0], 0, 0.5).unwrap_err();
    assert!(
        err.to_string().contains("table 3") && err.to_string().contains("lr_scale = 0.5"),
        "{err}"
    );
    assert!(t.is_empty(), "nothing applied");
    t.apply_scaled(&[1], &[1.0, 1.0], 0, 1.0).unwrap();
    let t = Table::new(sgd(2, 1.0)).unwrap();
    for bad in [-1.0, f32::NAN, f32::INFINITY] {
        let err = t.apply_scaled(&[1], &[1.0, 1.0], 0, bad).unwrap_err();
        assert!(err.to_string().contains("lr_scale"), "{err}");
    }
    assert!(t.is_empty());
    t.apply_scaled(&[1], &[1.0, 1.0], 0, 0.0).unwrap();
    assert_eq!(
        bits(&t.row(1).unwrap()),
        bits(&init_of(&sgd(2, 1.0), 1)),
        "lr 0 leaves the weights"
    );
}
