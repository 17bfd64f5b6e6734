//! The push stage's encoder: a thread of its own that turns a computed batch's summed embedding gradients
//! into push requests (per-table encoding with error feedback), so that work runs beside the next batch's
//! compute instead of between two computes.
//!
//! Jobs are encoded strictly in submission order (one thread, one FIFO queue), which error feedback needs: a
//! row's residual from batch `t` must be added to its push of batch `t + 1`. The training loop sums the
//! gradients per unique id itself ([`PushEncoder::record`]: it keeps the last few sums to replay on stale
//! rows, [`crate::step::replay`]) and hands the shared [`PushRecord`] over; when the record is dropped the plan goes
//! back to the plan stage and the gradient buffers to a pool, so steady state allocates neither.
//!
//! The residual store lives behind a mutex shared with the trainer, which locks it only between passes and
//! for checkpoints (when no job is queued); the encoder takes it once per batch.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use protocol::compression::feedback::ResidualStore;
use tokio::sync::oneshot;

use protocol::plan::{PartRequest, Plan, PushScratch, TableCodecs};

/// A batch's push, encoded.
pub struct EncodedPush {
    /// One request per (server, encoding).
    pub requests: Vec<PartRequest>,
    /// Unique rows pushed.
    pub rows: u64,
    /// Payload bytes.
    pub bytes: u64,
}

/// A computed batch's push before encoding: its plan and its gradients summed per unique id. Shared between
/// the encoder and the training loop, which keeps the last few to replay on stale pulled rows
/// ([`crate::step::replay`]); when the last holder drops it, the plan goes back to the plan stage and the gradient
/// buffers back to the encoder's pool.
pub struct PushRecord {
    /// The batch's plan.
    pub plan: Plan,
    /// `grads[t]`: table `t`'s gradients summed per unique id (`[unique_t x dim]`), multiplied by `scale`.
    pub grads: Vec<Vec<f32>>,
    /// The loss scale the gradients carry (the servers divide it out).
    pub scale: f32,
    recycle: Sender<Plan>,
    pool: Sender<TableRows>,
}

impl Drop for PushRecord {
    fn drop(&mut self) {
        let _ = self.recycle.send(std::mem::take(&mut self.plan));
        let _ = self.pool.send(std::mem::take(&mut self.grads));
    }
}

/// Rows of every table (`[t][unique_t x dim]`).
type TableRows = Vec<Vec<f32>>;

/// The encoder thread and its queues.
pub struct PushEncoder {
    jobs: Option<Sender<(Arc<PushRecord>, oneshot::Sender<EncodedPush>)>>,
    recycle: Sender<Plan>,
    pool: (Sender<TableRows>, Receiver<TableRows>),
    thread: Option<JoinHandle<()>>,
    /// Nanoseconds the encoder thread worked.
    busy: Arc<AtomicU64>,
}

/// Residual store shared between the trainer and its push encoder.
pub type SharedResiduals = Arc<Mutex<Option<ResidualStore>>>;

impl PushEncoder {
    /// Starts the encoder for `codecs`, with error feedback through `residuals`; finished plans go to
    /// `recycle`.
    pub fn spawn(
        codecs: TableCodecs,
        residuals: SharedResiduals,
        recycle: Sender<Plan>,
    ) -> std::io::Result<PushEncoder> {
        let (jobs, rx) = crossbeam_channel::unbounded::<(Arc<PushRecord>, oneshot::Sender<_>)>();
        let busy = Arc::new(AtomicU64::new(0));
        let thread_busy = busy.clone();
        let thread = std::thread::Builder::new()
            .name("trainer-push".into())
            .spawn(move || {
                crate::helpers::helper_thread();
                let mut scratch = PushScratch::default();
                for (record, reply) in rx {
                    let started = Instant::now();
                    let requests = {
                        // A poisoned lock means a panic elsewhere already failed the pass.
                        let mut store = residuals.lock().unwrap_or_else(|p| p.into_inner());
                        record.plan.push_requests(
                            &codecs,
                            &record.grads,
                            record.scale,
                            store.as_mut(),
                            &mut scratch,
                        )
                    };
                    drop(record);
                    let rows = requests
                        .iter()
                        .flat_map(|r| &r.counts)
                        .map(|c| c.count as u64)
                        .sum();
                    let bytes = requests.iter().map(|r| r.payload.len() as u64).sum();
                    crate::timing::add_busy(&thread_busy, started);
                    let _ = reply.send(EncodedPush {
                        requests,
                        rows,
                        bytes,
                    });
                }
            })?;
        Ok(PushEncoder {
            jobs: Some(jobs),
            recycle,
            pool: crossbeam_channel::unbounded(),
            thread: Some(thread),
            busy,
        })
    }

