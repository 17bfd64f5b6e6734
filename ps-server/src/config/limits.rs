//! Bounds on connections before they authenticate and on stalled streams (issue 40): what keeps idle or slow
//! sockets from holding the server's connection slots and in-flight bytes.

use std::time::Duration;

use serde::Deserialize;

use super::{at_least, secs, ConfigError, FileConfig};

/// Default [`FileConfig::handshake_timeout_secs`].
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`FileConfig::max_handshakes`].
pub const DEFAULT_MAX_HANDSHAKES: u64 = 256;
/// Default [`FileConfig::stream_idle_timeout_secs`].
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Validated bounds on handshakes and stalled streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Time a client has to complete its TLS handshake.
    pub handshake_timeout: Duration,
    /// Handshakes under way at once; one more drops the oldest.
    pub max_handshakes: usize,
    /// Time a request stream may make no progress; `None`: no bound.
    pub stream_idle_timeout: Option<Duration>,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_handshakes: DEFAULT_MAX_HANDSHAKES as usize,
            stream_idle_timeout: Some(DEFAULT_STREAM_IDLE_TIMEOUT),
        }
    }
}

impl FileConfig {
    /// The connection limits with their defaults; a handshake timeout of 0 is refused (no client could
    /// connect).
    pub(super) fn connection_limits(&self) -> Result<ConnectionLimits, ConfigError> {
        let handshake_timeout = secs(
            "handshake-timeout-secs",
            self.handshake_timeout_secs,
            DEFAULT_HANDSHAKE_TIMEOUT.as_secs_f64(),
        )?;
        if handshake_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "handshake-timeout-secs = 0, expected a number of seconds > 0".into(),
            ));
        }
        let max_handshakes = at_least(
            "max-handshakes",
            self.max_handshakes,
            DEFAULT_MAX_HANDSHAKES,
            1,
        )? as usize;
        let idle = secs(
            "stream-idle-timeout-secs",
            self.stream_idle_timeout_secs,
            DEFAULT_STREAM_IDLE_TIMEOUT.as_secs_f64(),
        )?;
        Ok(ConnectionLimits {
            handshake_timeout,
            max_handshakes,
            stream_idle_timeout: (!idle.is_zero()).then_some(idle),
        })
    }
}

/// Default [`FileConfig::max_tables`]: each table costs a column family (~2 MiB of memtable and hash buckets
/// before it holds a row), so 512 is ~1 GiB of fixed cost at most.
pub const DEFAULT_MAX_TABLES: u64 = 512;
/// Default [`FileConfig::max_table_dim`].
pub const DEFAULT_MAX_TABLE_DIM: u64 = 1024;
/// Default [`FileConfig::max_tables_per_request`].
pub const DEFAULT_MAX_TABLES_PER_REQUEST: u64 = 256;

/// Validated bounds on table registration by trainers (an admin certificate may pass `max_tables` and
/// `max_table_dim`; nobody passes `max_tables_per_request` or the engine's own bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistrationLimits {
    /// Tables a server may hold; a registration that would pass it is refused whole.
    pub max_tables: usize,
    /// Largest dimension a registered table may have (at most [`embedding::MAX_DIM`]).
    pub max_table_dim: usize,
    /// Tables one `RegisterTables` request may name.
    pub max_tables_per_request: usize,
}

impl Default for RegistrationLimits {
    fn default() -> RegistrationLimits {
        RegistrationLimits {
            max_tables: DEFAULT_MAX_TABLES as usize,
            max_table_dim: DEFAULT_MAX_TABLE_DIM as usize,
            max_tables_per_request: DEFAULT_MAX_TABLES_PER_REQUEST as usize,
        }
    }
}

