//! Issue 15: input with nothing to train on is an error, never a run that "succeeds" on zero samples.
//! Real `trainer` processes (`demo` with a one-server cluster, and `preprocess`); exit code and message checked.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

mod support;
use support::{generate, trainer};

/// Runs `trainer demo` on `train` and `test` with one server; returns its output.
fn demo(dir: &Path, train: &Path, test: &Path) -> Output {
    trainer()
        .env("NO_COLOR", "1")
        .args(["demo", "--servers", "1", "--batch-size", "256"])
        .arg("--train")
        .arg(train)
        .arg("--test")
        .arg(test)
        .arg("--data-dir")
        .arg(dir.join("run"))
        .arg("--summary-json")
        .arg(dir.join("summary.json"))
        .output()
        .unwrap()
}

/// Asserts that `out` failed with one error line naming `file`, saying no usable rows were found, and giving
/// `malformed` as the count of malformed lines.
fn assert_no_rows(out: &Output, file: &Path, malformed: u64) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit 0 on no usable rows: {stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("no usable rows"))
        .unwrap_or_else(|| panic!("no 'no usable rows' line in:\n{stderr}"));
    assert!(line.contains(&file.display().to_string()), "{line}");
    assert!(line.contains(&format!("{malformed} malformed")), "{line}");
    assert!(!stderr.contains("\x1b["), "colour codes in piped output");
}

/// The unusable inputs of the issue, each with its count of malformed lines.
fn unusable_inputs(dir: &Path) -> Vec<(PathBuf, u64)> {
    let empty = dir.join("empty.tsv");
    fs::write(&empty, "").unwrap();
    let blank = dir.join("blank.tsv");
    fs::write(&blank, "\n\n\n\r\n\n").unwrap();
    let garbage = dir.join("garbage.bin");
    // 1,500 lines of 999 pseudo-random bytes each (no line breaks inside, and never a label first), past
    // the default error budget of 1,000 bad lines.
    let garbage_lines = 1_500u64;
    let mut bytes = Vec::new();
    for i in 0..garbage_lines as u32 * 999 {
        let b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
        bytes.push(match b {
            _ if i % 999 == 0 => b'x',
            b'\n' | b'\r' => b'?',
            b => b,
        });
        if i % 999 == 998 {
            bytes.push(b'\n');
        }
    }
    fs::write(&garbage, &bytes).unwrap();
    let fake_gz = dir.join("text.gz");
    fs::write(&fake_gz, "this is not gzip\nnor criteo\n").unwrap();
    let long = dir.join("one_long_line.tsv");
    fs::write(&long, vec![b'7'; 64 << 20]).unwrap();
    vec![
        (empty, 0),
        (blank, 0),
        (garbage, garbage_lines),
        (fake_gz, 2),
        (long, 1),
    ]
}

#[test]
fn issue15_training_on_unusable_input_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let test = dir.path().join("test.tsv");
    generate(2_000, 2, &test);
    for (train, malformed) in unusable_inputs(dir.path()) {
        // The garbage file's lines exceed the default error budget: it fails on the budget, naming the file.
        let out = demo(dir.path(), &train, &test);
        if malformed > 1000 {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{stderr}");
            assert!(stderr.contains("error budget"), "{stderr}");
            assert!(stderr.contains(&train.display().to_string()), "{stderr}");
            continue;
        }
        assert_no_rows(&out, &train, malformed);
    }
}

#[test]
fn issue15_garbage_within_the_error_budget_is_no_rows_too() {
    let dir = tempfile::tempdir().unwrap();
    let test = dir.path().join("test.tsv");
    generate(2_000, 2, &test);
    let train = dir.path().join("few_garbage_lines.tsv");
    fs::write(
        &train,
        b"\x00\x01\x02\xff\nnot\ta\tcriteo\tline\n\x7fELF\x02\x01\n",
    )
    .unwrap();
    assert_no_rows(&demo(dir.path(), &train, &test), &train, 3);
}

#[test]
fn issue15_an_empty_test_set_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    generate(2_000, 1, &train);
    let test = dir.path().join("empty_test.tsv");
    fs::write(&test, "").unwrap();
    assert_no_rows(&demo(dir.path(), &train, &test), &test, 0);
}

#[test]
fn issue15_some_good_rows_keep_training_with_bad_lines_counted() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.tsv");
    generate(3_000, 1, &good);
    let test = dir.path().join("test.tsv");
    generate(1_000, 2, &test);
    let mut mixed = fs::read(&good).unwrap();
    mixed.extend_from_slice(b"garbage line\n\xff\xfe\n");
    let train = dir.path().join("mixed.tsv");
    fs::write(&train, mixed).unwrap();
    let out = demo(dir.path(), &train, &test);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let s = support::summary(&dir.path().join("summary.json"));
    assert_eq!(s["samples"], 3_000, "{s}");
    assert_eq!(s["bad_lines"], 2, "{s}");
    assert!(s["train_loss"].as_f64().unwrap().is_finite(), "{s}");
}

#[test]
fn issue15_preprocess_of_unusable_input_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (input, malformed)) in unusable_inputs(dir.path()).into_iter().enumerate() {
        if malformed > 1000 {
            continue; // the error budget, covered above
        }
        let out = trainer()
            .env("NO_COLOR", "1")
            .arg("preprocess")
            .arg("--input")
            .arg(&input)
            .arg("--out")
            .arg(dir.path().join(format!("shards-{i}")))
            .output()
            .unwrap();
        assert_no_rows(&out, &input, malformed);
    }
}
