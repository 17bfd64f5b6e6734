//! `--populate-rows N`: before measuring, every table receives one push of each of its first `N` ranks, so it
//! holds exactly `N` rows whatever the distribution (a pull creates no rows, and a pooled batch reaches only the
//! ids it happened to draw). The ids are those the sampler draws ([`table_id`] of ranks `1..=N`), so
//! `--populate-rows` equal to `--vocab` leaves no id a later pull could miss.
//!
//! [`chunk`] is the sans-IO part: the ids of one request's worth of ranks, as a [`Batch`] that
//! [`super::workload::plan`] splits by server and encodes like any other push.

use super::workload::{table_id, Batch};

/// Ranks per table in one populate request (each server gets its share of them).
pub const CHUNK_RANKS: u64 = 4096;

/// Number of chunks covering ranks `1..=rows`.
pub fn chunks(rows: u64) -> u64 {
    rows.div_ceil(CHUNK_RANKS)
}

/// Chunk `index` of a populate of `rows` ranks: ranks `index * CHUNK_RANKS + 1 ..` (at most [`CHUNK_RANKS`],
/// none past `rows`) of each of `tables` tables, as sorted distinct ids.
pub fn chunk(tables: u32, rows: u64, index: u64) -> Batch {
    let first = index.saturating_mul(CHUNK_RANKS) + 1;
    let last = (first + CHUNK_RANKS - 1).min(rows);
    let unique = (0..tables)
        .map(|t| {
            let mut ids: Vec<u64> = (first..=last).map(|r| table_id(t, r)).collect();
            ids.sort_unstable();
            ids
        })
        .collect();
    Batch { unique }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::config::Distribution;
    use crate::load::workload::IdSampler;
    use std::collections::HashSet;

    #[test]
    fn chunks_cover_every_rank_once() {
        let rows = 2 * CHUNK_RANKS + 5;
        assert_eq!(chunks(rows), 3);
        assert_eq!(chunks(0), 0);
        let mut seen: Vec<HashSet<u64>> = vec![HashSet::new(); 2];
        for i in 0..chunks(rows) {
            let b = chunk(2, rows, i);
            for (t, ids) in b.unique.iter().enumerate() {
                assert!(ids.windows(2).all(|w| w[0] < w[1]), "sorted and distinct");
                for &id in ids {
                    assert!(seen[t].insert(id), "id {id} twice");
                }
            }
        }
        for (t, s) in seen.iter().enumerate() {
            let want: HashSet<u64> = (1..=rows).map(|r| table_id(t as u32, r)).collect();
            assert_eq!(s, &want);
        }
    }

    #[test]
    fn populated_ids_are_the_ids_the_sampler_draws() {
        let vocab = 1000;
        let populated: HashSet<u64> = (0..chunks(vocab))
            .flat_map(|i| chunk(3, vocab, i).unique.swap_remove(1))
            .collect();
        for dist in [Distribution::Uniform, Distribution::Zipf] {
            let s = IdSampler::new(dist, vocab, 1.1).unwrap();
            let b = Batch::generate(&s, 3, 5000, 1, 0);
            assert!(b.unique[1].iter().all(|id| populated.contains(id)));
        }
    }
}
