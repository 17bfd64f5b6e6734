//! Unit tests of [`Table`].

use std::sync::Arc;

use super::*;
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
            rejected_nonfinite: 0
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
            rejected_nonfinite: 2
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
