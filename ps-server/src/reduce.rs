//! The server's side of `Reduce` ([`protocol::wire::message::reduce`]): sums of the trainers' contributions, per
//! reduce group and step, without sockets or clock (the caller passes `now` in and waits on the returned
//! channel; [`crate::server`] does the waiting).
//!
//! A step is finalized when every rank the group waits for has contributed, or by [`Reducer::expire`] at its
//! deadline with whoever arrived. Finalized steps are kept ([`KEEP_STEPS`] per group) so that a retried or
//! late contribution gets the same answer; groups idle for [`IDLE_GROUP`] are dropped (a job restarted later
//! starts afresh).
//!
//! Bounded ([`ReduceLimits`]): at most `max_groups` groups, and at most `max_bytes` of sums held (open steps'
//! sums, finalized steps' sums and encodings). A new step that would pass the bytes first drops finalized steps,
//! oldest of their group first (a retry of one then gets [`ReduceError::TooOld`], never a wrong sum); if that is
//! not enough, it is refused.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::wire::message::reduce::{self, ReduceHeader, ReducedHeader};
use protocol::Encoding;
use tokio::sync::watch;

/// Finalized steps kept per group, for retries and late contributions.
pub const KEEP_STEPS: u64 = 64;
/// A group with no contribution for this long is dropped.
pub const IDLE_GROUP: Duration = Duration::from_secs(60);

/// Bounds on what a server's reduce groups hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceLimits {
    /// Groups held at once (idle ones are dropped first).
    pub max_groups: usize,
    /// Bytes of sums held: open steps' sums, finalized steps' sums and their encodings.
    pub max_bytes: u64,
}

/// Default [`ReduceLimits::max_groups`].
pub const DEFAULT_MAX_GROUPS: usize = 64;
/// Default [`ReduceLimits::max_bytes`]: 2 GiB, 64 kept steps of a 3M-parameter dense model.
pub const DEFAULT_MAX_BYTES: u64 = 2 << 30;

