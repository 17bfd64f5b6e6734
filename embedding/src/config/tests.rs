//! Unit tests of [`TableConfig`]: state lengths, validation, JSON compatibility.

use super::*;

#[test]
fn state_len_per_optimizer() {
    let mut c = TableConfig::new(1, "t", 16);
    assert_eq!(c.state_len(), 1);
    assert_eq!(c.row_len(), 17);
    c.optimizer = OptimizerConfig::Sgd { lr: 0.1 };
    assert_eq!(c.state_len(), 0);
    c.optimizer = OptimizerConfig::Adagrad {
        lr: 0.1,
        eps: 1e-8,
        initial_accumulator: 0.0,
    };
    assert_eq!(c.row_len(), 32);
}

#[test]
fn validate_names_field_and_value() {
    let mut c = TableConfig::new(3, "t", 0);
    let e = c.validate().unwrap_err().to_string();
    assert_eq!(e, "table 3: invalid dim = 0, expected 1..=4096");
    c.dim = 4097;
    assert!(c.validate().is_err());
    c.dim = 4096;
    c.validate().unwrap();
    c.optimizer = OptimizerConfig::Sgd { lr: f32::NAN };
    let e = c.validate().unwrap_err().to_string();
    assert_eq!(
        e,
        "table 3: invalid optimizer.lr = NaN, expected a finite value > 0"
    );
    c.optimizer = OptimizerConfig::RowAdagrad {
        lr: 0.1,
        eps: 0.0,
        initial_accumulator: 0.0,
    };
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("optimizer.eps = 0"));
    c.optimizer = OptimizerConfig::Sgd { lr: 0.1 };
    c.init = InitConfig::normal(-1.0);
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("init.std = -1"));
}

#[test]
fn json_round_trip() {
    let c = TableConfig::new(7, "C7", 8);
    let s = serde_json::to_string(&c).unwrap();
    assert!(s.contains("\"type\":\"row_adagrad\""), "{s}");
    let back: TableConfig = serde_json::from_str(&s).unwrap();
    assert_eq!(back, c);
}

#[test]
fn state_len_of_adam_and_ftrl() {
    let mut c = TableConfig::new(1, "t", 16);
    c.optimizer = OptimizerConfig::Adam {
        lr: 0.001,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    assert_eq!(c.state_len(), 33);
    assert_eq!(c.row_len(), 49);
    c.optimizer = OptimizerConfig::Ftrl {
        alpha: 0.1,
        beta: 1.0,
        l1: 0.0,
        l2: 0.0,
    };
    assert_eq!(c.state_len(), 32);
    assert_eq!(c.optimizer.lr(), 0.1);
}

#[test]
fn validate_new_fields() {
    let base = TableConfig::new(4, "t", 8);
    let err = |f: &dyn Fn(&mut TableConfig)| {
        let mut c = base.clone();
        f(&mut c);
        c.validate().unwrap_err().to_string()
    };
    let adam = |beta1, beta2, eps| OptimizerConfig::Adam {
        lr: 0.1,
        beta1,
        beta2,
        eps,
    };
    assert_eq!(
        err(&|c| c.optimizer = adam(1.0, 0.999, 1e-8)),
        "table 4: invalid optimizer.beta1 = 1, expected a value in [0, 1)"
    );
    assert!(err(&|c| c.optimizer = adam(0.9, -0.1, 1e-8)).contains("optimizer.beta2 = -0.1"));
    assert!(err(&|c| c.optimizer = adam(0.9, f32::NAN, 1e-8)).contains("optimizer.beta2 = NaN"));
    assert!(err(&|c| c.optimizer = adam(0.9, 0.99, 0.0)).contains("optimizer.eps = 0"));
    let ftrl = |alpha, beta, l1, l2| OptimizerConfig::Ftrl {
        alpha,
        beta,
        l1,
        l2,
    };
    assert!(err(&|c| c.optimizer = ftrl(0.0, 1.0, 0.0, 0.0)).contains("optimizer.alpha = 0"));
    assert!(err(&|c| c.optimizer = ftrl(0.1, -1.0, 0.0, 0.0)).contains("optimizer.beta = -1"));
    assert!(err(&|c| c.optimizer = ftrl(0.1, 1.0, -2.0, 0.0)).contains("optimizer.l1 = -2"));
    assert!(
        err(&|c| c.optimizer = ftrl(0.1, 1.0, 0.0, f32::INFINITY)).contains("optimizer.l2 = inf")
    );
    assert_eq!(
        err(&|c| c.weight_decay = -0.5),
        "table 4: invalid weight_decay = -0.5, expected a finite value >= 0"
    );
    assert!(err(&|c| c.clip_norm = f32::NAN).contains("clip_norm = NaN"));
    let adm = |min_count, width, depth| {
        Some(AdmissionConfig {
            min_count,
            width,
            depth,
        })
    };
    assert_eq!(
        err(&|c| c.admission = adm(0, 16, 2)),
        "table 4: invalid admission.min_count = 0, expected an integer >= 1"
    );
    assert!(err(&|c| c.admission = adm(2, 0, 2)).contains("admission.width = 0"));
    assert!(err(&|c| c.admission = adm(2, 16, 9)).contains("admission.depth = 9"));
    assert_eq!(
        err(&|c| c.ttl_secs = Some(0)),
        "table 4: invalid ttl_secs = 0, expected 1..=4294967295 seconds"
    );
    assert!(err(&|c| c.ttl_secs = Some(1 << 40)).contains("ttl_secs = 1099511627776"));
    let mut ok = base.clone();
    ok.optimizer = adam(0.0, 0.999, 1e-8);
    ok.weight_decay = 1e-4;
    ok.clip_norm = 1.0;
    ok.admission = adm(1, 1, 1);
    ok.ttl_secs = Some(u64::from(u32::MAX));
    ok.validate().unwrap();
}

/// A config stored by an earlier version (before weight decay, clipping, admission and TTL) still loads,
/// with every new field off.
#[test]
fn config_of_earlier_versions_still_parses() {
    let old = r#"{"id":7,"name":"C7","dim":8,"optimizer":{"type":"row_adagrad","lr":0.01,"eps":1e-8,"initial_accumulator":0.0},"init":{"kind":{"type":"normal","std":0.5}},"seed":3}"#;
    let c: TableConfig = serde_json::from_str(old).unwrap();
    let want = TableConfig {
        init: InitConfig::normal(0.5),
        seed: 3,
        ..TableConfig::new(7, "C7", 8)
    };
    assert_eq!(c, want);
    assert_eq!((c.weight_decay, c.clip_norm), (0.0, 0.0));
    assert_eq!((c.admission, c.ttl_secs), (None, None));
}

#[test]
fn json_round_trip_of_new_fields() {
    let mut c = TableConfig::new(2, "C2", 4);
    c.optimizer = OptimizerConfig::Ftrl {
        alpha: 0.05,
        beta: 1.0,
        l1: 0.5,
        l2: 0.25,
    };
    c.weight_decay = 0.01;
    c.clip_norm = 2.0;
    c.admission = Some(AdmissionConfig {
        min_count: 3,
        width: 1024,
        depth: 4,
    });
    c.ttl_secs = Some(86_400);
    let s = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<TableConfig>(&s).unwrap(), c);
    c.optimizer = OptimizerConfig::Adam {
        lr: 0.001,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    let s = serde_json::to_string(&c).unwrap();
    assert!(s.contains("\"type\":\"adam\""), "{s}");
    assert_eq!(serde_json::from_str::<TableConfig>(&s).unwrap(), c);
}

#[test]
fn differences_lists_fields() {
    let a = TableConfig::new(1, "a", 16);
    let mut b = a.clone();
    assert_eq!(a.differences(&b), "");
    b.dim = 32;
    b.seed = 5;
    assert_eq!(
        a.differences(&b),
        "dim: registered 16, requested 32; seed: registered 0, requested 5"
    );
}

#[test]
fn counter_table_subtracts_pushes_exactly() {
    let cfg = TableConfig::counter(4, 2);
    cfg.validate().unwrap();
    assert_eq!((cfg.id, cfg.name.as_str(), cfg.dim), (4, "C4", 2));
    let mut row = [1f32; 2];
    crate::init::fill_row(&cfg, 99, &mut row);
    assert_eq!(row, [0.0; 2]);
}

/// JSON (files, the store, the wire's text) and TOML read back every config they write.
#[test]
fn json_and_toml_round_trip_of_every_optimizer() {
    for c in TableConfig::every_kind() {
        c.validate().unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"optimizer\":{\"type\":\""), "{json}");
        assert_eq!(serde_json::from_str::<TableConfig>(&json).unwrap(), c);
        let toml = toml::to_string(&c).unwrap();
        assert_eq!(toml::from_str::<TableConfig>(&toml).unwrap(), c, "{toml}");
    }
}

