//! Answering `SyncDeltas` and `PublishDense` ([`crate::sync`], `protocol::wire::message::sync`): the change log says
//! which ids, the engine gives their current values, as a pull would.

use embedding::TableConfig;
use protocol::compression::codec;
use protocol::wire::dense::DENSE_TABLE;
use protocol::wire::message::sync::{
    self, DeletedCount, DeltasHeader, DenseInfo, SyncCursor, SyncResume,
};
use protocol::{Encoding, ErrorCode, Response, TableCount};

use crate::metrics as m;
use crate::reply::{refuse, Refusal, Reply};
use crate::shard::Shard;
use crate::sync::{DenseVersion, Plan, MAX_PAGE_BYTES};

/// What a sync request gets.
#[derive(Debug)]
pub enum SyncOutcome {
    /// The answer.
    Reply(Reply),
    /// The subscriber is up to date and the caller allowed waiting: wait for the next cut, then ask again.
    UpToDate,
}

/// The fields of a [`protocol::Request::SyncDeltas`].
#[derive(Debug, Clone, Copy)]
pub struct SyncAsk {
    /// The subscriber's cursor.
    pub cursor: SyncCursor,
    /// Encoding of the rows.
    pub encoding: Encoding,
    /// Most rows in the answer.
    pub max_rows: u32,
    /// The dense version the subscriber holds.
    pub dense_version: u64,
}

/// Rows of one table in an answer.
type Part = (TableConfig, Vec<u64>);

/// Bytes of an answer's header beside its table counts (cursor, flags, times, dense info), with room to spare.
const ANSWER_HEADER_BYTES: usize = 4 << 10;
/// Bytes an id takes in an answer at most (a varint delta of a 64-bit id, beside each table's one coding byte).
const MAX_ID_BYTES: usize = 10;
/// Room for rows below which an answer carrying dense values leaves the rows to the next answer.
const MIN_PAGE_BYTES: usize = 64 << 10;

/// Where a scan page starts or the next one will: (table, last id sent of it); `None`: the start, or done.
type ScanAt = Option<(u32, Option<u64>)>;

