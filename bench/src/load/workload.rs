//! The benchmark's batches, without I/O: ids drawn per table (uniform or Zipf), deduplicated per batch like the
//! trainer does, and the per-server pull and push payloads built from them.
//!
//! Ids are salted by table (`mix64(table << 40 | rank)`, a bijection), so every table spreads evenly over the
//! shards, as the trainer's feature-salted ids do. A batch is a function of (seed, batch index) only.

use bytes::Bytes;
use protocol::compression::codec;
use protocol::wire::ids::IdCoding;
use protocol::wire::message::pull::IdSections;
use protocol::{Encoding, ShardMap, TableCount};

use crate::gen::rng::{mix64, Rng};
use crate::gen::zipf::Zipf;

use super::config::Distribution;

/// Largest vocabulary: ranks must fit below the table bits of the salted id.
pub const MAX_VOCAB: u64 = 1 << 40;

/// Draws ids.
#[derive(Debug, Clone)]
pub enum IdSampler {
    /// Uniform over `1..=n`.
    Uniform(u64),
    /// Zipf over `1..=n`.
    Zipf(Zipf),
}

impl IdSampler {
    /// The sampler a config asks for.
    pub fn new(dist: Distribution, vocab: u64, s: f64) -> anyhow::Result<IdSampler> {
        if vocab == 0 || vocab >= MAX_VOCAB {
            anyhow::bail!("vocabulary {vocab} out of range 1..2^40");
        }
        Ok(match dist {
            Distribution::Uniform => IdSampler::Uniform(vocab),
            Distribution::Zipf => IdSampler::Zipf(Zipf::new(vocab, s)?),
        })
    }

    /// One rank in `1..=n`.
    pub fn rank(&self, rng: &mut Rng) -> u64 {
        match self {
            // Multiply-shift range reduction: bias below 2^-24 for n < 2^40.
            IdSampler::Uniform(n) => ((rng.next_u64() as u128 * *n as u128) >> 64) as u64 + 1,
            IdSampler::Zipf(z) => z.sample(rng),
        }
    }
}

/// The id of `rank` in table `table`.
pub fn table_id(table: u32, rank: u64) -> u64 {
    mix64(((table as u64) << 40) | rank)
}

/// One batch: the distinct ids of each table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// `unique[t]`: sorted distinct ids of table `t`.
    pub unique: Vec<Vec<u64>>,
}

impl Batch {
    /// Draws `ids_per_table` ids for each of `tables` tables and deduplicates them; batch `index` of `seed`.
    pub fn generate(
        sampler: &IdSampler,
        tables: u32,
        ids_per_table: usize,
        seed: u64,
        index: u64,
    ) -> Batch {
        let mut rng = Rng::new(mix64(seed ^ mix64(index.wrapping_add(0x5157))));
        let unique = (0..tables)
            .map(|t| {
                let mut ids: Vec<u64> = (0..ids_per_table)
                    .map(|_| table_id(t, sampler.rank(&mut rng)))
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                ids
            })
            .collect();
        Batch { unique }
    }

    /// Distinct ids over all tables (the rows a pull or push moves).
    pub fn rows(&self) -> usize {
        self.unique.iter().map(Vec::len).sum()
    }
}

/// Gradient values for up to `max_rows` rows of `dim`: small normal values, shared by every batch (the
/// server's work does not depend on their values).
pub fn gradient_block(max_rows: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(mix64(seed ^ 0x67ad));
    (0..max_rows * dim)
        .map(|_| (rng.normal() * 0.01) as f32)
        .collect()
}

/// A pull and a push for one server, ready to send.
#[derive(Debug, Clone)]
pub struct ServerRequests {
    /// Pull header counts (tables with no ids left out).
    pub counts: Vec<TableCount>,
    /// Pull payload: one id section per table, ascending by pre-image ([`IdCoding::Unmixed`], as the trainer
    /// sends them).
    pub pull_ids: Bytes,
    /// Push payload: ids, then gradient rows encoded.
    pub push_payload: Bytes,
    /// Rows (distinct ids) in the request.
    pub rows: usize,
}

