//! Following a shard map that changes while the client runs (a live reshard, [`crate::wire::message::reshard`]).
//!
//! Pulls, pushes and prefetches name their server and carry the client's map epoch. A server refuses one
//! with `WrongEpoch` (it holds another map) or `WrongShard` (the ids were grouped by an older map); the
//! client then asks that server for its map ([`PsClient::refresh_map`]):
//! - a newer map is taken (connecting to servers it adds), and the request's ids are split by it
//!   ([`wire::message::reshard::split`]) and sent to their new servers; a pull's rows come back in the order the one
//!   server would have answered, so callers see one answer;
//! - an older map means the server has not switched yet (a reshard commits sources before destinations):
//!   the request is retried with backoff, like a transient failure, for up to `retry_for`.
//!
//! A refused request changed nothing on the server, so re-routing a push applies each row once.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::replicas::ShardReplicas;
use super::{PsClient, PulledState, ServerConn, INITIAL_BACKOFF, MAX_BACKOFF};
use crate::compression::codec::Encoding;
use crate::error::{ErrorCode, ProtocolError};
use crate::routing::ShardMap;
use crate::transport::{Connection, Dialer};
use crate::wire;
use crate::wire::layout::{PayloadLayout, TableCount};
use crate::wire::message::prefetch::LeaseStats;
use crate::wire::message::push::PushId;
use crate::wire::message::reshard::{MapInfo, SplitPart};
use crate::wire::message::{Request, Response};

/// How often one request may be split again (a map that changes while its parts are in flight).
const MAX_REROUTES: u32 = 4;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ProtocolError>> + Send + 'a>>;

/// How a server's map compares with the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// Newer: the client took it.
    Newer,
    /// The same epoch.
    Same,
    /// Older: the server has not switched yet.
    Older,
}

/// What to do after one attempt.
enum Next {
    /// Return the attempt's result.
    Done,
    /// Send the same request again.
    Retry,
    /// Split the request by the current map.
    Reroute,
}

/// What differs between the requests the client re-routes ([`PsClient::routed`]): how one is sent to one
/// server, whether rows follow its id sections, and how the answers of its split parts merge.
trait Reroute<D: Dialer>: Copy + Send + Sync + 'static {
    /// The answer of one server, and of the merged parts.
    type Answer: Send + Sync;

    /// Sends the request for `tables` and `payload` to `server` under map `epoch`.
    fn send<'a>(
        self,
        client: &'a PsClient<D>,
        server: usize,
        epoch: u64,
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> BoxFuture<'a, Self::Answer>;

    /// The encoding of the rows that follow the id sections (a push's gradients), which each part carries
    /// for its ids; `None` when only ids are sent.
    fn rows(self) -> Option<Encoding> {
        None
    }

    /// One answer from the parts' answers, laid out as one server would have answered `tables`.
    fn merge(
        self,
        tables: &[TableCount],
        parts: &[SplitPart],
        answers: Vec<Self::Answer>,
    ) -> Result<Self::Answer, ProtocolError>;
}

/// A pull in this encoding.
#[derive(Clone, Copy)]
struct PullOp(Encoding);

impl<D: Dialer> Reroute<D> for PullOp {
    type Answer = Bytes;

    fn send<'a>(
        self,
        client: &'a PsClient<D>,
        server: usize,
        epoch: u64,
        tables: Vec<TableCount>,
        ids: Bytes,
    ) -> BoxFuture<'a, Bytes> {
        Box::pin(client.pull_once(server, epoch, self.0, tables, ids))
    }

    fn merge(
        self,
        tables: &[TableCount],
        parts: &[SplitPart],
        answers: Vec<Bytes>,
    ) -> Result<Bytes, ProtocolError> {
        let mut out = vec![0u8; PayloadLayout::of(tables)?.pull_response_bytes(self.0)];
        for (p, rows) in parts.iter().zip(&answers) {
            p.scatter_rows(tables, self.0, rows, &mut out)?;
        }
        Ok(Bytes::from(out))
    }
}

