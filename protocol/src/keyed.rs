//! Keyed pulls and pushes of one table: a caller's ids in any order, duplicates allowed, become one request per
//! server (unique ids, ascending, [`IdCoding::Plain`]) and the replies come back in the caller's order.
//!
//! This is the client's view for callers that hold no batch plan of their own (the Python package; the
//! trainer and serving plan many tables at once with [`crate::plan::Plan`]). The planning half is sans-IO ([`KeyedPlan`]:
//! dedup, route, build payloads, scatter replies, sum duplicate gradients) and tested without sockets; the I/O
//! half ([`pull_rows`], [`push_rows`]) sends one request per server in parallel through a [`PsClient`].
//!
//! Bad input is refused before anything is sent: a row buffer of the wrong length, a non-finite gradient
//! (named by row and column), an empty dimension.

use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinSet;

use crate::compression::codec::{decode_rows_at, encode_rows, Encoding};
use crate::error::ProtocolError;
use crate::routing::ShardMap;
use crate::transport::Dialer;
use crate::wire::ids::IdCoding;
use crate::wire::message::pull::IdSections;
use crate::PsClient;

/// The plan of one keyed request: the unique ids of the caller's ids, where each caller position's row is,
/// and which unique ids each server owns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyedPlan {
    /// Distinct ids, ascending.
    unique: Vec<u64>,
    /// `inverse[i]`: position in `unique` of the caller's `ids[i]`.
    inverse: Vec<u32>,
    /// `by_server[s]`: positions in `unique` owned by server `s`, ascending (so their ids are ascending too).
    by_server: Vec<Vec<u32>>,
}

impl KeyedPlan {
    /// Plans `ids` over `map`'s servers.
    pub fn new(ids: &[u64], map: &ShardMap) -> KeyedPlan {
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_unstable_by_key(|&i| ids[i as usize]);
        let mut unique = Vec::with_capacity(ids.len());
        let mut inverse = vec![0u32; ids.len()];
        for &i in &order {
            let id = ids[i as usize];
            if unique.last() != Some(&id) {
                unique.push(id);
            }
            inverse[i as usize] = (unique.len() - 1) as u32;
        }
        let mut by_server = Vec::new();
        map.group(&unique, &mut by_server);
        KeyedPlan {
            unique,
            inverse,
            by_server,
        }
    }

    /// Distinct ids, ascending.
    pub fn unique(&self) -> &[u64] {
        &self.unique
    }

    /// Position in [`KeyedPlan::unique`] of each caller id.
    pub fn inverse(&self) -> &[u32] {
        &self.inverse
    }

    /// Decodes server `server`'s reply `rows` (its unique ids' rows in `encoding`) into `unique_rows`
    /// (`unique().len() x dim`).
    pub fn scatter_unique(
        &self,
        server: usize,
        rows: &[u8],
        encoding: Encoding,
        dim: usize,
        unique_rows: &mut [f32],
    ) -> Result<(), ProtocolError> {
        // Each row decoded straight into its place (no scratch buffer to zero and copy from).
        decode_rows_at(rows, dim, encoding, &self.by_server[server], unique_rows)
    }

    /// Copies the unique rows to every caller position: `out` is `ids.len() x dim`.
    pub fn expand(&self, unique_rows: &[f32], dim: usize, out: &mut [f32]) {
        for (o, &u) in out.chunks_exact_mut(dim).zip(&self.inverse) {
            let u = u as usize * dim;
            o.copy_from_slice(&unique_rows[u..u + dim]);
        }
    }

    /// The caller's rows (`ids.len() x dim`) per unique id (`unique().len() x dim`), the last row of a
    /// duplicated id winning (as a later assignment would).
    pub fn last_of_duplicates(&self, rows: &[f32], dim: usize) -> Vec<f32> {
        let mut out = vec![0f32; self.unique.len() * dim];
        for (r, &u) in rows.chunks_exact(dim).zip(&self.inverse) {
            let u = u as usize * dim;
            out[u..u + dim].copy_from_slice(r);
        }
        out
    }

    /// Sums the caller's gradient rows (`ids.len() x dim`) per unique id (`unique().len() x dim`).
    pub fn sum_duplicates(&self, grads: &[f32], dim: usize) -> Vec<f32> {
        let mut sums = vec![0f32; self.unique.len() * dim];
        for (g, &u) in grads.chunks_exact(dim).zip(&self.inverse) {
            let u = u as usize * dim;
            for (s, &x) in sums[u..u + dim].iter_mut().zip(g) {
                *s += x;
            }
        }
        sums
    }

