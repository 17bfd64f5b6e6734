//! Every metric the protocol crate exports (in the process that uses it: ps-server, trainer, ps-serve), named
//! once.

use metrics::{describe_counter, describe_gauge};

/// Reloads of a certificate whose files changed, labelled `file` (`server.pem`, `trainer.pem`, ...) and
/// `outcome` (`loaded`, or `refused`: the new files do not load and the previous certificate stays).
pub const TLS_RELOADS_TOTAL: &str = "tls_certificate_reloads_total";
/// Unix seconds at which the certificate presented now expires, labelled `file`.
pub const TLS_CERTIFICATE_NOT_AFTER: &str = "tls_certificate_not_after_seconds";

/// Describes the metrics above to the installed recorder.
pub fn describe() {
    describe_counter!(
        TLS_RELOADS_TOTAL,
        "Reloads of a certificate whose files changed, by file and outcome (loaded, refused)."
    );
    describe_gauge!(
        TLS_CERTIFICATE_NOT_AFTER,
        "Unix seconds at which the certificate presented now expires, by file."
    );
}