/// A pull with optimizer state, rows in this encoding.
#[derive(Clone, Copy)]
struct PullWithStateOp(Encoding);

impl<D: Dialer> Reroute<D> for PullWithStateOp {
    type Answer = PulledState;

    fn send<'a>(
        self,
        client: &'a PsClient<D>,
        server: usize,
        epoch: u64,
        tables: Vec<TableCount>,
        ids: Bytes,
    ) -> BoxFuture<'a, PulledState> {
        Box::pin(client.pull_with_state_once(server, epoch, self.0, tables, ids))
    }

    fn merge(
        self,
        tables: &[TableCount],
        parts: &[SplitPart],
        answers: Vec<PulledState>,
    ) -> Result<PulledState, ProtocolError> {
        merge_with_state(tables, self.0, parts, &answers)
    }
}

/// A push of gradients in `encoding`, scaled by `grad_scale`, under one id for all its copies (retries and
/// the parts of a re-routed push: each server sees its part once).
#[derive(Clone, Copy)]
struct PushOp {
    encoding: Encoding,
    grad_scale: f32,
    lr_scale: f32,
    id: PushId,
}

impl<D: Dialer> Reroute<D> for PushOp {
    type Answer = (u64, u64);

    fn send<'a>(
        self,
        client: &'a PsClient<D>,
        server: usize,
        epoch: u64,
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> BoxFuture<'a, (u64, u64)> {
        Box::pin(client.push_once(
            server,
            epoch,
            (self.encoding, (self.grad_scale, self.lr_scale), self.id),
            tables,
            payload,
        ))
    }

    fn rows(self) -> Option<Encoding> {
        Some(self.encoding)
    }

    fn merge(
        self,
        _: &[TableCount],
        _: &[SplitPart],
        answers: Vec<(u64, u64)>,
    ) -> Result<(u64, u64), ProtocolError> {
        Ok(answers
            .into_iter()
            .fold((0, 0), |(a, r), (a2, r2)| (a + a2, r + r2)))
    }
}

/// A request of f32 rows answered by a count summed over servers: a write of rows' weights, or scores of ids
/// (one f32 each: rows of dim 1).
#[derive(Clone, Copy)]
enum F32RowsOp {
    /// `WriteRows`.
    WriteRows,
    /// `Score`, added or set.
    Score(embedding::ScoreMode),
}

impl<D: Dialer> Reroute<D> for F32RowsOp {
    type Answer = u64;

    fn send<'a>(
        self,
        client: &'a PsClient<D>,
        server: usize,
        epoch: u64,
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> BoxFuture<'a, u64> {
        match self {
            F32RowsOp::WriteRows => {
                Box::pin(client.write_rows_once(server, epoch, tables, payload))
            }
            F32RowsOp::Score(mode) => {
                Box::pin(client.score_once(server, epoch, mode, tables, payload))
            }
        }
    }

    fn rows(self) -> Option<Encoding> {
        Some(Encoding::F32)
    }

    fn merge(
        self,
        _: &[TableCount],
        _: &[SplitPart],
        answers: Vec<u64>,
    ) -> Result<u64, ProtocolError> {
        Ok(answers.into_iter().sum())
    }
}

/// A prefetch under `(owner, lease, release_below)`.
#[derive(Clone, Copy)]
struct PrefetchOp((u64, u64, u64));

impl<D: Dialer> Reroute<D> for PrefetchOp {
    type Answer = LeaseStats;

    fn send<'a>(
        self,
        client: &'a PsClient<D>,
        server: usize,
        epoch: u64,
        tables: Vec<TableCount>,
        ids: Bytes,
    ) -> BoxFuture<'a, LeaseStats> {
        Box::pin(client.prefetch_once(server, epoch, self.0, tables, ids))
    }

    fn merge(
        self,
        _: &[TableCount],
        _: &[SplitPart],
        answers: Vec<LeaseStats>,
    ) -> Result<LeaseStats, ProtocolError> {
        let mut sum = LeaseStats::default();
        for a in answers {
            sum += a;
        }
        Ok(sum)
    }
}

