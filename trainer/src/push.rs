//! The push stage's encoder: a thread of its own that turns a computed batch's embedding gradients into push
//! requests (sum per unique id, loss scale, per-table encoding with error feedback), so that work runs beside
//! the next batch's compute instead of between two computes.
//!
//! Jobs are encoded strictly in submission order (one thread, one FIFO queue), which error feedback needs: a
//! row's residual from batch `t` must be added to its push of batch `t + 1`. The training loop hands over the
//! batch's plan and gradient buffer; the plan goes back to the plan stage for reuse and the buffer back to the
//! loop ([`PushEncoder::buffer`]), so steady state allocates neither.
//!
//! The residual store lives behind a mutex shared with the trainer, which locks it only between passes and
//! for checkpoints (when no job is queued); the encoder takes it once per batch.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use protocol::feedback::ResidualStore;
use tokio::sync::oneshot;

use crate::plan::{PartRequest, Plan, TableCodecs};

/// A batch's push, encoded.
pub struct EncodedPush {
    /// One request per (server, encoding).
    pub requests: Vec<PartRequest>,
    /// Unique rows pushed.
    pub rows: u64,
    /// Payload bytes.
    pub bytes: u64,
}

struct Job {
    plan: Plan,
    emb_grad: Vec<f32>,
    scale: f32,
    reply: oneshot::Sender<EncodedPush>,
}

/// The encoder thread and its queues.
pub struct PushEncoder {
    jobs: Option<Sender<Job>>,
    buffers: Receiver<Vec<f32>>,
    thread: Option<JoinHandle<()>>,
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
        let (jobs, rx) = crossbeam_channel::unbounded::<Job>();
        let (buf_tx, buffers) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("trainer-push".into())
            .spawn(move || {
                let mut grads: Vec<Vec<f32>> = Vec::new();
                for job in rx {
                    let Job {
                        mut plan,
                        emb_grad,
                        scale,
                        reply,
                    } = job;
                    plan.reduce_gradients(&emb_grad, scale, &mut grads);
                    let _ = buf_tx.send(emb_grad);
                    let requests = {
                        // A poisoned lock means a panic elsewhere already failed the pass.
                        let mut store = residuals.lock().unwrap_or_else(|p| p.into_inner());
                        plan.push_requests(&codecs, &grads, scale, store.as_mut())
                    };
                    let rows = requests
                        .iter()
                        .flat_map(|r| &r.counts)
                        .map(|c| c.count as u64)
                        .sum();
                    let bytes = requests.iter().map(|r| r.payload.len() as u64).sum();
                    let _ = recycle.send(plan);
                    let _ = reply.send(EncodedPush {
                        requests,
                        rows,
                        bytes,
                    });
                }
            })?;
        Ok(PushEncoder {
            jobs: Some(jobs),
            buffers,
            thread: Some(thread),
        })
    }

    /// Queues a batch's push: its plan, its embedding gradients (`[batch x tables x dim]`, as the model wrote
    /// them) and the loss scale. The receiver yields the requests once encoded; it fails only if the encoder
    /// thread is gone (it panicked).
    pub fn submit(
        &self,
        plan: Plan,
        emb_grad: Vec<f32>,
        scale: f32,
    ) -> oneshot::Receiver<EncodedPush> {
        let (reply, rx) = oneshot::channel();
        if let Some(jobs) = &self.jobs {
            // If the thread is gone the job is dropped with its reply sender, and the receiver says so.
            let _ = jobs.send(Job {
                plan,
                emb_grad,
                scale,
                reply,
            });
        }
        rx
    }

    /// A gradient buffer to compute the next batch into: one the encoder is done with, or a new one.
    pub fn buffer(&self) -> Vec<f32> {
        self.buffers.try_recv().unwrap_or_default()
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
    use protocol::feedback::FeedbackConfig;
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
    /// and hands plans and buffers back.
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
            let mut p = plan(ids, 3);
            let mut grads = Vec::new();
            p.reduce_gradients(&grad, 5.0, &mut grads);
            expected.push(p.push_requests(&codecs, &grads, 5.0, Some(&mut inline_store)));
            let mut buf = enc.buffer();
            buf.clear();
            buf.extend_from_slice(&grad);
            pending.push(enc.submit(plan(ids, 3), buf, 5.0));
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