    /// The encoder thread's busy counter (nanoseconds).
    pub fn busy_nanos(&self) -> Arc<AtomicU64> {
        self.busy.clone()
    }

    /// Sums a computed batch's embedding gradients (`[batch x tables x dim]`, as the model wrote them) per
    /// unique id of its plan, multiplied by the loss scale, into a record for [`PushEncoder::submit`] (and
    /// for replay). Runs on the caller's thread, with a gradient buffer from the pool.
    pub fn record(&self, plan: Plan, emb_grad: &[f32], scale: f32) -> Arc<PushRecord> {
        let mut grads = self.pool.1.try_recv().unwrap_or_default();
        plan.reduce_gradients(emb_grad, scale, &mut grads);
        Arc::new(PushRecord {
            plan,
            grads,
            scale,
            recycle: self.recycle.clone(),
            pool: self.pool.0.clone(),
        })
    }

    /// Queues a batch's push. The receiver yields the requests once encoded (jobs are encoded in submission
    /// order); it fails only if the encoder thread is gone (it panicked).
    pub fn submit(&self, record: Arc<PushRecord>) -> oneshot::Receiver<EncodedPush> {
        let (reply, rx) = oneshot::channel();
        if let Some(jobs) = &self.jobs {
            // If the thread is gone the job is dropped with its reply sender, and the receiver says so.
            let _ = jobs.send((record, reply));
        }
        rx
    }
}

impl Drop for PushEncoder {
    fn drop(&mut self) {
        // Closing the queue ends the thread after the jobs already queued.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::compression::feedback::FeedbackConfig;
    use protocol::{Encoding, ShardMap};

    fn plan(ids: &[u64], tables: usize) -> Plan {
        let mut p = Plan::default();
        let sparse: Vec<Vec<u64>> = (0..tables as u64)
            .map(|t| {
                ids.iter()
                    .map(|&i| protocol::routing::mix64(i * 31 + t))
                    .collect()
            })
            .collect();
        p.build(&sparse, 2, &ShardMap::new(2));
        p
    }

    /// The threaded encoder gives the bytes of encoding inline, batch after batch (error feedback included),
    /// and records hand their plans back when dropped.
    #[test]
    fn encodes_like_the_inline_path_in_order() {
        let codecs = TableCodecs::uniform(3, Encoding::F16, Encoding::Int8);
        let cfg = FeedbackConfig::default();
        let shared: SharedResiduals = Arc::new(Mutex::new(Some(ResidualStore::new(2, cfg))));
        let mut inline_store = ResidualStore::new(2, cfg);
        let (recycle, recycled) = crossbeam_channel::unbounded();
        let enc = PushEncoder::spawn(codecs.clone(), shared.clone(), recycle).unwrap();
        let batches: Vec<Vec<u64>> = (0..6)
            .map(|b| (0..5).map(|i| (i * 3 + b) % 7).collect())
            .collect();
        let mut pending = Vec::new();
        let mut expected = Vec::new();
        for (b, ids) in batches.iter().enumerate() {
            let grad: Vec<f32> = (0..ids.len() * 3 * 2)
                .map(|i| ((i + b) as f32 * 0.37).sin() * 1e-3)
                .collect();
            let p = plan(ids, 3);
            let mut grads = Vec::new();
            p.reduce_gradients(&grad, 5.0, &mut grads);
            let mut scratch = PushScratch::default();
            expected.push(p.push_requests(
                &codecs,
                &grads,
                5.0,
                Some(&mut inline_store),
                &mut scratch,
            ));
            let record = enc.record(plan(ids, 3), &grad, 5.0);
            assert_eq!(record.grads, grads);
            pending.push(enc.submit(record));
        }
        for (rx, want) in pending.into_iter().zip(expected) {
            let got = rx.blocking_recv().unwrap();
            assert_eq!(got.requests.len(), want.len());
            for (g, w) in got.requests.iter().zip(&want) {
                assert_eq!(
                    (g.server, g.encoding, &g.counts, &g.payload),
                    (w.server, w.encoding, &w.counts, &w.payload)
                );
            }
        }
        drop(enc);
        assert_eq!(recycled.try_iter().count(), 6);
        let store = shared.lock().unwrap();
        assert_eq!(store.as_ref().unwrap().export(), inline_store.export());
    }
}
