//! The requests of [`PsClient`] beyond connecting and calling: table registration, pulls, pushes, prefetch,
//! reduce, serving's sync, flush and checkpoints. Each builds its header ([`crate::wire`]), sends it with
//! [`PsClient::call`] (retries, failover) and checks the answer's kind and lengths.

use std::time::Duration;

use bytes::Bytes;

use super::{PsClient, PulledState, SYNC_TIMEOUT_MARGIN};
use crate::compression::codec::Encoding;
use crate::error::ProtocolError;
use crate::transport::Dialer;
use crate::wire;
use crate::wire::layout::TableCount;
use crate::wire::message::{Request, Response, TableConfig};

impl<D: Dialer> PsClient<D> {
    /// Registers tables on every server (each shard's primary, which passes them to its backups).
    pub async fn register_tables(&self, tables: &[TableConfig]) -> Result<(), ProtocolError> {
        for i in 0..self.num_servers() {
            let req = Request::RegisterTables {
                tables: tables.to_vec(),
            };
            let (resp, _) = self.call(i, &req, Bytes::new()).await?;
            if !matches!(resp, Response::Registered { .. }) {
                return Err(self.unexpected(i, &resp, "Registered"));
            }
        }
        Ok(())
    }

    /// One pull from server `server` under map `epoch` ([`PsClient::pull`] re-routes).
    pub(super) async fn pull_once(
        &self,
        server: usize,
        epoch: u64,
        encoding: Encoding,
        tables: Vec<TableCount>,
        ids: Bytes,
    ) -> Result<Bytes, ProtocolError> {
        let req = wire::message::pull::request(epoch, encoding, tables);
        let (resp, rows) = self.call(server, &req, ids).await?;
        match (resp, &req) {
            (Response::Pulled { encoding: e, .. }, Request::Pull { tables, .. })
                if e == encoding =>
            {
                wire::message::pull::check_rows(tables, encoding, &rows)?;
                Ok(rows)
            }
            (other, _) => Err(self.unexpected(server, &other, "Pulled")),
        }
    }

    /// One pull with state from server `server` under map `epoch` ([`PsClient::pull_with_state`]
    /// re-routes).
    pub(super) async fn pull_with_state_once(
        &self,
        server: usize,
        epoch: u64,
        encoding: Encoding,
        tables: Vec<TableCount>,
        ids: Bytes,
    ) -> Result<PulledState, ProtocolError> {
        let req = wire::message::pull_with_state::request(epoch, encoding, tables.clone());
        let (resp, payload) = self.call(server, &req, ids).await?;
        match resp {
            Response::PulledWithState {
                encoding: e,
                tables: got,
                state_lens,
            } if e == encoding && got == tables => {
                let (rows, _) = wire::message::pull_with_state::split_reply(
                    &tables,
                    encoding,
                    &state_lens,
                    &payload,
                )?;
                let rows = rows.len();
                Ok(PulledState {
                    rows: payload.slice(..rows),
                    state: payload.slice(rows..),
                    state_lens,
                })
            }
            other => Err(self.unexpected(server, &other, "PulledWithState")),
        }
    }