impl Default for ReduceLimits {
    fn default() -> ReduceLimits {
        ReduceLimits {
            max_groups: DEFAULT_MAX_GROUPS,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// A finalized step: the sums and who is in them.
#[derive(Debug)]
pub struct Outcome {
    /// Samples, contributors, missing ranks.
    pub header: ReducedHeader,
    /// The sums.
    pub sum: Vec<f32>,
    /// The sums encoded, once per encoding asked for (every waiter of a step gets the same bytes).
    encoded: [OnceLock<Bytes>; 2],
}

impl Outcome {
    /// Bytes it holds: the sums and their encodings made so far.
    fn bytes(&self) -> u64 {
        let encoded: usize = self
            .encoded
            .iter()
            .map(|e| e.get().map_or(0, Bytes::len))
            .sum();
        (self.sum.len() * 4 + encoded) as u64
    }

    /// The sums in `encoding` (f32 or bf16), encoded on first use.
    pub fn encoded(&self, encoding: Encoding) -> Bytes {
        let slot = usize::from(encoding != Encoding::F32);
        self.encoded[slot]
            .get_or_init(|| {
                let mut out = Vec::new();
                reduce::encode_values(&self.sum, encoding, &mut out);
                Bytes::from(out)
            })
            .clone()
    }
}

/// What a contribution gets back: the answer, or a channel that will carry it (and the step's deadline, at
/// which the caller calls [`Reducer::expire`]).
pub enum Contribution {
    /// The step is finalized.
    Ready(Arc<Outcome>),
    /// Wait for the other ranks until `deadline`.
    Wait {
        /// Turns `Some` when the step is finalized.
        rx: watch::Receiver<Option<Arc<Outcome>>>,
        /// When to finalize without the missing ranks.
        deadline: Instant,
    },
}

/// A contribution refused; the message names the offending value.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReduceError {
    /// The header's world differs from the group's (another job with the same group number?).
    #[error("reduce group {group} has world {expected}, this contribution says {got} (another job with the same --reduce-group?)")]
    World {
        /// The group.
        group: u64,
        /// The group's world.
        expected: u32,
        /// The contribution's.
        got: u32,
    },
    /// The step's vector has another length.
    #[error("reduce group {group} step {step}: {got} values, the step's first contribution had {expected}")]
    Length {
        /// The group.
        group: u64,
        /// The step.
        step: u64,
        /// Values in the step.
        expected: u32,
        /// Values in this contribution.
        got: u32,
    },
    /// The step was finalized and dropped long ago.
    #[error("reduce group {group} step {step} is older than the oldest step kept ({oldest})")]
    TooOld {
        /// The group.
        group: u64,
        /// The step.
        step: u64,
        /// The oldest step kept.
        oldest: u64,
    },
    /// A new group while the server holds its maximum.
    #[error("reduce group {group}: this server holds {max} reduce groups already (its limit); end another job's group or raise max-reduce-groups")]
    TooManyGroups {
        /// The group.
        group: u64,
        /// The limit.
        max: usize,
    },
    /// A new step whose sum does not fit the bytes limit, even after dropping every finalized step that can be.
    #[error("reduce group {group} step {step}: {need} more bytes of sums, {held} held, the limit is {max} (max-reduce-bytes)")]
    Full {
        /// The group.
        group: u64,
        /// The step.
        step: u64,
        /// Bytes the step's sum needs.
        need: u64,
        /// Bytes held.
        held: u64,
        /// The limit.
        max: u64,
    },
    /// A value is NaN or infinite.
    #[error("reduce group {group} step {step} rank {rank}: value {index} is {value} (not finite)")]
    NonFinite {
        /// The group.
        group: u64,
        /// The step.
        step: u64,
        /// The sender.
        rank: u32,
        /// Index of the first bad value.
        index: usize,
        /// The value.
        value: f32,
    },
}

struct Step {
    /// The sum so far: the first contribution's buffer, the later ones added in.
    sum: Vec<f32>,
    /// Values per contribution.
    len: usize,
    samples: u64,
    contributed: BTreeSet<u32>,
    all_done: bool,
    deadline: Instant,
    tx: watch::Sender<Option<Arc<Outcome>>>,
}

impl Step {
    fn outcome(&self) -> Option<Arc<Outcome>> {
        self.tx.borrow().clone()
    }

    /// Bytes it holds: its sum while open, its outcome's once finalized.
    fn bytes(&self) -> u64 {
        match self.outcome() {
            Some(o) => o.bytes(),
            None => (self.len * 4) as u64,
        }
    }
}

struct Group {
    world: u32,
    /// Ranks missing at the last finalized step and silent since: not waited for.
    absent: BTreeSet<u32>,
    steps: BTreeMap<u64, Step>,
    /// Steps below this were dropped.
    oldest: u64,
    last_seen: Instant,
}

/// Every reduce group of this server.
#[derive(Default)]
pub struct Reducer {
    groups: Mutex<HashMap<u64, Group>>,
    limits: ReduceLimits,
}

/// Bytes every step of `groups` holds.
fn held_bytes(groups: &HashMap<u64, Group>) -> u64 {
    groups
        .values()
        .flat_map(|g| g.steps.values())
        .map(Step::bytes)
        .sum()
}

/// Drops finalized steps, each the oldest of its group (which then refuses it as too old), until `need` more
/// bytes fit under `max` or none is left to drop; returns the bytes then held.
fn make_room(groups: &mut HashMap<u64, Group>, need: u64, max: u64) -> u64 {
    let mut held = held_bytes(groups);
    while held + need > max {
        let oldest_done = groups
            .values_mut()
            .filter(|g| {
                g.steps
                    .first_key_value()
                    .is_some_and(|(_, s)| s.outcome().is_some())
            })
            .min_by_key(|g| g.last_seen);
        let Some(g) = oldest_done else { break };
        let (step, s) = g.steps.pop_first().expect("a first step");
        g.oldest = g.oldest.max(step + 1);
        held -= s.bytes();
        metrics::counter!(crate::metrics::REDUCE_STEPS_DROPPED_TOTAL).increment(1);
    }
    held
}

impl Reducer {
    /// An empty reducer within `limits`.
    pub fn new(limits: ReduceLimits) -> Reducer {
        Reducer {
            groups: Mutex::default(),
            limits,
        }
    }

    /// Bytes of sums held now.
    pub fn bytes(&self) -> u64 {
        held_bytes(&self.groups.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Adds `values` (already length-checked against `h.len`) as rank `h.rank`'s contribution to step
    /// `h.step` of group `h.group` at time `now`. The first contribution's buffer becomes the step's sum.
    pub fn contribute(
        &self,
        h: &ReduceHeader,
        values: Vec<f32>,
        now: Instant,
    ) -> Result<Contribution, ReduceError> {
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(ReduceError::NonFinite {
                group: h.group,
                step: h.step,
                rank: h.rank,
                index,
                value,
            });
        }
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.retain(|_, g| now.saturating_duration_since(g.last_seen) < IDLE_GROUP);
        if !groups.contains_key(&h.group) && groups.len() >= self.limits.max_groups {
            metrics::counter!(crate::metrics::REDUCE_REFUSED_TOTAL, "reason" => "groups")
                .increment(1);
            return Err(ReduceError::TooManyGroups {
                group: h.group,
                max: self.limits.max_groups,
            });
        }
        let new_step = groups
            .get(&h.group)
            .is_none_or(|g| !g.steps.contains_key(&h.step));
        if new_step {
            let need = (values.len() * 4) as u64;
            let held = make_room(&mut groups, need, self.limits.max_bytes);
            if held + need > self.limits.max_bytes {
                metrics::counter!(crate::metrics::REDUCE_REFUSED_TOTAL, "reason" => "bytes")
                    .increment(1);
                return Err(ReduceError::Full {
                    group: h.group,
                    step: h.step,
                    need,
                    held,
                    max: self.limits.max_bytes,
                });
            }
        }
        let g = groups.entry(h.group).or_insert_with(|| Group {
            world: h.world,
            absent: BTreeSet::new(),
            steps: BTreeMap::new(),
            oldest: 0,
            last_seen: now,
        });
        if g.world != h.world {
            return Err(ReduceError::World {
                group: h.group,
                expected: g.world,
                got: h.world,
            });
        }
        if h.step < g.oldest {
            return Err(ReduceError::TooOld {
                group: h.group,
                step: h.step,
                oldest: g.oldest,
            });
        }
        g.last_seen = now;
        // A rank heard from again is waited for at the steps after this one.
        g.absent.remove(&h.rank);
        let step = g.steps.entry(h.step).or_insert_with(|| Step {
            sum: Vec::new(),
            len: values.len(),
            samples: 0,
            contributed: BTreeSet::new(),
            all_done: true,
            deadline: now + Duration::from_millis(h.timeout_ms as u64),
            tx: watch::channel(None).0,
        });
        if step.len != values.len() {
            return Err(ReduceError::Length {
                group: h.group,
                step: h.step,
                expected: step.len as u32,
                got: values.len() as u32,
            });
        }
        if let Some(done) = step.outcome() {
            return Ok(Contribution::Ready(done));
        }
        if step.contributed.insert(h.rank) {
            if step.contributed.len() == 1 {
                step.sum = values;
            } else {
                for (s, v) in step.sum.iter_mut().zip(&values) {
                    *s += v;
                }
            }
            step.samples += h.samples;
            step.all_done &= h.done;
        }
        let waited: BTreeSet<u32> = (0..g.world).filter(|r| !g.absent.contains(r)).collect();
        if waited.is_subset(&step.contributed) {
            let done = finalize(g, h.step);
            return Ok(Contribution::Ready(done));
        }
        let step = &g.steps[&h.step];
        Ok(Contribution::Wait {
            rx: step.tx.subscribe(),
            deadline: step.deadline,
        })
    }

    /// Finalizes step `step` of `group` with whoever contributed if its deadline has passed at `now`;
    /// returns its outcome once finalized (`None`: not yet, or the group or step is gone).
    pub fn expire(&self, group: u64, step: u64, now: Instant) -> Option<Arc<Outcome>> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let g = groups.get_mut(&group)?;
        let s = g.steps.get(&step)?;
        if let Some(done) = s.outcome() {
            return Some(done);
        }
        if now < s.deadline {
            return None;
        }
        Some(finalize(g, step))
    }

    /// Groups held (for tests and metrics).
    pub fn groups(&self) -> usize {
        self.groups.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Finalizes `step` of `g` with its contributors: records its missing ranks as absent, wakes the waiters and
/// drops steps older than [`KEEP_STEPS`] before it.
fn finalize(g: &mut Group, step: u64) -> Arc<Outcome> {
    let s = g.steps.get_mut(&step).expect("finalize a step that exists");
    let missing: Vec<u32> = (0..g.world)
        .filter(|r| !s.contributed.contains(r))
        .collect();
    let done = Arc::new(Outcome {
        header: ReducedHeader {
            samples: s.samples,
            contributors: s.contributed.len() as u32,
            missing: missing.clone(),
            all_done: s.all_done,
        },
        sum: std::mem::take(&mut s.sum),
        encoded: Default::default(),
    });
    s.tx.send_replace(Some(done.clone()));
    if !missing.is_empty() {
        metrics::counter!(crate::metrics::REDUCE_MISSING_TOTAL).increment(missing.len() as u64);
    }
    g.absent = missing.into_iter().collect();
    let oldest = step.saturating_sub(KEEP_STEPS);
    g.oldest = g.oldest.max(oldest);
    g.steps = g.steps.split_off(&g.oldest);
    done
}

#[cfg(test)]
mod tests;
