//! Tests of the server's config: file, overlay and validation.
use super::*;

#[test]
fn toml_then_flags() {
    let file: FileConfig = toml::from_str(
        "listen = \"127.0.0.1:7100\"\ndata-dir = \"/d\"\ntls-dir = \"/t\"\nnum-shards = 2\nshard-index = 1\n",
    )
    .unwrap();
    let flags = FileConfig {
        listen: Some("127.0.0.1:7200".parse().unwrap()),
        ..Default::default()
    };
    let cfg = file.overlay(flags).validate().unwrap();
    assert_eq!(cfg.listen.port(), 7200);
    assert_eq!((cfg.shard_index, cfg.num_shards), (1, 2));
    assert_eq!(cfg.flush_interval, Duration::from_secs(30));
}

#[test]
fn admission_and_ttl() {
    let base = || FileConfig {
        data_dir: Some("/d".into()),
        tls_dir: Some("/t".into()),
        ..Default::default()
    };
    let off = base().validate().unwrap();
    assert_eq!((off.admission, off.row_ttl_secs), (None, None));
    assert_eq!(off.expire_interval, Duration::from_secs(60));
    let file: FileConfig = toml::from_str(
        "admission-min-count = 3\nrow-ttl-secs = 86400\nexpire-interval-secs = 0.5\n",
    )
    .unwrap();
    let cfg = base().overlay(file).validate().unwrap();
    assert_eq!(
        cfg.admission,
        Some(embedding::AdmissionConfig {
            min_count: 3,
            width: DEFAULT_SKETCH_WIDTH,
            depth: SKETCH_DEPTH
        })
    );
    assert_eq!(cfg.row_ttl_secs, Some(86400));
    assert_eq!(cfg.expire_interval, Duration::from_millis(500));
    let zero: FileConfig = toml::from_str("admission-min-count = 0\nrow-ttl-secs = 0").unwrap();
    let cfg = base().overlay(zero).validate().unwrap();
    assert_eq!((cfg.admission, cfg.row_ttl_secs), (None, None));
    for (file, needle) in [
        (
            "admission-min-count = 2\nadmission-sketch-width = 0",
            "admission-sketch-width = 0",
        ),
        ("row-ttl-secs = 4294967296", "row-ttl-secs = 4294967296"),
        ("expire-interval-secs = 0", "expire-interval-secs = 0"),
        ("expire-interval-secs = -1", "expire-interval-secs = -1"),
    ] {
        let f: FileConfig = toml::from_str(file).unwrap();
        let err = base().overlay(f).validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{file}: {err}");
    }
}

