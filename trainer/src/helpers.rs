//! The trainer's helper threads (the tokio I/O threads, the plan and push-encoder threads): they take the
//! helpers' scheduling policy (`--helper-threads`, [`base::sched`]) when they start, so that their wake-ups do
//! not preempt the training loop or its compute workers. A leaf: `run` and `step` both start helpers.

/// Gives the calling thread the helpers' scheduling policy; a refusal by the system is logged and the thread
/// goes on with its policy.
pub fn helper_thread() {
    if let Err(e) = base::sched::enter_helper() {
        tracing::warn!(error = %e, policy = %base::sched::helper_policy(), "helper thread keeps the default scheduling policy");
    }
}