/// Splits a batch by server and encodes its pull and push payloads (gradients from `grads`, see
/// [`gradient_block`]).
pub fn plan(
    batch: &Batch,
    map: &ShardMap,
    dim: usize,
    encoding: Encoding,
    grads: &[f32],
) -> Vec<ServerRequests> {
    let servers = map.num_servers as usize;
    let mut sections = vec![IdSections::new(); servers];
    let mut rows: Vec<Vec<f32>> = vec![Vec::new(); servers];
    let mut groups = Vec::new();
    let mut keyed: Vec<(u64, u32)> = Vec::new();
    let mut ids: Vec<u64> = Vec::new();
    for (t, unique) in batch.unique.iter().enumerate() {
        map.group(unique, &mut groups);
        for (s, positions) in groups.iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            // Wire order: ascending pre-images.
            keyed.clear();
            keyed.extend(
                positions
                    .iter()
                    .map(|&p| (IdCoding::Unmixed.key(unique[p as usize]), p)),
            );
            keyed.sort_unstable();
            ids.clear();
            ids.extend(keyed.iter().map(|&(_, p)| unique[p as usize]));
            sections[s].table(t as u32, dim as u32, IdCoding::Unmixed, &ids);
            // Gradient of a row: its position in the table's unique list picks a row of the block.
            for &(_, p) in &keyed {
                let at = (p as usize * dim) % grads.len().max(1);
                rows[s].extend_from_slice(&grads[at..at + dim]);
            }
        }
    }
    (0..servers)
        .map(|s| {
            let IdSections {
                counts, payload, ..
            } = std::mem::take(&mut sections[s]);
            let pull = payload;
            // The push: the same id sections, then the rows (protocol::wire::message::push).
            let mut push = pull.clone();
            codec::encode_rows(&rows[s], dim, encoding, &mut push);
            let n = counts.iter().map(|c: &TableCount| c.count as usize).sum();
            ServerRequests {
                counts,
                pull_ids: Bytes::from(pull),
                push_payload: Bytes::from(push),
                rows: n,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zipf() -> IdSampler {
        IdSampler::new(Distribution::Zipf, 10_000_000, 1.1).unwrap()
    }

    #[test]
    fn batches_are_deduplicated_and_salted_by_table() {
        let b = Batch::generate(&zipf(), 3, 2048, 7, 0);
        assert_eq!(b.unique.len(), 3);
        for ids in &b.unique {
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "sorted and distinct");
            // Zipf 1.1 repeats its head ranks many times in 2048 draws.
            assert!(!ids.is_empty() && ids.len() < 2048, "{} unique", ids.len());
        }
        assert!(b.unique[0].iter().all(|id| !b.unique[1].contains(id)));
        assert_eq!(b.rows(), b.unique.iter().map(Vec::len).sum::<usize>());
    }

    #[test]
    fn batches_are_a_function_of_seed_and_index() {
        let s = zipf();
        assert_eq!(
            Batch::generate(&s, 4, 500, 7, 3),
            Batch::generate(&s, 4, 500, 7, 3)
        );
        assert_ne!(
            Batch::generate(&s, 4, 500, 7, 3),
            Batch::generate(&s, 4, 500, 7, 4)
        );
        assert_ne!(
            Batch::generate(&s, 4, 500, 7, 3),
            Batch::generate(&s, 4, 500, 8, 3)
        );
    }

    #[test]
    fn uniform_stays_in_vocabulary_and_rarely_repeats() {
        let s = IdSampler::new(Distribution::Uniform, 100, 0.0).unwrap();
        let mut rng = Rng::new(1);
        let ranks: Vec<u64> = (0..10_000).map(|_| s.rank(&mut rng)).collect();
        assert!(ranks.iter().all(|&r| (1..=100).contains(&r)));
        assert!(ranks.contains(&1) && ranks.contains(&100));
        let big = IdSampler::new(Distribution::Uniform, 10_000_000, 0.0).unwrap();
        let b = Batch::generate(&big, 1, 2048, 1, 0);
        assert!(b.unique[0].len() > 2000, "{}", b.unique[0].len());
    }

    #[test]
    fn plan_splits_every_row_once_with_payloads_of_the_right_size() {
        let b = Batch::generate(&zipf(), 5, 1000, 1, 0);
        let map = ShardMap::new(3);
        let grads = gradient_block(1000, 8, 1);
        let reqs = plan(&b, &map, 8, Encoding::F16, &grads);
        assert_eq!(reqs.len(), 3);
        assert_eq!(reqs.iter().map(|r| r.rows).sum::<usize>(), b.rows());
        for (s, r) in reqs.iter().enumerate() {
            let layout = protocol::wire::layout::PayloadLayout::of(&r.counts).unwrap();
            assert_eq!(layout.ids, r.rows);
            let mut ids = Vec::new();
            protocol::wire::message::pull::decode(&r.counts, &r.pull_ids, &mut ids).unwrap();
            let used = r.pull_ids.len();
            let mut push_ids = Vec::new();
            let rows = protocol::wire::message::push::decode(
                &r.counts,
                Encoding::F16,
                &r.push_payload,
                &mut push_ids,
            )
            .unwrap();
            assert_eq!(
                (push_ids.as_slice(), rows.len()),
                (ids.as_slice(), layout.rows_bytes(Encoding::F16))
            );
            assert_eq!(
                r.push_payload.len(),
                used + layout.rows_bytes(Encoding::F16)
            );
            assert!(ids.iter().all(|&id| map.server_of(id) as usize == s));
            // Salted ranks travel as their pre-images: a few bytes per id instead of eight.
            assert!(used < 5 * r.rows, "{used} bytes for {} ids", r.rows);
        }
    }
}
