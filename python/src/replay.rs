//! Replay of a collection's own push on rows pulled before the servers applied it, without I/O: the rows and
//! optimizer state are updated as the servers update them (the same [`embedding::optimizer::update`] with the
//! table's config), so a step computes with the rows a synchronous run would (`pstrain/_lookup.py`; the Rust
//! trainer's counterpart is `trainer/src/step/replay.rs`).

use std::collections::HashMap;

use embedding::optimizer::{update, Regularizer};
use embedding::TableConfig;

/// For each id of `target` (distinct) that `pushed` (distinct) holds, updates its row of `rows`
/// (`target.len() x dim`) and its state of `state` (`target.len() x state_len`) with `cfg`'s optimizer and the
/// pushed gradient row of `grads` (`pushed.len() x dim`), at `opt` (the table's optimizer at the push's
/// learning-rate multiplier). Rows whose gradient is not finite are left, as the servers refuse them. The
/// caller checked the lengths. Returns the rows updated.
pub(crate) fn apply(
    (cfg, opt): (&TableConfig, &embedding::OptimizerConfig),
    rows: &mut [f32],
    state: &mut [f32],
    target: &[u64],
    pushed: &[u64],
    grads: &[f32],
) -> usize {
    let (dim, len) = (cfg.dim, cfg.state_len());
    let reg = Regularizer::of(cfg);
    let at: HashMap<u64, usize> = pushed.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut updated = 0;
    for (i, id) in target.iter().enumerate() {
        let Some(&j) = at.get(id) else { continue };
        let g = &grads[j * dim..(j + 1) * dim];
        if !g.iter().all(|x| x.is_finite()) {
            continue;
        }
        update(
            opt,
            reg,
            &mut rows[i * dim..(i + 1) * dim],
            &mut state[i * len..(i + 1) * len],
            g,
        );
        updated += 1;
    }
    updated
}