impl<D: Dialer> PsClient<D> {
    fn map_epoch(&self) -> u64 {
        self.shard_map.read().expect("not poisoned").epoch
    }

    /// Asks server `server` for its shard map; a newer one than the client's is taken (servers it adds are
    /// connected, servers it drops forgotten).
    pub(super) async fn refresh_map(&self, server: usize) -> Result<Seen, ProtocolError> {
        let (resp, _) = self
            .call(server, &Request::GetShardMap, Bytes::new())
            .await?;
        let Response::ShardMap { map: info } = resp else {
            return Err(self.unexpected(server, &resp, "ShardMap"));
        };
        self.take_map(&info).await
    }

    /// [`PsClient::refresh_map`] from `server`, or when it cannot answer (a server a reshard removed may be
    /// stopping), from the others in turn. A map newer than `epoch` followed meanwhile counts as newer.
    async fn refresh_from_any(&self, server: usize, epoch: u64) -> Result<Seen, ProtocolError> {
        let first = self.refresh_map(server).await;
        if self.map_epoch() > epoch {
            return Ok(Seen::Newer);
        }
        let err = match first {
            Ok(seen) => return Ok(seen),
            Err(e) => e,
        };
        for other in (0..self.num_servers()).filter(|&i| i != server) {
            if let Ok(seen) = self.refresh_map(other).await {
                return Ok(if self.map_epoch() > epoch {
                    Seen::Newer
                } else {
                    seen
                });
            }
        }
        Err(err)
    }

