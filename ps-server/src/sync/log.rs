//! [`ChangeLog`]: which rows pushes changed, cut into numbered deltas, and which ids a subscriber at a cursor
//! needs next. Sans-IO: times come in as Unix microseconds, values are not here (the shard gathers them).
//!
//! # Recording
//! A push appends the ids of each table it changed to a pending list, all tables under one lock taken once per
//! push ([`ChangeLog::record`]): no per-row lock or allocation (a table's list grows by doubling and is handed
//! over whole at the cut). Ids repeat across pushes; the cut sorts and deduplicates them.
//!
//! # Cutting
//! [`ChangeLog::cut`] takes the pending lists (a swap under the pending lock, so pushes wait only for that),
//! sorts and deduplicates them per table, and appends the delta with the next `seq`. Deltas are kept, oldest
//! dropped first, while they hold more than `retain_rows` ids in total (the newest is always kept). Cuts are
//! serialized, so seqs are appended in order.
//!
//! # Planning an answer
//! [`ChangeLog::plan`] turns a cursor into the ids to send: the union of the retained deltas after the
//! cursor's seq (a k-way merge of their sorted lists, from where the previous page stopped), or
//! [`Plan::UpToDate`], or [`Plan::Scan`] when the cursor is of another incarnation or its deltas were dropped.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use protocol::wire::dense::DENSE_TABLE;
use protocol::wire::message::sync::{SyncCursor, SyncResume};

/// Ids of one table.
type TableIds = (u32, Vec<u64>);

/// One cut: the rows changed between two cuts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    /// 1, 2, ... in cut order.
    pub seq: u64,
    /// When it was cut, Unix microseconds.
    pub cut_us: u64,
    /// When the oldest change in it was recorded, Unix microseconds.
    pub oldest_us: u64,
    /// Per table (ascending table ids), the ascending unique ids changed.
    pub tables: Vec<TableIds>,
}

impl Delta {
    /// Ids over all tables.
    pub fn ids(&self) -> usize {
        self.tables.iter().map(|(_, ids)| ids.len()).sum()
    }

    fn table(&self, table: u32) -> &[u64] {
        self.tables
            .binary_search_by_key(&table, |(t, _)| *t)
            .map_or(&[], |i| &self.tables[i].1)
    }
}

#[derive(Debug, Default)]
struct Pending {
    /// Per table, the ids recorded since the last cut (unsorted, repeated).
    tables: Vec<TableIds>,
    /// When the first of them was recorded (0: none yet).
    oldest_us: u64,
}

#[derive(Debug, Default)]
struct Retained {
    /// Oldest first; seqs contiguous, ending at `newest`.
    deltas: VecDeque<Arc<Delta>>,
    /// The newest seq cut (0: none).
    newest: u64,
    /// The seq of the newest delta dropped (0: none): cursors below it cannot be answered with deltas.
    floor: u64,
    /// Ids in `deltas`.
    ids: usize,
}

/// Where a page is to come from, as [`ChangeLog::plan`] decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing after the cursor: wait for the next cut, or answer without rows.
    UpToDate,
    /// The ids of a page of deltas and what to answer with them.
    Deltas(DeltaPage),
    /// A full scan: from `resume` (`None`: the start), its deltas continuing from seq `base`.
    Scan {
        /// The newest seq when the scan began.
        base: u64,
        /// Where the previous page stopped.
        resume: Option<(u32, Option<u64>)>,
    },
}

/// A page of the union of deltas `from + 1 ..= upto`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaPage {
    /// Per table (ascending), the ascending ids of this page.
    pub tables: Vec<TableIds>,
    /// The cursor's seq (the union starts after it).
    pub from: u64,
    /// The newest delta of the union.
    pub upto: u64,
    /// Whether the union is exhausted with this page.
    pub complete: bool,
    /// The oldest change in the union, Unix microseconds.
    pub oldest_us: u64,
    /// Cut time of delta `upto`, Unix microseconds.
    pub cut_us: u64,
}

/// The changes of one server (module docs).
#[derive(Debug)]
pub struct ChangeLog {
    retain_rows: usize,
    pending: Mutex<Pending>,
    retained: RwLock<Retained>,
    /// Serializes cuts (module docs, "Cutting").
    cutting: Mutex<()>,
}

