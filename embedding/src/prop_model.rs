//! The reference the engine's property tests compare it against ([`super::prop_test`], the arenas and the
//! store; [`super::prop_budget_test`], the capacity tier): every table's rows in a `HashMap`, created on first
//! push by the table's initializer, admitted by its count rule, updated by the optimizer's reference code.

use std::collections::HashMap;

use crate::config::TableConfig;
use crate::init;
use crate::optimizer::{self, Regularizer};

/// One table's rows (weights then optimizer state) by id.
pub(crate) type Rows = HashMap<u64, Vec<f32>>;

/// Rows per table and the admission sightings of ids without a row.
pub(crate) struct RowModel {
    /// The tables, by position.
    pub configs: Vec<TableConfig>,
    /// The rows the engine must hold, per table.
    pub live: Vec<Rows>,
    /// Pushes of ids without a row, per table (reset when the engine restarts: sketches are not persisted).
    pub sightings: Vec<HashMap<u64, u32>>,
}

impl RowModel {
    /// Empty tables of `configs`.
    pub fn new(configs: Vec<TableConfig>) -> RowModel {
        RowModel {
            live: vec![Rows::new(); configs.len()],
            sightings: vec![HashMap::new(); configs.len()],
            configs,
        }
    }

    /// What a gather of `ids` from table `t` returns: the weights of existing rows, the initializer's for others.
    pub fn gather(&self, t: usize, ids: &[u64]) -> Vec<f32> {
        let cfg = &self.configs[t];
        let mut out = vec![0.0; ids.len() * cfg.dim];
        for (i, id) in ids.iter().enumerate() {
            let dst = &mut out[i * cfg.dim..(i + 1) * cfg.dim];
            match self.live[t].get(id) {
                Some(row) => dst.copy_from_slice(&row[..cfg.dim]),
                None => init::fill_weights(cfg, *id, dst),
            }
        }
        out
    }

    /// Applies `grads` (a row per id) to table `t`, as the engine does: a row with a non-finite gradient is
    /// skipped, an id not admitted yet only counted; `applied` hears every id whose row was updated.
    pub fn apply(&mut self, t: usize, ids: &[u64], grads: &[f32], mut applied: impl FnMut(u64)) {
        let cfg = &self.configs[t];
        for (i, id) in ids.iter().enumerate() {
            let g = &grads[i * cfg.dim..(i + 1) * cfg.dim];
            if g.iter().any(|x| !x.is_finite()) {
                continue;
            }
            if let (Some(adm), false) = (cfg.admission, self.live[t].contains_key(id)) {
                let seen = self.sightings[t].entry(*id).or_default();
                *seen += 1;
                if *seen < adm.min_count {
                    continue;
                }
            }
            applied(*id);
            let row = self.live[t].entry(*id).or_insert_with(|| {
                let mut row = vec![0.0; cfg.row_len()];
                init::fill_row(cfg, *id, &mut row);
                row
            });
            let (w, s) = row.split_at_mut(cfg.dim);
            optimizer::update(&cfg.optimizer, Regularizer::of(cfg), w, s, g);
        }
    }
}

/// The bit patterns of `v`, to compare rows exactly (NaNs included).
pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