    /// Takes `info` if it is newer than the client's map.
    async fn take_map(&self, info: &MapInfo) -> Result<Seen, ProtocolError> {
        let _one = self.refresh.lock().await;
        let current = self.map_epoch();
        if info.epoch < current {
            return Ok(Seen::Older);
        }
        if info.epoch == current {
            return Ok(Seen::Same);
        }
        let map = info.map()?;
        let shards = self.shards_for(info, &map).await?;
        let dropped: Vec<Arc<ShardReplicas<D>>> = {
            let current = self.shards.read().expect("not poisoned");
            current
                .iter()
                .filter(|c| !shards.iter().any(|s| Arc::ptr_eq(c, s)))
                .cloned()
                .collect()
        };
        let old = self.num_servers();
        *self.shards.write().expect("not poisoned") = shards;
        *self.shard_map.write().expect("not poisoned") = map;
        // Servers the map dropped: close their connections (a leaving server drains until its clients go).
        for s in dropped {
            s.retired.store(true, Ordering::Release);
            for c in &s.conns {
                if let Some(conn) = c.conn.lock().expect("not poisoned").take() {
                    conn.close();
                }
            }
        }
        self.map_changes.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            from_epoch = current,
            epoch = info.epoch,
            servers_before = old,
            servers = info.num_servers,
            "followed a new shard map"
        );
        Ok(Seen::Newer)
    }

    /// The connections for `map`: a server at an index the client knows at the same address keeps its
    /// connection; others are dialed on first use.
    async fn shards_for(
        &self,
        info: &MapInfo,
        map: &ShardMap,
    ) -> Result<Vec<Arc<ShardReplicas<D>>>, ProtocolError> {
        let current = self.shards.read().expect("not poisoned").clone();
        if info.servers.is_empty() {
            // A map without addresses keeps the servers the client was given.
            if current.len() < map.num_servers as usize {
                return Err(ProtocolError::Connect {
                    server: "-".into(),
                    message: format!(
                        "shard map epoch {} has {} servers but lists no addresses, and the client knows {}",
                        info.epoch,
                        map.num_servers,
                        current.len()
                    ),
                });
            }
            return Ok(current[..map.num_servers as usize].to_vec());
        }
        let mut out = Vec::with_capacity(info.servers.len());
        for (i, name) in info.servers.iter().enumerate() {
            let addr = resolve(name).await?;
            match current.get(i) {
                Some(s) if !s.replicated() && s.conns[0].addr == addr => out.push(s.clone()),
                _ => {
                    let dial = self.dial.as_ref().ok_or_else(|| ProtocolError::Connect {
                        server: name.clone(),
                        message: format!(
                            "shard map epoch {} adds server {i} at {name}, and this client cannot dial new servers",
                            info.epoch
                        ),
                    })?;
                    out.push(Arc::new(ShardReplicas::new(vec![ServerConn {
                        addr,
                        dialer: dial(addr)?,
                        conn: Mutex::new(None),
                    }])));
                }
            }
        }
        Ok(out)
    }

    /// At connect time, server `i` reported a map epoch other than 1 (changed live): takes its map, owner
    /// table included, and when the map names other servers than the ones given, those servers. Returns
    /// whether the servers changed (the client is then connected through the map's list).
    pub(super) async fn follow_map_at_connect(&self, i: usize) -> Result<bool, ProtocolError> {
        let (resp, _) = self.call(i, &Request::GetShardMap, Bytes::new()).await?;
        let Response::ShardMap { map: info } = resp else {
            return Err(self.unexpected(i, &resp, "ShardMap"));
        };
        let map = info.map()?;
        if !info.servers.is_empty() {
            let mut named = Vec::new();
            for name in &info.servers {
                named.push(resolve(name).await?);
            }
            if named != self.cfg.servers {
                // Force the take: the client's own epoch is the placeholder of connect time.
                self.shard_map.write().expect("not poisoned").epoch = 0;
                self.take_map(&info).await?;
                return Ok(true);
            }
        }
        *self.shard_map.write().expect("not poisoned") = map;
        Ok(false)
    }

    /// Decides what follows an attempt sent to `server` under map `epoch`.
    async fn after<T>(
        &self,
        server: usize,
        epoch: u64,
        result: &Result<T, ProtocolError>,
        (start, backoff): (Instant, &mut Duration),
    ) -> Result<Next, ProtocolError> {
        let code = match result {
            Err(ProtocolError::NotInMap { .. }) => return Ok(Next::Reroute),
            Err(ProtocolError::Remote { code, .. })
                if matches!(code, ErrorCode::WrongEpoch | ErrorCode::WrongShard) =>
            {
                *code
            }
            _ => return Ok(Next::Done),
        };
        if self.map_epoch() > epoch || code == ErrorCode::WrongShard {
            // Another request already followed a newer map; or the server holds the request's epoch (it checks
            // the epoch first) and the ids were grouped by an older map than that: split them by the current
            // one, no need to ask.
            return Ok(Next::Reroute);
        }
        match self.refresh_from_any(server, epoch).await? {
            Seen::Newer => Ok(Next::Reroute),
            _ => {
                // The server has not switched to the client's map yet: wait for it.
                if start.elapsed() + *backoff > self.cfg.retry_for {
                    return Ok(Next::Done);
                }
                tokio::time::sleep(*backoff).await;
                *backoff = (*backoff * 2).min(MAX_BACKOFF);
                Ok(Next::Retry)
            }
        }
    }

    /// Sends one request to `server` (`attempt` builds it for a map epoch) until it is answered, retrying
    /// while the server has not switched to the client's map yet. `None` asks the caller to re-route (split by
    /// the current map); after [`MAX_REROUTES`] levels the result is returned as it is.
    async fn attempt<T, F, Fut>(
        &self,
        server: usize,
        depth: u32,
        mut attempt: F,
    ) -> Option<Result<T, ProtocolError>>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = Result<T, ProtocolError>>,
    {
        let (start, mut backoff) = (Instant::now(), INITIAL_BACKOFF);
        loop {
            let epoch = self.map_epoch();
            let result = attempt(epoch).await;
            match self
                .after(server, epoch, &result, (start, &mut backoff))
                .await
            {
                Err(e) => return Some(Err(e)),
                Ok(Next::Done) => return Some(result),
                Ok(Next::Retry) => continue,
                Ok(Next::Reroute) if depth < MAX_REROUTES => return None,
                Ok(Next::Reroute) => return Some(result),
            }
        }
    }

    /// Pulls rows from server `server`: `ids` holds one id section per table of `tables`, in order
    /// ([`wire::message::pull::IdSections`]). Returns the encoded rows, checked for length. Ids the server no longer
    /// owns (the map changed) are pulled from their new servers.
    pub async fn pull(
        &self,
        server: usize,
        encoding: Encoding,
        tables: Vec<TableCount>,
        ids: Bytes,
    ) -> Result<Bytes, ProtocolError> {
        self.routed(server, 0, PullOp(encoding), tables, ids).await
    }

    /// Pulls rows and their optimizer state from server `server` (see [`wire::message::pull_with_state`]). Returns the
    /// encoded rows, the state (f32 LE, `count x state_len` per table) and the state length of each table,
    /// checked for length. Re-routed like [`PsClient::pull`].
    pub async fn pull_with_state(
        &self,
        server: usize,
        encoding: Encoding,
        tables: Vec<TableCount>,
        ids: Bytes,
    ) -> Result<PulledState, ProtocolError> {
        self.routed(server, 0, PullWithStateOp(encoding), tables, ids)
            .await
    }

    /// Pushes gradients to server `server`: `payload` is the ids of every table then the encoded gradient rows
    /// of every table, each multiplied by `grad_scale` (the server divides it out). Returns (rows applied, rows
    /// rejected as non-finite). Rows of ids the server no longer owns go to their new servers.
    pub async fn push(
        &self,
        server: usize,
        encoding: Encoding,
        grad_scale: f32,
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> Result<(u64, u64), ProtocolError> {
        self.push_scaled(server, encoding, (grad_scale, 1.0), tables, payload)
            .await
    }

    /// [`PsClient::push`] at `lr_scale` times every table's learning rate (finite, >= 0; a learning-rate
    /// schedule reaching tables whose optimizer keeps state).
    pub async fn push_scaled(
        &self,
        server: usize,
        encoding: Encoding,
        (grad_scale, lr_scale): (f32, f32),
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> Result<(u64, u64), ProtocolError> {
        let op = PushOp {
            encoding,
            grad_scale,
            lr_scale,
            id: self.next_push_id(),
        };
        self.routed(server, 0, op, tables, payload).await
    }

    /// Sets the weights of rows on server `server`: `payload` is the ids of every table then every table's
    /// weights (f32 LE, `dim` per row; [`wire::message::write_rows`]). The rows' optimizer state is kept (a new
    /// row gets the initial state). Returns the rows written. Rows of ids the server no longer owns go to
    /// their new servers.
    pub async fn write_rows(
        &self,
        server: usize,
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> Result<u64, ProtocolError> {
        self.routed(server, 0, F32RowsOp::WriteRows, tables, payload)
            .await
    }

    /// Gives ids of tables that evict by score their scores on server `server`: `payload` is the ids of every
    /// table (`TableCount::dim` 1) then one f32 LE score per id ([`wire::message::score`]), added or set as
    /// `mode` says. Returns how many ids had a row there. Ids the server no longer owns go to their new servers.
    pub async fn score(
        &self,
        server: usize,
        mode: embedding::ScoreMode,
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> Result<u64, ProtocolError> {
        self.routed(server, 0, F32RowsOp::Score(mode), tables, payload)
            .await
    }

    /// Asks server `server` to bring the rows of `ids` (one id section per table of `tables`, as for
    /// [`PsClient::pull`]) into memory and pin them under lease `(owner, lease)`, after releasing `owner`'s
    /// leases numbered below `release_below` ([`wire::message::prefetch`]). Empty `tables` only release. Returns when
    /// the rows are in memory, with the server's counts (summed over the new servers when re-routed).
    pub async fn prefetch(
        &self,
        server: usize,
        owner: u64,
        lease: u64,
        release_below: u64,
        tables: Vec<TableCount>,
        ids: Bytes,
    ) -> Result<LeaseStats, ProtocolError> {
        let op = PrefetchOp((owner, lease, release_below));
        self.routed(server, 0, op, tables, ids).await
    }

    /// Sends `op` (its `tables` and `payload`) to `server` ([`PsClient::attempt`]); when it must be re-routed,
    /// splits it by the current map, sends each part to its server the same way (one level deeper) and merges
    /// the parts' answers into the one `server` would have given.
    fn routed<R: Reroute<D>>(
        &self,
        server: usize,
        depth: u32,
        op: R,
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> BoxFuture<'_, R::Answer> {
        Box::pin(async move {
            if let Some(done) = self
                .attempt(server, depth, |epoch| {
                    op.send(self, server, epoch, tables.clone(), payload.clone())
                })
                .await
            {
                return done;
            }
            let (mut parts, used) = self.split(&tables, &payload)?;
            if let Some(encoding) = op.rows() {
                let layout = PayloadLayout::of(&tables)?;
                wire::layout::check_len(
                    "re-routed push rows",
                    payload.len() - used,
                    layout.rows_bytes(encoding),
                )?;
                for p in &mut parts {
                    p.append_rows(&tables, encoding, &payload[used..]);
                }
            }
            let answers = futures_util::future::try_join_all(parts.iter().map(|p| {
                self.routed(
                    p.server as usize,
                    depth + 1,
                    op,
                    p.sections.counts.clone(),
                    Bytes::from(p.sections.payload.clone()),
                )
            }))
            .await?;
            op.merge(&tables, &parts, answers)
        })
    }

    fn split(
        &self,
        tables: &[TableCount],
        payload: &[u8],
    ) -> Result<(Vec<SplitPart>, usize), ProtocolError> {
        wire::message::reshard::split(tables, payload, &self.shard_map())
    }
}

/// One answer with state from the parts' answers, laid out as one server would have answered.
fn merge_with_state(
    tables: &[TableCount],
    encoding: Encoding,
    parts: &[SplitPart],
    answers: &[PulledState],
) -> Result<PulledState, ProtocolError> {
    let mut rows = vec![0u8; PayloadLayout::of(tables)?.pull_response_bytes(encoding)];
    let mut state_lens = vec![0u32; tables.len()];
    for (p, a) in parts.iter().zip(answers) {
        p.scatter_rows(tables, encoding, &a.rows, &mut rows)?;
        for ((t, _), &len) in p.origin.iter().zip(&a.state_lens) {
            state_lens[*t] = len;
        }
    }
    let state_bytes = PayloadLayout::state_bytes(tables, &state_lens)?;
    let mut state = vec![0u8; state_bytes];
    let mut offsets = Vec::with_capacity(tables.len());
    let mut at = 0;
    for (t, &len) in tables.iter().zip(&state_lens) {
        offsets.push(at);
        at += t.count as usize * len as usize * 4;
    }
    for (p, a) in parts.iter().zip(answers) {
        let mut from = 0;
        for ((t, positions), &len) in p.origin.iter().zip(&a.state_lens) {
            let width = len as usize * 4;
            for &i in positions {
                let src = a.state.get(from..from + width).ok_or_else(|| {
                    ProtocolError::BadPayload(format!(
                        "re-routed state reply from server {} is short",
                        p.server
                    ))
                })?;
                let to = offsets[*t] + i as usize * width;
                state[to..to + width].copy_from_slice(src);
                from += width;
            }
        }
    }
    Ok(PulledState {
        rows: Bytes::from(rows),
        state: Bytes::from(state),
        state_lens,
    })
}

/// Resolves a `host:port` of a shard map (servers of a resharded cluster have one replica).
async fn resolve(name: &str) -> Result<SocketAddr, ProtocolError> {
    let failed = |message: String| ProtocolError::Connect {
        server: name.to_owned(),
        message,
    };
    if name.contains('/') {
        return Err(failed(
            "a shard map lists replicas: resharding replicated shards is not supported".into(),
        ));
    }
    tokio::net::lookup_host(name)
        .await
        .map_err(|e| failed(format!("cannot resolve: {e}")))?
        .next()
        .ok_or_else(|| failed("resolves to no address".into()))
}