#[test]
fn persisted_json_of_the_previous_release_loads() {
    let old = r#"{"id":3,"name":"C3","dim":16,"optimizer":{"type":"adagrad","lr":0.1,"eps":0.000001,"initial_accumulator":0.1},"init":{"kind":{"type":"uniform","scale":0.25}},"seed":9,"weight_decay":0.0,"clip_norm":1.0,"admission":{"min_count":2,"width":64,"depth":2},"ttl_secs":60}"#;
    let c: TableConfig = serde_json::from_str(old).unwrap();
    let want = TableConfig {
        optimizer: OptimizerConfig::Adagrad {
            lr: 0.1,
            eps: 1e-6,
            initial_accumulator: 0.1,
        },
        init: InitConfig::uniform(0.25),
        seed: 9,
        clip_norm: 1.0,
        admission: Some(AdmissionConfig {
            min_count: 2,
            width: 64,
            depth: 2,
        }),
        ttl_secs: Some(60),
        ..TableConfig::new(3, "C3", 16)
    };
    assert_eq!(c, want);
    assert_eq!(serde_json::to_string(&c).unwrap(), old);
    // The tagged form still refuses what it refused.
    let unknown = old.replace("\"lr\":0.1,", "\"lr\":0.1,\"momentum\":0.9,");
    let e = serde_json::from_str::<TableConfig>(&unknown).unwrap_err();
    assert!(e.to_string().contains("unknown field `momentum`"), "{e}");
    let e = serde_json::from_str::<TableConfig>(&old.replace("adagrad", "lamb")).unwrap_err();
    assert!(e.to_string().contains("unknown variant `lamb`"), "{e}");
}

/// A TOML table config as users write it.
#[test]
fn toml_table_config_loads() {
    let text = r#"
        id = 1
        name = "user"
        dim = 8
        seed = 7
        optimizer = { type = "row_adagrad", lr = 0.05, eps = 1e-8, initial_accumulator = 0.0 }
        init = { kind = { type = "normal", std = 0.01 } }
        ttl_secs = 3600
    "#;
    let c: TableConfig = toml::from_str(text).unwrap();
    assert_eq!(
        c,
        TableConfig {
            optimizer: OptimizerConfig::RowAdagrad {
                lr: 0.05,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            init: InitConfig::normal(0.01),
            seed: 7,
            ttl_secs: Some(3600),
            ..TableConfig::new(1, "user", 8)
        }
    );
}
