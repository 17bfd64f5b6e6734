//! The hybrid dense mode (`--dense-mode hybrid`, the default with several trainers): each step, every
//! trainer's dense gradients are summed through the parameter servers before any trainer applies them, so all
//! trainers hold the same dense parameters and take the same optimizer step, as one trainer would at the
//! global batch; the embedding rows stay asynchronous under the staleness bound.
//!
//! A trainer sends `grad x samples` (its batch's mean gradient times its batch size: a sum over its samples),
//! cut into one contiguous slice per server ([`protocol::wire::message::reduce::slices`]); each server adds one slice
//! over the trainers ([`protocol::wire::message::reduce`]), and the trainer divides the sums by the total samples: the
//! mean gradient over the global batch, whatever each trainer's batch size was.
//!
//! Global batch: W trainers at batch `B/W` take the steps of one trainer at batch `B` — the same mean dense
//! gradient, and the embedding gradients scaled by `1/W` ([`DenseReduce::embedding_scale`]), so the
//! learning rates of one trainer carry over unchanged.
//!
//! The end of the data: a trainer out of batches keeps contributing zeros (samples 0, `done`) so that its
//! replica takes the same steps as the others', until a step's answer says every trainer is done.
//!
//! Overlap (`--dense-staleness 1`): step `t`'s sum travels while step `t+1` pulls and computes, and is applied
//! just after step `t+1`'s backward pass, so step `t+1`'s gradients are taken at parameters one step old. Every
//! trainer still applies the same sums in the same order, so the replicas stay identical; the barrier's wait
//! (the round trip and the slower trainer) hides behind a step of compute. [`DenseReduce::flush`] applies the
//! sum in flight (before an evaluation, a checkpoint, the end of the pass).

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use protocol::transport::{Dialer, NetDialer};
use protocol::wire::message::reduce::{self, ReduceHeader, ReducedHeader};
use protocol::{Encoding, ProtocolError, PsClient};
use tokio::task::{JoinHandle, JoinSet};

use crate::config::OnMissing;
use crate::model::Dlrm;

/// Errors of the dense reduce.
#[derive(Debug, thiserror::Error)]
pub enum ReduceError {
    /// A server's request failed or was refused.
    #[error("dense reduce of step {step} on server {server}: {source}")]
    Server {
        /// The step.
        step: u64,
        /// The server's index.
        server: usize,
        /// The cause.
        source: ProtocolError,
    },
    /// The step was finalized without some trainers, and `--on-missing-trainer fail`.
    #[error("dense reduce of step {step}: trainer rank(s) {missing:?} sent nothing within --reduce-timeout-secs (dead or stalled?); --on-missing-trainer continue goes on without them")]
    Missing {
        /// The step.
        step: u64,
        /// Ranks not in the sum.
        missing: Vec<u32>,
    },
    /// Servers disagree on a step (one finalized it without a rank another had).
    #[error("dense reduce of step {step}: servers disagree ({first} vs {other} samples)")]
    Disagree {
        /// The step.
        step: u64,
        /// Samples of the first server's answer.
        first: u64,
        /// Samples of another's.
        other: u64,
    },
    /// The model refused the gradients (a size mismatch: a bug).
    #[error("set the reduced dense gradients: {0}")]
    Model(#[from] crate::model::ModelError),
    /// The task carrying an overlapped step's sum panicked or was cancelled.
    #[error("dense reduce of step {step}: its task stopped ({reason})")]
    Task {
        /// The step.
        step: u64,
        /// The join error.
        reason: String,
    },
}

/// A step's sums and answer.
type Summed = Result<(ReducedHeader, Vec<f32>), ReduceError>;

/// What one step's reduce found.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// Samples over every contributor (0: nothing to apply).
    pub samples: u64,
    /// Every trainer is out of data: the last step.
    pub all_done: bool,
    /// Ranks not in the sum.
    pub missing: Vec<u32>,
}

/// What a trainer's reduce requests carry besides the values: shared with the task of an overlapped step.
struct Link<D: Dialer> {
    client: Arc<PsClient<D>>,
    group: u64,
    rank: u32,
    world: u32,
    timeout_ms: u32,
    /// How the sums travel (`--reduce-encoding`).
    encoding: Encoding,
    /// The slice of the flat gradient each server sums.
    slices: Vec<Range<usize>>,
    /// Values of the flat gradient.
    flat_len: usize,
}

