//! The verdict: acknowledged increments per counter (from the log) against the counters' values (pulled as
//! f32). `lost_acked` sums `max(0, acked - found)` over the rows. An increment beyond the acknowledged ones is
//! either a push sent and never acknowledged (its reply lost, the auditor killed before logging it, a push
//! that failed after the client's retries) that was applied, counted in `unacked_applied` up to the number
//! of such pushes naming the row ([`unacknowledged`]), or a push applied twice, counted in `duplicates`.
//! The verdict also carries the longest pause of a shard ([`super::pause`]), which the caller sets from the
//! log's records ([`Verdict::max_pause`]).

use bytes::Bytes;
use protocol::compression::codec;
use protocol::wire::ids::IdCoding;
use protocol::wire::message::pull::IdSections;
use protocol::{Encoding, ProtocolError, PsClient};
use serde::Serialize;

use super::{Ack, AuditRows, Pause, Record, AUDIT_TABLE_ID};

/// One counter row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RowCount {
    /// Server index.
    pub server: usize,
    /// Row id.
    pub id: u64,
    /// Acknowledged increments.
    pub acked: u64,
    /// The counter's value.
    pub found: f32,
}

impl RowCount {
    /// Acknowledged increments missing from the counter.
    pub fn lost(&self) -> u64 {
        self.acked
            .saturating_sub(self.found.round().max(0.0) as u64)
    }

    /// Increments in the counter beyond the acknowledged ones.
    pub fn extra(&self) -> u64 {
        (self.found.round().max(0.0) as u64).saturating_sub(self.acked)
    }
}

/// The outcome of an audit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Every counter row.
    pub rows: Vec<RowCount>,
    /// Acknowledged pushes in the log.
    pub acked_pushes: u64,
    /// Acknowledged increments (sum of `acked`).
    pub acked_increments: u64,
    /// Sum of the counters.
    pub found_increments: u64,
    /// Sum over rows of `max(0, acked - found)`: acknowledged updates lost.
    pub lost_acked: u64,
    /// Sum over rows of `max(0, found - acked - unacked)`: increments beyond every push sent, so pushes
    /// applied twice.
    pub duplicates: u64,
    /// Sum over rows of `min(found - acked, unacked)` (when positive): pushes sent and never acknowledged that
    /// were applied.
    pub unacked_applied: u64,
    /// Pushes sent and never acknowledged ([`unacknowledged`]).
    pub unacked_pushes: u64,
    /// Counters that are not whole numbers (should never happen: a sign of foreign writes to the table).
    pub non_integral: u64,
    /// The longest gap between two acknowledged pushes of one server within one life of the auditor
    /// ([`super::pause::max_pause`]); `None` when not computed or nothing to measure (printed as 0).
    pub max_pause: Option<Pause>,
}

impl Verdict {
    /// One line, `key=value` pairs (`max_pause_s` with millisecond precision, 0 when nothing was measured;
    /// `max_pause_server` is the server it was on, `-` then).
    pub fn line(&self) -> String {
        let (pause, server) = match self.max_pause {
            Some(p) => (p.seconds, p.server.to_string()),
            None => (0.0, "-".to_owned()),
        };
        format!(
            "audit rows={} acked_pushes={} acked_increments={} found_increments={} lost_acked_updates={} \
             duplicates={} max_pause_s={pause:.3} max_pause_server={server} non_integral={} \
             unacked_pushes={} unacked_applied={}",
            self.rows.len(),
            self.acked_pushes,
            self.acked_increments,
            self.found_increments,
            self.lost_acked,
            self.duplicates,
            self.non_integral,
            self.unacked_pushes,
            self.unacked_applied
        )
    }
}

/// Acknowledged increments per counter, `[server][row]`, of the acks that `keep` selects.
pub fn tally(rows: &AuditRows, acks: &[Ack], keep: impl Fn(&Ack) -> bool) -> Vec<Vec<u64>> {
    let mut counts = vec![vec![0u64; rows.rows_per_server()]; rows.num_servers()];
    for ack in acks.iter().filter(|a| keep(a)) {
        for (i, c) in counts[ack.server].iter_mut().enumerate() {
            *c += ack.mask >> i & 1;
        }
    }
    counts
}

/// Pulls every counter as f32, `[server][row]`.
pub async fn pull_counters(
    client: &PsClient,
    rows: &AuditRows,
) -> Result<Vec<Vec<f32>>, ProtocolError> {
    let mut out = Vec::with_capacity(rows.num_servers());
    for (s, ids) in rows.per_server.iter().enumerate() {
        let mut pull = IdSections::new();
        pull.table(AUDIT_TABLE_ID, 1, IdCoding::Plain, ids);
        let bytes = client
            .pull(s, Encoding::F32, pull.counts, Bytes::from(pull.payload))
            .await?;
        let mut values = vec![0.0f32; ids.len()];
        codec::decode(&bytes, Encoding::F32, &mut values)?;
        out.push(values);
    }
    Ok(out)
}

