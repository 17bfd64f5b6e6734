//! The first two stages of the training pipeline, each on a thread of its own behind a bounded queue:
//! parse ([`BatchReader`]) -> plan (dedup ids per table, group by server: [`Plan::build`]; with a
//! [`Prefetcher`], each planned batch's ids are sent ahead to the servers, the queue's depth ahead of its pull). The training loop
//! ([`crate::train`]) takes planned batches from here and runs the remaining stages: pull (up to `k` batches
//! ahead of compute), compute, push (asynchronous).
//!
//! Plans are recycled: the loop hands a finished batch's plan back ([`PlanStage::recycle`]) so that steady
//! state allocates no plan buffers. To resume at a data position, the stage discards the first `skip` batches
//! unplanned (the reader cannot seek inside text or compressed files, so they are parsed and dropped).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use protocol::ShardMap;

use crate::criteo::{Batch, BatchReader, ReadError, ReadStats};
use crate::step::prefetch::Prefetcher;
use protocol::plan::{Plan, SparseLayout};

/// A parsed and planned batch.
pub struct Planned {
    /// The batch's index in this rank's data (counting skipped batches).
    pub index: u64,
    /// The rows.
    pub batch: Batch,
    /// Its plan.
    pub plan: Plan,
}

/// The plan stage: a thread turning the reader's batches into [`Planned`] batches.
pub struct PlanStage {
    rx: Option<Receiver<Result<Planned, ReadError>>>,
    recycle: Sender<Plan>,
    thread: Option<JoinHandle<ReadStats>>,
    /// Nanoseconds the plan thread worked (planning and prefetch requests, not waiting).
    busy: Arc<AtomicU64>,
    /// Nanoseconds the reader thread worked.
    reader_busy: Arc<AtomicU64>,
}

impl PlanStage {
    /// Starts planning `reader`'s batches for rows of `dim` on the servers of `map()` (asked for each batch,
    /// so batches planned after a live reshard go to the new servers), at most `depth` planned
    /// batches waiting (at least 1), after discarding the first `skip` batches. An empty batch ends the data.
    /// With `prefetch`, each planned batch is prefetched under its index in the pass (skipped batches not
    /// counted).
    pub fn spawn<D: protocol::transport::Dialer>(
        reader: BatchReader,
        layout: SparseLayout,
        map: impl Fn() -> ShardMap + Send + 'static,
        depth: usize,
        skip: u64,
        prefetch: Option<std::sync::Arc<Prefetcher<D>>>,
    ) -> std::io::Result<PlanStage> {
        let (tx, rx) = crossbeam_channel::bounded(depth.max(1));
        let (recycle, recycled) = crossbeam_channel::unbounded::<Plan>();
        let busy = Arc::new(AtomicU64::new(0));
        let reader_busy = reader.busy_nanos();
        let thread_busy = busy.clone();
        let thread = std::thread::Builder::new()
            .name("trainer-plan".into())
            .spawn(move || {
                crate::helpers::helper_thread();
                let mut reader = reader;
                for (index, item) in (0u64..).zip(reader.by_ref()) {
                    let item = match item {
                        Ok(b) if b.len == 0 => break,
                        Ok(_) if index < skip => continue,
                        Ok(batch) => {
                            let started = Instant::now();
                            let mut plan = recycled.try_recv().unwrap_or_default();
                            plan.build_with(
                                &layout,
                                batch.len,
                                &batch.sparse,
                                &batch.offsets,
                                &map(),
                            );
                            if let Some(p) = &prefetch {
                                p.send(index - skip, &plan);
                            }
                            crate::timing::add_busy(&thread_busy, started);
                            Ok(Planned { index, batch, plan })
                        }
                        Err(e) => Err(e),
                    };
                    let failed = item.is_err();
                    if tx.send(item).is_err() || failed {
                        break;
                    }
                }
                reader.stats()
            })?;
        Ok(PlanStage {
            rx: Some(rx),
            recycle,
            thread: Some(thread),
            busy,
            reader_busy,
        })
    }