impl Shard {
    /// Answers a sync request, or with `may_wait` says [`SyncOutcome::UpToDate`] when there is nothing to
    /// send (no delta after the cursor, no newer dense version).
    pub fn sync_deltas(&self, ask: SyncAsk, may_wait: bool) -> Result<SyncOutcome, Refusal> {
        let Some(log) = self.sync.log() else {
            return Err(refuse(
                ErrorCode::BadRequest,
                "delta sync is off on this server (--sync-interval 0)",
            ));
        };
        sync::validate_request(ask.encoding, ask.max_rows)?;
        let incarnation = self.sync.incarnation;
        let dense = self.sync.dense_newer_than(ask.dense_version);
        // The answer fits the frame cap: rows and their ids within what the header and the dense values leave.
        let dense_bytes = dense.as_ref().map_or(0, |d| d.values.len() * 4);
        let page_bytes = self.sync_page_bytes(dense_bytes);
        let row_bytes = |t: u32| {
            self.engine
                .table(t)
                .map_or(0, |t| ask.encoding.row_bytes(t.dim()) + MAX_ID_BYTES)
        };
        // `None`: the dense values leave no room for rows; they go alone, the rows in the next answer.
        let plan = page_bytes.map(|page_bytes| {
            log.plan(
                incarnation,
                &ask.cursor,
                ask.max_rows as usize,
                page_bytes,
                &row_bytes,
            )
        });
        let mut header = DeltasHeader {
            incarnation,
            cursor: SyncCursor {
                incarnation,
                seq: ask.cursor.seq,
                resume: None,
            },
            complete: true,
            scan: false,
            encoding: ask.encoding,
            tables: Vec::new(),
            deleted: Vec::new(),
            oldest_change_unix_us: 0,
            cut_unix_us: 0,
            dense: None,
        };
        let (parts, kind) = match plan {
            Some(Plan::UpToDate) if dense.is_none() && may_wait => {
                return Ok(SyncOutcome::UpToDate)
            }
            Some(Plan::UpToDate) => (Vec::new(), "empty"),
            None => {
                // Not complete: the subscriber asks again at once, from the same cursor.
                header.cursor = ask.cursor;
                header.complete = false;
                (Vec::new(), "dense")
            }
            Some(Plan::Deltas(page)) => {
                let last = page
                    .tables
                    .last()
                    .and_then(|(t, ids)| Some((*t, *ids.last()?)));
                header.complete = page.complete;
                header.cursor.seq = if page.complete { page.upto } else { page.from };
                if let (false, Some((table, after))) = (page.complete, last) {
                    header.cursor.resume = Some(SyncResume::Deltas {
                        upto: page.upto,
                        table,
                        after,
                    });
                }
                header.oldest_change_unix_us = page.oldest_us;
                header.cut_unix_us = page.cut_us;
                let parts = page
                    .tables
                    .into_iter()
                    .map(|(t, ids)| Ok((self.engine.table(t)?.config().clone(), ids)))
                    .collect::<Result<Vec<Part>, embedding::EmbeddingError>>()?;
                (parts, "deltas")
            }
            Some(Plan::Scan { base, resume }) => {
                if resume.is_none() {
                    metrics::counter!(m::SYNC_SCANS_TOTAL).increment(1);
                }
                let page_bytes = page_bytes.expect("a scan plan has room for rows");
                let (parts, next) =
                    self.scan_page(resume, ask.encoding, ask.max_rows as usize, page_bytes)?;
                header.scan = true;
                header.cursor.seq = base;
                header.complete = next.is_none();
                header.cursor.resume = next.map(|(table, after)| SyncResume::Scan { table, after });
                (parts, "scan")
            }
        };
        // Current values; ids without a row (expired, capped, never admitted) become deletions.
        let mut present = Vec::with_capacity(parts.len());
        let mut deleted = Vec::new();
        let mut absent = Vec::new();
        for (cfg, mut ids) in parts {
            let mut rows = vec![0.0; ids.len() * cfg.dim];
            self.read_durable(cfg.id, &ids, || {
                absent.clear();
                self.engine
                    .gather_or_absent(cfg.id, &ids, &mut rows, &mut absent)?;
                Ok(())
            })?;
            if !absent.is_empty() {
                deleted.push((cfg.id, split_absent(&mut ids, &mut rows, cfg.dim, &absent)));
            }
            if !ids.is_empty() {
                present.push((cfg, ids, rows));
            }
        }
        let mut payload = Vec::new();
        for (cfg, ids, _) in &present {
            header.tables.push(TableCount {
                table: cfg.id,
                count: ids.len() as u32,
                dim: cfg.dim as u32,
            });
            sync::put_ids(ids, &mut payload);
        }
        let mut gone = 0u64;
        for (table, ids) in &deleted {
            header.deleted.push(DeletedCount {
                table: *table,
                count: ids.len() as u32,
            });
            sync::put_ids(ids, &mut payload);
            gone += ids.len() as u64;
        }
        let mut sent = 0u64;
        for (cfg, ids, rows) in &present {
            codec::encode_rows(rows, cfg.dim, ask.encoding, &mut payload);
            sent += ids.len() as u64;
        }
        if let Some(d) = dense {
            header.dense = Some(DenseInfo {
                version: d.version,
                step: d.step,
                published_unix_us: d.published_us,
                len: d.values.len() as u32,
            });
            sync::put_dense(&d.values, &mut payload);
        }
        metrics::counter!(m::SYNC_REQUESTS_TOTAL, "answer" => kind).increment(1);
        metrics::counter!(m::SYNC_ROWS_SENT_TOTAL).increment(sent);
        metrics::counter!(m::SYNC_DELETIONS_SENT_TOTAL).increment(gone);
        Ok(SyncOutcome::Reply(Reply {
            header: Response::Deltas { header },
            payload,
        }))
    }

    /// Bytes of rows (with their ids) an answer carrying `dense_bytes` of dense values may hold within this
    /// server's frame cap, at most [`MAX_PAGE_BYTES`]; `None` when the dense values leave too little for a
    /// page (they then go alone).
    fn sync_page_bytes(&self, dense_bytes: usize) -> Option<usize> {
        // The header: its fixed fields and one table count (12 bytes) per table of the page.
        let header = ANSWER_HEADER_BYTES + 12 * self.engine.table_count();
        let room = (self.max_frame as usize)
            .saturating_sub(header + dense_bytes)
            .min(MAX_PAGE_BYTES);
        (dense_bytes == 0 || room >= MIN_PAGE_BYTES).then_some(room)
    }

