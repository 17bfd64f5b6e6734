//! Batch planning, without I/O: deduplicate each table's ids, group unique ids by server, build the pull and
//! push payloads, and move rows between per-unique-id buffers and the model's `[B x tables x dim]` layout.
//!
//! Call order per batch: [`Plan::build`] -> for each server [`Plan::pull_request`] -> for each reply
//! [`Plan::scatter_pulled`] -> [`Plan::gather_embeddings`] -> (compute) -> [`Plan::reduce_gradients`] -> for
//! each server [`Plan::push_request`]. Buffers are reused across batches (no allocation per row).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use protocol::codec;
use protocol::message::put_ids;
use protocol::{Encoding, ProtocolError, ShardMap, TableCount};

/// A hasher for ids that are already well mixed (feature ids are a bijective 64-bit mix): one multiply.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type IdMap = HashMap<u64, u32, BuildHasherDefault<IdHasher>>;

/// The plan of one batch.
#[derive(Default)]
pub struct Plan {
    batch: usize,
    dim: usize,
    /// `unique[t]`: distinct ids of table `t`, in first-seen order.
    unique: Vec<Vec<u64>>,
    /// `inverse[t][i]`: position in `unique[t]` of sample `i`'s id.
    inverse: Vec<Vec<u32>>,
    /// `by_server[s][t]`: positions in `unique[t]` owned by server `s`.
    by_server: Vec<Vec<Vec<u32>>>,
    seen: IdMap,
    ids_scratch: Vec<u64>,
    rows_scratch: Vec<f32>,
}

impl Plan {
    /// Plans a batch: `sparse[t]` holds the ids of table `t` for every sample (all of equal length).
    pub fn build(&mut self, sparse: &[Vec<u64>], dim: usize, map: &ShardMap) {
        let tables = sparse.len();
        self.batch = sparse.first().map_or(0, Vec::len);
        self.dim = dim;
        let servers = map.num_servers as usize;
        self.unique.resize_with(tables, Vec::new);
        self.inverse.resize_with(tables, Vec::new);
        self.by_server.resize_with(servers, Vec::new);
        for s in &mut self.by_server {
            s.resize_with(tables, Vec::new);
            s.iter_mut().for_each(Vec::clear);
        }
        for (t, ids) in sparse.iter().enumerate() {
            debug_assert_eq!(ids.len(), self.batch);
            let (unique, inverse) = (&mut self.unique[t], &mut self.inverse[t]);
            unique.clear();
            inverse.clear();
            self.seen.clear();
            for &id in ids {
                let next = unique.len() as u32;
                let pos = *self.seen.entry(id).or_insert(next);
                if pos == next {
                    unique.push(id);
                }
                inverse.push(pos);
            }
            for (u, &id) in unique.iter().enumerate() {
                self.by_server[map.server_of(id) as usize][t].push(u as u32);
            }
        }
    }

    /// Samples in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Number of tables.
    pub fn tables(&self) -> usize {
        self.unique.len()
    }

    /// Distinct ids over all tables.
    pub fn unique_ids(&self) -> usize {
        self.unique.iter().map(Vec::len).sum()
    }

    /// Distinct ids of each table.
    pub fn unique(&self, table: usize) -> &[u64] {
        &self.unique[table]
    }

    /// Whether server `s` owns any id of this batch.
    pub fn has_work(&self, server: usize) -> bool {
        self.by_server[server].iter().any(|p| !p.is_empty())
    }