#[test]
fn bad_configs_name_the_field() {
    let err = toml::from_str::<FileConfig>("lisen = \"x\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("lisen"), "{err}");
    let base = || FileConfig {
        data_dir: Some("/d".into()),
        tls_dir: Some("/t".into()),
        ..Default::default()
    };
    let err = FileConfig {
        shard_index: Some(2),
        num_shards: Some(2),
        ..base()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("shard-index = 2"), "{err}");
    let err = FileConfig {
        flush_interval_secs: Some(f64::NAN),
        ..base()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("flush-interval-secs"), "{err}");
    let err = FileConfig {
        memory_budget_rows: Some(0),
        ..base()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("memory-budget-rows = 0"), "{err}");
    let cfg: FileConfig = toml::from_str("memory-budget-rows = 100").unwrap();
    assert_eq!(
        base().overlay(cfg).validate().unwrap().memory_budget_rows,
        Some(100)
    );
    let err = FileConfig {
        tls_dir: None,
        ..base()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("tls-dir"), "{err}");
}

#[test]
fn durability_parses_and_a_bad_value_names_the_field() {
    let base = || FileConfig {
        data_dir: Some("/d".into()),
        tls_dir: Some("/t".into()),
        ..Default::default()
    };
    assert_eq!(base().validate().unwrap().durability, Durability::Periodic);
    for (text, want) in [
        ("none", Durability::None),
        ("periodic", Durability::Periodic),
        ("sync", Durability::Sync),
    ] {
        let file: FileConfig = toml::from_str(&format!("durability = \"{text}\"")).unwrap();
        assert_eq!(base().overlay(file).validate().unwrap().durability, want);
    }
    let err = toml::from_str::<FileConfig>("durability = \"always\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("durability"), "{err}");
    assert!(err.contains("always"), "{err}");
}

#[test]
fn shard_index_from_pod_names() {
    assert_eq!(shard_index_from_hostname("ps-0").unwrap(), 0);
    assert_eq!(shard_index_from_hostname("pstrain-ps-12").unwrap(), 12);
    assert_eq!(shard_index_from_hostname("ps-3.ps.ml.svc").unwrap(), 3);
    for bad in ["ps", "ps-", "ps-x1", "ps-1a", "", "ps-99999999999"] {
        let err = shard_index_from_hostname(bad).unwrap_err().to_string();
        assert!(err.contains(&format!("{bad:?}")), "{err}");
    }
}

#[test]
fn connection_limits_have_defaults_and_name_bad_values() {
    let base = || FileConfig {
        data_dir: Some("/d".into()),
        tls_dir: Some("/t".into()),
        ..Default::default()
    };
    let cfg = base().validate().unwrap();
    assert_eq!(cfg.connection_limits, ConnectionLimits::default());
    let f: FileConfig = toml::from_str(
        "handshake-timeout-secs = 2.5\nmax-handshakes = 8\nstream-idle-timeout-secs = 0",
    )
    .unwrap();
    let cfg = base().overlay(f).validate().unwrap();
    assert_eq!(
        cfg.connection_limits,
        ConnectionLimits {
            handshake_timeout: Duration::from_millis(2500),
            max_handshakes: 8,
            stream_idle_timeout: None,
        }
    );
    for (file, needle) in [
        ("handshake-timeout-secs = 0", "handshake-timeout-secs = 0"),
        ("handshake-timeout-secs = -3", "handshake-timeout-secs = -3"),
        ("max-handshakes = 0", "max-handshakes = 0"),
        (
            "stream-idle-timeout-secs = -1",
            "stream-idle-timeout-secs = -1",
        ),
    ] {
        let f: FileConfig = toml::from_str(file).unwrap();
        let err = base().overlay(f).validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{file}: {err}");
    }
}

#[test]
fn weight_guard_defaults_to_refuse_and_names_a_bad_bound() {
    let base = || FileConfig {
        data_dir: Some("/d".into()),
        tls_dir: Some("/t".into()),
        ..Default::default()
    };
    assert_eq!(
        base().validate().unwrap().weight_guard,
        embedding::WeightGuard::Refuse
    );
    let f: FileConfig =
        toml::from_str("weight-guard = \"clamp\"\nweight-clamp-abs = 100.0").unwrap();
    assert_eq!(
        base().overlay(f).validate().unwrap().weight_guard,
        embedding::WeightGuard::Clamp { max_abs: 100.0 }
    );
    let f: FileConfig =
        toml::from_str("weight-guard = \"clamp\"\nweight-clamp-abs = -1.0").unwrap();
    let err = base().overlay(f).validate().unwrap_err().to_string();
    assert!(err.contains("weight-clamp-abs = -1"), "{err}");
}

#[test]
fn registration_limits_and_the_no_backup_mode_have_defaults_and_name_bad_values() {
    let base = || FileConfig {
        data_dir: Some("/d".into()),
        tls_dir: Some("/t".into()),
        ..Default::default()
    };
    let cfg = base().validate().unwrap();
    assert_eq!(cfg.registration_limits, RegistrationLimits::default());
    assert_eq!(cfg.reduce_limits, crate::reduce::ReduceLimits::default());
    assert_eq!(
        cfg.replicated_without_backup,
        ReplicatedWithoutBackup::Degrade
    );
    let f: FileConfig = toml::from_str(
        "max-tables = 8\nmax-table-dim = 4096\nmax-tables-per-request = 2\n\
         replicated-without-backup = \"refuse\"\nreplicas = [\"10.0.0.1:7000\", \"10.0.0.2:7000\"]",
    )
    .unwrap();
    let cfg = base().overlay(f).validate().unwrap();
    assert_eq!(
        cfg.registration_limits,
        RegistrationLimits {
            max_tables: 8,
            max_table_dim: 4096,
            max_tables_per_request: 2,
        }
    );
    assert_eq!(
        cfg.replicated_without_backup,
        ReplicatedWithoutBackup::Refuse
    );
    for (file, needle) in [
        ("max-tables = 0", "max-tables = 0"),
        ("max-table-dim = 4097", "max-table-dim = 4097"),
        ("max-tables-per-request = 0", "max-tables-per-request = 0"),
        ("max-reduce-groups = 0", "max-reduce-groups = 0"),
        ("max-reduce-bytes = 1000", "max-reduce-bytes = 1000"),
        ("replicated-without-backup = \"refuse\"", "without replicas"),
    ] {
        let f: FileConfig = toml::from_str(file).unwrap();
        let err = base().overlay(f).validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{file}: {err}");
    }
}
