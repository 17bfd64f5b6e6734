//! The leaf every crate of the workspace may use, and that uses none of them: the one hash of ids, the one
//! deterministic generator, and run-time SIMD dispatch. It exists so that no crate depends on another for these
//! (DESIGN.md, "Crates": "the shared hash/RNG lives in none of them but a small leaf they all use"): before it,
//! `criteo` and `protocol` depended on the storage crate (`embedding`) for splitmix64.
//!
//! # Layout
//! - [`hash`]: [`hash::mix64`] (the splitmix64 finalizer), its inverse, [`hash::splitmix64`], and
//!   [`hash::IdHasher`], the `HashMap` hasher of ids.
//! - [`rng`]: [`rng::SplitMix64`], the seeded generator (initial weights, generated data, fuzzers).
//! - [`fuzz`]: what the structured fuzzers share (their size and seed from the environment, float edges).
//! - [`simd`]: [`simd::isa`] and [`multiversion!`], one loop compiled for AVX-512, AVX2 and the baseline.
//! - [`sched`]: the scheduling policy of helper threads ([`sched::enter_helper`]), so that their wake-ups do not
//!   preempt the compute threads they serve.

#![warn(missing_docs)]

pub mod fuzz;
pub mod hash;
pub mod rng;
pub mod sched;
pub mod simd;
