//! The pull and push stages of the training loop: a batch's pulls behind the staleness gate, receiving and
//! replaying rows, and a batch's push (see the parent module's docs for the order they run in).

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use protocol::transport::Dialer;
use protocol::{Encoding, ProtocolError};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::{Result, TrainError, Trainer};
use crate::criteo::Batch;
use crate::metrics as m;
use crate::step::dense_sync::DenseSync;
use crate::step::exchange::{pull_all, pull_parts, push_all, PartReplies, Replies};
use crate::step::push::{PushEncoder, PushRecord};
use crate::step::replay::Push;
use crate::timing::{Phase, Stopwatch};
use protocol::plan::{PartReply, Plan};

/// A batch's pulled rows, dense rows, and when its staleness gate opened (`None` without a gate).
type PullResult = Result<(PartReplies, Option<Replies>, Option<Instant>), ProtocolError>;
pub(super) type PushResult = Result<(u64, u64)>;

/// A batch whose pulls are in flight.
pub(super) struct Stage {
    pub(super) batch: Batch,
    pub(super) plan: Plan,
    pub(super) pull: JoinHandle<PullResult>,
    /// The batch's index in the pass.
    pub(super) index: u64,
    /// The rows hold the pushes of the pass's batches `0..needed` (and none later, when replaying): its pull
    /// waited for them. `None` without a gate (evaluation).
    pub(super) needed: Option<u64>,
    /// Whether the rows were pulled with their optimizer state, to replay the pushes `needed..index` on them.
    pub(super) replay: bool,
    /// Turns true (or closes) once the pull is answered.
    pub(super) replied: watch::Receiver<bool>,
}

/// Acknowledged pushes of a pass as a prefix: the value is the `n` such that pushes `0..n` are all
/// acknowledged (pushes may complete out of order; a pull gated on `n` must hold every one of them).
pub(super) struct AckPrefix {
    done: Mutex<BTreeSet<u64>>,
    tx: watch::Sender<u64>,
}

impl AckPrefix {
    pub(super) fn new() -> (Arc<AckPrefix>, watch::Receiver<u64>) {
        let (tx, rx) = watch::channel(0);
        let done = Mutex::new(BTreeSet::new());
        (Arc::new(AckPrefix { done, tx }), rx)
    }

    /// Records push `j` (of the pass) as acknowledged.
    pub(super) fn ack(&self, j: u64) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        done.insert(j);
        self.tx.send_modify(|n| {
            while done.remove(n) {
                *n += 1;
            }
        });
    }
}

