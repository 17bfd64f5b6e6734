//! Conformance suite for [`Store`] implementations: one generic function per behaviour, instantiated for each
//! store by [`store_conformance_tests!`] (as tikv's `engine_traits_tests` does for its engines).

use std::sync::Arc;

use crate::batch::DirtyBatch;
use crate::error::StoreError;
use crate::store::Store;

/// Opens (or reopens) the store under test. A reopen happens after every earlier handle was dropped and must
/// see everything flushed before.
pub(crate) trait Harness {
    fn open(&mut self) -> Arc<dyn Store>;
}

fn batch(rows: &[(u64, [f32; 2])]) -> DirtyBatch {
    let mut b = DirtyBatch::new();
    b.reset(8);
    for (id, row) in rows {
        b.push_row(*id, row);
    }
    b
}

fn scan(s: &dyn Store, table: u32) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    s.scan_rows(table, &mut |id, v| {
        out.push((id, v.to_vec()));
        Ok(())
    })
    .unwrap();
    out
}

fn le(row: [f32; 2]) -> Vec<u8> {
    row.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn rows_round_trip_in_id_order(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(3).unwrap();
    s.ensure_table(3).unwrap();
    assert!(scan(&*s, 3).is_empty());
    // Big-endian keys: u64::MAX after 256, 256 after 1 (little-endian keys would misorder these).
    s.write_rows(
        3,
        &batch(&[(u64::MAX, [1.0, 2.0]), (256, [3.0, 4.0]), (1, [5.0, 6.0])]),
        false,
    )
    .unwrap();
    s.write_rows(3, &batch(&[(256, [7.0, 8.0])]), true).unwrap();
    s.write_rows(3, &DirtyBatch::new(), false).unwrap();
    assert_eq!(
        scan(&*s, 3),
        vec![
            (1, le([5.0, 6.0])),
            (256, le([7.0, 8.0])),
            (u64::MAX, le([1.0, 2.0]))
        ]
    );
}

pub(crate) fn tables_are_isolated(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(1).unwrap();
    s.ensure_table(2).unwrap();
    s.write_rows(1, &batch(&[(5, [1.0, 1.0])]), false).unwrap();
    s.write_rows(2, &batch(&[(5, [2.0, 2.0])]), false).unwrap();
    assert_eq!(scan(&*s, 1), vec![(5, le([1.0, 1.0]))]);
    assert_eq!(scan(&*s, 2), vec![(5, le([2.0, 2.0]))]);
}

pub(crate) fn unknown_table_is_an_error(h: &mut dyn Harness) {
    let s = h.open();
    let e = s
        .write_rows(9, &batch(&[(1, [0.0; 2])]), false)
        .unwrap_err();
    assert_eq!(e, StoreError::UnknownTable(9));
    let e = s.scan_rows(9, &mut |_, _| Ok(())).unwrap_err();
    assert_eq!(e, StoreError::UnknownTable(9));
    let e = s.get_rows(9, &[1], &mut |_, _| Ok(())).unwrap_err();
    assert_eq!(e, StoreError::UnknownTable(9));
}

pub(crate) fn get_rows_in_request_order(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(1).unwrap();
    s.write_rows(1, &batch(&[(10, [1.0, 0.0]), (20, [2.0, 0.0])]), false)
        .unwrap();
    let mut got = Vec::new();
    s.get_rows(1, &[20, 15, 10, 20], &mut |i, v| {
        got.push((i, v.map(<[u8]>::to_vec)));
        Ok(())
    })
    .unwrap();
    assert_eq!(
        got,
        vec![
            (0, Some(le([2.0, 0.0]))),
            (1, None),
            (2, Some(le([1.0, 0.0]))),
            (3, Some(le([2.0, 0.0])))
        ]
    );
}

pub(crate) fn scan_stops_at_callback_error(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(1).unwrap();
    s.write_rows(
        1,
        &batch(&[(1, [0.0; 2]), (2, [0.0; 2]), (3, [0.0; 2])]),
        false,
    )
    .unwrap();
    let mut seen = 0;
    let stop = StoreError::CorruptKey { table: 1, len: 0 };
    let e = s
        .scan_rows(1, &mut |id, _| {
            seen += 1;
            if id == 2 {
                Err(stop.clone())
            } else {
                Ok(())
            }
        })
        .unwrap_err();
    assert_eq!(e, stop);
    assert_eq!(seen, 2);
}

pub(crate) fn values_are_stored_verbatim(h: &mut dyn Harness) {
    // The store does not know row lengths; a 3-byte value comes back as 3 bytes (the engine rejects it).
    let s = h.open();
    s.ensure_table(1).unwrap();
    let mut b = DirtyBatch::new();
    b.reset(3);
    b.push_bytes(7, &[1, 2, 3]);
    s.write_rows(1, &b, false).unwrap();
    assert_eq!(scan(&*s, 1), vec![(7, vec![1, 2, 3])]);
}

pub(crate) fn meta_put_get_list(h: &mut dyn Harness) {
    let s = h.open();
    assert_eq!(s.get_meta("table/1").unwrap(), None);
    s.put_meta("table/2", b"two").unwrap();
    s.put_meta("table/1", b"one").unwrap();
    s.put_meta("tablex", b"x").unwrap();
    s.put_meta("other", b"o").unwrap();
    s.put_meta("table/1", b"uno").unwrap();
    assert_eq!(s.get_meta("table/1").unwrap(), Some(b"uno".to_vec()));
    assert_eq!(
        s.list_meta("table/").unwrap(),
        vec![
            ("table/1".to_owned(), b"uno".to_vec()),
            ("table/2".to_owned(), b"two".to_vec())
        ]
    );
    assert_eq!(s.list_meta("zzz").unwrap(), vec![]);
    assert_eq!(s.list_meta("").unwrap().len(), 4);
}

pub(crate) fn write_tables_carries_meta_and_survives_reopen(h: &mut dyn Harness) {
    use crate::store::MetaWrite;
    let put = |k: &str, v: &[u8]| MetaWrite {
        key: k.into(),
        value: Some(v.to_vec()),
    };
    {
        let s = h.open();
        s.ensure_table(1).unwrap();
        s.put_meta("push/a", b"old").unwrap();
        s.put_meta("push/b", b"gone").unwrap();
        let meta = [
            put("push/a", b"new"),
            put("push/c", b"c"),
            MetaWrite {
                key: "push/b".into(),
                value: None,
            },
        ];
        s.write_tables(&[(1, &batch(&[(5, [1.0, 2.0])]))], &meta, true)
            .unwrap();
        // Metadata alone, no rows.
        s.write_tables(&[], &[put("push/d", b"d")], true).unwrap();
        s.delete_meta("push/c").unwrap();
        s.delete_meta("push/never").unwrap();
        s.flush().unwrap();
    }
    let s = h.open();
    assert_eq!(scan(&*s, 1), vec![(5, le([1.0, 2.0]))]);
    assert_eq!(
        s.list_meta("push/").unwrap(),
        vec![
            ("push/a".to_owned(), b"new".to_vec()),
            ("push/d".to_owned(), b"d".to_vec())
        ]
    );
    // An unknown table writes nothing, metadata included.
    assert!(matches!(
        s.write_tables(
            &[
                (1, &batch(&[(6, [0.0, 0.0])])),
                (77, &batch(&[(1, [0.0, 0.0])]))
            ],
            &[put("push/e", b"e")],
            true
        ),
        Err(StoreError::UnknownTable(77))
    ));
    assert_eq!(s.get_meta("push/e").unwrap(), None);
}

pub(crate) fn survives_reopen(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(4).unwrap();
    s.ensure_table(5).unwrap();
    s.write_rows(4, &batch(&[(1, [1.0, 2.0])]), false).unwrap();
    s.put_meta("table/4", b"cfg").unwrap();
    s.flush().unwrap();
    drop(s);
    let s = h.open();
    // Tables exist after reopen without ensure_table.
    assert_eq!(scan(&*s, 4), vec![(1, le([1.0, 2.0]))]);
    assert!(scan(&*s, 5).is_empty());
    assert_eq!(s.get_meta("table/4").unwrap(), Some(b"cfg".to_vec()));
    s.write_rows(5, &batch(&[(2, [0.0; 2])]), false).unwrap();
}

pub(crate) fn delete_rows_removes_only_those_ids(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(1).unwrap();
    s.ensure_table(2).unwrap();
    s.write_rows(
        1,
        &batch(&[(1, [1.0, 0.0]), (2, [2.0, 0.0]), (3, [3.0, 0.0])]),
        false,
    )
    .unwrap();
    s.write_rows(2, &batch(&[(2, [9.0, 0.0])]), false).unwrap();
    // Id 7 was never stored: ignored. Duplicates are fine.
    s.delete_rows(1, &[2, 7, 2]).unwrap();
    s.delete_rows(1, &[]).unwrap();
    assert_eq!(scan(&*s, 1), vec![(1, le([1.0, 0.0])), (3, le([3.0, 0.0]))]);
    assert_eq!(scan(&*s, 2), vec![(2, le([9.0, 0.0]))]);
    let mut got = Vec::new();
    s.get_rows(1, &[2, 3], &mut |i, v| {
        got.push((i, v.is_some()));
        Ok(())
    })
    .unwrap();
    assert_eq!(got, vec![(0, false), (1, true)]);
    assert_eq!(
        s.delete_rows(9, &[1]).unwrap_err(),
        StoreError::UnknownTable(9)
    );
    // A deleted row can be written again, and deletions survive a reopen.
    s.write_rows(1, &batch(&[(2, [4.0, 0.0])]), false).unwrap();
    s.delete_rows(1, &[1]).unwrap();
    s.flush().unwrap();
    drop(s);
    let s = h.open();
    assert_eq!(scan(&*s, 1), vec![(2, le([4.0, 0.0])), (3, le([3.0, 0.0]))]);
}

pub(crate) fn estimate_rows_counts_written_rows(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(4).unwrap();
    assert_eq!(s.estimate_rows(4).unwrap(), 0);
    s.write_rows(
        4,
        &batch(&[(1, [1.0, 1.0]), (2, [2.0, 2.0]), (3, [3.0, 3.0])]),
        false,
    )
    .unwrap();
    // Exact for a fresh table with distinct keys (RocksDB's estimate counts memtable entries).
    assert_eq!(s.estimate_rows(4).unwrap(), 3);
    assert_eq!(s.estimate_rows(9).unwrap_err(), StoreError::UnknownTable(9));
}

pub(crate) fn scan_ids_pages_in_id_order(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(5).unwrap();
    s.write_rows(
        5,
        &batch(&[
            (u64::MAX, [1.0, 1.0]),
            (256, [2.0, 2.0]),
            (1, [3.0, 3.0]),
            (2, [4.0, 4.0]),
        ]),
        false,
    )
    .unwrap();
    let page = |after, limit| {
        let mut out = vec![99];
        s.scan_ids(5, after, limit, &mut out).unwrap();
        out
    };
    // Appends after what `out` held.
    assert_eq!(page(None, 2), [99, 1, 2]);
    assert_eq!(page(Some(2), 2), [99, 256, u64::MAX]);
    assert_eq!(page(Some(1), 10), [99, 2, 256, u64::MAX]);
    assert_eq!(page(Some(u64::MAX), 10), [99]);
    assert_eq!(page(None, 0), [99]);
    let mut out = Vec::new();
    assert_eq!(
        s.scan_ids(6, None, 1, &mut out).unwrap_err(),
        StoreError::UnknownTable(6)
    );
}

/// Feeds `rows` to a [`Store::write_sorted`] as they are (in the given order, ascending or not).
fn write_sorted(s: &dyn Store, table: u32, rows: &[(u64, [f32; 2])]) -> Result<u64, StoreError> {
    s.write_sorted(table, &mut |put| {
        for (id, row) in rows {
            put(*id, &le(*row))?;
        }
        Ok(())
    })
}

pub(crate) fn write_sorted_overwrites_and_orders_with_other_writes(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(2).unwrap();
    s.ensure_table(3).unwrap();
    assert_eq!(write_sorted(&*s, 2, &[]).unwrap(), 0);
    // Rows written the ordinary way first (RocksDB: in the memtable), some of them overwritten in between.
    s.write_rows(
        2,
        &batch(&[(1, [1.0, 1.0]), (5, [5.0, 5.0]), (u64::MAX, [9.0, 9.0])]),
        false,
    )
    .unwrap();
    let rows: Vec<(u64, [f32; 2])> = (2..5000u64).map(|i| (i, [i as f32, -(i as f32)])).collect();
    assert_eq!(write_sorted(&*s, 2, &rows).unwrap(), 4998);
    let got = scan(&*s, 2);
    assert_eq!(got.len(), 5000);
    assert_eq!(got[0], (1, le([1.0, 1.0])));
    assert_eq!(got[4], (5, le([5.0, -5.0])), "the later write wins");
    assert_eq!(got[4999], (u64::MAX, le([9.0, 9.0])));
    // A write after it wins over it, and other tables see nothing.
    s.write_rows(2, &batch(&[(7, [0.5, 0.5])]), false).unwrap();
    assert_eq!(scan(&*s, 2)[6], (7, le([0.5, 0.5])));
    assert!(scan(&*s, 3).is_empty());
    s.flush().unwrap();
    drop(s);
    let s = h.open();
    let got = scan(&*s, 2);
    assert_eq!(got.len(), 5000);
    assert_eq!(got[4], (5, le([5.0, -5.0])));
    assert_eq!(got[6], (7, le([0.5, 0.5])));
    assert_eq!(got[4998], (4999, le([4999.0, -4999.0])));
}

pub(crate) fn write_sorted_refuses_rows_out_of_order(h: &mut dyn Harness) {
    let s = h.open();
    s.ensure_table(1).unwrap();
    for bad in [
        &[(3u64, [1.0f32, 1.0]), (2, [2.0, 2.0])][..],
        &[(3, [1.0, 1.0]), (3, [2.0, 2.0])][..],
    ] {
        match write_sorted(&*s, 1, bad).unwrap_err() {
            StoreError::Backend { op, detail } => {
                assert_eq!(op, "write_sorted table 1");
                assert!(
                    detail.contains(&format!("row {} after row 3", bad[1].0)),
                    "{detail}"
                );
            }
            e => panic!("{e:?}"),
        }
    }
    // Nothing of a refused write is stored, and an error of the rows' producer stops the write the same way.
    assert!(scan(&*s, 1).is_empty());
    let err = s
        .write_sorted(1, &mut |put| {
            put(1, &le([1.0, 1.0]))?;
            Err(StoreError::CorruptValue {
                table: 1,
                id: 2,
                len: 3,
                expected: 8,
            })
        })
        .unwrap_err();
    assert!(
        matches!(err, StoreError::CorruptValue { id: 2, .. }),
        "{err:?}"
    );
    assert!(scan(&*s, 1).is_empty());
    assert_eq!(
        write_sorted(&*s, 8, &[(1, [0.0; 2])]).unwrap_err(),
        StoreError::UnknownTable(8)
    );
}

/// Instantiates every conformance test for the harness built by `$make`.
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::store_conformance::store_conformance_tests!(@each $make;
            rows_round_trip_in_id_order,
            tables_are_isolated,
            unknown_table_is_an_error,
            get_rows_in_request_order,
            scan_stops_at_callback_error,
            values_are_stored_verbatim,
            meta_put_get_list,
            write_tables_carries_meta_and_survives_reopen,
            survives_reopen,
            delete_rows_removes_only_those_ids,
            estimate_rows_counts_written_rows,
            scan_ids_pages_in_id_order,
            write_sorted_overwrites_and_orders_with_other_writes,
            write_sorted_refuses_rows_out_of_order,
        );
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let mut h = $make;
                $crate::store_conformance::$name(&mut h);
            }
        )*
    };
}

pub(crate) use store_conformance_tests;
