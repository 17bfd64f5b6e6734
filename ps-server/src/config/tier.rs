//! The capacity tier's settings: the RocksDB setup ([`embedding::RocksTuning`]) and how long prefetch pins last.

use serde::Deserialize;

use super::{ConfigError, FileConfig};

/// How the server sets up RocksDB's column families.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RocksdbTuning {
    /// Bloom filters, a shared block cache holding index and filter blocks, a hash index in data blocks and a
    /// memtable bloom: for the tier's single-row reads (`embedding::rocks_store`, "Tuning").
    #[default]
    PointLookup,
    /// RocksDB's defaults (no compression either way), for comparisons.
    Defaults,
}

/// The capacity tier's settings, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierConfig {
    /// The RocksDB setup.
    pub rocks: embedding::RocksTuning,
    /// Seconds a prefetch's pins last at most.
    pub pin_secs: u64,
}

/// Default of `prefetch-pin-secs`: a trainer releases its pins within a few batches; this only ends the pins
/// of prefetches whose batch never came (a trainer that died or stopped).
pub const DEFAULT_PIN_SECS: u64 = 60;

impl FileConfig {
    /// The tier's settings with their defaults.
    pub(super) fn tier(&self) -> Result<TierConfig, ConfigError> {
        let mib = self
            .block_cache_mib
            .unwrap_or((embedding::DEFAULT_BLOCK_CACHE_BYTES >> 20) as u64);
        if mib == 0 || mib > 1 << 20 {
            return Err(ConfigError::Invalid(format!(
                "block-cache-mib = {mib}, expected 1 to 1048576"
            )));
        }
        let pin_secs = self.prefetch_pin_secs.unwrap_or(DEFAULT_PIN_SECS);
        if pin_secs == 0 {
            return Err(ConfigError::Invalid(
                "prefetch-pin-secs = 0, expected at least 1".into(),
            ));
        }
        let reserve_mib = self
            .disk_reserve_mib
            .unwrap_or(embedding::DEFAULT_RESERVE_BYTES >> 20);
        if reserve_mib > 1 << 30 {
            return Err(ConfigError::Invalid(format!(
                "disk-reserve-mib = {reserve_mib}, expected 0 to 1073741824"
            )));
        }
        Ok(TierConfig {
            rocks: embedding::RocksTuning {
                point_lookup: self.rocksdb_tuning.unwrap_or_default() == RocksdbTuning::PointLookup,
                block_cache_bytes: (mib << 20) as usize,
                reserve_bytes: reserve_mib << 20,
            },
            pin_secs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        let t = FileConfig::default().tier().unwrap();
        assert_eq!(t.pin_secs, DEFAULT_PIN_SECS);
        assert!(t.rocks.point_lookup);
        assert_eq!(t.rocks.block_cache_bytes, 64 << 20);
        let cfg: FileConfig = toml::from_str(
            "block-cache-mib = 8\nrocksdb-tuning = \"defaults\"\nprefetch-pin-secs = 5",
        )
        .unwrap();
        let t = cfg.tier().unwrap();
        assert_eq!(
            (t.rocks.block_cache_bytes, t.rocks.point_lookup, t.pin_secs),
            (8 << 20, false, 5)
        );
        for (text, field) in [
            ("block-cache-mib = 0", "block-cache-mib = 0"),
            ("prefetch-pin-secs = 0", "prefetch-pin-secs = 0"),
        ] {
            let cfg: FileConfig = toml::from_str(text).unwrap();
            let err = cfg.tier().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
        let err = toml::from_str::<FileConfig>("rocksdb-tuning = \"fast\"").unwrap_err();
        assert!(err.to_string().contains("fast"), "{err}");
    }
}
