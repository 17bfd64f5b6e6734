//! Log set-up shared by every binary: `tracing` events to stderr, filtered by `RUST_LOG` (default `info`),
//! with ANSI colour only when stderr is a terminal and `NO_COLOR` is unset (issue 15: colour codes in log
//! files and pipes).

use std::ffi::OsStr;
use std::io::IsTerminal;

/// Whether log lines carry ANSI colour codes: only on a terminal, and never when `NO_COLOR` is set to a
/// non-empty value (<https://no-color.org>), so logs written to a file or a pipe stay plain text.
pub fn use_color(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Installs the process-wide log subscriber (`RUST_LOG`, default `info`), writing to stderr, coloured only
/// where [`use_color`] says. A second call does nothing.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let color = use_color(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(color)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::use_color;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_color(true, None));
        assert!(use_color(true, Some(OsStr::new(""))));
        assert!(!use_color(true, Some(OsStr::new("1"))));
        assert!(!use_color(false, None));
        assert!(!use_color(false, Some(OsStr::new("1"))));
    }
}
