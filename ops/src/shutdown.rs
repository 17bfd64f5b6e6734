//! The shutdown signal every long-running binary passes into its `run` (STYLE.md, "Shutdown"): tests pass
//! a future of their own instead.

/// Resolves when SIGTERM or SIGINT arrives.
///
/// # Panics
/// If the signal handlers cannot be installed (no signal support in this process), which happens at start-up.
pub async fn signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