impl<D: Dialer> Trainer<D> {
    /// Sends a batch's pulls (embedding rows, and dense rows when they live on the servers). With a gate
    /// `(acked, index, k)`, the pulls of the pass's batch `index` wait until the pushes `0..index - k` are
    /// acknowledged; with `k > 0` and replay on, rows come with their optimizer state.
    pub(super) fn start(
        &mut self,
        batch: Batch,
        mut plan: Plan,
        gate: Option<(watch::Receiver<u64>, u64, u64)>,
    ) -> Stage {
        let requests = plan.pull_requests(&self.codecs);
        let dense_requests = self.dense.as_ref().map(DenseSync::pull_requests);
        let client = self.client.clone();
        let wire = self.wire.clone();
        let raw_bytes = plan.unique_values() as u64 * 4;
        let rows = plan.unique_ids() as u64;
        let index = gate.as_ref().map_or(0, |g| g.1);
        let needed = gate.as_ref().map(|g| g.1.saturating_sub(g.2));
        let replay = self.replayer.is_some() && needed.is_some_and(|n| n < index);
        let (replied_tx, replied) = watch::channel(false);
        let pull = tokio::spawn(async move {
            // Dropped when the task ends, which wakes pushes waiting for this answer even on failure.
            let _replied = replied_tx;
            let mut opened = None;
            if let Some((mut acked, index, k)) = gate {
                let needed = index.saturating_sub(k);
                // The counter's sender lives as long as the pass; if it is gone the pass is over anyway.
                let seen = acked.wait_for(|&n| n >= needed).await.map_or(index, |n| *n);
                // Earlier batches of the pass whose updates these rows may lack.
                metrics::histogram!(m::STALENESS_BATCHES).record(index.saturating_sub(seen) as f64);
                opened = Some(Instant::now());
            }
            let started = Instant::now();
            let dense = async {
                match dense_requests {
                    Some(r) => pull_all(&client, Encoding::F32, r).await.map(Some),
                    None => Ok(None),
                }
            };
            let (emb, dense) = tokio::try_join!(pull_parts(&client, requests, replay), dense)?;
            let received: usize = emb.iter().map(|(_, b)| b.rows.len() + b.state.len()).sum();
            if let Some(d) = &dense {
                let bytes: usize = d.iter().map(|(_, b)| b.len()).sum();
                metrics::counter!(m::DENSE_BYTES_RECEIVED_TOTAL).increment(bytes as u64);
            }
            metrics::histogram!(m::PULL_SECONDS).record(started.elapsed().as_secs_f64());
            metrics::counter!(m::ROWS_PULLED_TOTAL).increment(rows);
            metrics::counter!(m::WIRE_BYTES_RECEIVED_TOTAL).increment(received as u64);
            wire[1].fetch_add(received as u64, std::sync::atomic::Ordering::Relaxed);
            metrics::counter!(m::RAW_BYTES_RECEIVED_TOTAL).increment(raw_bytes);
            Ok((emb, dense, opened))
        });
        Stage {
            batch,
            plan,
            pull,
            index,
            needed,
            replay,
            replied,
        }
    }

    /// Waits for a stage's rows and lays them out as the model's input in `self.emb` (and sets the dense
    /// parameters when they come from the servers). Pushes of `in_flight` (by pass index) that the rows lack
    /// are replayed on them first. With `watch`, the wait is charged to [`Phase::PullWait`] (the part of it
    /// before the staleness gate opened to [`Phase::AckWait`]), the replay to [`Phase::Replay`] and the layout
    /// work to [`Phase::Gather`].
    pub(super) async fn receive(
        &mut self,
        stage: &mut Stage,
        in_flight: &VecDeque<(u64, Arc<PushRecord>)>,
        mut watch: Option<&mut Stopwatch>,
    ) -> Result<()> {
        let waiting = Instant::now();
        let (replies, dense, opened) = (&mut stage.pull)
            .await
            .map_err(|_| TrainError::Stopped("pull task"))?
            .map_err(TrainError::servers("pull embedding rows"))?;
        if let Some(w) = watch.as_deref_mut() {
            let waited = w.lap(Phase::PullWait).as_secs_f64();
            if let Some(opened) = opened {
                let gated = opened.saturating_duration_since(waiting).as_secs_f64();
                w.recharge(Phase::PullWait, Phase::AckWait, gated.min(waited));
            }
        }
        let parts: Vec<PartReply<'_>> = replies
            .iter()
            .map(|(i, reply)| PartReply {
                request: *i,
                rows: &reply.rows,
                state: stage
                    .replay
                    .then_some((&reply.state[..], &reply.state_lens[..])),
            })
            .collect();
        if let Err((k, e)) =
            stage
                .plan
                .scatter_replies(&parts, &mut self.unique_rows, &mut self.unique_state)
        {
            let s = stage.plan.part_server(parts[k].request);
            let from = format!("rows from server {}", self.client.addr(s));
            return Err(TrainError::servers(from)(e));
        }
        if let Some(w) = watch.as_deref_mut() {
            w.lap(Phase::Gather);
        }
        if let (true, Some(replayer), Some(needed)) =
            (stage.replay, &mut self.replayer, stage.needed)
        {
            let started = Instant::now();
            let pushes: Vec<Push<'_>> = in_flight
                .iter()
                .filter(|(j, _)| needed <= *j && *j < stage.index)
                .map(|(_, r)| Push {
                    plan: &r.plan,
                    grads: &r.grads,
                    scale: r.scale,
                })
                .collect();
            let rows = replayer.replay(
                &stage.plan,
                &mut self.unique_rows,
                &mut self.unique_state,
                &pushes,
            );
            metrics::counter!(m::ROWS_REPLAYED_TOTAL).increment(rows as u64);
            metrics::histogram!(m::REPLAY_SECONDS).record(started.elapsed().as_secs_f64());
            if let Some(w) = watch.as_deref_mut() {
                w.lap(Phase::Replay);
            }
        }
        stage
            .plan
            .gather_embeddings(&self.unique_rows, &mut self.emb);
        if let (Some(sync), Some(replies)) = (&mut self.dense, dense) {
            sync.apply_pulled(&replies, &mut self.model)?;
        }
        if let Some(w) = watch {
            w.lap(Phase::Gather);
        }
        Ok(())
    }

