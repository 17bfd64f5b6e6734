//! Request handling without sockets or clock: a decoded request, its payload and the time in, a response and
//! its payload out.
//!
//! The QUIC loop ([`crate::server`]) only reads a frame and the clock, calls [`Shard::handle`] and writes the
//! reply, so every rule here (epoch, shard ownership, table and dimension checks, payload lengths, TTL stamps)
//! is tested without a network and at fixed times. The shard's state and its storage operations are in
//! [`crate::shard`]; this module adds only the handling of requests to it.
//! A push is validated whole before any row is applied: a bad table or dimension anywhere in it leaves every
//! table untouched.

use protocol::compression::codec;
use protocol::wire::message::push::{PushAnswer, PushId};
use protocol::wire::{self, layout::PayloadLayout};
use protocol::{
    Encoding, ErrorCode, Request, Response, ShardMap, TableConfig, TableCount, PROTOCOL_VERSION,
};

use crate::config::Durability;
use crate::metrics as m;
use crate::reply::{refuse, Refusal, Reply};
use crate::shard::push_window::Admission;
use crate::shard::Shard;

/// Counts a pull's rows (with or without state) on a table with a memory budget by where they came from ([`m::TIER_ROWS_TOTAL`]).
fn record_tier(stats: &embedding::GatherStats) {
    for (outcome, n) in [
        ("hit", stats.rows_resident),
        ("miss", stats.rows_read_back),
        ("late", stats.rows_waited),
    ] {
        if n > 0 {
            metrics::counter!(m::TIER_ROWS_TOTAL, "outcome" => outcome).increment(n as u64);
        }
    }
}

/// The typed refusal of a request the connection's role may not send, counted in
/// [`m::REQUESTS_FORBIDDEN_TOTAL`] by role and kind.
pub fn authorize(access: &protocol::Access, req: &Request) -> Result<(), Refusal> {
    access.authorize_request(req).map_err(|forbidden| {
        metrics::counter!(
            m::REQUESTS_FORBIDDEN_TOTAL,
            "role" => access.label(),
            "kind" => req.kind().label()
        )
        .increment(1);
        tracing::warn!(
            role = access.label(),
            request = req.kind().name(),
            "forbidden request"
        );
        refuse(ErrorCode::Forbidden, forbidden.message)
    })
}

impl Shard {
    /// [`Shard::handle_us`] for a connection with `access`: a request its role may not send is answered
    /// `Forbidden` ([`authorize`]) and changes nothing.
    pub fn handle_as(
        &self,
        access: &protocol::Access,
        req: Request,
        payload: &[u8],
        now_us: u64,
    ) -> Reply {
        match authorize(access, &req) {
            Ok(()) => match req {
                Request::RegisterTables { tables } => self.register_as(access, &tables),
                req => self.handle_us(req, payload, now_us),
            },
            Err(refusal) => refusal.into_reply(),
        }
    }

    /// Handles one request at Unix time `now` (seconds): [`Shard::handle_us`] at the start of that second.
    pub fn handle(&self, req: Request, payload: &[u8], now: u64) -> Reply {
        self.handle_us(req, payload, now.saturating_mul(1_000_000))
    }

    /// Handles one request at Unix time `now_us` (microseconds): pushed rows are stamped with its second for
    /// TTL expiry and recorded as changed at it for the delta sync, and a checkpoint's manifest records it.
    /// A sync request is answered at once (the server loop waits for cuts: [`Shard::sync_deltas`]). Never
    /// panics on peer input: every problem becomes a [`Response::Error`].
    pub fn handle_us(&self, req: Request, payload: &[u8], now_us: u64) -> Reply {
        // A push's pending acknowledgement is not waited for here: dropped, its answer stands as it is.
        self.handle_replicated(req, payload, now_us).0
    }

