//! The store's failpoints ([`embedding::failpoints`]), in their own test target: their configuration is global
//! to the process, so each test holds a `FailScenario` (one at a time) and tears it down.
#![cfg(all(feature = "failpoints", feature = "rocksdb"))]

use embedding::failpoints::STORE_WRITE;
use embedding::{DirtyBatch, RocksStore, Store};
use fail::FailScenario;

fn one_row() -> DirtyBatch {
    let mut rows = DirtyBatch::new();
    rows.reset(4);
    rows.push_row(5, &[1.0]);
    rows
}

#[test]
fn store_write_failpoint_fails_every_write_while_configured() {
    let scenario = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let s = RocksStore::open(dir.path().join("db")).unwrap();
    s.ensure_table(1).unwrap();
    let rows = one_row();
    s.write_rows(1, &rows, false).unwrap();

    fail::cfg(STORE_WRITE, "return").unwrap();
    let e = s.write_rows(1, &rows, true).unwrap_err().to_string();
    assert!(e.contains("write_rows table 1"), "{e}");
    assert!(e.contains("No space left on device"), "{e}");
    assert!(e.contains(STORE_WRITE), "{e}");
    let e = s
        .write_tables(&[(1, &rows)], &[], true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("write_tables"), "{e}");
    assert!(s.delete_rows(1, &[5]).is_err());
    assert!(s.put_meta("k", b"v").is_err());
    assert!(s.flush().is_err());
    // Reads still work, and see the row written before the fault.
    let mut found = 0;
    s.get_rows(1, &[5], &mut |_, v| {
        found += usize::from(v.is_some());
        Ok(())
    })
    .unwrap();
    assert_eq!(found, 1);

    fail::remove(STORE_WRITE);
    s.write_rows(1, &rows, true).unwrap();
    s.put_meta("k", b"v").unwrap();
    s.flush().unwrap();
    scenario.teardown();
}

#[test]
fn store_write_failpoint_returns_the_configured_error() {
    let scenario = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let s = RocksStore::open(dir.path().join("db")).unwrap();
    s.ensure_table(1).unwrap();
    fail::cfg(STORE_WRITE, "return(IO error: Input/output error)").unwrap();
    let e = s.write_rows(1, &one_row(), false).unwrap_err().to_string();
    assert!(e.contains("IO error: Input/output error"), "{e}");
    assert!(!e.contains("No space left"), "{e}");
    scenario.teardown();
    // Teardown clears the configuration.
    s.write_rows(1, &one_row(), false).unwrap();
}