    /// Queues the batch's push on the encoder thread (the dense gradients, when they live on the servers, are
    /// taken here, before the next compute overwrites them); the future sends it once encoded and once every
    /// pull of `waits` is answered.
    pub(super) fn send_push(
        &mut self,
        encoder: &PushEncoder,
        record: Arc<PushRecord>,
        waits: Vec<watch::Receiver<bool>>,
    ) -> impl std::future::Future<Output = PushResult> {
        let scale = record.scale;
        // Every unique id is pushed: its id and its f32 gradient row, raw.
        let raw_bytes = (record.plan.unique_ids() * 8 + record.plan.unique_values() * 4) as u64;
        let encoded = encoder.submit(record);
        let dense: Vec<_> = match &mut self.dense {
            Some(dense) => dense
                .push_step(&self.model)
                .into_iter()
                .map(|(s, counts, payload)| (s, Encoding::F32, 1.0, counts, payload))
                .collect(),
            None => Vec::new(),
        };
        let dense_bytes: usize = dense.iter().map(|r| r.4.len()).sum();
        metrics::counter!(m::DENSE_BYTES_SENT_TOTAL).increment(dense_bytes as u64);
        let client = self.client.clone();
        let wire = self.wire.clone();
        async move {
            for mut w in waits {
                // An error means the pull task ended without answering: nothing to wait for.
                let _ = w.wait_for(|&answered| answered).await;
            }
            let encoded = encoded
                .await
                .map_err(|_| TrainError::Stopped("push encoder thread"))?;
            metrics::counter!(m::ROWS_PUSHED_TOTAL).increment(encoded.rows);
            metrics::counter!(m::WIRE_BYTES_SENT_TOTAL).increment(encoded.bytes);
            wire[0].fetch_add(encoded.bytes, std::sync::atomic::Ordering::Relaxed);
            metrics::counter!(m::RAW_BYTES_SENT_TOTAL).increment(raw_bytes);
            let mut requests: Vec<_> = encoded
                .requests
                .into_iter()
                .map(|p| {
                    (
                        p.server,
                        p.encoding,
                        scale,
                        p.counts,
                        Bytes::from(p.payload),
                    )
                })
                .collect();
            requests.extend(dense);
            let started = Instant::now();
            let done = push_all(&client, requests)
                .await
                .map_err(TrainError::servers("push gradients"))?;
            metrics::histogram!(m::PUSH_SECONDS).record(started.elapsed().as_secs_f64());
            Ok(done)
        }
    }
}

/// Waits for every push in flight; returns the rows rejected as non-finite.
pub(super) async fn drain(pushes: &mut JoinSet<PushResult>) -> Result<u64> {
    let mut rejected = 0;
    while let Some(r) = pushes.join_next().await {
        rejected += r.map_err(|_| TrainError::Stopped("push task"))??.1;
    }
    Ok(rejected)
}
