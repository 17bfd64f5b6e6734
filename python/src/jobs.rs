//! Requests checked and copied out of Python's arrays ([`PullJob`], [`PushJob`]), ready to run on the
//! runtime: the GIL is not needed once they exist, and the caller may reuse its arrays at once.
//!
//! A failed request's error names the operation, the server's error (which names the server) and how long the
//! request really took, retries included: a dead server is reported with the wait it cost, not only with the
//! last attempt's timeout.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use numpy::{PyReadonlyArray1, PyReadonlyArray2};
use protocol::compression::codec::decode_rows;
use protocol::keyed::{pull_tables, push_tables, TableIds};
use protocol::wire::ids::IdCoding;
use protocol::wire::message::pull::IdSections;
use protocol::{Encoding, ProtocolError, PsClient};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tokio::task::JoinSet;

use crate::counters::Counters;
use crate::errors::RequestError;

/// The wire encoding named `s` (the `encoding=` argument of pulls and pushes).
pub(crate) fn parse_encoding(s: &str) -> PyResult<Encoding> {
    match s {
        "f32" => Ok(Encoding::F32),
        "f16" => Ok(Encoding::F16),
        "bf16" => Ok(Encoding::Bf16),
        "int8" => Ok(Encoding::Int8),
        other => Err(PyValueError::new_err(format!(
            "encoding = {other:?}: expected one of 'f32', 'f16', 'bf16', 'int8'"
        ))),
    }
}

/// An array's elements in logical order: one `memcpy` when it is contiguous (the usual case), else element by
/// element.
fn copy_out<T: Copy, D: numpy::ndarray::Dimension>(
    a: numpy::ndarray::ArrayView<'_, T, D>,
) -> Vec<T> {
    match a.as_slice() {
        Some(s) => s.to_vec(),
        None => a.iter().copied().collect(),
    }
}

/// The error of a request that failed after `start`: the operation, the cause, and the time it took.
fn failed(what: &str, e: ProtocolError, start: Instant) -> RequestError {
    let mut r = RequestError::new(what, e);
    r.message = format!(
        "{} (gave up after {:.1} s)",
        r.message,
        start.elapsed().as_secs_f64()
    );
    r
}

/// The error of a request still unanswered at the client's deadline: names the servers it went to.
fn timed_out(what: &str, client: &PsClient, secs: f64) -> RequestError {
    let servers: Vec<String> = (0..client.num_servers())
        .map(|i| client.addr(i).to_string())
        .collect();
    RequestError::timeout(&format!("{what} to servers {}", servers.join(", ")), secs)
}

