//! The longest pause of a shard as the auditor saw it: the longest gap, over servers (shards), between two
//! consecutive acknowledged pushes of that server in the log — how long a shard took no acknowledged write,
//! e.g. while its primary was killed and a backup took over (or a lone server restarted).
//!
//! The gaps are taken within one life of the auditor only: a gap that spans an `# open` marker (the auditor
//! was restarted, so its own downtime is in the gap) is not counted. Within a life the `# open` marker (written
//! once the auditor has connected and registered its table) and an orderly `# close` (every push in flight
//! finished) count as points of every server's timeline too, so a shard that takes no push from the auditor's
//! start, or none until its orderly stop, shows as a pause instead of vanishing. A log without markers (written
//! before they existed) is one life without those end points.

use serde::Serialize;

use super::log::Record;

/// The longest pause found.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pause {
    /// Its length in seconds.
    pub seconds: f64,
    /// The server (shard) it was on.
    pub server: usize,
    /// Start: the acknowledgement (or the auditor's start) before it, ms since the Unix epoch.
    pub from_ms: u64,
    /// End: the acknowledgement (or the auditor's orderly stop) after it, ms since the Unix epoch.
    pub to_ms: u64,
}

/// The longest gap over `servers` servers in `records` (in log order), or `None` if no server has two points in
/// one life of the auditor. Records of a server `>= servers` are ignored (the reader refuses them anyway).
pub fn max_pause(servers: usize, records: &[Record]) -> Option<Pause> {
    let mut last: Vec<Option<u64>> = vec![None; servers];
    let mut best: Option<Pause> = None;
    let mut gap = |server: usize, from_ms: u64, to_ms: u64| {
        let ms = to_ms.saturating_sub(from_ms);
        if best.is_none_or(|b| ms > b.to_ms.saturating_sub(b.from_ms)) {
            best = Some(Pause {
                seconds: ms as f64 / 1000.0,
                server,
                from_ms,
                to_ms,
            });
        }
    };
    for record in records {
        match *record {
            Record::Open(t) => last.iter_mut().for_each(|l| *l = Some(t)),
            Record::Close(t) => {
                for (s, l) in last.iter_mut().enumerate() {
                    if let Some(from) = l.take() {
                        gap(s, from, t);
                    }
                }
            }
            Record::Sent(_) => {}
            Record::Ack(a) => {
                let Some(l) = last.get_mut(a.server) else {
                    continue;
                };
                if let Some(from) = *l {
                    gap(a.server, from, a.t_ms);
                }
                *l = Some(a.t_ms);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Ack;

    fn ack(t_ms: u64, server: usize) -> Record {
        Record::Ack(Ack {
            t_ms,
            server,
            mask: 1,
        })
    }

    fn longest(servers: usize, records: &[Record]) -> Option<(u64, usize)> {
        max_pause(servers, records).map(|p| (p.to_ms - p.from_ms, p.server))
    }

    #[test]
    fn longest_gap_between_acks_of_one_server() {
        // Server 0 acks every 10 ms except one 700 ms hole; server 1 every 50 ms. The interleaving of the two
        // servers does not matter: gaps are per server.
        let records = [
            ack(1000, 0),
            ack(1005, 1),
            ack(1010, 0),
            ack(1055, 1),
            ack(1710, 0),
            ack(1105, 1),
            ack(1720, 0),
        ];
        assert_eq!(longest(2, &records), Some((700, 0)));
        let p = max_pause(2, &records).unwrap();
        assert_eq!((p.from_ms, p.to_ms), (1010, 1710));
        assert!((p.seconds - 0.7).abs() < 1e-9);
        // Server 1's gaps only.
        assert_eq!(longest(2, &records[1..4]), Some((50, 1)));
    }

    #[test]
    fn nothing_to_measure() {
        assert_eq!(longest(2, &[]), None);
        // One ack per server, no markers: no gap.
        assert_eq!(longest(2, &[ack(5, 0), ack(9, 1)]), None);
    }

    #[test]
    fn a_gap_across_a_restart_of_the_auditor_is_not_counted() {
        // Life 1: acks up to 1100, then the auditor is killed (no close marker); life 2 opens at 9000.
        let records = [
            Record::Open(1000),
            ack(1050, 0),
            ack(1100, 0),
            Record::Open(9000),
            ack(9020, 0),
            ack(9030, 0),
        ];
        // Gaps: 50 (open->1050), 50, then 20 (open->9020), 10; not 9020 - 1100.
        assert_eq!(longest(1, &records), Some((50, 0)));
    }

    #[test]
    fn open_and_close_bound_a_shard_that_took_no_push() {
        // Server 1 takes nothing in the whole life: open to close is its pause.
        let records = [
            Record::Open(1000),
            ack(1010, 0),
            ack(1020, 0),
            Record::Close(1400),
        ];
        assert_eq!(longest(2, &records), Some((400, 1)));
        // A shard stuck from its last ack to the orderly stop.
        let records = [
            Record::Open(1000),
            ack(1010, 0),
            ack(1020, 1),
            ack(1030, 0),
            ack(1040, 1),
            ack(1045, 0),
            Record::Close(2040),
        ];
        assert_eq!(longest(2, &records), Some((1000, 1)));
    }

    #[test]
    fn a_close_ends_the_life_and_old_logs_without_markers_are_one_life() {
        let records = [
            ack(100, 0),
            ack(300, 0),
            Record::Close(350),
            ack(5000, 0),
            ack(5010, 0),
        ];
        // 200 between the first acks, 50 to the close; the ack after the close starts a new timeline.
        assert_eq!(longest(1, &records), Some((200, 0)));
        // Out-of-range servers are ignored, not a panic.
        assert_eq!(longest(1, &[ack(1, 3), ack(2, 3)]), None);
    }
}
