//! Serving end to end with real processes: `trainer demo --export-dir` trains through real servers and
//! writes an export; `ps-serve` loads it and answers `/v1/predict`; the answers on the test rows give the
//! trainer's evaluation AUC and logloss; bad requests get 4xx naming the problem while the server keeps
//! serving; a SIGKILLed `ps-serve` restarts from the export with the same answers.

mod support;

use support::{http, predict_lines, Serve};

fn labels(lines: &[String]) -> Vec<bool> {
    lines.iter().map(|l| l.starts_with('1')).collect()
}

/// Mean binary cross-entropy, clamped as the trainer's evaluator clamps it.
fn logloss(probs: &[f64], labels: &[bool]) -> f64 {
    let probs: Vec<f32> = probs.iter().map(|&p| p as f32).collect();
    let labels: Vec<f32> = labels.iter().map(|&l| f32::from(u8::from(l))).collect();
    model::eval::logloss(&probs, &labels)
}

/// A refused request: the status, path, content type, body and a part of the error message expected.
type BadRequest<'a> = (u16, &'a str, Option<&'a str>, Vec<u8>, &'a str);

/// Equal to float rounding.
fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-6, "{x} vs {y}");
    }
}

/// The trainer's export holds its tables as SafeTensors per shard (`tables.safetensors`), row for row the
/// shard's snapshot, and its dense parameters as `dense.safetensors` equal to `dense.bin`.
fn open_export_equals_the_snapshot(root: &std::path::Path) {
    use embedding::snapshot::tensors::{read_tables, TABLES_FILE};
    let export = model::export::Export::open(root).unwrap();
    let shards: Vec<_> = std::fs::read_dir(export.dir.join("ps"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(shards.len(), export.manifest.num_shards as usize);
    for shard in shards {
        let snap = embedding::snapshot::Snapshot::open(&shard).unwrap();
        let tables = read_tables(&shard.join(TABLES_FILE)).unwrap();
        assert_eq!(tables.len(), snap.manifest().tables.len());
        for t in &tables {
            let mut want = Vec::new();
            snap.for_each_row(t.config.id, &mut |id, bytes| {
                want.push((id, bytes.to_vec()));
                Ok(())
            })
            .unwrap();
            let (dim, sl) = (t.config.dim, t.config.state_len());
            let got: Vec<(u64, Vec<u8>)> = t
                .ids
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    let row = t.weights[i * dim..(i + 1) * dim]
                        .iter()
                        .chain(&t.state[i * sl..(i + 1) * sl]);
                    (id, row.flat_map(|v| v.to_le_bytes()).collect())
                })
                .collect();
            assert!(!got.is_empty(), "table {} has rows", t.prefix);
            assert_eq!(got, want, "table {}", t.prefix);
        }
    }
    let dense =
        embedding::tensors::read_file(&export.dir.join(model::export::DENSE_TENSORS_FILE)).unwrap();
    let flat: Vec<f32> = std::fs::read(export.dir.join(model::export::DENSE_FILE))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(dense.names().count(), export.manifest.param_sizes.len());
    assert_eq!(
        dense
            .f32("bottom.0.weight", dense.shape("bottom.0.weight").unwrap())
            .unwrap(),
        &flat[..export.manifest.param_sizes[0]]
    );
}

/// ps-serve on an export of bf16 rows (issue 43): it holds them as bf16 (the tables' configs say so) and answers
/// with the trainer's AUC and logloss; the export's SafeTensors weights are BF16.
#[test]
fn served_predictions_of_bf16_rows_are_the_trainers() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train.tsv"), dir.path().join("test.tsv"));
    support::generate(20_000, 1, &train);
    support::generate(3_000, 2, &test);
    let export = dir.path().join("export");
    let (summary, stderr) = support::run_demo(
        dir.path(),
        &train,
        &test,
        &[
            "--export-dir",
            export.to_str().unwrap(),
            "--row-precision",
            "bf16",
        ],
    );
    assert!(stderr.contains("export at step"), "{stderr}");
    let dir = model::export::Export::open(&export).unwrap().dir;
    let shard = dir.join("ps/shard-0-of-2/tables.safetensors");
    let file = embedding::tensors::read_file(&shard).unwrap();
    assert_eq!(
        file.dtype("C1.weight").unwrap(),
        embedding::tensors::Dtype::BF16
    );
    let lines = support::read_lines(&test);
    let labels = labels(&lines);
    let serve = Serve::start(&["--export", export.to_str().unwrap()]);
    let probs = predict_lines(serve.addr, &lines, 500);
    let auc = support::auc(&probs, &labels).unwrap();
    let want_auc = summary["auc"].as_f64().unwrap();
    assert!(
        (auc - want_auc).abs() < 1e-6,
        "served AUC {auc}, trainer's {want_auc}"
    );
    let ll = logloss(&probs, &labels);
    let want_ll = summary["logloss"].as_f64().unwrap();
    assert!(
        (ll - want_ll).abs() < 1e-5,
        "served logloss {ll}, trainer's {want_ll}"
    );
    serve.terminate();
}