impl ChangeLog {
    /// An empty log keeping deltas of up to `retain_rows` ids in total.
    pub fn new(retain_rows: usize) -> ChangeLog {
        ChangeLog {
            retain_rows,
            pending: Mutex::default(),
            retained: RwLock::default(),
            cutting: Mutex::new(()),
        }
    }

    /// Records that a push at `now_us` changed the rows of `parts` (table, ids); the dense table is left out
    /// (serving gets dense parameters by [`protocol::Request::PublishDense`]). One lock for the whole push.
    pub fn record<'a>(&self, parts: impl IntoIterator<Item = (u32, &'a [u64])>, now_us: u64) {
        let mut p = self.pending.lock();
        for (table, ids) in parts {
            if table == DENSE_TABLE || ids.is_empty() {
                continue;
            }
            if p.oldest_us == 0 {
                p.oldest_us = now_us.max(1);
            }
            match p.tables.iter_mut().find(|(t, _)| *t == table) {
                Some((_, list)) => list.extend_from_slice(ids),
                None => p.tables.push((table, ids.to_vec())),
            }
        }
    }

    /// Cuts a delta of everything recorded since the last cut, at `now_us`, and returns it (`None`, and no
    /// seq used, when nothing was recorded).
    pub fn cut(&self, now_us: u64) -> Option<Arc<Delta>> {
        let _one = self.cutting.lock();
        let Pending { tables, oldest_us } = std::mem::take(&mut *self.pending.lock());
        let mut tables: Vec<TableIds> = tables
            .into_iter()
            .filter(|(_, ids)| !ids.is_empty())
            .map(|(t, mut ids)| {
                ids.sort_unstable();
                ids.dedup();
                ids.shrink_to_fit();
                (t, ids)
            })
            .collect();
        if tables.is_empty() {
            return None;
        }
        tables.sort_unstable_by_key(|(t, _)| *t);
        let mut r = self.retained.write();
        let delta = Arc::new(Delta {
            seq: r.newest + 1,
            cut_us: now_us,
            oldest_us: oldest_us.min(now_us),
            tables,
        });
        r.newest = delta.seq;
        r.ids += delta.ids();
        r.deltas.push_back(delta.clone());
        while r.ids > self.retain_rows && r.deltas.len() > 1 {
            let old = r.deltas.pop_front().expect("more than one");
            r.ids -= old.ids();
            r.floor = old.seq;
        }
        Some(delta)
    }

    /// The newest seq cut (0: none).
    pub fn newest(&self) -> u64 {
        self.retained.read().newest
    }

    /// Ids in the retained deltas.
    pub fn retained_ids(&self) -> usize {
        self.retained.read().ids
    }

    /// Decides what a subscriber at `cursor` of this server's `incarnation` gets next: at most `max_rows`
    /// ids of a delta page, and no more rows than `max_bytes` allows at `row_bytes(table)` bytes a row (at
    /// least one row, so a page always moves on).
    pub fn plan(
        &self,
        incarnation: u64,
        cursor: &SyncCursor,
        max_rows: usize,
        max_bytes: usize,
        row_bytes: &dyn Fn(u32) -> usize,
    ) -> Plan {
        let r = self.retained.read();
        if cursor.incarnation != incarnation {
            return Plan::Scan {
                base: r.newest,
                resume: None,
            };
        }
        let (upto, start) = match cursor.resume {
            Some(SyncResume::Scan { table, after }) => {
                return Plan::Scan {
                    base: cursor.seq,
                    resume: Some((table, after)),
                }
            }
            Some(SyncResume::Deltas { upto, table, after }) => (upto, Some((table, after))),
            None => (r.newest, None),
        };
        if cursor.seq > upto || upto > r.newest || cursor.seq < r.floor {
            // Trimmed (or a cursor this incarnation never answered): start over.
            return Plan::Scan {
                base: r.newest,
                resume: None,
            };
        }
        if cursor.seq == upto {
            return Plan::UpToDate;
        }
        let deltas: Vec<&Delta> = r
            .deltas
            .iter()
            .filter(|d| d.seq > cursor.seq && d.seq <= upto)
            .map(|d| &**d)
            .collect();
        let mut page = DeltaPage {
            tables: Vec::new(),
            from: cursor.seq,
            upto,
            complete: true,
            oldest_us: deltas.iter().map(|d| d.oldest_us).min().unwrap_or(0),
            cut_us: deltas.last().map_or(0, |d| d.cut_us),
        };
        let mut tables: Vec<u32> = deltas
            .iter()
            .flat_map(|d| d.tables.iter().map(|(t, _)| *t))
            .filter(|&t| start.is_none_or(|(st, _)| t >= st))
            .collect();
        tables.sort_unstable();
        tables.dedup();
        let (mut rows, mut bytes) = (0usize, 0usize);
        for table in tables {
            let after = start.and_then(|(st, a)| (st == table).then_some(a));
            let cost = row_bytes(table).max(1);
            let lists: Vec<&[u64]> = deltas
                .iter()
                .map(|d| {
                    let ids = d.table(table);
                    &ids[after.map_or(0, |a| ids.partition_point(|&id| id <= a))..]
                })
                .filter(|ids| !ids.is_empty())
                .collect();
            let room = |rows: usize, bytes: usize| {
                rows < max_rows && (rows == 0 || bytes + cost <= max_bytes)
            };
            let mut ids = Vec::new();
            let exhausted = merge_unique(&lists, &mut ids, |_| {
                let ok = room(rows, bytes);
                if ok {
                    rows += 1;
                    bytes += cost;
                }
                ok
            });
            if !ids.is_empty() {
                page.tables.push((table, ids));
            }
            if !exhausted {
                page.complete = false;
                break;
            }
        }
        Plan::Deltas(page)
    }
}

