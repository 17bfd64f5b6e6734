//! How a process's helper threads share the cores with its compute threads.
//!
//! A trainer (the `trainer` binary, or PyTorch with the `pstrain` package) has compute threads (the training
//! loop and its rayon or OpenMP workers) and helper threads that wake many times a step for short work: the
//! tokio I/O threads that send and receive rows, the plan, push-encoder and reader threads. With Linux's default
//! policy a thread that wakes preempts the one running on its core at once, so on a small machine a helper's
//! wake-up lands in the middle of a parallel region: the preempted compute thread becomes the straggler every
//! other worker of the region waits for, and the training loop's own thread, preempted inside
//! `pstrain`'s push call, waited 2-3 ms per step for work of ~0.2 ms (issues 42 and 44).
//!
//! [`Policy::Batch`] is Linux's `SCHED_BATCH`: same weight as a normal thread, but a batch thread that wakes does
//! not preempt a running normal one; it runs when a core is free, or at the next scheduler tick. Helpers get the
//! same CPU share, and the compute threads are no longer cut in the middle of their work. Helper threads call
//! [`enter_helper`] when they start; the process sets the policy they take with [`set_helper_policy`] (the
//! default is [`Policy::Batch`]). Elsewhere than Linux both policies leave the thread as it is.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

/// A thread's scheduling policy (Linux `SCHED_OTHER` or `SCHED_BATCH`); helpers' default is batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// The system's default policy: a thread that wakes may preempt the one running.
    Normal,
    /// `SCHED_BATCH`: the same share of the CPU, without preempting running threads on wake-up.
    #[default]
    Batch,
}

impl FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Policy, String> {
        match s.trim() {
            "normal" => Ok(Policy::Normal),
            "batch" => Ok(Policy::Batch),
            other => Err(format!(
                "scheduling policy {other:?}: expected \"batch\" or \"normal\""
            )),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Normal => "normal",
            Policy::Batch => "batch",
        })
    }
}

/// The policy [`enter_helper`] gives helper threads: 0 normal, 1 batch.
static HELPERS: AtomicU8 = AtomicU8::new(1);

/// Sets the policy that helper threads started from now on take in [`enter_helper`] (threads already running
/// keep theirs).
pub fn set_helper_policy(policy: Policy) {
    HELPERS.store(u8::from(policy == Policy::Batch), Ordering::Relaxed);
}

/// The policy helper threads take ([`Policy::Batch`] unless [`set_helper_policy`] said otherwise).
pub fn helper_policy() -> Policy {
    if HELPERS.load(Ordering::Relaxed) == 1 {
        Policy::Batch
    } else {
        Policy::Normal
    }
}

/// Gives the calling thread the helpers' policy ([`helper_policy`]). A thread that stays normal because the
/// system refused is only slower to share: the caller logs the error and goes on.
pub fn enter_helper() -> std::io::Result<()> {
    set_current(helper_policy())
}

/// Sets the calling thread's policy (Linux; elsewhere nothing changes).
pub fn set_current(policy: Policy) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let which = match policy {
            Policy::Normal => libc::SCHED_OTHER,
            Policy::Batch => libc::SCHED_BATCH,
        };
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` lives for the call; pid 0 is the calling thread (Linux schedules threads).
        if unsafe { libc::sched_setscheduler(0, which, &param) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(
                e.kind(),
                format!("set this thread's scheduling policy to {policy}: {e}"),
            ));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = policy;
    Ok(())
}

/// The calling thread's policy: [`Policy::Batch`] for `SCHED_BATCH`, [`Policy::Normal`] for anything else
/// (and always elsewhere than Linux).
pub fn current() -> Policy {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: no arguments besides the calling thread.
        if unsafe { libc::sched_getscheduler(0) } == libc::SCHED_BATCH {
            return Policy::Batch;
        }
    }
    Policy::Normal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_print_and_bad_names_are_named() {
        for p in [Policy::Normal, Policy::Batch] {
            assert_eq!(p.to_string().parse::<Policy>(), Ok(p));
        }
        assert_eq!(" batch ".parse::<Policy>(), Ok(Policy::Batch));
        let e = "idle".parse::<Policy>().unwrap_err();
        assert!(e.contains("\"idle\""), "{e}");
    }

    /// Each thread has its own policy: setting it on one thread leaves the others as they are, and it can be
    /// set back (lowering to batch and returning to normal need no privilege).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_takes_and_leaves_the_batch_policy_alone() {
        std::thread::spawn(|| {
            assert_eq!(current(), Policy::Normal);
            set_current(Policy::Batch).unwrap();
            assert_eq!(current(), Policy::Batch);
            let other = std::thread::spawn(current).join().unwrap();
            // A thread spawned by a batch thread inherits its policy, as on any Linux thread.
            assert_eq!(other, Policy::Batch);
            set_current(Policy::Normal).unwrap();
            assert_eq!(current(), Policy::Normal);
        })
        .join()
        .unwrap();
        assert_eq!(current(), Policy::Normal);
    }

    /// Helpers take the process's helper policy, batch unless set otherwise.
    #[cfg(target_os = "linux")]
    #[test]
    fn helpers_take_the_process_policy() {
        assert_eq!(helper_policy(), Policy::Batch);
        let got = std::thread::spawn(|| {
            enter_helper().unwrap();
            current()
        })
        .join()
        .unwrap();
        assert_eq!(got, Policy::Batch);
    }
}
