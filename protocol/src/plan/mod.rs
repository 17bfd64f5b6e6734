//! Batch planning, without I/O: deduplicate each table's ids, group unique ids by server, build the pull and
//! push payloads, and move rows between per-unique-id buffers and the model's `[B x tables x dim]` layout.
//!
//! Call order per batch: [`Plan::build`] -> for each server [`Plan::pull_request`] -> for each reply
//! [`Plan::scatter_pulled`] -> [`Plan::gather_embeddings`] -> (compute) -> [`Plan::reduce_gradients`] -> for
//! each server [`Plan::push_request`]. Buffers are reused across batches (no allocation per row).
//!
//! With per-table encodings ([`TableCodecs`]) a server gets one request per distinct encoding instead:
//! [`Plan::pull_requests`] -> [`Plan::scatter_replies`] (all replies, decoded table by table in parallel; or
//! [`Plan::scatter_part`] for one), and [`Plan::push_requests`], which also runs
//! error feedback for lossy push encodings ([`crate::compression::feedback`]).
//!
//! On the wire each table's ids are sorted and delta + varint coded as [`IdCoding::Unmixed`] sections (the
//! feature ids are a splitmix64 mix, whose pre-images within a feature differ little: [`crate::wire::ids`]);
//! [`Plan::build`] sorts each server's share of a table into that order once, and rows travel in it.

use crate::compression::codec;
use crate::compression::feedback::ResidualStore;
use crate::wire::ids::IdCoding;
use crate::wire::message::pull::IdSections;
use crate::wire::message::pull_with_state::get_state_at;
use crate::{Encoding, ProtocolError, ShardMap, TableCount};
use base::multiversion;

mod bags;
mod codecs;
mod dedup;

pub use bags::{FeatureShape, SparseLayout};
pub use codecs::TableCodecs;
pub use dedup::Dedup;

/// How ids travel (see the module docs).
const ID_CODING: IdCoding = IdCoding::Unmixed;

/// One request of a batch for one server: the tables of one encoding.
#[derive(Debug, Clone)]
pub struct PartRequest {
    /// Server index.
    pub server: usize,
    /// Row encoding of the request.
    pub encoding: Encoding,
    /// Header counts (tables with no ids left out).
    pub counts: Vec<TableCount>,
    /// Payload: id sections (then, for a push, the encoded gradient rows).
    pub payload: Vec<u8>,
}

/// The plan of one batch.
#[derive(Default)]
pub struct Plan {
    batch: usize,
    /// The sparse layout and what follows from it.
    shape: bags::Derived,
    /// `unique[t]`: distinct ids of table `t`, in first-seen order.
    unique: Vec<Vec<u64>>,
    /// `inverse[t][k]`: position in `unique[t]` of the `k`-th id of the table's features (feature by feature,
    /// in feature order: feature `f`'s ids start at `base[f]`).
    inverse: Vec<Vec<u32>>,
    /// `base[f]`: where feature `f`'s ids start in its table's `inverse`.
    base: Vec<usize>,
    /// `offsets[f]`: feature `f`'s bag offsets (`[batch + 1]`), empty for a one-hot feature.
    offsets: Vec<Vec<u32>>,
    /// `by_server[s][t]`: positions in `unique[t]` owned by server `s`, in wire order.
    by_server: Vec<Vec<Vec<u32>>>,
    /// `keys[s][t][k]`: the wire-order key of `unique[t][by_server[s][t][k]]` (ascending), which lets two
    /// plans find their common ids by merging (the trainer's replay, `trainer::step::replay`).
    keys: Vec<Vec<Vec<u64>>>,
    seen: Dedup,
    /// The parts of the last [`Plan::pull_requests`]: (server, encoding, counts).
    pull_parts: Vec<(usize, Encoding, Vec<TableCount>)>,
    ids_scratch: Vec<u64>,
    sort_scratch: Vec<(u64, u32)>,
}