// Not derived: a derive would ask `D: Clone`, and only the `Arc` is cloned.
impl<D: Dialer> Clone for Link<D> {
    fn clone(&self) -> Link<D> {
        Link {
            client: self.client.clone(),
            group: self.group,
            rank: self.rank,
            world: self.world,
            timeout_ms: self.timeout_ms,
            encoding: self.encoding,
            slices: self.slices.clone(),
            flat_len: self.flat_len,
        }
    }
}

/// An overlapped step's sum on its way.
struct Pending {
    step: u64,
    task: JoinHandle<Summed>,
}

/// One trainer's side of the hybrid dense mode.
pub struct DenseReduce<D: Dialer = NetDialer> {
    link: Arc<Link<D>>,
    on_missing: OnMissing,
    /// The flat gradient (a sum over this trainer's samples), then the mean over the global batch (empty
    /// while both buffers are in flight or applied; reallocated once).
    flat: Vec<f32>,
    /// Overlap each step's sum with the next step (`--dense-staleness 1`).
    overlap: bool,
    /// The overlapped step in flight.
    pending: Option<Pending>,
}

impl<D: Dialer> DenseReduce<D> {
    /// The reduce of `model`'s gradients for rank `rank` of `world` in group `group`.
    pub fn new(
        client: Arc<PsClient<D>>,
        model: &Dlrm,
        (group, rank, world): (u64, usize, usize),
        timeout_secs: f64,
        on_missing: OnMissing,
        encoding: Encoding,
    ) -> DenseReduce<D> {
        let slices = reduce::slices(model.num_params(), client.num_servers());
        DenseReduce {
            link: Arc::new(Link {
                client,
                group,
                rank: rank as u32,
                world: world as u32,
                timeout_ms: ((timeout_secs * 1000.0).round() as u32)
                    .clamp(1, reduce::MAX_TIMEOUT_MS),
                encoding,
                slices,
                flat_len: model.num_params(),
            }),
            on_missing,
            flat: vec![0.0; model.num_params()],
            overlap: false,
            pending: None,
        }
    }

    /// Moves to reduce group `group` (a resumed job: the previous run's finalized steps must not answer this
    /// one's). Call between passes, with nothing in flight.
    pub fn set_group(&mut self, group: u64) {
        debug_assert!(self.pending.is_none(), "set_group with a step in flight");
        let mut link = Link::clone(&self.link);
        link.group = group;
        self.link = Arc::new(link);
    }

    /// Overlaps each step's sum with the next step (module docs); `false` applies it within its own step.
    pub fn with_overlap(mut self, overlap: bool) -> DenseReduce<D> {
        self.overlap = overlap;
        self
    }

    /// Sums `values` (this trainer's, over `samples` samples) with the other trainers' for reduce step
    /// `step`, one slice per server, in parallel; returns the answer and the sums (in `values`' buffer).
    pub async fn sum(&self, step: u64, values: Vec<f32>, samples: u64, done: bool) -> Summed {
        self.link.sum(step, values, samples, done).await
    }

    /// The factor on a trainer's embedding gradients that makes W trainers at batch `B/W` push what one
    /// trainer at batch `B` would (module docs).
    pub fn embedding_scale(&self) -> f32 {
        1.0 / self.link.world as f32
    }

    /// Sums step `step`'s dense gradients over the trainers and, if any trainer had samples, sets `model`'s
    /// gradients to the mean over the global batch and takes the optimizer step. `samples` is this trainer's
    /// batch (its gradients are those of its last backward pass), or 0 with `done` when it is out of data.
    ///
    /// With overlap, the sum of `step` is sent and the previous step's is applied instead; the outcome is the
    /// previous step's (samples 0 and not all done when there was none).
    pub async fn step(
        &mut self,
        step: u64,
        model: &mut Dlrm,
        samples: u64,
        done: bool,
    ) -> Result<StepOutcome, ReduceError> {
        let mut flat = std::mem::take(&mut self.flat);
        flat.resize(self.link.flat_len, 0.0);
        if samples > 0 {
            // The model divided the batch's summed loss by this: multiplying gives the sum over the samples.
            let divisor = model.grad_divisor(samples as usize) as f32;
            let mut at = 0;
            for g in model.grads() {
                for (d, v) in flat[at..at + g.len()].iter_mut().zip(g) {
                    *d = v * divisor;
                }
                at += g.len();
            }
        } else {
            flat.fill(0.0);
        }
        if !self.overlap {
            let summed = self.link.sum(step, flat, samples, done).await;
            return self.apply(step, summed, model);
        }
        let link = self.link.clone();
        let task = tokio::spawn(async move { link.sum(step, flat, samples, done).await });
        match self.pending.replace(Pending { step, task }) {
            Some(previous) => self.finish(previous, model).await,
            None => Ok(StepOutcome {
                samples: 0,
                all_done: false,
                missing: Vec::new(),
            }),
        }
    }