    /// The push payload for server `server`: its id sections, then its unique ids' gradient rows (from
    /// `unique_grads`) in `encoding`.
    pub fn push_payload(
        &self,
        server: usize,
        sections: IdSections,
        unique_grads: &[f32],
        encoding: Encoding,
        dim: usize,
    ) -> IdSections {
        let mut sections = sections;
        let pos = &self.by_server[server];
        let mut rows = Vec::with_capacity(pos.len() * dim);
        for &p in pos {
            let p = p as usize * dim;
            rows.extend_from_slice(&unique_grads[p..p + dim]);
        }
        encode_rows(&rows, dim, encoding, &mut sections.payload);
        debug_assert!(crate::wire::message::push::check_rows(&sections, encoding).is_ok());
        sections
    }
}

/// Checks that a row buffer holds `n x dim` values.
fn check_rows_len(what: &str, len: usize, n: usize, dim: usize) -> Result<(), ProtocolError> {
    if dim == 0 {
        return Err(ProtocolError::BadPayload(format!(
            "{what}: dim = 0, expected at least 1"
        )));
    }
    if len != n * dim {
        return Err(ProtocolError::BadPayload(format!(
            "{what}: {len} values for {n} ids of dim {dim}, expected {}",
            n * dim
        )));
    }
    Ok(())
}

/// Refuses a gradient buffer holding a NaN or an infinity, naming its row and column.
pub fn check_finite(grads: &[f32], dim: usize) -> Result<(), ProtocolError> {
    match grads.iter().position(|g| !g.is_finite()) {
        None => Ok(()),
        Some(i) => Err(ProtocolError::BadPayload(format!(
            "gradient row {} column {} is {}: gradients must be finite",
            i / dim.max(1),
            i % dim.max(1),
            grads[i]
        ))),
    }
}

/// One table's part of a keyed request: its id, row dimension and the caller's ids (any order, duplicates
/// allowed).
#[derive(Debug, Clone, Copy)]
pub struct TableIds<'a> {
    /// Table id.
    pub table: u32,
    /// Row dimension.
    pub dim: usize,
    /// The caller's ids.
    pub ids: &'a [u64],
}

