//! `Score` on the server ([`protocol::wire::message::score`]): a trainer gives ids of tables that evict by
//! score their scores. Checked before any score changes: primary, map epoch, every table known and evicting by
//! score, every id owned, every score finite and `>= 0` (named by table, id and value). Scores live in this
//! server's memory only (not replicated, synced nor persisted: the module docs of the request say why).

use protocol::{wire, Response, ScoreMode, TableCount};

use crate::metrics as m;
use crate::reply::{Refusal, Reply};
use crate::shard::Shard;

impl Shard {
    /// Gives every id of the payload its score, added or set as `mode` says; the reply counts the ids that
    /// had a row.
    pub(super) fn score(
        &self,
        epoch: u64,
        mode: ScoreMode,
        tables: &[TableCount],
        payload: &[u8],
    ) -> Result<Reply, Refusal> {
        self.replica.require_primary("score")?;
        let route = self.routing.read();
        Self::check_epoch(&route.map, epoch)?;
        let (mut ids, mut scores) = (Vec::new(), Vec::new());
        wire::message::score::decode(tables, payload, &mut ids, &mut scores)?;
        // Every table, owner and score checked before any score changes.
        let mut at = 0usize;
        for t in tables {
            let table = self.engine.table(t.table)?;
            let n = t.count as usize;
            self.check_ownership(&route.map, t.table, &ids[at..at + n])?;
            // An empty call checks the policy and the scores, and changes nothing.
            table.score(&[], &[], mode)?;
            if let Some(i) = scores[at..at + n]
                .iter()
                .position(|s| !(s.is_finite() && *s >= 0.0))
            {
                return Err(embedding::EmbeddingError::BadScore {
                    table: t.table,
                    id: ids[at + i],
                    score: scores[at + i],
                }
                .into());
            }
            at += n;
        }
        let mut found = 0u64;
        at = 0;
        for t in tables {
            let n = t.count as usize;
            found += self
                .engine
                .score(t.table, &ids[at..at + n], &scores[at..at + n], mode)?
                as u64;
            at += n;
        }
        drop(route);
        metrics::counter!(m::SCORES_TOTAL, "found" => "true").increment(found);
        metrics::counter!(m::SCORES_TOTAL, "found" => "false").increment(ids.len() as u64 - found);
        Ok(Reply {
            header: Response::Scored { rows: found },
            payload: Vec::new(),
        })
    }
}