    /// Applies the overlapped step in flight, if any, and returns its outcome.
    pub async fn flush(&mut self, model: &mut Dlrm) -> Result<Option<StepOutcome>, ReduceError> {
        match self.pending.take() {
            Some(p) => self.finish(p, model).await.map(Some),
            None => Ok(None),
        }
    }

    async fn finish(&mut self, p: Pending, model: &mut Dlrm) -> Result<StepOutcome, ReduceError> {
        let summed = p.task.await.unwrap_or_else(|e| {
            Err(ReduceError::Task {
                step: p.step,
                reason: e.to_string(),
            })
        });
        self.apply(p.step, summed, model)
    }

    /// Checks a step's answer and applies its mean gradient; keeps the buffer for the next step.
    fn apply(
        &mut self,
        step: u64,
        summed: Summed,
        model: &mut Dlrm,
    ) -> Result<StepOutcome, ReduceError> {
        let (h, flat) = summed?;
        if !h.missing.is_empty() {
            metrics::counter!(crate::metrics::REDUCE_MISSING_TOTAL)
                .increment(h.missing.len() as u64);
            if self.on_missing == OnMissing::Fail {
                return Err(ReduceError::Missing {
                    step,
                    missing: h.missing,
                });
            }
            tracing::warn!(step, missing = ?h.missing, "dense reduce went on without some trainers");
        }
        if h.samples > 0 {
            // The mean over the global batch of the trainers in the sum; a short last step counts for its
            // samples (Dlrm::grad_divisor).
            let trainers = (self.link.world as usize)
                .saturating_sub(h.missing.len())
                .max(1);
            let nominal = (model.grad_divisor(0) * trainers) as u64;
            model.apply_flat_gradients(&flat, 1.0 / h.samples.max(nominal) as f32)?;
        }
        self.flat = flat;
        Ok(StepOutcome {
            samples: h.samples,
            all_done: h.all_done,
            missing: h.missing,
        })
    }
}

impl<D: Dialer> Link<D> {
    async fn sum(&self, step: u64, mut values: Vec<f32>, samples: u64, done: bool) -> Summed {
        // Sliced over the servers of connect time (every trainer the same way, whatever a live reshard did
        // since: servers keep their indices; a shrink below that count fails the reduce with `NotInMap`).
        let slices = if values.len() == self.flat_len {
            self.slices.clone()
        } else {
            reduce::slices(values.len(), self.slices.len())
        };
        let mut set = JoinSet::new();
        for (server, range) in slices.iter().enumerate() {
            let header = ReduceHeader {
                group: self.group,
                step,
                rank: self.rank,
                world: self.world,
                samples,
                done,
                timeout_ms: self.timeout_ms,
                len: range.len() as u32,
                encoding: self.encoding,
            };
            let mut payload = Vec::new();
            reduce::encode_values(&values[range.clone()], self.encoding, &mut payload);
            let client = self.client.clone();
            set.spawn(async move {
                let r = client.reduce(server, header, Bytes::from(payload)).await;
                (server, r)
            });
        }
        let mut first: Option<ReducedHeader> = None;
        while let Some(joined) = set.join_next().await {
            let (server, r) = joined.expect("reduce task panicked");
            let fail = |source| ReduceError::Server {
                step,
                server,
                source,
            };
            let (h, payload) = r.map_err(fail)?;
            let range = slices[server].clone();
            reduce::decode_values_into("reduced", &payload, self.encoding, &mut values[range])
                .map_err(fail)?;
            match &first {
                Some(f) if f.samples != h.samples => {
                    return Err(ReduceError::Disagree {
                        step,
                        first: f.samples,
                        other: h.samples,
                    })
                }
                Some(_) => {}
                None => first = Some(h),
            }
        }
        let h = first.unwrap_or(ReducedHeader {
            samples,
            contributors: 1,
            missing: Vec::new(),
            all_done: done,
        });
        Ok((h, values))
    }
}