/// The pushes of `records` sent and never acknowledged: a `Sent` not followed by an `Ack` of its server in
/// the same life of the auditor (one push per server is in flight at a time).
pub fn unacknowledged(servers: usize, records: &[Record]) -> Vec<Ack> {
    let mut pending: Vec<Option<Ack>> = vec![None; servers];
    let mut out = Vec::new();
    for r in records {
        match r {
            Record::Sent(a) if a.server < servers => {
                out.extend(pending[a.server].replace(*a));
            }
            Record::Ack(a) if a.server < servers => pending[a.server] = None,
            Record::Open(_) | Record::Close(_) => {
                out.extend(pending.iter_mut().filter_map(Option::take))
            }
            _ => {}
        }
    }
    out.extend(pending.into_iter().flatten());
    out
}

/// Compares the log with the counters: `acks` acknowledged, `unacked` sent and never acknowledged.
pub fn compare(rows: &AuditRows, acks: &[Ack], unacked: &[Ack], found: &[Vec<f32>]) -> Verdict {
    let acked = tally(rows, acks, |_| true);
    let maybe = tally(rows, unacked, |_| true);
    let mut v = Verdict {
        rows: Vec::new(),
        acked_pushes: acks.len() as u64,
        acked_increments: 0,
        found_increments: 0,
        lost_acked: 0,
        duplicates: 0,
        unacked_applied: 0,
        unacked_pushes: unacked.len() as u64,
        non_integral: 0,
        max_pause: None,
    };
    for (s, ids) in rows.per_server.iter().enumerate() {
        for (i, &id) in ids.iter().enumerate() {
            let row = RowCount {
                server: s,
                id,
                acked: acked[s][i],
                found: found[s][i],
            };
            v.acked_increments += row.acked;
            v.found_increments += row.found.round().max(0.0) as u64;
            v.lost_acked += row.lost();
            let extra = row.extra();
            v.unacked_applied += extra.min(maybe[s][i]);
            v.duplicates += extra.saturating_sub(maybe[s][i]);
            v.non_integral += u64::from(row.found.fract() != 0.0 || row.found < 0.0);
            v.rows.push(row);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_sent_and_never_acknowledged_are_found_per_server_and_life() {
        let a = |server, mask| Ack {
            t_ms: 0,
            server,
            mask,
        };
        let records = [
            Record::Open(0),
            Record::Sent(a(0, 1)),
            Record::Ack(a(0, 1)),
            Record::Sent(a(0, 2)), // failed after retries: the next push of server 0 follows
            Record::Sent(a(1, 4)),
            Record::Sent(a(0, 3)),
            Record::Ack(a(0, 3)),
            Record::Open(1), // the auditor was killed with server 1's push in flight
            Record::Sent(a(1, 5)),
            Record::Ack(a(1, 5)),
            Record::Sent(a(0, 6)), // in flight at the end
        ];
        assert_eq!(unacknowledged(2, &records), vec![a(0, 2), a(1, 4), a(0, 6)]);
    }

    #[test]
    fn lost_and_duplicates_are_counted_per_row() {
        let rows = AuditRows::new(2, 2).unwrap();
        let ack = |server, mask| Ack {
            t_ms: 0,
            server,
            mask,
        };
        let acks = [ack(0, 0b11), ack(0, 0b01), ack(1, 0b10)];
        assert_eq!(tally(&rows, &acks, |_| true), vec![vec![2, 1], vec![0, 1]]);
        // Row (0,0): 2 acked, 1 found -> 1 lost; row (1,0): 0 acked, 2 found -> 2 duplicates.
        let v = compare(&rows, &acks, &[], &[vec![1.0, 1.0], vec![2.0, 1.0]]);
        assert_eq!((v.lost_acked, v.duplicates, v.non_integral), (1, 2, 0));
        // One push naming row (1,0) was sent and never acknowledged: one of its two extra increments is that
        // push, the other a duplicate.
        let v = compare(
            &rows,
            &acks,
            &[ack(1, 0b01)],
            &[vec![1.0, 1.0], vec![2.0, 1.0]],
        );
        assert_eq!(
            (v.duplicates, v.unacked_applied, v.unacked_pushes),
            (1, 1, 1)
        );
        assert_eq!((v.acked_increments, v.found_increments), (4, 5));
        let v = compare(&rows, &acks, &[], &[vec![2.0, 1.5], vec![0.0, 1.0]]);
        assert_eq!(v.non_integral, 1);
        assert!(v.line().contains("lost_acked_updates=0"), "{}", v.line());
        assert!(v.line().contains("max_pause_s=0.000 "), "{}", v.line());
        let v = Verdict {
            max_pause: Some(Pause {
                seconds: 1.25,
                server: 1,
                from_ms: 1000,
                to_ms: 2250,
            }),
            ..v
        };
        assert!(
            v.line().ends_with("unacked_pushes=0 unacked_applied=0"),
            "{}",
            v.line()
        );
        // chaos.sh reads these three, in this order.
        assert!(
            v.line()
                .contains("lost_acked_updates=0 duplicates=1 max_pause_s=1.250 max_pause_server=1"),
            "{}",
            v.line()
        );
    }
}