/// ps-serve holding rows at a serving precision (`--row-precision`, issue 43): f32 answers exactly as the
/// trainer evaluated, bf16 and int8 within a small AUC distance, each in less memory than the one before, and
/// int8 in less than the engine store; an export kept as SafeTensors only loads to the same answers.
#[test]
fn served_predictions_of_quantized_rows_stay_near_the_trainers() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train.tsv"), dir.path().join("test.tsv"));
    support::generate(20_000, 1, &train);
    support::generate(3_000, 2, &test);
    let export = dir.path().join("export");
    let (summary, _) = support::run_demo(
        dir.path(),
        &train,
        &test,
        &["--export-dir", export.to_str().unwrap()],
    );
    let lines = support::read_lines(&test);
    let labels = labels(&lines);
    let want = summary["auc"].as_f64().unwrap();
    let export_s = export.to_str().unwrap();
    let served = |extra: &[&str]| {
        let mut args = vec!["--export", export_s];
        args.extend_from_slice(extra);
        let serve = Serve::start(&args);
        let probs = predict_lines(serve.addr, &lines, 500);
        let (_, metrics) = http(serve.addr, "GET", "/metrics", None, b"");
        let bytes = local_cluster::metric(&metrics, "serving_rows_memory_bytes").unwrap();
        let rows = local_cluster::metric(&metrics, "serving_rows_in_memory").unwrap();
        assert!(serve.terminate().success());
        (probs, bytes, rows)
    };
    let (_, engine_bytes, engine_rows) = served(&[]);
    let mut last = (f64::INFINITY, "nothing");
    let mut int8 = Vec::new();
    for (p, max_gap) in [("f32", 1e-6), ("bf16", 0.002), ("int8", 0.005)] {
        let (probs, bytes, rows) = served(&["--row-precision", p]);
        assert!(rows > 0.0 && rows <= engine_rows, "{p}: {rows} rows");
        let auc = support::auc(&probs, &labels).unwrap();
        assert!(
            (auc - want).abs() < max_gap,
            "{p}: served AUC {auc}, the trainer's {want}"
        );
        assert!(
            bytes < last.0,
            "{p}: {bytes} bytes of rows, not less than {} with {}",
            last.0,
            last.1
        );
        last = (bytes, p);
        if p == "int8" {
            assert!(
                bytes < engine_bytes,
                "int8: {bytes} bytes, the engine store {engine_bytes}"
            );
            int8 = probs;
        }
        eprintln!("{p}: {bytes} bytes for {rows} rows (engine store {engine_bytes}), AUC {auc} (trainer {want})");
    }
    // Without the shards' RocksDB the rows load from tables.safetensors: the same int8 rows, the same answers.
    let version = model::export::Export::open(&export).unwrap().dir;
    for shard in ["shard-0-of-2", "shard-1-of-2"] {
        std::fs::remove_dir_all(
            version
                .join("ps")
                .join(shard)
                .join(embedding::snapshot::DB_DIR),
        )
        .unwrap();
    }
    let (probs, _, _) = served(&["--row-precision", "int8"]);
    assert_eq!(probs, int8);
}