    /// Header counts and id payload of the pull for server `s` (tables with no ids are left out).
    pub fn pull_request(&self, server: usize) -> (Vec<TableCount>, Vec<u8>) {
        let mut counts = Vec::new();
        let mut payload = Vec::new();
        for (t, positions) in self.by_server[server].iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            counts.push(TableCount {
                table: t as u32,
                count: positions.len() as u32,
                dim: self.dim as u32,
            });
            payload.reserve(positions.len() * 8);
            for &p in positions {
                payload.extend_from_slice(&self.unique[t][p as usize].to_le_bytes());
            }
        }
        (counts, payload)
    }

    /// Decodes server `s`'s pulled rows into `unique_rows[t]` (`[unique_t x dim]`, resized as needed).
    pub fn scatter_pulled(
        &mut self,
        server: usize,
        rows: &[u8],
        encoding: Encoding,
        unique_rows: &mut Vec<Vec<f32>>,
    ) -> Result<(), ProtocolError> {
        let dim = self.dim;
        unique_rows.resize_with(self.unique.len(), Vec::new);
        let width = encoding.bytes_per_element();
        let expected: usize = self.by_server[server]
            .iter()
            .map(|p| p.len() * dim * width)
            .sum();
        protocol::message::check_len("pulled rows", rows.len(), expected)?;
        let mut at = 0;
        for (t, positions) in self.by_server[server].iter().enumerate() {
            let dst = &mut unique_rows[t];
            dst.resize(self.unique[t].len() * dim, 0.0);
            if positions.is_empty() {
                continue;
            }
            let n = positions.len() * dim;
            self.rows_scratch.resize(n, 0.0);
            codec::decode(&rows[at..at + n * width], encoding, &mut self.rows_scratch)?;
            at += n * width;
            for (k, &p) in positions.iter().enumerate() {
                let p = p as usize;
                dst[p * dim..(p + 1) * dim]
                    .copy_from_slice(&self.rows_scratch[k * dim..(k + 1) * dim]);
            }
        }
        Ok(())
    }

    /// Expands per-unique rows into the model's input `[batch x tables x dim]`.
    pub fn gather_embeddings(&self, unique_rows: &[Vec<f32>], out: &mut Vec<f32>) {
        let (b, tables, dim) = (self.batch, self.unique.len(), self.dim);
        out.resize(b * tables * dim, 0.0);
        for (t, inverse) in self.inverse.iter().enumerate() {
            let rows = &unique_rows[t];
            for (i, &u) in inverse.iter().enumerate() {
                let u = u as usize;
                let at = (i * tables + t) * dim;
                out[at..at + dim].copy_from_slice(&rows[u * dim..(u + 1) * dim]);
            }
        }
    }

    /// Sums the model's embedding gradients `[batch x tables x dim]` per unique id into `out[t]`
    /// (`[unique_t x dim]`), multiplied by `scale`.
    pub fn reduce_gradients(&self, emb_grad: &[f32], scale: f32, out: &mut Vec<Vec<f32>>) {
        let (tables, dim) = (self.unique.len(), self.dim);
        out.resize_with(tables, Vec::new);
        for (t, inverse) in self.inverse.iter().enumerate() {
            let acc = &mut out[t];
            acc.clear();
            acc.resize(self.unique[t].len() * dim, 0.0);
            for (i, &u) in inverse.iter().enumerate() {
                let u = u as usize;
                let src = &emb_grad[(i * tables + t) * dim..][..dim];
                for (a, g) in acc[u * dim..(u + 1) * dim].iter_mut().zip(src) {
                    *a += g * scale;
                }
            }
        }
    }

    /// Header counts and payload (ids, then encoded gradient rows) of the push for server `s`.
    pub fn push_request(
        &mut self,
        server: usize,
        grads: &[Vec<f32>],
        encoding: Encoding,
    ) -> (Vec<TableCount>, Vec<u8>) {
        let dim = self.dim;
        let mut counts = Vec::new();
        let mut payload = Vec::new();
        self.ids_scratch.clear();
        for (t, positions) in self.by_server[server].iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            counts.push(TableCount {
                table: t as u32,
                count: positions.len() as u32,
                dim: dim as u32,
            });
            self.ids_scratch
                .extend(positions.iter().map(|&p| self.unique[t][p as usize]));
        }
        put_ids(&self.ids_scratch, &mut payload);
        for (t, positions) in self.by_server[server].iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            self.rows_scratch.clear();
            for &p in positions {
                let p = p as usize;
                self.rows_scratch
                    .extend_from_slice(&grads[t][p * dim..(p + 1) * dim]);
            }
            codec::encode(&self.rows_scratch, encoding, &mut payload);
        }
        (counts, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_route_gather_reduce_round_trip() {
        let map = ShardMap::new(2);
        let sparse = vec![vec![5u64, 9, 5, 7], vec![1u64, 1, 1, 1]];
        let mut plan = Plan::default();
        plan.build(&sparse, 2, &map);
        assert_eq!(plan.unique(0), &[5, 9, 7]);
        assert_eq!(plan.unique(1), &[1]);
        assert_eq!(plan.unique_ids(), 4);
        // Serve every pull as if the row of id x were [x, -x].
        let mut unique_rows = Vec::new();
        for s in 0..2 {
            let (counts, ids) = plan.pull_request(s);
            let mut rows = Vec::new();
            for chunk in ids.chunks_exact(8) {
                let id = u64::from_le_bytes(chunk.try_into().unwrap()) as f32;
                codec::encode(&[id, -id], Encoding::F32, &mut rows);
            }
            assert_eq!(
                counts.iter().map(|c| c.count as usize).sum::<usize>() * 8,
                ids.len()
            );
            plan.scatter_pulled(s, &rows, Encoding::F32, &mut unique_rows)
                .unwrap();
        }
        let mut emb = Vec::new();
        plan.gather_embeddings(&unique_rows, &mut emb);
        assert_eq!(
            emb,
            [5., -5., 1., -1., 9., -9., 1., -1., 5., -5., 1., -1., 7., -7., 1., -1.]
        );
        // Gradients: sample i, table t, element e = i + 10t + 100e.
        let grad: Vec<f32> = (0..4)
            .flat_map(|i| {
                (0..2).flat_map(move |t| (0..2).map(move |e| (i + 10 * t + 100 * e) as f32))
            })
            .collect();
        let mut sums = Vec::new();
        plan.reduce_gradients(&grad, 2.0, &mut sums);
        assert_eq!(
            sums[0],
            [2.0 * 2., 2.0 * 202., 2.0, 2.0 * 101., 6.0, 2.0 * 103.]
        );
        assert_eq!(sums[1], [2.0 * 46., 2.0 * 446.]);
        let mut pushed = 0;
        for s in 0..2 {
            let (counts, payload) = plan.push_request(s, &sums, Encoding::F32);
            let n: usize = counts.iter().map(|c| c.count as usize).sum();
            assert_eq!(payload.len(), n * 8 + n * 2 * 4);
            pushed += n;
        }
        assert_eq!(pushed, 4);
    }

    #[test]
    fn short_reply_is_an_error() {
        let map = ShardMap::new(1);
        let mut plan = Plan::default();
        plan.build(&[vec![1, 2]], 4, &map);
        let mut rows = Vec::new();
        let err = plan
            .scatter_pulled(0, &[0u8; 12], Encoding::F16, &mut rows)
            .unwrap_err();
        assert!(err.to_string().contains("12 bytes, expected 16"), "{err}");
    }
}