impl FileConfig {
    /// The registration limits with their defaults; each at least 1, the dimension at most
    /// [`embedding::MAX_DIM`].
    pub(super) fn registration_limits(&self) -> Result<RegistrationLimits, ConfigError> {
        let max_tables = at_least("max-tables", self.max_tables, DEFAULT_MAX_TABLES, 1)? as usize;
        let max_table_dim = at_least(
            "max-table-dim",
            self.max_table_dim,
            DEFAULT_MAX_TABLE_DIM,
            1,
        )? as usize;
        if max_table_dim > embedding::MAX_DIM {
            return Err(ConfigError::Invalid(format!(
                "max-table-dim = {max_table_dim}, expected at most {}",
                embedding::MAX_DIM
            )));
        }
        let max_tables_per_request = at_least(
            "max-tables-per-request",
            self.max_tables_per_request,
            DEFAULT_MAX_TABLES_PER_REQUEST,
            1,
        )? as usize;
        Ok(RegistrationLimits {
            max_tables,
            max_table_dim,
            max_tables_per_request,
        })
    }
}

impl FileConfig {
    /// The reduce limits with their defaults: at least one group and 1 MiB.
    pub(super) fn reduce_limits(&self) -> Result<crate::reduce::ReduceLimits, ConfigError> {
        let d = crate::reduce::ReduceLimits::default();
        Ok(crate::reduce::ReduceLimits {
            max_groups: at_least(
                "max-reduce-groups",
                self.max_reduce_groups,
                d.max_groups as u64,
                1,
            )? as usize,
            max_bytes: at_least(
                "max-reduce-bytes",
                self.max_reduce_bytes,
                d.max_bytes,
                1 << 20,
            )?,
        })
    }
}

/// Default [`PushWindowLimits::clients`].
pub const DEFAULT_PUSH_WINDOW_CLIENTS: usize = 1024;
/// Default [`PushWindowLimits::per_client`].
pub const DEFAULT_PUSH_WINDOW_PER_CLIENT: usize = 1024;

/// The bounds of the push window (`push-window-clients`, `push-window-per-client`; `crate::shard::push_window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushWindowLimits {
    /// Clients remembered; the one idle longest is forgotten first.
    pub clients: usize,
    /// Answers remembered per client; the oldest are forgotten first.
    pub per_client: usize,
}

impl Default for PushWindowLimits {
    fn default() -> PushWindowLimits {
        PushWindowLimits {
            clients: DEFAULT_PUSH_WINDOW_CLIENTS,
            per_client: DEFAULT_PUSH_WINDOW_PER_CLIENT,
        }
    }
}

impl FileConfig {
    /// The push window's bounds with their defaults: at least one client and 16 answers per client.
    pub(super) fn push_window_limits(&self) -> Result<PushWindowLimits, ConfigError> {
        Ok(PushWindowLimits {
            clients: at_least(
                "push-window-clients",
                self.push_window_clients,
                DEFAULT_PUSH_WINDOW_CLIENTS as u64,
                1,
            )? as usize,
            per_client: at_least(
                "push-window-per-client",
                self.push_window_per_client,
                DEFAULT_PUSH_WINDOW_PER_CLIENT as u64,
                16,
            )? as usize,
        })
    }
}

/// Default [`FileConfig::weight_clamp_abs`].
pub const DEFAULT_WEIGHT_CLAMP_ABS: f32 = 1e6;

/// `weight-guard`: what a push may leave in a row ([`embedding::WeightGuard`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WeightGuardMode {
    /// Undo an update that would leave a non-finite weight or state.
    #[default]
    Refuse,
    /// Keep weights within `weight-clamp-abs`.
    Clamp,
}

impl FileConfig {
    /// The weight guard: `refuse` by default; `clamp` with a finite bound > 0.
    pub(super) fn weight_guard(&self) -> Result<embedding::WeightGuard, ConfigError> {
        let max_abs = self.weight_clamp_abs.unwrap_or(DEFAULT_WEIGHT_CLAMP_ABS);
        if !(max_abs.is_finite() && max_abs > 0.0) {
            return Err(ConfigError::Invalid(format!(
                "weight-clamp-abs = {max_abs}, expected a finite number > 0"
            )));
        }
        Ok(match self.weight_guard.unwrap_or_default() {
            WeightGuardMode::Refuse => embedding::WeightGuard::Refuse,
            WeightGuardMode::Clamp => embedding::WeightGuard::Clamp { max_abs },
        })
    }
}