/// Merges sorted `lists` into `out` ascending without repeats, while `take(id)` agrees; returns whether every
/// id was taken.
fn merge_unique(lists: &[&[u64]], out: &mut Vec<u64>, mut take: impl FnMut(u64) -> bool) -> bool {
    let mut heap: BinaryHeap<Reverse<(u64, usize, usize)>> = lists
        .iter()
        .enumerate()
        .map(|(i, l)| Reverse((l[0], i, 0)))
        .collect();
    while let Some(Reverse((id, i, at))) = heap.pop() {
        if out.last() != Some(&id) {
            if !take(id) {
                return false;
            }
            out.push(id);
        }
        if let Some(&next) = lists[i].get(at + 1) {
            heap.push(Reverse((next, i, at + 1)));
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const INC: u64 = 99;

    fn cursor(seq: u64, resume: Option<SyncResume>) -> SyncCursor {
        SyncCursor {
            incarnation: INC,
            seq,
            resume,
        }
    }

    fn plan(log: &ChangeLog, c: &SyncCursor, max_rows: usize) -> Plan {
        log.plan(INC, c, max_rows, usize::MAX, &|_| 4)
    }

    #[test]
    fn cuts_sort_dedup_and_skip_the_dense_table() {
        let log = ChangeLog::new(100);
        assert!(log.cut(5).is_none(), "nothing recorded, no seq used");
        log.record([(2, &[9u64, 3][..]), (DENSE_TABLE, &[1][..])], 10);
        log.record([(1, &[4u64][..]), (2, &[3u64, 7][..])], 20);
        let d = log.cut(30).unwrap();
        assert_eq!(
            *d,
            Delta {
                seq: 1,
                cut_us: 30,
                oldest_us: 10,
                tables: vec![(1, vec![4]), (2, vec![3, 7, 9])],
            }
        );
        log.record([(1, &[5u64][..])], 40);
        assert_eq!(log.cut(50).unwrap().seq, 2);
        assert_eq!((log.newest(), log.retained_ids()), (2, 5));
    }

    #[test]
    fn a_cursor_gets_the_union_after_it_then_is_up_to_date() {
        let log = ChangeLog::new(100);
        log.record([(1, &[4u64, 8][..])], 10);
        log.cut(20);
        log.record([(1, &[8u64, 2][..]), (3, &[1u64][..])], 30);
        log.cut(40);
        let Plan::Deltas(p) = plan(&log, &cursor(0, None), 10) else {
            panic!()
        };
        assert_eq!(p.tables, vec![(1, vec![2, 4, 8]), (3, vec![1])]);
        assert_eq!(
            (p.from, p.upto, p.complete, p.oldest_us, p.cut_us),
            (0, 2, true, 10, 40)
        );
        let Plan::Deltas(p) = plan(&log, &cursor(1, None), 10) else {
            panic!()
        };
        assert_eq!(p.tables, vec![(1, vec![2, 8]), (3, vec![1])]);
        assert_eq!(plan(&log, &cursor(2, None), 10), Plan::UpToDate);
        // Another incarnation, or a seq this one never cut: a scan from the newest seq.
        let other = SyncCursor {
            incarnation: 1,
            ..cursor(2, None)
        };
        assert_eq!(
            plan(&log, &other, 10),
            Plan::Scan {
                base: 2,
                resume: None
            }
        );
        assert!(matches!(
            plan(&log, &cursor(3, None), 10),
            Plan::Scan { .. }
        ));
    }

    #[test]
    fn pages_resume_where_they_stopped_and_ignore_later_cuts() {
        let log = ChangeLog::new(100);
        log.record([(1, &[1u64, 2, 3][..]), (2, &[5u64, 6][..])], 10);
        log.cut(20);
        let mut c = cursor(0, None);
        let mut got = Vec::new();
        loop {
            let Plan::Deltas(p) = plan(&log, &c, 2) else {
                panic!()
            };
            // A cut between pages is not in this union.
            log.record([(1, &[0u64][..])], 30);
            log.cut(40);
            let last = p.tables.last().map(|(t, ids)| (*t, *ids.last().unwrap()));
            got.extend(p.tables);
            if p.complete {
                break;
            }
            let (table, after) = last.unwrap();
            c.resume = Some(SyncResume::Deltas {
                upto: p.upto,
                table,
                after,
            });
        }
        assert_eq!(
            got,
            vec![(1, vec![1, 2]), (1, vec![3]), (2, vec![5]), (2, vec![6])]
        );
    }

    #[test]
    fn byte_budget_bounds_a_page_but_always_sends_a_row() {
        let log = ChangeLog::new(100);
        log.record([(1, &[1u64, 2, 3][..])], 10);
        log.cut(20);
        let Plan::Deltas(p) = log.plan(INC, &cursor(0, None), 10, 10, &|_| 4) else {
            panic!()
        };
        assert_eq!((p.tables, p.complete), (vec![(1, vec![1, 2])], false));
        let Plan::Deltas(p) = log.plan(INC, &cursor(0, None), 10, 1, &|_| 4) else {
            panic!()
        };
        assert_eq!(p.tables, vec![(1, vec![1])]);
    }

    #[test]
    fn retention_drops_the_oldest_and_trimmed_cursors_scan() {
        let log = ChangeLog::new(3);
        for (i, ids) in [&[1u64, 2][..], &[3, 4][..], &[5, 6, 7, 8][..]]
            .into_iter()
            .enumerate()
        {
            log.record([(1, ids)], i as u64);
            log.cut(i as u64 + 1);
        }
        // The newest delta stays even over the limit.
        assert_eq!((log.newest(), log.retained_ids()), (3, 4));
        assert!(matches!(
            plan(&log, &cursor(1, None), 10),
            Plan::Scan { base: 3, .. }
        ));
        let Plan::Deltas(p) = plan(&log, &cursor(2, None), 10) else {
            panic!()
        };
        assert_eq!(p.tables, vec![(1, vec![5, 6, 7, 8])]);
    }

    #[test]
    fn merge_unique_stops_when_told() {
        let (a, b) = ([1u64, 3, 5], [1u64, 2, 5, 9]);
        let mut out = Vec::new();
        assert!(merge_unique(&[&a, &b], &mut out, |_| true));
        assert_eq!(out, [1, 2, 3, 5, 9]);
        out.clear();
        let mut n = 0;
        assert!(!merge_unique(&[&a, &b], &mut out, |_| {
            n += 1;
            n <= 3
        }));
        assert_eq!(out, [1, 2, 3]);
    }
}