    /// One push to server `server` under map `epoch` ([`PsClient::push`] re-routes): gradients in `encoding`,
    /// multiplied by `grad_scale`, under push `id`.
    pub(super) async fn push_once(
        &self,
        server: usize,
        epoch: u64,
        (encoding, scales, id): (Encoding, (f32, f32), wire::message::push::PushId),
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> Result<(u64, u64), ProtocolError> {
        let req = wire::message::push::request(epoch, encoding, scales, tables, id)?;
        let (resp, _) = self.call(server, &req, payload).await?;
        match resp {
            Response::Pushed {
                rows,
                rejected_nonfinite,
            } => Ok((rows, rejected_nonfinite)),
            other => Err(self.unexpected(server, &other, "Pushed")),
        }
    }

    /// One request of scores to server `server` under map `epoch` ([`PsClient::score`] re-routes).
    pub(super) async fn score_once(
        &self,
        server: usize,
        epoch: u64,
        mode: embedding::ScoreMode,
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> Result<u64, ProtocolError> {
        let req = wire::message::score::request(epoch, mode, tables);
        let (resp, _) = self.call(server, &req, payload).await?;
        match resp {
            Response::Scored { rows } => Ok(rows),
            other => Err(self.unexpected(server, &other, "Scored")),
        }
    }

    /// One write of rows' weights to server `server` under map `epoch` ([`PsClient::write_rows`] re-routes).
    pub(super) async fn write_rows_once(
        &self,
        server: usize,
        epoch: u64,
        tables: Vec<TableCount>,
        payload: Bytes,
    ) -> Result<u64, ProtocolError> {
        let req = wire::message::write_rows::request(epoch, tables);
        let (resp, _) = self.call(server, &req, payload).await?;
        match resp {
            Response::WroteRows { rows } => Ok(rows),
            other => Err(self.unexpected(server, &other, "WroteRows")),
        }
    }

    /// One prefetch on server `server` under map `epoch` ([`PsClient::prefetch`] re-routes).
    pub(super) async fn prefetch_once(
        &self,
        server: usize,
        epoch: u64,
        (owner, lease, release_below): (u64, u64, u64),
        tables: Vec<TableCount>,
        ids: Bytes,
    ) -> Result<wire::message::prefetch::LeaseStats, ProtocolError> {
        let req = wire::message::prefetch::request(epoch, owner, lease, release_below, tables);
        let (resp, _) = self.call(server, &req, ids).await?;
        match resp {
            Response::Prefetched { stats } => Ok(stats),
            other => Err(self.unexpected(server, &other, "Prefetched")),
        }
    }

    /// Sends this trainer's contribution `values` (f32 LE, [`wire::message::reduce::encode_values`]) to one step of a
    /// reduce group on server `server`, and waits for the sum over the group ([`wire::message::reduce`]).
    pub async fn reduce(
        &self,
        server: usize,
        header: wire::message::reduce::ReduceHeader,
        values: Bytes,
    ) -> Result<(wire::message::reduce::ReducedHeader, Bytes), ProtocolError> {
        let req = wire::message::reduce::request(header);
        let (resp, payload) = self.call(server, &req, values).await?;
        match resp {
            Response::Reduced { header } => Ok((header, payload)),
            other => Err(self.unexpected(server, &other, "Reduced")),
        }
    }

    /// Asks server `server` for the rows changed after `cursor` ([`wire::message::sync`]): at most `max_rows` rows in
    /// `encoding` (f32, f16 or bf16), and the dense parameters if the server holds a version newer than
    /// `dense_version`. When the cursor is up to date the server waits up to `wait_ms` (cut to
    /// [`wire::message::sync::MAX_WAIT_MS`]) for its next delta: a standing long-poll; this request is allowed that
    /// wait plus [`SYNC_TIMEOUT_MARGIN`] (and at least the configured request timeout). Send the answer's
    /// `header.cursor` next, at once while `header.complete` is false.
    pub async fn sync_deltas(
        &self,
        server: usize,
        cursor: wire::message::sync::SyncCursor,
        encoding: Encoding,
        max_rows: u32,
        wait_ms: u32,
        dense_version: u64,
    ) -> Result<wire::message::sync::DeltaBatch, ProtocolError> {
        let req = wire::message::sync::request(cursor, encoding, max_rows, wait_ms, dense_version);
        let wait = Duration::from_millis(u64::from(wait_ms.min(wire::message::sync::MAX_WAIT_MS)));
        let timeout = self.cfg.request_timeout.max(wait + SYNC_TIMEOUT_MARGIN);
        let (resp, payload) = self
            .call_within(server, &req, Bytes::new(), timeout)
            .await?;
        match resp {
            Response::Deltas { header } if header.encoding == encoding => {
                wire::message::sync::decode(header, &payload)
            }
            other => Err(self.unexpected(server, &other, "Deltas")),
        }
    }

    /// Gives server 0 the dense parameters `values` of `version` (> 0, newer is larger: Unix microseconds of
    /// the publication, [`wire::message::sync::MAX_DENSE_CLOCK_SKEW_US`]) at training `step`, for sync subscribers
    /// ([`wire::message::sync`]), under this client's job number (versions grow within a job). Returns the newest version the server holds (larger than
    /// `version` when a newer one was published first).
    pub async fn publish_dense(
        &self,
        version: u64,
        step: u64,
        values: &[f32],
    ) -> Result<u64, ProtocolError> {
        let len = u32::try_from(values.len())
            .ok()
            .filter(|&n| n <= wire::message::sync::MAX_DENSE_VALUES)
            .ok_or_else(|| {
                ProtocolError::BadPayload(format!(
                    "publish dense: {} values exceed the cap of {}",
                    values.len(),
                    wire::message::sync::MAX_DENSE_VALUES
                ))
            })?;
        let mut payload = Vec::with_capacity(values.len() * 4);
        wire::message::sync::put_dense(values, &mut payload);
        let req = wire::message::sync::publish_request(self.job, version, step, len);
        let (resp, _) = self.call(0, &req, Bytes::from(payload)).await?;
        match resp {
            Response::Published { version } => Ok(version),
            other => Err(self.unexpected(0, &other, "Published")),
        }
    }

    /// Asks every server to write its dirty rows to storage; returns the rows written.
    pub async fn flush(&self) -> Result<u64, ProtocolError> {
        let mut total = 0;
        for i in 0..self.num_servers() {
            let (resp, _) = self.call(i, &Request::Flush, Bytes::new()).await?;
            match resp {
                Response::Flushed { rows } => total += rows,
                other => return Err(self.unexpected(i, &other, "Flushed")),
            }
        }
        Ok(total)
    }

    /// Asks every server, one after another, to write a consistent snapshot of its tables into
    /// `dir/shard-<index>-of-<num_servers>/` (`dir` is a path on the servers' file systems, typically shared
    /// storage; it must not hold a snapshot already). Returns each server's (rows, shard directory), in shard
    /// order. Each server's snapshot holds whole pushes only; pause pushes around the call for one cut across
    /// servers. Checkpoints of large tables take long: the request timeout applies to each server.
    pub async fn checkpoint(
        &self,
        dir: &str,
        step: u64,
    ) -> Result<Vec<(u64, String)>, ProtocolError> {
        self.checkpoint_with(dir, step, false, None).await
    }

    /// [`checkpoint`](Self::checkpoint) for an export: each shard directory also gets its tables as one
    /// SafeTensors file (`tables.safetensors`, docs/serving.md), readable without our code, and leaves out the
    /// rows `prune` names (publish-time pruning; the servers keep them).
    pub async fn export_snapshot(
        &self,
        dir: &str,
        step: u64,
        prune: Option<embedding::ExportPrune>,
    ) -> Result<Vec<(u64, String)>, ProtocolError> {
        self.checkpoint_with(dir, step, true, prune).await
    }

    async fn checkpoint_with(
        &self,
        dir: &str,
        step: u64,
        tensors: bool,
        prune: Option<embedding::ExportPrune>,
    ) -> Result<Vec<(u64, String)>, ProtocolError> {
        let req = Request::Checkpoint {
            dir: dir.to_owned(),
            step,
            tensors,
            prune,
        };
        let mut out = Vec::with_capacity(self.num_servers());
        for i in 0..self.num_servers() {
            let (resp, _) = self.call(i, &req, Bytes::new()).await?;
            match resp {
                Response::Checkpointed { rows, dir } => out.push((rows, dir)),
                other => return Err(self.unexpected(i, &other, "Checkpointed")),
            }
        }
        Ok(out)
    }
}