    /// A page of a full scan from `resume` ((table, last id sent), `None`: the start), tables in id order
    /// then ids ascending, the dense table left out; returns the rows' (table, ids) and where the next page
    /// starts (`None`: the scan is complete).
    fn scan_page(
        &self,
        resume: ScanAt,
        encoding: Encoding,
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<(Vec<Part>, ScanAt), Refusal> {
        let (start, start_after) = resume.unwrap_or((0, None));
        let (mut rows, mut bytes) = (0usize, 0usize);
        let mut parts = Vec::new();
        for cfg in self.engine.tables() {
            if cfg.id < start || cfg.id == DENSE_TABLE {
                continue;
            }
            let after = if cfg.id == start { start_after } else { None };
            let cost = encoding.row_bytes(cfg.dim) + MAX_ID_BYTES;
            let by_bytes = if rows == 0 {
                (max_bytes / cost).max(1)
            } else {
                max_bytes.saturating_sub(bytes) / cost
            };
            let limit = (max_rows - rows).min(by_bytes);
            if limit == 0 {
                return Ok((parts, Some((cfg.id, after))));
            }
            let ids = self.engine.scan_ids(cfg.id, after, limit)?;
            rows += ids.len();
            bytes += ids.len() * cost;
            let full = ids.len() == limit;
            let last = ids.last().copied();
            if !ids.is_empty() {
                parts.push((cfg.clone(), ids));
            }
            if full {
                return Ok((parts, Some((cfg.id, last))));
            }
        }
        Ok((parts, None))
    }

    /// Keeps published dense parameters (the newest version wins), received at `now_us` from `job`: a version
    /// is the publication's Unix microseconds, at most [`sync::MAX_DENSE_CLOCK_SKEW_US`] ahead of this
    /// server's clock (so no publisher can pin a version later ones cannot pass), and growing within a job.
    pub(super) fn publish_dense(
        &self,
        (job, version): (u64, u64),
        step: u64,
        len: u32,
        payload: &[u8],
        now_us: u64,
    ) -> Result<Reply, Refusal> {
        if version == 0 {
            return Err(refuse(
                ErrorCode::BadRequest,
                "publish dense: version 0, expected > 0",
            ));
        }
        let latest = now_us.saturating_add(sync::MAX_DENSE_CLOCK_SKEW_US);
        if version > latest {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "publish dense: version {version} is more than {} s ahead of this server's clock                      ({now_us} us): versions are the publication's Unix microseconds",
                    sync::MAX_DENSE_CLOCK_SKEW_US / 1_000_000
                ),
            ));
        }
        let values = sync::decode_dense(len, payload)?;
        let held = self
            .sync
            .publish(
                job,
                DenseVersion {
                    version,
                    step,
                    published_us: now_us,
                    values,
                },
            )
            .map_err(|e| refuse(ErrorCode::BadRequest, e))?;
        metrics::counter!(m::SYNC_DENSE_PUBLISHED_TOTAL).increment(1);
        Ok(Reply {
            header: Response::Published { version: held },
            payload: Vec::new(),
        })
    }
}

/// Removes the ids at positions `absent` (ascending) from `ids` and their rows (`dim` values each) from
/// `rows`, keeping the order of the rest; returns the removed ids.
fn split_absent(ids: &mut Vec<u64>, rows: &mut Vec<f32>, dim: usize, absent: &[usize]) -> Vec<u64> {
    let mut gone = Vec::with_capacity(absent.len());
    let mut next = absent.iter().copied().peekable();
    let mut kept = 0;
    for i in 0..ids.len() {
        if next.peek() == Some(&i) {
            next.next();
            gone.push(ids[i]);
            continue;
        }
        if kept != i {
            ids[kept] = ids[i];
            rows.copy_within(i * dim..(i + 1) * dim, kept * dim);
        }
        kept += 1;
    }
    ids.truncate(kept);
    rows.truncate(kept * dim);
    gone
}