/// One answer to request `request` of the last [`Plan::pull_requests`] ([`Plan::scatter_replies`]): its rows
/// and, for a pull with state, its optimizer state with one state length per table of the request
/// (`count x state_lens[k]` f32 LE for table `k`).
#[derive(Debug, Clone, Copy)]
pub struct PartReply<'a> {
    /// Index of the request in the last [`Plan::pull_requests`].
    pub request: usize,
    /// The encoded rows, tables in the request's order.
    pub rows: &'a [u8],
    /// The optimizer state and its per-table lengths (`None` for a pull without state).
    pub state: Option<(&'a [u8], &'a [u32])>,
}

/// An answer with what it answers (see [`Plan::scatter`]).
struct Answer<'a> {
    server: usize,
    encoding: Encoding,
    counts: &'a [TableCount],
    rows: &'a [u8],
    state: Option<(&'a [u8], &'a [u32])>,
}

/// One table's share of one answer.
struct Section<'a> {
    /// Index of the answer (for errors).
    answer: usize,
    server: usize,
    encoding: Encoding,
    rows: &'a [u8],
    /// Empty for a pull without state.
    state: &'a [u8],
}

/// Scratch buffers of [`Plan::push_requests`] (kept by the caller so that a plan can be shared read-only).
#[derive(Default)]
pub struct PushScratch {
    ids: Vec<u64>,
    rows: Vec<f32>,
}

impl Plan {
    /// Plans a batch of one-hot features, feature `t` reading table `t` of dimension `dim`: `sparse[t]` holds
    /// the ids of table `t` for every sample (all of equal length).
    pub fn build(&mut self, sparse: &[Vec<u64>], dim: usize, map: &ShardMap) {
        let batch = sparse.first().map_or(0, Vec::len);
        self.build_with(
            &SparseLayout::uniform(sparse.len(), dim),
            batch,
            sparse,
            &[],
            map,
        );
    }