    /// [`Shard::handle_us`], and for a push on a primary with `replicated` durability, what its reply must
    /// wait for: its rows stored by every in-sync backup ([`PendingAck::settle`]). `Join` needs the shard's
    /// `Arc` and is answered by the server loop ([`Shard::join`]).
    pub fn handle_replicated(
        &self,
        req: Request,
        payload: &[u8],
        now_us: u64,
    ) -> (Reply, Option<PendingAck>) {
        let now = now_us / 1_000_000;
        let mut wait = None;
        let result = match req {
            Request::Hello { version } => self.hello(version),
            // Without a connection's role: a trainer's limits ([`Shard::register_as`] for others).
            Request::RegisterTables { tables } => self.register(&tables, false),
            Request::Pull {
                epoch,
                encoding,
                tables,
            } => self.pull(epoch, encoding, &tables, payload, false),
            Request::Push {
                epoch,
                encoding,
                grad_scale,
                tables,
                id,
                lr_scale,
            } => self
                .push_once(
                    id,
                    (epoch, encoding, (grad_scale, lr_scale)),
                    &tables,
                    payload,
                    now_us,
                )
                .map(|(reply, w)| {
                    wait = w.map(|wait| PendingAck {
                        wait: Some(wait),
                        id,
                        answer: reply.header.clone(),
                        window: self.pushes.clone(),
                    });
                    reply
                }),
            Request::WriteRows { epoch, tables } => self
                .write_rows(epoch, &tables, payload, now_us)
                .map(|(reply, w)| {
                    wait = w.map(|wait| PendingAck {
                        wait: Some(wait),
                        id: PushId::NONE,
                        answer: reply.header.clone(),
                        window: self.pushes.clone(),
                    });
                    reply
                }),
            Request::Score {
                epoch,
                mode,
                tables,
            } => self.score(epoch, mode, &tables, payload),
            Request::Flush => self.flush(),
            Request::Checkpoint {
                dir,
                step,
                tensors,
                prune,
            } => self.checkpoint_request(&dir, step, tensors, prune, now_us),
            Request::PullWithState {
                epoch,
                encoding,
                tables,
            } => self.pull(epoch, encoding, &tables, payload, true),
            Request::Prefetch {
                epoch,
                owner,
                lease,
                release_below,
                tables,
            } => self.prefetch(epoch, (owner, lease, release_below), &tables, payload, now),
            // A reduce waits for the other trainers: the server loop answers it ([`crate::server`]).
            Request::Reduce { .. } => Err(refuse(
                ErrorCode::Internal,
                "a reduce is answered by the server loop, not by Shard::handle",
            )),
            Request::SyncDeltas {
                cursor,
                encoding,
                max_rows,
                wait_ms: _,
                dense_version,
            } => {
                let ask = SyncAsk {
                    cursor,
                    encoding,
                    max_rows,
                    dense_version,
                };
                self.sync_deltas(ask, false).map(|o| match o {
                    SyncOutcome::Reply(r) => r,
                    SyncOutcome::UpToDate => unreachable!("may_wait is false"),
                })
            }
            Request::PublishDense {
                job,
                version,
                step,
                len,
            } => self
                .replica
                .require_primary("publish dense")
                .and_then(|()| self.publish_dense((job, version), step, len, payload, now_us)),
            Request::Replicate { header } => self.replicate(&header, payload, now),
            Request::Promote { shard_epoch, force } => self.promote(shard_epoch, force),
            Request::Join { .. } | Request::Reshard { .. } => Err(refuse(
                ErrorCode::Internal,
                "joins and reshard steps are answered by the server loop, not by Shard::handle",
            )),
            Request::GetShardMap => self.shard_map_info(),
            Request::MoveRows { header } => self.move_rows(&header, payload, now_us),
        };
        (result.unwrap_or_else(Refusal::into_reply), wait)
    }

    fn hello(&self, version: u32) -> Result<Reply, Refusal> {
        if version != PROTOCOL_VERSION {
            return Err(refuse(
                ErrorCode::UnsupportedVersion,
                format!("protocol version {version}, this server speaks {PROTOCOL_VERSION}"),
            ));
        }
        let map = self.routing.map();
        Ok(Reply {
            header: Response::Hello {
                shard_index: self.shard_index,
                num_shards: map.num_servers,
                epoch: map.epoch,
                routing: map.routing_fingerprint(),
                tables: self.engine.registered_tables(),
                replica: self.replica.info(),
            },
            payload: Vec::new(),
        })
    }

    /// Registers `tables` for a connection with `access`: within the shard's registration limits, except that an admin
    /// certificate may pass `max-tables` and `max-table-dim`. Registers a table per column family, which
    /// touches the disk: the server loop calls it off the async workers.
    pub fn register_as(&self, access: &protocol::Access, tables: &[TableConfig]) -> Reply {
        let admin = *access == protocol::Access::Role(protocol::Role::Admin);
        self.register(tables, admin)
            .unwrap_or_else(Refusal::into_reply)
    }

