//! Delta sync from the training servers (docs/serving.md, "Delta sync").

use std::sync::Arc;

use crate::batcher::Batcher;
use crate::config::ServeConfig;
use crate::state::Loaded;

/// Starts following the training servers when `cfg` subscribes to any.
pub async fn start(
    cfg: &ServeConfig,
    _loaded: &Loaded,
    _batcher: &Batcher,
    _stopping: Arc<tokio::sync::Notify>,
) -> anyhow::Result<()> {
    if cfg.sync.is_some() {
        anyhow::bail!("--subscribe: delta sync is not built yet");
    }
    Ok(())
}