    /// Plans a batch of `batch` samples with `layout`: `sparse[f]` holds feature `f`'s ids, one per sample
    /// when `offsets[f]` is empty (or missing), else the bags `offsets[f][i]..offsets[f][i + 1]`.
    ///
    /// # Panics
    /// If `sparse` does not have one id list per feature, or a list does not match `batch` and its offsets.
    pub fn build_with(
        &mut self,
        layout: &SparseLayout,
        batch: usize,
        sparse: &[Vec<u64>],
        offsets: &[Vec<u32>],
        map: &ShardMap,
    ) {
        assert_eq!(sparse.len(), layout.features.len(), "plan: sparse columns");
        self.shape.set(layout);
        let tables = layout.tables();
        self.batch = batch;
        self.base.resize(layout.features.len(), 0);
        self.offsets.resize_with(layout.features.len(), Vec::new);
        for (f, dst) in self.offsets.iter_mut().enumerate() {
            dst.clear();
            let src = offsets.get(f).map_or(&[][..], Vec::as_slice);
            if src.is_empty() {
                assert_eq!(sparse[f].len(), batch, "plan: feature {f}'s ids");
            } else {
                assert_eq!(src.len(), batch + 1, "plan: feature {f}'s offsets");
                assert_eq!(
                    src[batch] as usize,
                    sparse[f].len(),
                    "plan: feature {f}'s bags"
                );
                dst.extend_from_slice(src);
            }
        }
        let servers = map.num_servers as usize;
        self.unique.resize_with(tables, Vec::new);
        self.unique.truncate(tables);
        self.inverse.resize_with(tables, Vec::new);
        self.inverse.truncate(tables);
        self.by_server.resize_with(servers, Vec::new);
        self.keys.resize_with(servers, Vec::new);
        for (s, k) in self.by_server.iter_mut().zip(&mut self.keys) {
            s.resize_with(tables, Vec::new);
            s.truncate(tables);
            s.iter_mut().for_each(Vec::clear);
            k.resize_with(tables, Vec::new);
            k.truncate(tables);
            k.iter_mut().for_each(Vec::clear);
        }
        for t in 0..tables {
            let (unique, inverse) = (&mut self.unique[t], &mut self.inverse[t]);
            unique.clear();
            inverse.clear();
            self.seen.clear();
            for &f in &self.shape.of_table[t] {
                self.base[f] = inverse.len();
                for &id in &sparse[f] {
                    inverse.push(self.seen.position(id, unique));
                }
            }
            for (u, &id) in unique.iter().enumerate() {
                self.by_server[map.server_of(id) as usize][t].push(u as u32);
            }
            // Wire order: ascending pre-images (computed once per id, not per comparison).
            for (server, keys) in self.by_server.iter_mut().zip(&mut self.keys) {
                let positions = &mut server[t];
                self.sort_scratch.clear();
                self.sort_scratch.extend(
                    positions
                        .iter()
                        .map(|&p| (ID_CODING.key(unique[p as usize]), p)),
                );
                self.sort_scratch.sort_unstable();
                positions.clear();
                positions.extend(self.sort_scratch.iter().map(|&(_, p)| p));
                keys[t].extend(self.sort_scratch.iter().map(|&(k, _)| k));
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

    /// The f32 values of the distinct ids' rows over all tables (`Σ unique_t x dim_t`): their raw size.
    pub fn unique_values(&self) -> usize {
        (0..self.unique.len())
            .map(|t| self.unique[t].len() * self.dim(t))
            .sum()
    }

    /// Distinct ids of each table.
    pub fn unique(&self, table: usize) -> &[u64] {
        &self.unique[table]
    }

    /// Row dimension of table `t`.
    pub fn dim(&self, t: usize) -> usize {
        self.shape.layout.dims[t]
    }

    /// The sparse layout of the last build.
    pub fn layout(&self) -> &SparseLayout {
        &self.shape.layout
    }

    /// Width of one sample's pooled embeddings (the model's input row).
    pub fn width(&self) -> usize {
        self.shape.width
    }

    /// Number of servers the plan splits ids over.
    pub fn servers(&self) -> usize {
        self.by_server.len()
    }

    /// Server `s`'s share of table `t`: positions in [`Plan::unique`]`(t)` and their wire-order keys, both in
    /// ascending key order (equal keys are equal ids).
    pub fn share(&self, s: usize, t: usize) -> (&[u32], &[u64]) {
        (&self.by_server[s][t], &self.keys[s][t])
    }

    /// Whether server `s` owns any id of this batch.
    pub fn has_work(&self, server: usize) -> bool {
        self.by_server[server].iter().any(|p| !p.is_empty())
    }

    /// Header counts and id payload of the pull for server `s` (tables with no ids are left out).
    pub fn pull_request(&self, server: usize) -> (Vec<TableCount>, Vec<u8>) {
        let (mut sections, mut scratch) = (IdSections::new(), Vec::new());
        for t in 0..self.unique.len() {
            self.put_table_ids(server, t, &mut sections, &mut scratch);
        }
        (sections.counts, sections.payload)
    }

    /// Appends table `t`'s count and id section for server `s`, if it has ids there.
    fn put_table_ids(
        &self,
        server: usize,
        t: usize,
        sections: &mut IdSections,
        scratch: &mut Vec<u64>,
    ) {
        let positions = &self.by_server[server][t];
        scratch.clear();
        scratch.extend(positions.iter().map(|&p| self.unique[t][p as usize]));
        sections.table(t as u32, self.dim(t) as u32, ID_CODING, scratch);
    }

    /// The distinct encodings of `list` over the tables, in first-seen order.
    fn encodings(&self, codecs: &TableCodecs, push: bool) -> Vec<Encoding> {
        let mut out = Vec::new();
        for t in 0..self.unique.len() {
            let e = if push {
                codecs.push_of(t)
            } else {
                codecs.pull_of(t)
            };
            if !out.contains(&e) {
                out.push(e);
            }
        }
        out
    }

    /// The pulls of this batch with per-table encodings: one request per (server, encoding) with ids. The
    /// plan remembers them: answer `i` goes to [`Plan::scatter_part_at`]`(i, ..)`.
    pub fn pull_requests(&mut self, codecs: &TableCodecs) -> Vec<PartRequest> {
        self.pull_parts.clear();
        let mut out = Vec::new();
        for encoding in self.encodings(codecs, false) {
            for server in 0..self.by_server.len() {
                let mut sections = IdSections::new();
                let mut scratch = std::mem::take(&mut self.ids_scratch);
                for t in 0..self.unique.len() {
                    if codecs.pull_of(t) == encoding {
                        self.put_table_ids(server, t, &mut sections, &mut scratch);
                    }
                }
                self.ids_scratch = scratch;
                let IdSections {
                    counts, payload, ..
                } = sections;
                if !counts.is_empty() {
                    self.pull_parts.push((server, encoding, counts.clone()));
                    out.push(PartRequest {
                        server,
                        encoding,
                        counts,
                        payload,
                    });
                }
            }
        }
        out
    }

    /// The server of request `i` of the last [`Plan::pull_requests`].
    pub fn part_server(&self, i: usize) -> usize {
        self.pull_parts.get(i).map_or(usize::MAX, |p| p.0)
    }

    /// Decodes every answer to the last [`Plan::pull_requests`] into `unique_rows[t]` (`[unique_t x dim]`)
    /// and, for pulls with state, each row's optimizer state into `unique_state[t]` (`[unique_t x
    /// state_len_t]`), both resized as needed. Every answer is checked against its request (tables, row
    /// counts, lengths, one state length per table) before anything is written; then the tables are decoded
    /// in parallel over the rayon pool (this runs on the training loop's critical path: 30 ms a step on one
    /// thread for DLRM-v2's 150k pulled rows with state). An error carries the index in `parts` of the
    /// answer it is about.
    pub fn scatter_replies(
        &self,
        parts: &[PartReply<'_>],
        unique_rows: &mut Vec<Vec<f32>>,
        unique_state: &mut Vec<Vec<f32>>,
    ) -> Result<(), (usize, ProtocolError)> {
        let mut answers = Vec::with_capacity(parts.len());
        for (k, part) in parts.iter().enumerate() {
            let Some((server, encoding, counts)) = self.pull_parts.get(part.request) else {
                let e = format!("no pull request {} in this batch", part.request);
                return Err((k, ProtocolError::BadPayload(e)));
            };
            answers.push(Answer {
                server: *server,
                encoding: *encoding,
                counts,
                rows: part.rows,
                state: part.state,
            });
        }
        self.scatter(&answers, unique_rows, unique_state)
    }

    /// Decodes the rows answering a [`Plan::pull_requests`] request (`server`, `encoding`, `counts` as sent)
    /// into `unique_rows[t]` (`[unique_t x dim]`, resized as needed).
    pub fn scatter_part(
        &self,
        server: usize,
        encoding: Encoding,
        counts: &[TableCount],
        rows: &[u8],
        unique_rows: &mut Vec<Vec<f32>>,
    ) -> Result<(), ProtocolError> {
        let answer = Answer {
            server,
            encoding,
            counts,
            rows,
            state: None,
        };
        self.scatter(&[answer], unique_rows, &mut Vec::new())
            .map_err(|(_, e)| e)
    }

    /// Checks `answers` and splits them by table, then decodes table by table over the rayon pool (see
    /// [`Plan::scatter_replies`]).
    fn scatter(
        &self,
        answers: &[Answer<'_>],
        unique_rows: &mut Vec<Vec<f32>>,
        unique_state: &mut Vec<Vec<f32>>,
    ) -> Result<(), (usize, ProtocolError)> {
        use rayon::prelude::*;
        let tables = self.unique.len();
        // `by_table[t]`: table t's sections of every answer; `state_len[t]`: its state's f32s per row.
        let mut by_table: Vec<Vec<Section<'_>>> = (0..tables).map(|_| Vec::new()).collect();
        let mut state_len: Vec<Option<usize>> = vec![None; tables];
        for (k, a) in answers.iter().enumerate() {
            self.split_answer(k, a, &mut by_table, &mut state_len)
                .map_err(|e| (k, e))?;
        }
        unique_rows.resize_with(tables, Vec::new);
        unique_state.resize_with(tables, Vec::new);
        for t in 0..tables {
            let n = self.unique[t].len();
            unique_rows[t].resize(n * self.dim(t), 0.0);
            if let Some(len) = state_len[t] {
                unique_state[t].resize(n * len, 0.0);
            }
        }
        unique_rows[..tables]
            .par_iter_mut()
            .zip(unique_state[..tables].par_iter_mut())
            .zip(by_table.par_iter())
            .enumerate()
            .try_for_each(|(t, ((rows, state), sections))| {
                let (dim, len) = (self.dim(t), state_len[t].unwrap_or(0));
                for s in sections {
                    let positions = &self.by_server[s.server][t];
                    codec::decode_rows_at(s.rows, dim, s.encoding, positions, rows)
                        .map_err(|e| (s.answer, e))?;
                    if !s.state.is_empty() {
                        get_state_at(s.state, len, positions, state).map_err(|e| (s.answer, e))?;
                    }
                }
                Ok(())
            })
    }

    /// Checks answer `k` against the plan (its tables exist and hold as many rows of this server as it
    /// answers, its rows and state have the lengths its counts give, a table's state length is the same in
    /// every answer) and appends its sections to `by_table`.
    fn split_answer<'a>(
        &self,
        k: usize,
        a: &Answer<'a>,
        by_table: &mut [Vec<Section<'a>>],
        state_len: &mut [Option<usize>],
    ) -> Result<(), ProtocolError> {
        let mut expected = 0;
        for c in a.counts {
            let t = c.table as usize;
            let n = self
                .by_server
                .get(a.server)
                .and_then(|s| s.get(t))
                .map_or(0, Vec::len);
            if t >= self.unique.len() || n != c.count as usize {
                return Err(ProtocolError::BadPayload(format!(
                    "pulled table {t} with {} rows, this batch has {n} there",
                    c.count
                )));
            }
            expected += n * a.encoding.row_bytes(self.dim(t));
        }
        crate::wire::layout::check_len("pulled rows", a.rows.len(), expected)?;
        let (state, lens) = a.state.unwrap_or((&[], &[]));
        if a.state.is_some() {
            let expected = crate::wire::layout::PayloadLayout::state_bytes(a.counts, lens)?;
            crate::wire::layout::check_len("pulled optimizer state", state.len(), expected)?;
        }
        let (mut at, mut state_at) = (0, 0);
        for (i, c) in a.counts.iter().enumerate() {
            let (t, n) = (c.table as usize, c.count as usize);
            let bytes = n * a.encoding.row_bytes(self.dim(t));
            let mut section = Section {
                answer: k,
                server: a.server,
                encoding: a.encoding,
                rows: &a.rows[at..at + bytes],
                state: &[],
            };
            at += bytes;
            if a.state.is_some() {
                let len = lens[i] as usize;
                match state_len[t] {
                    Some(l) if l != len => {
                        return Err(ProtocolError::BadPayload(format!(
                            "pulled optimizer state of table {t} with {len} f32s per row, another server \
                             sent {l}"
                        )))
                    }
                    _ => state_len[t] = Some(len),
                }
                section.state = &state[state_at..state_at + 4 * n * len];
                state_at += 4 * n * len;
            }
            by_table[t].push(section);
        }
        Ok(())
    }

    /// Decodes server `s`'s pulled rows into `unique_rows[t]` (`[unique_t x dim]`, resized as needed).
    pub fn scatter_pulled(
        &self,
        server: usize,
        rows: &[u8],
        encoding: Encoding,
        unique_rows: &mut Vec<Vec<f32>>,
    ) -> Result<(), ProtocolError> {
        let counts: Vec<TableCount> = (0..self.unique.len())
            .filter(|&t| !self.by_server[server][t].is_empty())
            .map(|t| TableCount {
                table: t as u32,
                count: self.by_server[server][t].len() as u32,
                dim: self.dim(t) as u32,
            })
            .collect();
        self.scatter_part(server, encoding, &counts, rows, unique_rows)
    }

    /// Pools per-unique rows into the model's input `[batch x width]` (feature `f` of sample `i` at
    /// `i * width + offset(f)`; with one-hot features of one dimension, `[batch x tables x dim]`).
    pub fn gather_embeddings(&self, unique_rows: &[Vec<f32>], out: &mut Vec<f32>) {
        use rayon::prelude::*;
        let (b, width) = (self.batch, self.shape.width);
        out.resize(b * width, 0.0);
        if width == 0 {
            return;
        }
        // Sample by sample, so the output is written in order; split over the rayon pool (this runs on the
        // training loop's critical path, between dense steps).
        const SAMPLES: usize = 256;
        out[..b * width]
            .par_chunks_mut(SAMPLES * width)
            .enumerate()
            .for_each(|(c, part)| gather_part(self, unique_rows, c * SAMPLES, part));
    }

    /// Spreads the model's embedding gradients `[batch x width]` over the bags and sums them per unique id
    /// into `out[t]` (`[unique_t x dim_t]`), multiplied by `scale`.
    pub fn reduce_gradients(&self, emb_grad: &[f32], scale: f32, out: &mut Vec<Vec<f32>>) {
        use rayon::prelude::*;
        let tables = self.unique.len();
        let (shape, width) = (&self.shape, self.shape.width);
        out.resize_with(tables, Vec::new);
        out.truncate(tables);
        // Tables are independent: split over the rayon pool (idle between dense steps; this runs on the
        // training loop's critical path). Each table's sum keeps its order, so the result does not depend
        // on the pool.
        let per_table = out[..tables].par_iter_mut().zip(self.unique.par_iter());
        per_table.enumerate().for_each(|(t, (acc, unique))| {
            let dim = shape.layout.dims[t];
            acc.clear();
            acc.resize(unique.len() * dim, 0.0);
            spread_table(self, emb_grad, width, t, scale, acc);
        });
    }

    /// Header counts and payload (ids, then encoded gradient rows) of the push for server `s`, every table in
    /// `encoding`, without error feedback.
    pub fn push_request(
        &self,
        server: usize,
        grads: &[Vec<f32>],
        encoding: Encoding,
    ) -> (Vec<TableCount>, Vec<u8>) {
        let tables: Vec<usize> = (0..self.unique.len()).collect();
        let mut scratch = PushScratch::default();
        self.push_tables(server, &tables, grads, encoding, 1.0, None, &mut scratch)
    }

    /// The pushes of this batch with per-table encodings: one request per (server, encoding) with ids.
    /// `grads[t]` are the summed gradients (multiplied by `scale`, which travels as the request's
    /// `grad_scale`). Lossy encodings go through `residuals` (error feedback) when given; this ends the
    /// residual store's step.
    pub fn push_requests(
        &self,
        codecs: &TableCodecs,
        grads: &[Vec<f32>],
        scale: f32,
        mut residuals: Option<&mut ResidualStore>,
        scratch: &mut PushScratch,
    ) -> Vec<PartRequest> {
        let mut out = Vec::new();
        for encoding in self.encodings(codecs, true) {
            let tables: Vec<usize> = (0..self.unique.len())
                .filter(|&t| codecs.push_of(t) == encoding)
                .collect();
            for server in 0..self.by_server.len() {
                let (counts, payload) = self.push_tables(
                    server,
                    &tables,
                    grads,
                    encoding,
                    scale,
                    residuals
                        .as_deref_mut()
                        .filter(|_| codecs.feedback_for(encoding)),
                    scratch,
                );
                if !counts.is_empty() {
                    out.push(PartRequest {
                        server,
                        encoding,
                        counts,
                        payload,
                    });
                }
            }
        }
        if let Some(r) = residuals {
            r.end_step();
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn push_tables(
        &self,
        server: usize,
        tables: &[usize],
        grads: &[Vec<f32>],
        encoding: Encoding,
        scale: f32,
        mut residuals: Option<&mut ResidualStore>,
        scratch: &mut PushScratch,
    ) -> (Vec<TableCount>, Vec<u8>) {
        let mut sections = IdSections::new();
        for &t in tables {
            self.put_table_ids(server, t, &mut sections, &mut scratch.ids);
        }
        let IdSections {
            counts,
            mut payload,
            ..
        } = sections;
        // The rows follow the id sections, table by table in header order (crate::wire::message::push).
        for c in &counts {
            let t = c.table as usize;
            let dim = self.dim(t);
            let positions = &self.by_server[server][t];
            scratch.rows.clear();
            scratch.ids.clear();
            for &p in positions {
                let p = p as usize;
                scratch
                    .rows
                    .extend_from_slice(&grads[t][p * dim..(p + 1) * dim]);
                scratch.ids.push(self.unique[t][p]);
            }
            match residuals.as_deref_mut() {
                Some(r) if r.dim() == dim => r.encode_rows(
                    t as u32,
                    &scratch.ids,
                    &scratch.rows,
                    scale,
                    encoding,
                    &mut payload,
                ),
                _ => codec::encode_rows(&scratch.rows, dim, encoding, &mut payload),
            }
        }
        (counts, payload)
    }
}

multiversion! {
    /// Pools samples `first..` of `plan`'s batch into `part` (whole samples of `[width]`): the body of
    /// [`Plan::gather_embeddings`], compiled for AVX-512 and AVX2 too (the workspace's baseline is SSE2, where
    /// these row moves ran one float at a time).
    fn gather_part(plan: &Plan, unique_rows: &[Vec<f32>], first: usize, part: &mut [f32]) {
        let shape = &plan.shape;
        // What each feature reads, looked up once per part rather than once per sample.
        let features: Vec<_> = shape
            .layout
            .features
            .iter()
            .enumerate()
            .map(|(f, feature)| {
                let t = feature.table;
                let at = shape.offset[f]..shape.offset[f] + shape.layout.dims[t];
                let inverse = &plan.inverse[t][plan.base[f]..];
                (at, &unique_rows[t][..], inverse, &plan.offsets[f][..], feature.mean)
            })
            .collect();
        for (k, sample) in part.chunks_exact_mut(shape.width).enumerate() {
            let i = first + k;
            for (at, rows, inverse, offsets, mean) in &features {
                let dst = &mut sample[at.clone()];
                bags::pool_into(dst, rows, inverse, bags::bag(offsets, i), *mean);
            }
        }
    }
}

multiversion! {
    /// Spreads the gradients of table `t`'s features (`emb_grad` `[batch x width]`) onto its unique ids in
    /// `acc` (zeroed, `[unique_t x dim_t]`), times `scale`: the body of [`Plan::reduce_gradients`], dispatched
    /// like [`gather_part`].
    fn spread_table(plan: &Plan, emb_grad: &[f32], width: usize, t: usize, scale: f32, acc: &mut [f32]) {
        let shape = &plan.shape;
        let dim = shape.layout.dims[t];
        for &f in &shape.of_table[t] {
            let mean = shape.layout.features[f].mean;
            let inverse = &plan.inverse[t][plan.base[f]..];
            for i in 0..plan.batch {
                let g = &emb_grad[i * width + shape.offset[f]..][..dim];
                bags::spread(acc, g, inverse, bags::bag(&plan.offsets[f], i), mean, scale);
            }
        }
    }
}

#[cfg(test)]
mod tests;
