//! Tests of the parent module.

use super::*;
use crate::model::spec::ModelSpec;
use protocol::plan::SparseLayout;

#[test]
fn defaults_are_valid_and_match_the_issue() {
    let m = ModelArgs::default();
    m.validate().unwrap();
    assert_eq!(m.dlrm().interaction_dim(), 367);
    assert_eq!(m.table_configs(26).len(), 26);
    assert_eq!(m.batch_size, 2048);
    assert_eq!((m.staleness_bound(1), m.staleness_bound(2)), (2, 0));
    let explicit: ModelArgs = toml::from_str("max-in-flight = 3").unwrap();
    assert_eq!(
        (explicit.staleness_bound(1), explicit.staleness_bound(4)),
        (3, 3)
    );
    // The synchronous warm-up only where rows can lack updates the trainer cannot replay (issue 44).
    assert_eq!((m.staleness_warmup(1), m.staleness_warmup(2)), (0, 100));
    let no_replay = ModelArgs {
        replay_own_updates: false,
        ..ModelArgs::default()
    };
    assert_eq!(no_replay.staleness_warmup(1), 100);
    let explicit: ModelArgs = toml::from_str("staleness-warmup-steps = 7").unwrap();
    assert_eq!(
        (explicit.staleness_warmup(1), explicit.staleness_warmup(2)),
        (7, 7)
    );
    for bad in [0.0, -0.5, 1.5, f32::NAN] {
        let m = ModelArgs {
            dense_push_fraction: bad,
            ..ModelArgs::default()
        };
        let err = m.validate().unwrap_err();
        assert!(err.mentions("dense-push-fraction"), "{bad}: {err}");
    }
}

#[test]
fn bad_values_named() {
    let m = ModelArgs {
        lr: Some(f32::NAN),
        ..ModelArgs::default()
    };
    assert!(m.validate().unwrap_err().mentions("lr = NaN"));
    let m = ModelArgs {
        bottom_mlp: vec![512, 8],
        ..ModelArgs::default()
    };
    assert!(m.validate().is_err());
    let err = toml::from_str::<ModelArgs>("batch-sise = 3")
        .unwrap_err()
        .to_string();
    assert!(err.contains("batch-sise"), "{err}");
    let m: ModelArgs = toml::from_str("batch-size = 3\noptimizer = \"sgd\"").unwrap();
    assert_eq!((m.batch_size, m.optimizer), (3, OptimizerKind::Sgd));
}

#[test]
fn per_table_encodings_parse_and_bad_entries_are_named() {
    let m = ModelArgs {
        pull_encoding: Some(Encoding::F16),
        push_encoding: Some(Encoding::Int8),
        table_encoding: vec!["C3=f32".into(), "C26=bf16/f16".into()],
        ..ModelArgs::default()
    };
    m.validate().unwrap();
    let c = m.table_codecs(26).unwrap();
    assert_eq!((c.pull[0], c.push[0]), (Encoding::F16, Encoding::Int8));
    assert_eq!((c.pull[2], c.push[2]), (Encoding::F32, Encoding::F32));
    assert_eq!((c.pull[25], c.push[25]), (Encoding::Bf16, Encoding::F16));
    assert!(m.residual_store(&c).is_some());
    for (bad, named) in [
        ("C27=f16", "C27"),
        ("C3", "NAME=ENC"),
        ("C3=f8", "f8"),
        ("X1=f16", "X1"),
    ] {
        let m = ModelArgs {
            table_encoding: vec![bad.into()],
            ..ModelArgs::default()
        };
        let err = m.validate().unwrap_err();
        assert!(err.mentions(named), "{bad}: {err}");
    }
    let m: ModelArgs =
        toml::from_str("push-encoding = \"int8\"\ntable-encoding = [\"C1=f32\"]").unwrap();
    assert_eq!(m.table_codecs(26).unwrap().push[1], Encoding::Int8);
    let off = ModelArgs {
        encoding: Encoding::F32,
        ..ModelArgs::default()
    };
    assert!(off.residual_store(&off.table_codecs(26).unwrap()).is_none());
}

#[test]
fn dense_precision_parses_and_the_k8s_model_config_picks_auto() {
    assert_eq!(ModelArgs::default().dense_precision, DensePrecision::F32);
    let k8s: ModelArgs = toml::from_str(include_str!("../../../k8s/base/model.toml")).unwrap();
    assert_eq!(k8s.dense_precision, DensePrecision::Auto);
    for (text, want) in [("f32", DensePrecision::F32), ("bf16", DensePrecision::Bf16)] {
        let m: ModelArgs = toml::from_str(&format!("dense-precision = \"{text}\"")).unwrap();
        assert_eq!(m.dense_precision, want);
    }
    let err = toml::from_str::<ModelArgs>("dense-precision = \"fp8\"").unwrap_err();
    assert!(err.to_string().contains("fp8"), "{err}");
    assert_eq!(DensePrecision::F32.resolve(), crate::model::Precision::F32);
    let auto = DensePrecision::Auto.resolve();
    assert_eq!(
        auto == crate::model::Precision::Bf16,
        crate::model::bf16_preferred()
    );
}