/// The id sections of server `server`'s request over every table of `parts` that has ids there, and which
/// tables (indices into `parts`) they are, in request order.
fn server_sections(
    plans: &[KeyedPlan],
    parts: &[TableIds<'_>],
    server: usize,
) -> (IdSections, Vec<usize>) {
    let mut sections = IdSections::new();
    let mut order = Vec::new();
    let mut ids = Vec::new();
    for (t, (plan, part)) in plans.iter().zip(parts).enumerate() {
        let pos = &plan.by_server[server];
        if pos.is_empty() {
            continue;
        }
        ids.clear();
        ids.extend(pos.iter().map(|&p| plan.unique[p as usize]));
        sections.table(part.table, part.dim as u32, IdCoding::Plain, &ids);
        order.push(t);
    }
    (sections, order)
}

/// Pulls the rows of several tables' ids in `encoding`, one request per server (all tables together) in
/// parallel, into `out`: table `t`'s rows (`ids.len() x dim`, row `i` for `ids[i]`) follow those of the tables
/// before it, so `out` holds `sum(ids.len() x dim)` values.
pub async fn pull_tables<D: Dialer>(
    client: &Arc<PsClient<D>>,
    encoding: Encoding,
    parts: &[TableIds<'_>],
    out: &mut [f32],
) -> Result<(), ProtocolError> {
    let total: usize = parts.iter().map(|p| p.ids.len() * p.dim).sum();
    if out.len() != total {
        return Err(ProtocolError::BadPayload(format!(
            "pull: an output of {} values for {total} values of rows",
            out.len()
        )));
    }
    for p in parts {
        check_rows_len("pull", p.ids.len() * p.dim, p.ids.len(), p.dim)?;
    }
    let map = client.shard_map();
    let plans: Vec<KeyedPlan> = parts.iter().map(|p| KeyedPlan::new(p.ids, &map)).collect();
    let mut set = JoinSet::new();
    for server in 0..map.num_servers as usize {
        let (sections, order) = server_sections(&plans, parts, server);
        if order.is_empty() {
            continue;
        }
        let client = client.clone();
        set.spawn(async move {
            let rows = client
                .pull(
                    server,
                    encoding,
                    sections.counts,
                    Bytes::from(sections.payload),
                )
                .await?;
            Ok::<_, ProtocolError>((server, order, rows))
        });
    }
    let mut unique_rows: Vec<Vec<f32>> = plans
        .iter()
        .zip(parts)
        .map(|(plan, p)| vec![0f32; plan.unique().len() * p.dim])
        .collect();
    while let Some(joined) = set.join_next().await {
        let (server, order, rows) = joined.expect("pull task panicked")?;
        let mut at = 0;
        for t in order {
            let (plan, dim) = (&plans[t], parts[t].dim);
            let len = plan.by_server[server].len() * encoding.row_bytes(dim);
            let bytes = rows.get(at..at + len).ok_or_else(|| {
                ProtocolError::BadPayload(format!(
                    "pull reply of {} bytes is short of table {}'s rows",
                    rows.len(),
                    parts[t].table
                ))
            })?;
            plan.scatter_unique(server, bytes, encoding, dim, &mut unique_rows[t])?;
            at += len;
        }
    }
    let mut rest = out;
    for ((plan, p), u) in plans.iter().zip(parts).zip(&unique_rows) {
        let (mine, tail) = rest.split_at_mut(p.ids.len() * p.dim);
        plan.expand(u, p.dim, mine);
        rest = tail;
    }
    Ok(())
}

/// Pushes several tables' gradient rows (`grads[t]` is `parts[t].ids.len() x dim`; rows of a repeated id are
/// summed) in `encoding`, one request per server (all tables together) in parallel, applied at `lr_scale`
/// times each table's learning rate (1: the registered rate). Returns the rows the servers applied.
pub async fn push_tables<D: Dialer>(
    client: &Arc<PsClient<D>>,
    (encoding, lr_scale): (Encoding, f32),
    parts: &[TableIds<'_>],
    grads: &[&[f32]],
) -> Result<u64, ProtocolError> {
    if grads.len() != parts.len() {
        return Err(ProtocolError::BadPayload(format!(
            "{} gradient buffers for {} tables",
            grads.len(),
            parts.len()
        )));
    }
    for (p, g) in parts.iter().zip(grads) {
        check_rows_len("push", g.len(), p.ids.len(), p.dim)?;
        check_finite(g, p.dim)?;
    }
    crate::wire::message::push::check_lr_scale(lr_scale)?;
    let map = client.shard_map();
    let plans: Vec<KeyedPlan> = parts.iter().map(|p| KeyedPlan::new(p.ids, &map)).collect();
    let mut sums: Vec<Vec<f32>> = plans
        .iter()
        .zip(parts.iter().zip(grads))
        .map(|(plan, (p, g))| plan.sum_duplicates(g, p.dim))
        .collect();
    let scale = f16_scale(encoding, &sums);
    if scale != 1.0 {
        for x in sums.iter_mut().flatten() {
            *x *= scale;
        }
    }
    let mut set = JoinSet::new();
    for server in 0..map.num_servers as usize {
        let (mut sections, order) = server_sections(&plans, parts, server);
        if order.is_empty() {
            continue;
        }
        for &t in &order {
            sections = plans[t].push_payload(server, sections, &sums[t], encoding, parts[t].dim);
        }
        let client = client.clone();
        set.spawn(async move {
            client
                .push_scaled(
                    server,
                    encoding,
                    (scale, lr_scale),
                    sections.counts,
                    Bytes::from(sections.payload),
                )
                .await
        });
    }
    let mut applied = 0;
    while let Some(joined) = set.join_next().await {
        let (rows, rejected) = joined.expect("push task panicked")?;
        if rejected > 0 {
            return Err(ProtocolError::BadPayload(format!(
                "a server rejected {rejected} non-finite gradient rows"
            )));
        }
        applied += rows;
    }
    Ok(applied)
}

/// Sets the weights of the rows of several tables (`weights[i]` is `parts[i].ids.len() x dim`, finite; a
/// duplicated id takes its last row), their optimizer state kept ([`crate::wire::message::write_rows`]): one
/// request per server. Returns the rows written.
pub async fn write_tables<D: Dialer>(
    client: &Arc<PsClient<D>>,
    parts: &[TableIds<'_>],
    weights: &[&[f32]],
) -> Result<u64, ProtocolError> {
    if weights.len() != parts.len() {
        return Err(ProtocolError::BadPayload(format!(
            "{} weight buffers for {} tables",
            weights.len(),
            parts.len()
        )));
    }
    for (p, w) in parts.iter().zip(weights) {
        check_rows_len("write", w.len(), p.ids.len(), p.dim)?;
        if let Some(i) = w.iter().position(|x| !x.is_finite()) {
            return Err(ProtocolError::BadPayload(format!(
                "table {}: weight row {} column {} is {}: weights must be finite",
                p.table,
                i / p.dim.max(1),
                i % p.dim.max(1),
                w[i]
            )));
        }
    }
    let map = client.shard_map();
    let plans: Vec<KeyedPlan> = parts.iter().map(|p| KeyedPlan::new(p.ids, &map)).collect();
    let rows: Vec<Vec<f32>> = plans
        .iter()
        .zip(parts.iter().zip(weights))
        .map(|(plan, (p, w))| plan.last_of_duplicates(w, p.dim))
        .collect();
    let mut set = JoinSet::new();
    for server in 0..map.num_servers as usize {
        let (mut sections, order) = server_sections(&plans, parts, server);
        if order.is_empty() {
            continue;
        }
        for &t in &order {
            sections =
                plans[t].push_payload(server, sections, &rows[t], Encoding::F32, parts[t].dim);
        }
        let client = client.clone();
        set.spawn(async move {
            client
                .write_rows(server, sections.counts, Bytes::from(sections.payload))
                .await
        });
    }
    let mut written = 0;
    while let Some(joined) = set.join_next().await {
        written += joined.expect("write task panicked")?;
    }
    Ok(written)
}

/// Gives the ids of tables that evict by score ([`embedding::EvictionPolicy::Score`]) their scores:
/// `scores[i]` holds one score per id of `parts[i]` (finite and `>= 0`; `parts[i].dim` is ignored), added to
/// the rows' or replacing them (`mode`; a duplicated id adds its scores, or takes its last), one request per
/// server for every table ([`crate::wire::message::score`]). Returns how many distinct ids had a row (the
/// others are not scored). Bad scores are refused naming table, id and position before anything is sent.
pub async fn score_tables<D: Dialer>(
    client: &Arc<PsClient<D>>,
    parts: &[TableIds<'_>],
    scores: &[&[f32]],
    mode: embedding::ScoreMode,
) -> Result<u64, ProtocolError> {
    if scores.len() != parts.len() {
        return Err(ProtocolError::BadPayload(format!(
            "{} score buffers for {} tables",
            scores.len(),
            parts.len()
        )));
    }
    for (p, s) in parts.iter().zip(scores) {
        check_rows_len("score", s.len(), p.ids.len(), 1)?;
        if let Some(i) = s.iter().position(|s| !(s.is_finite() && *s >= 0.0)) {
            return Err(ProtocolError::BadPayload(format!(
                "table {}: score {} of id {} (position {i}) is not a finite value >= 0",
                p.table, s[i], p.ids[i]
            )));
        }
    }
    let parts: Vec<TableIds<'_>> = parts.iter().map(|p| TableIds { dim: 1, ..*p }).collect();
    let map = client.shard_map();
    let plans: Vec<KeyedPlan> = parts.iter().map(|p| KeyedPlan::new(p.ids, &map)).collect();
    let unique: Vec<Vec<f32>> = plans
        .iter()
        .zip(scores)
        .map(|(plan, s)| match mode {
            embedding::ScoreMode::Add => plan.sum_duplicates(s, 1),
            embedding::ScoreMode::Set => plan.last_of_duplicates(s, 1),
        })
        .collect();
    let mut set = JoinSet::new();
    for server in 0..map.num_servers as usize {
        let (mut sections, order) = server_sections(&plans, &parts, server);
        if order.is_empty() {
            continue;
        }
        for &t in &order {
            sections = plans[t].push_payload(server, sections, &unique[t], Encoding::F32, 1);
        }
        let client = client.clone();
        set.spawn(async move {
            client
                .score(server, mode, sections.counts, Bytes::from(sections.payload))
                .await
        });
    }
    let mut scored = 0;
    while let Some(joined) = set.join_next().await {
        scored += joined.expect("score task panicked")?;
    }
    Ok(scored)
}

/// [`score_tables`] of one table.
pub async fn score_ids<D: Dialer>(
    client: &Arc<PsClient<D>>,
    table: u32,
    ids: &[u64],
    scores: &[f32],
    mode: embedding::ScoreMode,
) -> Result<u64, ProtocolError> {
    score_tables(client, &[TableIds { table, dim: 1, ids }], &[scores], mode).await
}

/// The gradient scale of an f16 push: gradients of a mean loss are often below f16's normal range (6.1e-5)
/// and would lose their bits or flush to zero, so they travel multiplied by the power of two that brings the
/// largest to about 2^14 (the server divides it out; a power of two changes no f32 bit). 1 for the other
/// encodings (bf16 has f32's range; int8 scales each row).
pub fn f16_scale(encoding: Encoding, grads: &[Vec<f32>]) -> f32 {
    if encoding != Encoding::F16 {
        return 1.0;
    }
    let max = grads.iter().flatten().fold(0f32, |m, &g| m.max(g.abs()));
    if max == 0.0 || !max.is_finite() {
        return 1.0;
    }
    let exp = (14 - max.log2().ceil() as i32).clamp(-100, 100);
    2f32.powi(exp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plan_dedups_and_routes_every_unique_id_once() {
        let map = ShardMap::new(3);
        let ids = [9u64, 3, 9, 7, 3, 1 << 40];
        let plan = KeyedPlan::new(&ids, &map);
        assert_eq!(plan.unique(), &[3, 7, 9, 1 << 40]);
        for (i, &u) in plan.inverse().iter().enumerate() {
            assert_eq!(plan.unique()[u as usize], ids[i]);
        }
        let parts = [TableIds {
            table: 5,
            dim: 2,
            ids: &ids,
        }];
        let plans = [plan];
        let plan = &plans[0];
        let mut seen: Vec<u64> = (0..3)
            .flat_map(|s| {
                let (sec, order) = server_sections(&plans, &parts, s);
                assert!(sec.counts.iter().all(|c| c.table == 5));
                assert_eq!(order.is_empty(), plan.by_server[s].is_empty());
                plan.by_server[s]
                    .iter()
                    .map(|&p| plan.unique[p as usize])
                    .collect::<Vec<_>>()
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, plan.unique());
    }

    #[test]
    fn f16_pushes_are_scaled_into_range_by_a_power_of_two() {
        let g = vec![vec![3e-7f32, -1e-6], vec![2e-6]];
        let s = f16_scale(Encoding::F16, &g);
        assert_eq!(s.log2().fract(), 0.0);
        let top = 2e-6 * s;
        assert!((8192.0..=16384.0).contains(&top), "{top}");
        assert_eq!(f16_scale(Encoding::F32, &g), 1.0);
        assert_eq!(f16_scale(Encoding::F16, &[vec![0.0]]), 1.0);
    }

    #[test]
    fn bad_lengths_and_gradients_are_named() {
        let e = check_rows_len("push", 5, 2, 2).unwrap_err().to_string();
        assert!(e.contains("5 values for 2 ids of dim 2"), "{e}");
        let e = check_finite(&[0.0, 1.0, 2.0, f32::NAN], 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 1 column 1 is NaN"), "{e}");
        assert!(check_rows_len("pull", 0, 0, 0).is_err());
    }

    proptest! {
        /// Against a plain model: scatter + expand gives each caller position its id's row, and the pushed
        /// sums equal a HashMap's per-id sums.
        #[test]
        fn plan_matches_a_hashmap_model(ids in proptest::collection::vec(0u64..20, 0..40), servers in 1u32..4) {
            let dim = 2;
            let map = ShardMap::new(servers);
            let plan = KeyedPlan::new(&ids, &map);
            let row_of = |id: u64| [id as f32, -(id as f32)];
            let mut unique_rows = vec![0f32; plan.unique().len() * dim];
            for s in (0..servers as usize).filter(|&s| !plan.by_server[s].is_empty()) {
                let mut bytes = Vec::new();
                let rows: Vec<f32> = plan.by_server[s].iter().flat_map(|&p| row_of(plan.unique[p as usize])).collect();
                encode_rows(&rows, dim, Encoding::F32, &mut bytes);
                plan.scatter_unique(s, &bytes, Encoding::F32, dim, &mut unique_rows).unwrap();
            }
            let mut out = vec![0f32; ids.len() * dim];
            plan.expand(&unique_rows, dim, &mut out);
            for (i, &id) in ids.iter().enumerate() {
                prop_assert_eq!(&out[i * dim..i * dim + dim], &row_of(id)[..]);
            }
            let grads: Vec<f32> = (0..ids.len() * dim).map(|x| x as f32).collect();
            let sums = plan.sum_duplicates(&grads, dim);
            let mut model = std::collections::HashMap::<u64, [f32; 2]>::new();
            for (i, &id) in ids.iter().enumerate() {
                let e = model.entry(id).or_default();
                e[0] += grads[i * dim];
                e[1] += grads[i * dim + 1];
            }
            prop_assert_eq!(model.len(), plan.unique().len());
            for (u, id) in plan.unique().iter().enumerate() {
                prop_assert_eq!(&sums[u * dim..u * dim + dim], &model[id][..]);
            }
        }
    }
}