    /// The busy counters (nanoseconds) of the plan thread and of the reader thread, in that order.
    pub fn busy_nanos(&self) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
        (self.busy.clone(), self.reader_busy.clone())
    }

    /// The next planned batch (blocking), `None` at the end of the data.
    pub fn next_planned(&mut self) -> Option<Result<Planned, ReadError>> {
        let item = self.rx.as_ref()?.recv().ok();
        if item.is_none() {
            self.rx = None;
        }
        item
    }

    /// Like [`next_planned`](Self::next_planned) without waiting: `Pending` while the next batch is not
    /// planned yet (a stream's training loop computes the batch it has instead of waiting to fill its
    /// pull window).
    pub fn poll_planned(&mut self) -> std::task::Poll<Option<Result<Planned, ReadError>>> {
        use crossbeam_channel::TryRecvError;
        use std::task::Poll;
        let Some(rx) = self.rx.as_ref() else {
            return Poll::Ready(None);
        };
        match rx.try_recv() {
            Ok(item) => Poll::Ready(Some(item)),
            Err(TryRecvError::Empty) => Poll::Pending,
            Err(TryRecvError::Disconnected) => {
                self.rx = None;
                Poll::Ready(None)
            }
        }
    }

    /// A sender for handing finished plans back from another thread.
    pub fn recycler(&self) -> Sender<Plan> {
        self.recycle.clone()
    }

    /// Hands a finished batch's plan back for reuse.
    pub fn recycle(&self, plan: Plan) {
        let _ = self.recycle.send(plan);
    }

    /// Stops the stage (if not at the end yet) and returns the reader's counts.
    pub fn finish(mut self) -> ReadStats {
        self.rx = None;
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for PlanStage {
    fn drop(&mut self) {
        // Closing the queue wakes a thread blocked on a full queue; it then drops the reader, which stops.
        self.rx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criteo::ReaderConfig;

    fn lines(n: usize) -> String {
        (0..n)
            .map(|i| {
                let ints = vec![format!("{i}"); 13].join("\t");
                let cats = vec![format!("{:08x}", i % 5); 26].join("\t");
                format!("{}\t{ints}\t{cats}\n", i % 2)
            })
            .collect()
    }

    fn fixed(map: &ShardMap) -> impl Fn() -> ShardMap + Send + 'static {
        let map = map.clone();
        move || map.clone()
    }

    #[test]
    fn plans_every_batch_in_order_and_skips_a_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.tsv");
        std::fs::write(&path, lines(10)).unwrap();
        let map = ShardMap::new(2);
        let reader = BatchReader::spawn(ReaderConfig::new([&path], 3)).unwrap();
        let mut stage = PlanStage::spawn::<protocol::transport::NetDialer>(
            reader,
            SparseLayout::uniform(26, 4),
            fixed(&map),
            1,
            0,
            None,
        )
        .unwrap();
        let mut seen = Vec::new();
        while let Some(p) = stage.next_planned() {
            let p = p.unwrap();
            assert_eq!(p.plan.batch(), p.batch.len);
            assert_eq!(p.plan.tables(), 26);
            seen.push((p.index, p.batch.len));
            stage.recycle(p.plan);
        }
        assert_eq!(seen, [(0, 3), (1, 3), (2, 3), (3, 1)]);
        assert_eq!(stage.finish().rows, 10);

        let reader = BatchReader::spawn(ReaderConfig::new([&path], 3)).unwrap();
        let mut stage = PlanStage::spawn::<protocol::transport::NetDialer>(
            reader,
            SparseLayout::uniform(26, 4),
            fixed(&map),
            2,
            2,
            None,
        )
        .unwrap();
        let first = stage.next_planned().unwrap().unwrap();
        assert_eq!((first.index, first.batch.labels[0]), (2, 0.0));
        // Dropped early: the threads stop.
        drop(stage);
    }
}
