//! `WriteRows` on the server ([`protocol::wire::message::write_rows`]): a trainer sets rows' weights (loading
//! saved weights). Checked as a push is before any row changes (primary, map epoch, tables, every id owned,
//! every weight finite); the rows then go where a push's go: to the backups (the reply waits for them in
//! `replicated` durability), to a reshard's destinations, to the delta sync, and to disk synced in `sync`.

use protocol::compression::codec::{self, Encoding};
use protocol::{wire, ErrorCode, Response, TableCount};

use crate::config::Durability;
use crate::metrics as m;
use crate::reply::{refuse, Refusal, Reply};
use crate::shard::Shard;

impl Shard {
    /// Sets the weights of every row of the payload (their optimizer state kept), stamped and recorded at
    /// `now_us`, and what the reply waits for in `replicated` durability.
    pub(super) fn write_rows(
        &self,
        epoch: u64,
        tables: &[TableCount],
        payload: &[u8],
        now_us: u64,
    ) -> Result<(Reply, Option<crate::shard::replica::AckWait>), Refusal> {
        let now = now_us / 1_000_000;
        self.replica.require_primary("write rows")?;
        self.replica.require_backup_for_push()?;
        let route = self.routing.read();
        Self::check_epoch(&route.map, epoch)?;
        self.refuse_while_writes_fail("row writes")?;
        self.check_tables(tables)?;
        let mut all_ids = Vec::new();
        let bytes = wire::message::write_rows::decode(tables, payload, &mut all_ids)?;
        // Every table's weights decoded and checked, and every id's owner, before any row changes.
        let (mut at, mut byte_at) = (0usize, 0usize);
        let mut weights = Vec::with_capacity(tables.len());
        for t in tables {
            let (n, dim) = (t.count as usize, t.dim as usize);
            let ids = &all_ids[at..at + n];
            self.check_ownership(&route.map, t.table, ids)?;
            let width = n * Encoding::F32.row_bytes(dim);
            let mut w = vec![0.0f32; n * dim];
            codec::decode_rows(&bytes[byte_at..byte_at + width], dim, Encoding::F32, &mut w)?;
            if let Some(i) = w.iter().position(|x| !x.is_finite()) {
                return Err(refuse(
                    ErrorCode::BadRequest,
                    format!(
                        "write rows: table {} id {}: weight {} is not finite",
                        t.table,
                        ids[i / dim],
                        w[i]
                    ),
                ));
            }
            weights.push(w);
            at += n;
            byte_at += width;
        }
        let (mut written, mut outcome, mut tried) = (0u64, Ok(()), 0);
        at = 0;
        for (t, w) in tables.iter().zip(&weights) {
            let ids = &all_ids[at..at + t.count as usize];
            tried += 1;
            match self.engine.write_weights(t.table, ids, w, now) {
                Ok(n) => written += n as u64,
                Err(e) => {
                    outcome = Err(Refusal::from(e));
                    break;
                }
            }
            at += t.count as usize;
        }
        let wait = self.rows_changed(&route, &tables[..tried], &all_ids, None, now_us);
        drop(route);
        outcome?;
        metrics::counter!(m::ROWS_WRITTEN_TOTAL).increment(written);
        if self.durability == Durability::Sync {
            self.persist_push(tables, &all_ids, &[])?;
        }
        let reply = Reply {
            header: Response::WroteRows { rows: written },
            payload: Vec::new(),
        };
        Ok((reply, wait))
    }
}