/// Rows and optimizer state of several tables' unique ids, one request per server in parallel: `rows` is
/// every table's `ids x dim` one table after another, `state` every table's `ids x state_lens[t]`.
async fn pull_tables_with_state(
    client: &Arc<PsClient>,
    encoding: Encoding,
    parts: &[TableIds<'_>],
    state_lens: &[usize],
) -> Result<(Vec<f32>, Vec<f32>), ProtocolError> {
    let map = client.shard_map();
    let servers = map.num_servers as usize;
    // Per table, per server: positions of its ids, ascending by id (the wire's order for plain ids).
    let mut routed: Vec<Vec<Vec<u32>>> = Vec::with_capacity(parts.len());
    for p in parts {
        let mut by_server = Vec::new();
        map.group(p.ids, &mut by_server);
        for pos in &mut by_server {
            pos.sort_unstable_by_key(|&i| p.ids[i as usize]);
            if pos
                .windows(2)
                .any(|w| p.ids[w[0] as usize] == p.ids[w[1] as usize])
            {
                return Err(ProtocolError::BadPayload(format!(
                    "pull with state of table {}: ids must be distinct",
                    p.table
                )));
            }
        }
        routed.push(by_server);
    }
    let row_at: Vec<usize> = parts
        .iter()
        .scan(0, |at, p| {
            let here = *at;
            *at += p.ids.len() * p.dim;
            Some(here)
        })
        .collect();
    let state_at: Vec<usize> = parts
        .iter()
        .zip(state_lens)
        .scan(0, |at, (p, &l)| {
            let here = *at;
            *at += p.ids.len() * l;
            Some(here)
        })
        .collect();
    let mut rows = vec![0f32; parts.iter().map(|p| p.ids.len() * p.dim).sum()];
    let mut state = vec![
        0f32;
        parts
            .iter()
            .zip(state_lens)
            .map(|(p, l)| p.ids.len() * l)
            .sum()
    ];
    let mut set = JoinSet::new();
    // Servers index the inner level of `routed` (`routed[table][server]`), which the lint takes for the outer.
    #[allow(clippy::needless_range_loop)]
    for server in 0..servers {
        let mut sections = IdSections::new();
        let mut order = Vec::new();
        let mut ids = Vec::new();
        for (t, p) in parts.iter().enumerate() {
            let pos = &routed[t][server];
            if pos.is_empty() {
                continue;
            }
            ids.clear();
            ids.extend(pos.iter().map(|&i| p.ids[i as usize]));
            sections.table(p.table, p.dim as u32, IdCoding::Plain, &ids);
            order.push(t);
        }
        if order.is_empty() {
            continue;
        }
        let client = client.clone();
        set.spawn(async move {
            let got = client
                .pull_with_state(
                    server,
                    encoding,
                    sections.counts,
                    Bytes::from(sections.payload),
                )
                .await?;
            Ok::<_, ProtocolError>((server, order, got))
        });
    }
    while let Some(joined) = set.join_next().await {
        let (server, order, got) = joined.expect("pull task panicked")?;
        let (mut r_at, mut s_at) = (0, 0);
        for (k, &t) in order.iter().enumerate() {
            let (p, pos) = (&parts[t], &routed[t][server]);
            let want = state_lens[t];
            let have = got.state_lens.get(k).copied().unwrap_or(0) as usize;
            if have != want {
                return Err(ProtocolError::BadPayload(format!(
                    "table {}: the server holds {have} f32s of optimizer state per row, this client expects \
                     {want} (was the table registered with another optimizer?)",
                    p.table
                )));
            }
            let r_len = pos.len() * encoding.row_bytes(p.dim);
            let s_len = pos.len() * want * 4;
            let (rb, sb) = match (
                got.rows.get(r_at..r_at + r_len),
                got.state.get(s_at..s_at + s_len),
            ) {
                (Some(r), Some(s)) => (r, s),
                _ => {
                    return Err(ProtocolError::BadPayload(format!(
                        "pull with state reply of server {server} is short of table {}'s rows",
                        p.table
                    )))
                }
            };
            // Each row decoded straight into its place (no scratch buffer to zero and copy from).
            let row_bytes = encoding.row_bytes(p.dim);
            for (j, &i) in pos.iter().enumerate() {
                let (i, d) = (i as usize, p.dim);
                let o = row_at[t] + i * d;
                decode_rows(
                    &rb[j * row_bytes..(j + 1) * row_bytes],
                    d,
                    encoding,
                    &mut rows[o..o + d],
                )?;
                let o = state_at[t] + i * want;
                for (x, b) in state[o..o + want]
                    .iter_mut()
                    .zip(sb[j * want * 4..(j + 1) * want * 4].chunks_exact(4))
                {
                    *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            r_at += r_len;
            s_at += s_len;
        }
    }
    Ok((rows, state))
}

/// A pull, checked and copied out of Python's arrays, ready to run on the runtime.
pub(crate) struct PullJob {
    tables: Vec<(u32, usize)>,
    encoding: Encoding,
    /// Each table's ids (shared with the handle of a pull with state, which replays onto its rows).
    pub(crate) ids: Vec<Arc<Vec<u64>>>,
    what: String,
    /// With each table's f32s of optimizer state per row: a pull with state (ids distinct).
    pub(crate) state_lens: Option<Vec<usize>>,
}

impl PullJob {
    pub(crate) fn new(
        tables: Vec<(u32, usize)>,
        what: &str,
        encoding: &str,
        ids: &[PyReadonlyArray1<'_, u64>],
    ) -> PyResult<PullJob> {
        let encoding = parse_encoding(encoding)?;
        if ids.len() != tables.len() {
            return Err(PyValueError::new_err(format!(
                "{what}: {} id arrays for {} tables",
                ids.len(),
                tables.len()
            )));
        }
        let ids: Vec<Arc<Vec<u64>>> = ids
            .iter()
            .map(|a| Arc::new(copy_out(a.as_array())))
            .collect();
        let n: usize = ids.iter().map(|i| i.len()).sum();
        Ok(PullJob {
            tables,
            encoding,
            ids,
            what: format!("pull of {what} ({n} ids)"),
            state_lens: None,
        })
    }

    /// The table ids, in request order.
    pub(crate) fn table_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.tables.iter().map(|t| t.0)
    }

    pub(crate) fn shapes(&self) -> Vec<(usize, usize)> {
        self.ids
            .iter()
            .zip(&self.tables)
            .map(|(i, t)| (i.len(), t.1))
            .collect()
    }

    pub(crate) async fn run(
        self,
        client: &Arc<PsClient>,
        counters: &Counters,
        timeout: Duration,
    ) -> Result<(Vec<f32>, Vec<f32>), RequestError> {
        let start = Instant::now();
        let parts: Vec<TableIds<'_>> = self
            .tables
            .iter()
            .zip(&self.ids)
            .map(|(&(table, dim), ids)| TableIds {
                table,
                dim,
                ids: ids.as_slice(),
            })
            .collect();
        let encoding = self.encoding;
        let pulled = async {
            match &self.state_lens {
                Some(lens) => pull_tables_with_state(client, encoding, &parts, lens).await,
                None => {
                    let total: usize = parts.iter().map(|p| p.ids.len() * p.dim).sum();
                    let mut rows = vec![0f32; total];
                    pull_tables(client, encoding, &parts, &mut rows).await?;
                    Ok((rows, Vec::new()))
                }
            }
        };
        let r = match tokio::time::timeout(timeout, pulled).await {
            Ok(Ok(got)) => Ok(got),
            Ok(Err(e)) => Err(failed(&self.what, e, start)),
            Err(_) => Err(timed_out(&self.what, client, timeout.as_secs_f64())),
        };
        let n: usize = self.ids.iter().map(|i| i.len()).sum();
        counters.pull_calls.fetch_add(1, Ordering::Relaxed);
        counters.pull_rows.fetch_add(n as u64, Ordering::Relaxed);
        counters
            .pull_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

/// Refuses a push's learning-rate multiplier unless finite and >= 0, naming the push.
pub(crate) fn check_lr_scale(what: &str, lr_scale: f32) -> PyResult<()> {
    if lr_scale.is_finite() && lr_scale >= 0.0 {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "push of {what}: lr_scale {lr_scale}, expected a finite number >= 0"
    )))
}

/// A push, checked and copied out of Python's arrays, ready to run on the runtime.
pub(crate) struct PushJob {
    tables: Vec<(u32, usize)>,
    encoding: Encoding,
    /// Each table's distinct ids and gradients (`ids x dim`), shared with a [`crate::replay::ReplayLog`].
    pub(crate) ids: Vec<Arc<Vec<u64>>>,
    pub(crate) grads: Vec<Arc<Vec<f32>>>,
    what: String,
    /// Multiplies every table's learning rate for this push (a schedule on the optimizer handle).
    pub(crate) lr_scale: f32,
}

impl PushJob {
    pub(crate) fn new(
        tables: Vec<(u32, usize)>,
        what: &str,
        (encoding, lr_scale): (&str, f32),
        ids: &[PyReadonlyArray1<'_, u64>],
        grads: &[PyReadonlyArray2<'_, f32>],
    ) -> PyResult<PushJob> {
        let encoding = parse_encoding(encoding)?;
        check_lr_scale(what, lr_scale)?;
        if ids.len() != tables.len() || grads.len() != tables.len() {
            return Err(PyValueError::new_err(format!(
                "{what}: {} id arrays and {} gradient arrays for {} tables",
                ids.len(),
                grads.len(),
                tables.len()
            )));
        }
        let mut all_ids = Vec::with_capacity(ids.len());
        let mut all_grads = Vec::with_capacity(ids.len());
        for ((i, g), &(_, dim)) in ids.iter().zip(grads).zip(&tables) {
            let i: Vec<u64> = copy_out(i.as_array());
            let shape = g.as_array().shape().to_vec();
            if shape != [i.len(), dim] {
                return Err(PyValueError::new_err(format!(
                    "push of {what}: grads shape {shape:?} for {} ids of dim {dim}",
                    i.len()
                )));
            }
            all_grads.push(copy_out(g.as_array()));
            all_ids.push(i);
        }
        Ok(PushJob::from_parts(
            tables,
            what,
            (encoding, lr_scale),
            all_ids,
            all_grads,
        ))
    }

    /// The table ids, in request order.
    pub(crate) fn tables(&self) -> impl Iterator<Item = u32> + '_ {
        self.tables.iter().map(|t| t.0)
    }

    /// A push of `ids[i]` and `grads[i]` (`len x dim`) to `tables[i]`, checked by the caller.
    pub(crate) fn from_parts(
        tables: Vec<(u32, usize)>,
        what: &str,
        (encoding, lr_scale): (Encoding, f32),
        ids: Vec<Vec<u64>>,
        grads: Vec<Vec<f32>>,
    ) -> PushJob {
        let n: usize = ids.iter().map(Vec::len).sum();
        PushJob {
            tables,
            encoding,
            ids: ids.into_iter().map(Arc::new).collect(),
            grads: grads.into_iter().map(Arc::new).collect(),
            what: format!("push of {what} ({n} ids)"),
            lr_scale,
        }
    }

    pub(crate) async fn run(
        self,
        client: &Arc<PsClient>,
        counters: &Counters,
        timeout: Duration,
    ) -> Result<u64, RequestError> {
        let start = Instant::now();
        let parts: Vec<TableIds<'_>> = self
            .tables
            .iter()
            .zip(&self.ids)
            .map(|(&(table, dim), ids)| TableIds {
                table,
                dim,
                ids: ids.as_slice(),
            })
            .collect();
        let grads: Vec<&[f32]> = self.grads.iter().map(|g| g.as_slice()).collect();
        let r = tokio::time::timeout(
            timeout,
            push_tables(client, (self.encoding, self.lr_scale), &parts, &grads),
        )
        .await;
        let r = match r {
            Ok(Ok(applied)) => Ok(applied),
            Ok(Err(e)) => Err(failed(&self.what, e, start)),
            Err(_) => Err(timed_out(&self.what, client, timeout.as_secs_f64())),
        };
        let n: usize = self.ids.iter().map(|i| i.len()).sum();
        counters.push_calls.fetch_add(1, Ordering::Relaxed);
        counters.push_rows.fetch_add(n as u64, Ordering::Relaxed);
        counters
            .push_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}
