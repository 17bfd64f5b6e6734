//! Tests of [`super::ModelSpec`]: shipped specs, round trips, and refusals naming the field.

use super::*;

const SMALL: &str = r#"
name = "t"
bottom_mlp = [8, 4]
top_mlp = [4, 1]
[sparse]
dim = 4
[[feature]]
column = "C1"
table = "a"
[[feature]]
column = "C2"
table = "b"
tokens = 3
pooling = "mean"
"#;

fn refused(text: &str) -> String {
    match ModelSpec::parse(text) {
        Ok(spec) => panic!("accepted {spec:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn shipped_specs_parse() {
    for (name, _) in SHIPPED {
        let spec = ModelSpec::load(name).unwrap();
        assert_eq!(spec.name, name);
        assert_eq!(spec.features.len(), 26);
        spec.dlrm_config().validate().unwrap();
    }
    let v2 = ModelSpec::load("dlrm-v2").unwrap();
    assert_eq!(v2.feature_dim(0), 128);
    assert_eq!(
        v2.interaction,
        InteractionConfig::Dcn {
            layers: 3,
            rank: 512
        }
    );
    let tokens: Vec<usize> = v2.features.iter().map(|f| f.tokens).collect();
    assert_eq!(
        tokens,
        [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
    );
    assert!(v2.is_multi_hot());
    assert_eq!(v2.dlrm_config().interaction_dim(), 128 + 26 * 128);
}

#[test]
fn defaults_overrides_and_shared_tables() {
    let spec = ModelSpec::parse(SMALL).unwrap();
    assert_eq!(spec.tables.len(), 2);
    assert_eq!(spec.features[1].pooling, Pooling::Mean);
    assert_eq!(spec.features[1].tokens, 3);
    assert_eq!(spec.tables[0].lr, 0.05);
    assert_eq!(spec.tables[0].pull, Encoding::F16);
    let shared = SMALL.replace("table = \"b\"", "table = \"a\"");
    let spec = ModelSpec::parse(&shared).unwrap();
    assert_eq!(spec.tables.len(), 1);
    assert_eq!(spec.features[1].table, 0);
    let layout = spec.sparse_layout();
    assert_eq!(layout.dims, [4]);
    assert_eq!(layout.width(), 8);
    let input = spec.feature_layout();
    assert_eq!(input.features[1].table, 0);
    assert_eq!(input.features[1].column, 1);
    assert_eq!(input.features[1].tokens, 3);
}

#[test]
fn a_spec_round_trips_through_toml() {
    let file: SpecFile = toml::from_str(SMALL).unwrap();
    let text = toml::to_string(&file).unwrap();
    let back: SpecFile = toml::from_str(&text).unwrap();
    assert_eq!(back, file);
    assert_eq!(back.resolve().unwrap(), ModelSpec::parse(SMALL).unwrap());
    for (_, shipped) in SHIPPED {
        let file: SpecFile = toml::from_str(shipped).unwrap();
        let back: SpecFile = toml::from_str(&toml::to_string(&file).unwrap()).unwrap();
        assert_eq!(back.resolve().unwrap(), file.resolve().unwrap());
    }
}

#[test]
fn bad_specs_are_refused_naming_the_field() {
    let unknown = refused(&SMALL.replace("tokens = 3", "tokens = 3\ncolour = 1"));
    assert!(unknown.contains("colour"), "{unknown}");
    let zero = refused(&SMALL.replace("tokens = 3", "tokens = 3\ndim = 0"));
    assert!(zero.contains("feature[1] (C2).dim: 0"), "{zero}");
    let no_table = refused(&SMALL.replace("table = \"b\"\n", ""));
    assert!(no_table.contains("table"), "{no_table}");
    let dot = refused(&SMALL.replace("tokens = 3", "tokens = 3\ndim = 8"));
    assert!(
        dot.starts_with("interaction: dot needs every feature's dim")
            && dot.contains("feature[1] (C2) has dim 8"),
        "{dot}"
    );
    // The same dimension mismatch fits a DCN interaction.
    let dcn = SMALL.replace("tokens = 3", "tokens = 3\ndim = 8")
        + "[interaction]\nkind = \"dcn\"\nlayers = 2\nrank = 3\n";
    let spec = ModelSpec::parse(&dcn).unwrap();
    assert_eq!(spec.dlrm_config().feature_dims, [4, 8]);
    let no_rank = refused(&dcn.replace("rank = 3", "rank = 0"));
    assert!(no_rank.starts_with("interaction"), "{no_rank}");
    let shared = refused(
        &SMALL
            .replace("table = \"b\"", "table = \"a\"")
            .replace("tokens = 3", "tokens = 3\ndim = 8"),
    );
    assert!(
        shared.contains("feature[1] (C2).dim: 8, but table \"a\" has dim 4 from feature[0] (C1)"),
        "{shared}"
    );
    let column = refused(&SMALL.replace("\"C2\"", "\"C27\""));
    assert!(column.contains("feature[1].column: \"C27\""), "{column}");
    let twice = refused(&SMALL.replace("\"C2\"", "\"C1\""));
    assert!(twice.contains("feature[1] (C1).column"), "{twice}");
    let enc = refused(&SMALL.replace("tokens = 3", "tokens = 3\nencoding = \"f17\""));
    assert!(enc.contains("feature[1] (C2).encoding"), "{enc}");
    let dense = refused(&SMALL.replace("name = \"t\"", "name = \"t\"\ndense_inputs = 14"));
    assert!(dense.starts_with("dense_inputs: 14"), "{dense}");
    let top = refused(&SMALL.replace("top_mlp = [4, 1]", "top_mlp = [4, 2]"));
    assert!(top.starts_with("top_mlp"), "{top}");
    let none = refused("name = \"x\"\nbottom_mlp = [4]\ntop_mlp = [1]\n");
    assert!(none.starts_with("feature"), "{none}");
    let missing_dim = refused(&SMALL.replace("[sparse]\ndim = 4", ""));
    assert!(
        missing_dim.contains("feature[0] (C1).dim: missing"),
        "{missing_dim}"
    );
    assert!(matches!(
        ModelSpec::load("no-such-spec"),
        Err(SpecError::Unknown(_))
    ));
}

/// `ids = "token"` (TorchRec's Criteo ids) and `optimizer = "adam"`: set per table, carried into the reader's
/// layout and the table configs, agreed by every feature of a shared table, kept out of the JSON when hashed
/// (exports written before it read back as hashed).
#[test]
fn token_ids_and_adam_tables() {
    let text = r#"
name = "t"
bottom_mlp = [8, 4]
top_mlp = [4, 1]
[sparse]
dim = 4
hash_size = 100
[[feature]]
column = "C1"
table = "a"
ids = "token"
optimizer = "adam"
[[feature]]
column = "C2"
table = "b"
"#;
    let spec = ModelSpec::parse(text).unwrap();
    assert_eq!(spec.tables[0].ids, Ids::Token);
    assert_eq!(spec.tables[1].ids, Ids::Hashed);
    let layout = spec.feature_layout();
    assert_eq!(layout.features[0].ids, criteo::IdScheme::Token);
    assert_eq!(layout.features[0].id(Some(0x1234)), 0x1234 % 100);
    assert_eq!(layout.features[1].ids, criteo::IdScheme::Hashed);
    let configs = spec.table_configs(1, 0.05);
    assert!(matches!(
        configs[0].optimizer,
        OptimizerConfig::Adam { lr, .. } if lr == OptimizerKind::Adam.default_lr()
    ));
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(json.matches("\"ids\"").count(), 1, "{json}");
    let old = json.replace(",\"ids\":\"token\"", "");
    let back: ModelSpec = serde_json::from_str(&old).unwrap();
    assert_eq!(back.tables[0].ids, Ids::Hashed);
    let shared = text.replace(
        "table = \"b\"",
        "table = \"a\"\nids = \"hashed\"\noptimizer = \"adam\"",
    );
    let err = refused(&shared);
    assert!(err.contains("ids"), "{err}");
    let err = refused(&text.replace("ids = \"token\"", "ids = \"raw\""));
    assert!(err.contains("raw"), "{err}");
}

/// `precision`: set in `[sparse]` or per table, carried into the table configs, agreed by the features of a
/// shared table, refused for SGD tables, and kept out of the JSON when f32 (specs and exports written before it
/// read back as f32).
#[test]
fn row_precision_per_table() {
    let text = r#"
name = "t"
bottom_mlp = [8, 4]
top_mlp = [4, 1]
[sparse]
dim = 4
precision = "bf16"
[[feature]]
column = "C1"
table = "a"
[[feature]]
column = "C2"
table = "b"
precision = "f32"
"#;
    let spec = ModelSpec::parse(text).unwrap();
    let configs = spec.table_configs(1, 0.05);
    assert_eq!(configs[0].precision, RowPrecision::Bf16);
    assert_eq!(configs[1].precision, RowPrecision::F32);
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(json.matches("\"precision\"").count(), 1, "{json}");
    let back: ModelSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, spec);
    let err = refused(&text.replace(
        "table = \"b\"\nprecision = \"f32\"",
        "table = \"a\"\nprecision = \"f16\"",
    ));
    assert!(err.contains("precision") && err.contains("bf16"), "{err}");
    let err = refused(&text.replace(
        "precision = \"bf16\"",
        "precision = \"bf16\"\noptimizer = \"sgd\"",
    ));
    assert!(
        err.contains("feature[0] (C1).precision") && err.contains("sgd"),
        "{err}"
    );
    let err = refused(&text.replace("\"bf16\"", "\"int8\""));
    assert!(err.contains("int8"), "{err}");
    // The trainer's `--row-precision` sets every table, with the same refusal.
    let mut all = spec.clone();
    all.set_precision(RowPrecision::F16).unwrap();
    assert!(all.tables.iter().all(|t| t.precision == RowPrecision::F16));
    let mut sgd =
        ModelSpec::parse(&text.replace("precision = \"bf16\"", "optimizer = \"sgd\"")).unwrap();
    let err = sgd
        .set_precision(RowPrecision::Bf16)
        .unwrap_err()
        .to_string();
    assert!(err.contains("table[0].precision"), "{err}");
}

/// `eviction`: a row cap per table, carried into the table configs, agreed by the features of a shared table.
#[test]
fn row_caps_per_table() {
    let text = r#"
name = "t"
bottom_mlp = [8, 4]
top_mlp = [4, 1]
[sparse]
dim = 4
[[feature]]
column = "C1"
table = "a"
eviction = { policy = "lfu", max_rows = 1000, decay_secs = 60 }
[[feature]]
column = "C2"
table = "b"
"#;
    let spec = ModelSpec::parse(text).unwrap();
    let configs = spec.table_configs(1, 0.05);
    let cap = configs[0].eviction.unwrap();
    assert_eq!(
        (cap.max_rows, cap.max_bytes, cap.decay_secs),
        (Some(1000), None, Some(60))
    );
    assert_eq!(configs[1].eviction, None);
    let back: ModelSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
    assert_eq!(back, spec);
    let err = refused(&text.replace("table = \"b\"", "table = \"a\""));
    assert!(err.contains("eviction"), "{err}");
    let err = refused(&text.replace("\"lfu\"", "\"lru\""));
    assert!(err.contains("lru"), "{err}");
    // The score policy parses (pstrain feeds its scores).
    let scored = ModelSpec::parse(&text.replace("\"lfu\"", "\"score\"")).unwrap();
    assert_eq!(
        scored.table_configs(1, 0.05)[0].eviction.unwrap().policy,
        protocol::EvictionPolicy::Score
    );
}