    /// Refuses the whole request, before anything is registered, if it passes a registration limit (counted
    /// by reason); `admin` passes the table count and dimension limits.
    fn check_registration(&self, tables: &[TableConfig], admin: bool) -> Result<(), Refusal> {
        let limits = &self.registration;
        let refused = |reason: &'static str, message: String| {
            metrics::counter!(m::TABLE_REGISTRATIONS_REFUSED_TOTAL, "reason" => reason)
                .increment(1);
            tracing::warn!(reason, %message, "table registration refused");
            Err(refuse(ErrorCode::BadRequest, message))
        };
        if tables.len() > limits.max_tables_per_request {
            return refused(
                "per_request",
                format!(
                    "a registration of {} tables, this server takes at most {} per request \
                     (max-tables-per-request): register them in several requests",
                    tables.len(),
                    limits.max_tables_per_request
                ),
            );
        }
        if admin {
            return Ok(());
        }
        if let Some(t) = tables.iter().find(|t| t.dim > limits.max_table_dim) {
            return refused(
                "dim",
                format!(
                    "table {} ({:?}): dim {}, this server takes at most {} from a trainer \
                     (max-table-dim); an admin certificate may register up to {}",
                    t.id,
                    t.name,
                    t.dim,
                    limits.max_table_dim,
                    embedding::MAX_DIM
                ),
            );
        }
        let mut new: Vec<u32> = tables
            .iter()
            .map(|t| t.id)
            .filter(|&id| !self.engine.has_table(id))
            .collect();
        new.sort_unstable();
        new.dedup();
        let held = self.engine.table_count();
        if held + new.len() > limits.max_tables {
            return refused(
                "tables",
                format!(
                    "{} new tables on top of the {held} this server holds would pass its limit of {} \
                     (max-tables); an admin certificate may register more",
                    new.len(),
                    limits.max_tables
                ),
            );
        }
        Ok(())
    }

    fn register(&self, tables: &[TableConfig], admin: bool) -> Result<Reply, Refusal> {
        self.replica.require_primary("register tables")?;
        self.check_registration(tables, admin)?;
        // Each config is checked as one from a file, all before any is registered (the engine checks again
        // with the table policy applied).
        for cfg in tables {
            cfg.validate()?;
        }
        // The count again under the tables' lock: concurrent registrations cannot pass it together.
        let max = (!admin).then_some(self.registration.max_tables);
        let mut done = 0;
        let result = tables.iter().try_for_each(|cfg| {
            self.engine
                .register_table_within(cfg.clone(), max)
                .map(|()| done += 1)
        });
        metrics::gauge!(m::TABLES).set(self.engine.table_count() as f64);
        // Backups and a reshard's destinations get what was registered, even when a later table failed.
        let registered = &tables[..done];
        if !registered.is_empty() {
            self.replica.links.tables_registered(registered.to_vec());
            let mover = self.routing.read().mover.clone();
            if let Some(m) = mover {
                m.tables_registered(registered.to_vec());
            }
        }
        result?;
        Ok(Reply {
            header: Response::Registered {
                tables: self.engine.tables().len() as u32,
            },
            payload: Vec::new(),
        })
    }

    fn check_epoch(map: &ShardMap, epoch: u64) -> Result<(), Refusal> {
        if epoch != map.epoch {
            return Err(refuse(
                ErrorCode::WrongEpoch,
                format!(
                    "request epoch {epoch}, server shard-map epoch {}: refresh the shard map",
                    map.epoch
                ),
            ));
        }
        Ok(())
    }

    /// Checks tables and dimensions of every entry before anything is read or written.
    fn check_tables(&self, tables: &[TableCount]) -> Result<(), Refusal> {
        for t in tables {
            let table = self.engine.table(t.table)?;
            if table.dim() != t.dim as usize {
                return Err(refuse(
                    ErrorCode::WrongDimension,
                    format!(
                        "table {}: request dim {}, table dim {}",
                        t.table,
                        t.dim,
                        table.dim()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Where the rows a push (or a write of rows) changed go, under the routing lock it checked its epoch
    /// with: the delta sync records them at `now_us`, the backups get them (with the push's `answer`), a
    /// reshard's destinations get those of moving virtual shards. `tables` are the tables tried, their ids at
    /// the front of `all_ids`. Returns what the reply waits for in `replicated` durability.
    fn rows_changed(
        &self,
        route: &crate::shard::reshard::RouteState,
        tables: &[TableCount],
        all_ids: &[u64],
        answer: Option<PushAnswer>,
        now_us: u64,
    ) -> Option<crate::shard::replica::AckWait> {
        let parts = table_parts(tables, all_ids);
        self.sync.record(parts.iter().copied(), now_us);
        let wait = self.replica.links.after_push(
            &self.engine,
            &parts,
            answer,
            self.replica.waits_for_backups(),
        );
        if let Some(mover) = &route.mover {
            mover.forward(&self.engine, &parts);
        }
        wait
    }

    /// Refuses `what` (pushes, row writes) while storage writes fail ([`crate::write_health`]).
    fn refuse_while_writes_fail(&self, what: &str) -> Result<(), Refusal> {
        match self.writes.failure() {
            Some(failure) => Err(refuse(
                ErrorCode::Storage,
                format!(
                    "storage writes failing ({failure}): {what} refused until a write succeeds"
                ),
            )),
            None => Ok(()),
        }
    }

    fn check_ownership(&self, map: &ShardMap, table: u32, ids: &[u64]) -> Result<(), Refusal> {
        if map.num_servers == 1 && self.shard_index == 0 {
            return Ok(());
        }
        if let Some(&id) = ids
            .iter()
            .find(|&&id| map.server_of(id) != self.shard_index)
        {
            return Err(refuse(
                ErrorCode::WrongShard,
                format!(
                    "table {table}: id {id} belongs to shard {}, this is shard {}",
                    map.server_of(id),
                    self.shard_index
                ),
            ));
        }
        Ok(())
    }

    /// Checks a pull's header and decodes every id (a malformed section anywhere refuses the whole pull
    /// before anything is read).
    fn pull_ids(
        &self,
        map: &ShardMap,
        epoch: u64,
        tables: &[TableCount],
        payload: &[u8],
    ) -> Result<(PayloadLayout, Vec<u64>), Refusal> {
        self.replica.require_readable("pull")?;
        Self::check_epoch(map, epoch)?;
        self.check_tables(tables)?;
        let mut all_ids = Vec::new();
        let layout = wire::message::pull::decode(tables, payload, &mut all_ids)?;
        Ok((layout, all_ids))
    }

    /// Reads rows of `table` with `read`, again after a wait while one of `ids` is held by a push whose synced
    /// write is not done ([`crate::shard::unsynced`], `sync` durability only); refused as the transient
    /// `Storage`, naming a row, if one stays held past [`crate::shard::unsynced::WAIT`].
    pub(crate) fn read_durable(
        &self,
        table: u32,
        ids: &[u64],
        mut read: impl FnMut() -> Result<(), Refusal>,
    ) -> Result<(), Refusal> {
        let Some(u) = &self.unsynced else {
            return read();
        };
        let deadline = std::time::Instant::now() + crate::shard::unsynced::WAIT;
        loop {
            read()?;
            let Some(id) = u.first_held(table, ids) else {
                return Ok(());
            };
            metrics::counter!(m::READS_WAITED_FOR_SYNC_TOTAL).increment(1);
            if !u.wait(table, ids, deadline) {
                return Err(refuse(
                    ErrorCode::Storage,
                    format!(
                        "table {table} row {id}: its last update is applied but its synced write is not done \
                         after {:?} (a full or failing disk?); retry once writes work",
                        crate::shard::unsynced::WAIT
                    ),
                ));
            }
        }
    }

    /// A pull; `with_state` ([`Request::PullWithState`]) appends each row's optimizer state after the rows.
    fn pull(
        &self,
        epoch: u64,
        encoding: Encoding,
        tables: &[TableCount],
        payload: &[u8],
        with_state: bool,
    ) -> Result<Reply, Refusal> {
        // Held while reading: a reshard's switch waits for pulls under the old map (then deletes moved rows).
        let route = self.routing.read();
        let (layout, all_ids) = self.pull_ids(&route.map, epoch, tables, payload)?;
        // The state's bytes, so that neither buffer grows (a growing buffer of tens of MB is copied at every
        // doubling), and the largest table's rows (with their state, or the weights alone), for scratch that
        // does not grow table after table either: the tables were checked to exist (`pull_ids`), the counts
        // against the payload.
        let (mut state_bytes, mut full_len, mut rows_len) = (0usize, 0usize, 0usize);
        for t in tables {
            let (n, dim) = (t.count as usize, t.dim as usize);
            if with_state {
                let row_len = self.engine.table(t.table)?.row_len();
                let len = row_len.saturating_sub(dim);
                state_bytes = state_bytes.saturating_add(n.saturating_mul(len * 4));
                full_len = full_len.max(n.saturating_mul(row_len));
            } else {
                rows_len = rows_len.max(n.saturating_mul(dim));
            }
        }
        let mut out = Vec::with_capacity(layout.pull_response_bytes(encoding) + state_bytes);
        let (mut state, mut state_lens) = (Vec::with_capacity(state_bytes), Vec::new());
        let (mut full, mut rows, mut halves) = (
            Vec::with_capacity(full_len),
            Vec::with_capacity(rows_len),
            Vec::new(),
        );
        let mut start = 0;
        for t in tables {
            let (n, dim) = (t.count as usize, t.dim as usize);
            let ids = &all_ids[start..start + n];
            start += n;
            self.check_ownership(&route.map, t.table, ids)?;
            rows.clear();
            if with_state {
                let row_len = self.engine.table(t.table)?.row_len();
                full.clear();
                full.resize(n * row_len, 0.0);
                self.read_durable(t.table, ids, || {
                    record_tier(&self.engine.gather_with_state(t.table, ids, &mut full)?);
                    Ok(())
                })?;
                // Each row encoded straight from the gathered row (no copy of the weights first).
                for row in full.chunks_exact(row_len) {
                    codec::encode_rows(&row[..dim], dim, encoding, &mut out);
                    wire::message::pull_with_state::put_state(&row[dim..], &mut state);
                }
                state_lens.push((row_len - dim) as u32);
                continue;
            } else if encoding == Encoding::Bf16
                && self.engine.table(t.table)?.codec().precision() == embedding::RowPrecision::Bf16
            {
                // bf16 rows pulled in bf16: the stored halves as they are, no conversion.
                halves.clear();
                halves.resize(n * dim, 0u16);
                self.read_durable(t.table, ids, || {
                    record_tier(&self.engine.gather_bf16(t.table, ids, &mut halves)?);
                    Ok(())
                })?;
                if cfg!(target_endian = "little") {
                    out.extend_from_slice(bytemuck::cast_slice(&halves));
                } else {
                    halves
                        .iter()
                        .for_each(|h| out.extend_from_slice(&h.to_le_bytes()));
                }
                continue;
            } else {
                rows.resize(n * dim, 0.0);
                self.read_durable(t.table, ids, || {
                    record_tier(&self.engine.gather_stats(t.table, ids, &mut rows)?);
                    Ok(())
                })?;
            }
            codec::encode_rows(&rows, dim, encoding, &mut out);
        }
        out.extend_from_slice(&state);
        metrics::counter!(m::ROWS_PULLED_TOTAL).increment(layout.ids as u64);
        let tables = tables.to_vec();
        let header = if with_state {
            Response::PulledWithState {
                encoding,
                tables,
                state_lens,
            }
        } else {
            Response::Pulled { encoding, tables }
        };
        Ok(Reply {
            header,
            payload: out,
        })
    }

    /// A prefetch ([`protocol::wire::message::prefetch`]) under `(owner, lease, release_below)`: every section, table and
    /// id ownership is checked before any row is read or any lease released; pins end at `now` plus the
    /// shard's pin deadline at the latest. Reads RocksDB: the server runs it on a blocking thread.
    fn prefetch(
        &self,
        epoch: u64,
        (owner, lease, release_below): (u64, u64, u64),
        tables: &[TableCount],
        payload: &[u8],
        now: u64,
    ) -> Result<Reply, Refusal> {
        self.replica.require_primary("prefetch")?;
        let map = self.routing.map();
        Self::check_epoch(&map, epoch)?;
        self.check_tables(tables)?;
        let mut all_ids = Vec::new();
        wire::message::prefetch::decode(tables, payload, &mut all_ids)?;
        let mut parts = Vec::with_capacity(tables.len());
        let mut start = 0;
        for t in tables {
            let ids = &all_ids[start..start + t.count as usize];
            self.check_ownership(&map, t.table, ids)?;
            parts.push((t.table, ids));
            start += t.count as usize;
        }
        let stats =
            self.engine
                .prefetch(owner, lease, release_below, &parts, now, self.pin_secs)?;
        let rows = stats.rows;
        metrics::counter!(m::PREFETCH_REQUESTS_TOTAL).increment(1);
        for (outcome, n) in [
            ("resident", rows.resident),
            ("read_back", rows.read_back),
            ("waited", rows.waited),
            ("absent", rows.absent),
            ("untiered", rows.untiered),
        ] {
            if n > 0 {
                metrics::counter!(m::PREFETCH_ROWS_TOTAL, "outcome" => outcome).increment(n as u64);
            }
        }
        Ok(Reply {
            header: Response::Prefetched { stats },
            payload: Vec::new(),
        })
    }

    /// Push `id` applied once ([`crate::shard::push_window`]): a copy already applied is answered from the
    /// window; the first copy is applied ([`Shard::push`]) and its answer remembered, at once or, when it
    /// waits for backups, by [`PendingAck::settle`].
    fn push_once(
        &self,
        id: PushId,
        head: (u64, Encoding, (f32, f32)),
        tables: &[TableCount],
        payload: &[u8],
        now_us: u64,
    ) -> Result<(Reply, Option<crate::shard::replica::AckWait>), Refusal> {
        self.replica.require_primary("push")?;
        let shape = crate::shard::push_window::push_shape(head.1, tables, payload.len());
        match self.pushes.admit(id, shape)? {
            Admission::Apply => {}
            Admission::Answer(header) => {
                return Ok((
                    Reply {
                        header,
                        payload: Vec::new(),
                    },
                    None,
                ))
            }
            Admission::Write(unwritten) => {
                let written = self.write_unwritten(id, shape, unwritten);
                if written.is_ok() {
                    metrics::counter!(m::PUSH_RETRIES_ANSWERED_TOTAL).increment(1);
                }
                return written;
            }
        }
        let mut changed = false;
        let mut unwritten = None;
        let result = self.push(
            (id, shape),
            head,
            tables,
            payload,
            now_us,
            (&mut changed, &mut unwritten),
        );
        match &result {
            Ok((_, Some(_))) => {} // settled once its backups stored it
            Ok((reply, None)) => self.pushes.finish(id, Some(&reply.header)),
            Err(refusal) => match unwritten {
                Some(u) => self.pushes.keep_unwritten(id, u, &refusal.response()),
                None => self
                    .pushes
                    .finish(id, changed.then(|| refusal.response()).as_ref()),
            },
        }
        result
    }

    /// Writes every push applied in memory whose synced write failed, with its answer (once writes work
    /// again: [`Shard::probe_writes`]); stops at the first that fails, the rest staying unwritten for their
    /// retries or the next probe.
    pub(crate) fn write_unwritten_pushes(&self) {
        let mut failed = false;
        for (id, shape, unwritten) in self.pushes.take_unwritten() {
            if failed {
                let again = Response::Error {
                    code: ErrorCode::Storage,
                    message: "its synced write failed".into(),
                };
                self.pushes.keep_unwritten(id, unwritten, &again);
                continue;
            }
            failed = self.write_unwritten(id, shape, unwritten).is_err();
        }
    }

    /// The retry of a push applied in memory whose synced write failed: writes its rows now, with its answer
    /// when the window is durable, and answers it; while writes still fail, it stays unwritten and the retry
    /// is refused with the transient `Storage`.
    fn write_unwritten(
        &self,
        id: PushId,
        shape: u64,
        unwritten: Box<crate::shard::push_window::Unwritten>,
    ) -> Result<(Reply, Option<crate::shard::replica::AckWait>), Refusal> {
        let (rows, rejected) = match unwritten.answer {
            Response::Pushed {
                rows,
                rejected_nonfinite,
            } => (rows, rejected_nonfinite),
            _ => (0, 0),
        };
        let meta = self.pushes.durable_writes(id, shape, rows, rejected);
        match self.persist_push(&unwritten.tables, &unwritten.ids, &meta) {
            Ok(()) => {
                self.pushes.finish(id, Some(&unwritten.answer));
                Ok((
                    Reply {
                        header: unwritten.answer,
                        payload: Vec::new(),
                    },
                    None,
                ))
            }
            Err(refusal) => {
                let response = refusal.response();
                self.pushes.keep_unwritten(id, unwritten, &response);
                Err(refusal)
            }
        }
    }

    /// A push, its rows stamped with `now_us`'s second for TTL expiry and recorded as changed at `now_us` for
    /// the delta sync. `changed` is set once rows may have changed (a refusal after that is remembered as
    /// the push's answer); `unwritten` is set when the push was applied and its synced write failed (its
    /// retry writes it).
    fn push(
        &self,
        (id, shape): (PushId, u64),
        (epoch, encoding, (grad_scale, lr_scale)): (u64, Encoding, (f32, f32)),
        tables: &[TableCount],
        payload: &[u8],
        now_us: u64,
        (changed, unwritten): (
            &mut bool,
            &mut Option<Box<crate::shard::push_window::Unwritten>>,
        ),
    ) -> Result<(Reply, Option<crate::shard::replica::AckWait>), Refusal> {
        let now = now_us / 1_000_000;
        self.replica.require_backup_for_push()?;
        // Held until the push's rows are queued to a reshard's destinations: the switch to a new map sees
        // every push either forwarded or refused (`crate::shard::reshard`).
        let route = self.routing.read();
        Self::check_epoch(&route.map, epoch)?;
        self.refuse_while_writes_fail("pushes")?;
        wire::message::push::check_grad_scale(grad_scale)?;
        wire::message::push::check_lr_scale(lr_scale)?;
        self.check_tables(tables)?;
        // Every table must take the learning-rate multiplier (FTRL takes none but 1) before any row changes.
        for t in tables {
            self.engine.table(t.table)?.scaled_optimizer(lr_scale)?;
        }
        // Every id section and the rows' length are checked, then ownership of every id, before any row
        // changes.
        let mut all_ids = Vec::new();
        let grad_bytes = wire::message::push::decode(tables, encoding, payload, &mut all_ids)?;
        let mut start = 0;
        for t in tables {
            self.check_ownership(
                &route.map,
                t.table,
                &all_ids[start..start + t.count as usize],
            )?;
            start += t.count as usize;
        }
        let (mut id_at, mut grad_at) = (0usize, 0usize);
        let mut grads = Vec::new();
        let (mut applied, mut rejected, mut not_admitted) = (0u64, 0u64, 0u64);
        let (mut refused_weights, mut clamped_weights) = (0u64, 0u64);
        // With `sync`, reads of these rows wait from now until their synced write is done (dropped on return).
        let held = self
            .unsynced
            .as_ref()
            .map(|u| u.hold(&table_parts(tables, &all_ids)));
        // One guard for all tables: a checkpoint holds all of this push or none of it.
        let guard = self.engine.begin_push();
        *changed = true;
        let mut outcome = Ok(());
        let mut tried = 0;
        for t in tables {
            let n = t.count as usize;
            let elements = n * t.dim as usize;
            let width = n * encoding.row_bytes(t.dim as usize);
            grads.clear();
            grads.resize(elements, 0.0);
            if let Err(e) = codec::decode_rows(
                &grad_bytes[grad_at..grad_at + width],
                t.dim as usize,
                encoding,
                &mut grads,
            ) {
                outcome = Err(Refusal::from(e));
                break;
            }
            if grad_scale != 1.0 {
                let inv = 1.0 / grad_scale;
                grads.iter_mut().for_each(|g| *g *= inv);
            }
            tried += 1;
            match guard.apply_scaled(t.table, &all_ids[id_at..id_at + n], &grads, now, lr_scale) {
                Ok(stats) => {
                    applied += stats.applied as u64;
                    rejected += stats.rejected_nonfinite as u64;
                    not_admitted += stats.rejected_admission as u64;
                    refused_weights += stats.refused_nonfinite_weights as u64;
                    clamped_weights += stats.clamped_weights as u64;
                }
                Err(e) => {
                    outcome = Err(e.into());
                    break;
                }
            }
            id_at += n;
            grad_at += width;
        }
        // Recorded after the applies (a cut between a record and its apply would send the old value) and
        // under the push gate (a checkpoint's cut sees every push its snapshot holds, `crate::checkpoint`);
        // the tables a failed push tried are recorded too, as they may have changed. One lock for the push.
        // The rows go to the backups whatever the outcome: a failed push may have changed some. With its
        // answer when it has one, so that a promoted backup answers its retry.
        let answer = (outcome.is_ok() && id.is_some()).then_some(PushAnswer {
            id,
            rows: applied,
            rejected_nonfinite: rejected + refused_weights,
        });
        let wait = self.rows_changed(&route, &tables[..tried], &all_ids, answer, now_us);
        drop(route);
        outcome?;
        drop(guard);
        metrics::counter!(m::ROWS_PUSHED_TOTAL).increment(applied);
        if rejected > 0 {
            metrics::counter!(m::ROWS_REJECTED_NONFINITE_TOTAL).increment(rejected);
        }
        if not_admitted > 0 {
            metrics::counter!(m::ROWS_REJECTED_ADMISSION_TOTAL).increment(not_admitted);
        }
        if refused_weights > 0 {
            metrics::counter!(m::ROWS_REFUSED_NONFINITE_WEIGHTS_TOTAL).increment(refused_weights);
            tracing::warn!(
                rows = refused_weights,
                "push updates refused: they would have left non-finite weights (diverging training?)"
            );
        }
        if clamped_weights > 0 {
            metrics::counter!(m::ROWS_CLAMPED_WEIGHTS_TOTAL).increment(clamped_weights);
        }
        if self.durability == Durability::Sync {
            // The answer its retries get, stored with its rows: a restart after this write answers them.
            let meta = self
                .pushes
                .durable_writes(id, shape, applied, rejected + refused_weights);
            if let Err(refusal) = self.persist_push(tables, &all_ids, &meta) {
                if id.is_some() {
                    *unwritten = Some(Box::new(crate::shard::push_window::Unwritten {
                        answer: Response::Pushed {
                            rows: applied,
                            rejected_nonfinite: rejected + refused_weights,
                        },
                        tables: tables.to_vec(),
                        ids: all_ids,
                        held: held.map(std::sync::Arc::new),
                    }));
                }
                return Err(refusal);
            }
            // Durable, not yet acknowledged: a crash here must not lose the push nor apply it twice.
            #[cfg(feature = "failpoints")]
            embedding::failpoints::crash_point(crate::failpoints::PUSH_BEFORE_ACK);
        }
        let reply = Reply {
            header: Response::Pushed {
                rows: applied,
                // Gradient rows with NaN or infinity, and updates undone by the weight guard.
                rejected_nonfinite: rejected + refused_weights,
            },
            payload: Vec::new(),
        };
        Ok((reply, wait))
    }
}

/// The `(table, ids)` of each of `tables`, whose ids lie one table after another in `all_ids`.
fn table_parts<'a>(tables: &[TableCount], all_ids: &'a [u64]) -> Vec<(u32, &'a [u64])> {
    let mut at = 0;
    tables
        .iter()
        .map(|t| {
            let ids = &all_ids[at..at + t.count as usize];
            at += t.count as usize;
            (t.table, ids)
        })
        .collect()
}

/// A push's answer waiting for its backups ([`Shard::handle_replicated`]).
pub struct PendingAck {
    wait: Option<crate::shard::replica::AckWait>,
    id: PushId,
    answer: Response,
    window: std::sync::Arc<crate::shard::push_window::PushWindow>,
}

impl PendingAck {
    /// Waits until every in-sync backup stored the push's rows, then remembers the answer as the push's (a
    /// retry arriving meanwhile was refused as in progress).
    pub async fn settle(mut self) {
        if let Some(wait) = self.wait.take() {
            wait.wait().await;
        }
    }
}

impl Drop for PendingAck {
    /// Also when the wait is abandoned (the request's connection closed): the push was applied, and a retry
    /// must get its answer rather than wait for a settlement that will not come.
    fn drop(&mut self) {
        self.window.finish(self.id, Some(&self.answer));
    }
}

mod score;
mod storage;
mod write_rows;

mod sync;
pub use sync::{SyncAsk, SyncOutcome};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod sync_tests;

#[cfg(test)]
mod prefetch_tests;
