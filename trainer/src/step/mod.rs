//! The stages of one training step, in data-path order (DESIGN.md, "One training step"). The loop that drives
//! them, with its staleness gate and evaluation, is [`crate::train`].
//!
//! # Layout (in the order a batch passes through)
//! 1. [`pipeline`]: parse (reader thread) and plan (plan thread), each behind a bounded queue; the plan
//!    thread sends each planned batch's ids ahead to the servers ([`prefetch`]).
//! 2. Plan ([`protocol::plan`], shared with serving): per-batch planning without I/O: dedup ids per table,
//!    route unique ids to servers, build pull payloads, then gather pulled rows into the model's layout and
//!    reduce gradients per unique id.
//! 3. [`exchange`]: the batch's requests to the servers, in parallel: embedding pulls, dense pulls, pushes.
//! 4. [`replay`]: the trainer's own unacknowledged pushes replayed onto pulled rows (staleness correction).
//! 5. Compute: the dense model's forward, backward and optimizer step ([`crate::model`]).
//! 6. [`push`]: the push encoder thread: summed gradients into per-table encoded push requests, with
//! 7. error feedback for lossy pushes ([`protocol::compression::feedback::ResidualStore`], the sender's
//!    residuals).
//! 8. [`dense_sync`]: the dense parameters on the servers, for several trainers (pulled with the rows,
//!    pushed with the gradients), in the asynchronous dense mode; [`dense_reduce`]: the hybrid mode's
//!    per-step sum of every trainer's dense gradients.

pub mod pipeline;

pub mod prefetch;

pub mod exchange;

pub mod replay;

pub mod push;

pub mod dense_sync;

pub mod dense_reduce;

#[cfg(test)]
mod perf;