#[test]
fn served_predictions_are_the_trainers() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train.tsv"), dir.path().join("test.tsv"));
    support::generate(30_000, 1, &train);
    support::generate(4_000, 2, &test);
    let export = dir.path().join("export");
    let (summary, stderr) = support::run_demo(
        dir.path(),
        &train,
        &test,
        &["--export-dir", export.to_str().unwrap()],
    );
    assert!(stderr.contains("export at step"), "{stderr}");
    open_export_equals_the_snapshot(&export);
    let lines = support::read_lines(&test);
    let labels = labels(&lines);

    let serve = Serve::start(&[
        "--export",
        export.to_str().unwrap(),
        "--max-body-bytes",
        "200000",
        "--max-rows",
        "1000",
    ]);
    let probs = predict_lines(serve.addr, &lines, 500);
    assert_eq!(probs.len(), lines.len());
    let auc = support::auc(&probs, &labels).unwrap();
    let want_auc = summary["auc"].as_f64().unwrap();
    assert!(
        (auc - want_auc).abs() < 1e-6,
        "served AUC {auc}, trainer's {want_auc}"
    );
    let ll = logloss(&probs, &labels);
    let want_ll = summary["logloss"].as_f64().unwrap();
    assert!(
        (ll - want_ll).abs() < 1e-5,
        "served logloss {ll}, trainer's {want_ll}"
    );
    // One row at a time gives the same answers as batches, to float rounding (micro-batching cuts the rows
    // into other chunks).
    close(&predict_lines(serve.addr, &lines[..20], 1), &probs[..20]);

    // The same row as JSON.
    let fields: Vec<&str> = lines[0].split('\t').skip(1).collect();
    let mut obj = serde_json::Map::new();
    for (i, f) in fields.iter().enumerate().filter(|(_, f)| !f.is_empty()) {
        let (key, value) = if i < 13 {
            (
                format!("I{}", i + 1),
                serde_json::json!(f.parse::<i64>().unwrap()),
            )
        } else {
            (format!("C{}", i - 12), serde_json::json!(f))
        };
        obj.insert(key, value);
    }
    let body = serde_json::Value::Array(vec![serde_json::Value::Object(obj)]).to_string();
    let (status, answer) = http(
        serve.addr,
        "POST",
        "/v1/predict",
        Some("application/json"),
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{answer}");
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert!((v["probabilities"][0].as_f64().unwrap() - probs[0]).abs() < 1e-6);
    assert_eq!(v["version"], summary["step"]);

    // Bad requests: 4xx naming the problem; the server keeps serving.
    let unlabeled = |l: &String| l.split_once('\t').unwrap().1.to_owned();
    let row = unlabeled(&lines[0]);
    let cases: Vec<BadRequest> = vec![
        (
            400,
            "/v1/predict",
            Some("application/json"),
            b"[{\"I1\": ".to_vec(),
            "malformed JSON",
        ),
        (
            400,
            "/v1/predict",
            Some("text/tab-separated-values"),
            format!("{row}\textra").into_bytes(),
            "expected at most 39",
        ),
        (
            400,
            "/v1/predict",
            None,
            row.replacen('\t', "\tzz\t", 1).into_bytes(),
            "is not a 64-bit integer",
        ),
        (
            400,
            "/v1/predict",
            Some("text/tab-separated-values"),
            format!("{}\tnothex!", "\t".repeat(12)).into_bytes(),
            "column C1",
        ),
        (
            400,
            "/v1/predict",
            Some("application/json"),
            br#"[{"C27": "00"}]"#.to_vec(),
            "unknown key",
        ),
        (
            413,
            "/v1/predict",
            Some("text/tab-separated-values"),
            vec![b'\n'; 300_000],
            "--max-body-bytes",
        ),
        (
            413,
            "/v1/predict",
            Some("text/tab-separated-values"),
            "1\n".repeat(1001).into_bytes(),
            "--max-rows 1000",
        ),
        (
            415,
            "/v1/predict",
            Some("image/png"),
            row.clone().into_bytes(),
            "content type",
        ),
        (400, "/v1/predict", None, b"".to_vec(), "no rows"),
        (404, "/v2/predict", None, Vec::new(), "no route /v2/predict"),
    ];
    for (want, path, ct, body, needle) in cases {
        let (status, answer) = http(serve.addr, "POST", path, ct, &body);
        assert_eq!(status, want, "{path} {needle}: {answer}");
        assert!(answer.contains(needle), "expected {needle:?} in {answer}");
        assert!(answer.starts_with("{\"error\":"), "{answer}");
    }
    let (status, answer) = http(serve.addr, "GET", "/v1/predict", None, b"");
    assert_eq!(
        (status, answer.contains("use POST")),
        (405, true),
        "{answer}"
    );
    let after = predict_lines(serve.addr, &lines[..5], 5);
    close(&after, &probs[..5]);
    let (status, metrics) = http(serve.addr, "GET", "/metrics", None, b"");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("serving_requests_total{route=\"/v1/predict\",code=\"400\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("serving_batch_rows_bucket"), "{metrics}");

    // SIGKILL, restart from the export: the same answers.
    drop(serve);
    let serve = Serve::start(&["--export", export.to_str().unwrap()]);
    close(&predict_lines(serve.addr, &lines[..50], 50), &probs[..50]);
    let status = serve.terminate();
    assert!(status.success(), "ps-serve exited with {status} on SIGTERM");

    // The export kept as SafeTensors only (every shard's RocksDB removed): ps-serve loads the tables from
    // tables.safetensors and answers exactly as before.
    let version = model::export::Export::open(&export).unwrap().dir;
    for entry in std::fs::read_dir(version.join("ps")).unwrap() {
        std::fs::remove_dir_all(entry.unwrap().path().join("rocksdb")).unwrap();
    }
    let serve = Serve::start(&["--export", export.to_str().unwrap()]);
    let from_tensors = predict_lines(serve.addr, &lines, 500);
    assert_eq!(from_tensors, probs, "the same probabilities, bit for bit");
    let status = serve.terminate();
    assert!(status.success(), "ps-serve exited with {status} on SIGTERM");
}

/// Publish-time pruning (issue 43): with every table capped (so its rows count their updates), an export with
/// `--export-prune-min-count 2` holds fewer rows than the same training's export without it, and only rows
/// the unpruned export holds; `ps-serve` loads it.
#[test]
fn a_pruned_export_leaves_out_rarely_updated_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train.tsv"), dir.path().join("test.tsv"));
    support::generate(20_000, 1, &train);
    support::generate(2_000, 2, &test);
    let d = trainer::config::ModelArgs::default();
    let list = |v: &[usize]| {
        v.iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut spec = format!(
        "name = \"capped\"\nbottom_mlp = [{}]\ntop_mlp = [{}]\n[sparse]\ndim = {}\n",
        list(&d.bottom_mlp),
        list(&d.top_mlp),
        d.bottom_mlp.last().unwrap()
    );
    for k in 1..=26 {
        spec += &format!(
            "[[feature]]\ncolumn = \"C{k}\"\ntable = \"C{k}\"\n\
             eviction = {{ policy = \"lfu\", max_rows = 100000000 }}\n"
        );
    }
    let spec_path = dir.path().join("capped.toml");
    std::fs::write(&spec_path, spec).unwrap();
    let spec_path = spec_path.to_str().unwrap();
    // Rows per (table, id) of the export under `root`, from its shards' tables.safetensors.
    let exported = |root: &std::path::Path| {
        let version = model::export::Export::open(root).unwrap().dir;
        let mut ids = std::collections::BTreeSet::new();
        for shard in ["shard-0-of-2", "shard-1-of-2"] {
            let file = version.join("ps").join(shard).join("tables.safetensors");
            for t in embedding::snapshot::tensors::read_tables(&file).unwrap() {
                ids.extend(t.ids.iter().map(|&id| (t.config.id, id)));
            }
        }
        ids
    };
    let run = |name: &str, extra: &[&str]| {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let export = sub.join("export");
        let mut args = vec![
            "--model-spec",
            spec_path,
            "--export-dir",
            export.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        support::run_demo(&sub, &train, &test, &args);
        export
    };
    let whole = exported(&run("whole", &[]));
    let pruned_root = run("pruned", &["--export-prune-min-count", "2"]);
    let pruned = exported(&pruned_root);
    assert!(
        !pruned.is_empty() && pruned.len() < whole.len(),
        "{} rows pruned export, {} whole",
        pruned.len(),
        whole.len()
    );
    assert!(pruned.is_subset(&whole));
    let serve = Serve::start(&["--export", pruned_root.to_str().unwrap()]);
    let (_, metrics) = http(serve.addr, "GET", "/metrics", None, b"");
    let rows = local_cluster::metric(&metrics, "serving_rows_in_memory").unwrap();
    assert!(
        rows >= pruned.len() as f64 && rows < whole.len() as f64,
        "{rows}"
    );
    assert!(serve.terminate().success());
}