#[test]
fn error_feedback_auto_skips_f16_and_old_bool_configs_still_parse() {
    let f16 = ModelArgs::default();
    assert_eq!(f16.error_feedback, FeedbackMode::Auto);
    let c = f16.table_codecs(26).unwrap();
    assert!(!c.feedback_for(Encoding::F16) && c.feedback_for(Encoding::Int8));
    assert!(f16.residual_store(&c).is_none(), "auto: no store for f16");
    let mixed = ModelArgs {
        table_encoding: vec!["C2=f16/int8".into()],
        ..ModelArgs::default()
    };
    assert!(mixed
        .residual_store(&mixed.table_codecs(26).unwrap())
        .is_some());
    for (text, mode) in [
        ("error-feedback = true", FeedbackMode::On),
        ("error-feedback = false", FeedbackMode::Off),
        ("error-feedback = \"auto\"", FeedbackMode::Auto),
        ("error-feedback = \"on\"", FeedbackMode::On),
    ] {
        let m: ModelArgs = toml::from_str(text).unwrap();
        assert_eq!(m.error_feedback, mode, "{text}");
    }
    let on: ModelArgs = toml::from_str("error-feedback = true").unwrap();
    let c = on.table_codecs(26).unwrap();
    assert!(c.feedback_for(Encoding::F16) && on.residual_store(&c).is_some());
    let err = toml::from_str::<ModelArgs>("error-feedback = \"maybe\"").unwrap_err();
    assert!(err.to_string().contains("maybe"), "{err}");
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        m: ModelArgs,
    }
    for (flag, mode) in [("true", FeedbackMode::On), ("false", FeedbackMode::Off)] {
        let cli = Cli::parse_from(["x", "--error-feedback", flag]);
        assert_eq!(cli.m.error_feedback, mode, "{flag}");
    }
}

#[test]
fn model_flags_beside_a_spec_are_refused() {
    let spec = ModelArgs {
        model_spec: Some("dlrm-v2-small".into()),
        ..ModelArgs::default()
    };
    spec.validate().unwrap();
    let both = ModelArgs {
        emb_dim: 32,
        ..spec.clone()
    };
    let err = both.validate().unwrap_err().to_string();
    assert!(
        err.contains("\"dlrm-v2-small\" with --emb-dim") && err.contains("edit the spec"),
        "{err}"
    );
    let encoding = ModelArgs {
        table_encoding: vec!["C3=f32".into()],
        ..spec
    };
    assert!(encoding
        .validate()
        .unwrap_err()
        .mentions("--table-encoding"));
    let unknown = ModelArgs {
        model_spec: Some("no-such-spec".into()),
        ..ModelArgs::default()
    };
    assert!(unknown.validate().unwrap_err().mentions("no-such-spec"));
}

#[test]
fn the_kaggle_spec_is_the_flags_model() {
    let flags = ModelArgs::default().flag_spec().unwrap();
    let kaggle = ModelSpec::load("dlrm-kaggle").unwrap();
    // The shipped file spells out the flags' default dense optimizer, which the flags leave to --optimizer.
    assert_eq!(kaggle.dense, Some((DenseKind::Adam, Some(0.002))));
    assert_eq!(
        ModelSpec {
            name: "flags".into(),
            dense: None,
            ..kaggle.clone()
        },
        flags
    );
    assert_eq!(kaggle.dlrm_config(), ModelArgs::default().dlrm());
    assert_eq!(
        kaggle.table_configs(1, 0.05),
        ModelArgs::default().table_configs(26)
    );
    assert_eq!(
        kaggle.codecs(Vec::new()).push,
        ModelArgs::default().table_codecs(26).unwrap().push
    );
    assert_eq!(kaggle.sparse_layout(), SparseLayout::uniform(26, 16));
}

/// A spec table evicting by score is refused by the trainer (which gives no scores), naming the table and
/// what to use instead.
#[test]
fn a_table_evicting_by_score_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scored.toml");
    let text = r#"
name = "t"
bottom_mlp = [8, 4]
top_mlp = [4, 1]
[sparse]
dim = 4
[[feature]]
column = "C1"
table = "items"
eviction = { policy = "score", max_rows = 1000 }
"#;
    std::fs::write(&path, text).unwrap();
    let args = ModelArgs {
        model_spec: Some(path.display().to_string()),
        ..ModelArgs::default()
    };
    let err = args.spec().unwrap_err().to_string();
    assert!(
        err.contains("table items") && err.contains("use policy \"lfu\""),
        "{err}"
    );
    std::fs::write(&path, text.replace("\"score\"", "\"lfu\"")).unwrap();
    args.spec().unwrap();
}
