//! Tests of the columnar shard format: both versions' round trips, strided and picked reads, refusals.

use super::*;
use crate::layout::FeatureInput;
use crate::parse::{parse_line, Row};

fn batch(n: u32) -> Batch {
    let mut batch = Batch::with_capacity(n as usize);
    for k in 0..n {
        let mut row = Row {
            label: (k % 3 == 0) as u32 as f32,
            ..Row::default()
        };
        row.dense = std::array::from_fn(|d| k as f32 + d as f32 / 16.0);
        row.sparse = std::array::from_fn(|j| (j as u32 != k % 26).then_some(k * 100 + j as u32));
        batch.push_row(&row);
    }
    batch
}

fn encode(batch: &Batch) -> Vec<u8> {
    let mut bytes = Vec::new();
    write_shard(batch, &mut bytes).unwrap();
    bytes
}

#[test]
fn round_trip_whole_and_strided() {
    let original = batch(50);
    let bytes = encode(&original);
    assert_eq!(bytes.len(), HEADER_LEN + 50 * ROW_BYTES);
    let shard = Shard::parse(&bytes).unwrap();
    assert_eq!(shard.rows(), 50);
    let mut whole = Batch::default();
    shard.append_rows(0, 1, 30, &mut whole);
    shard.append_rows(30, 1, 20, &mut whole);
    assert_eq!(whole, original);
    // Rows 3, 10, 17, ... against pushing the same rows one by one.
    let mut strided = Batch::default();
    shard.append_rows(3, 7, 7, &mut strided);
    let mut want = Batch::default();
    for r in (3..50).step_by(7) {
        want.len += 1;
        want.labels.push(original.labels[r]);
        want.dense.extend_from_slice(original.dense_row(r));
        for j in 0..NUM_SPARSE {
            want.sparse[j].push(original.sparse[j][r]);
        }
    }
    assert_eq!(strided, want);
    shard.append_rows(0, 1, 0, &mut strided);
    assert_eq!(strided, want);
    assert_eq!(Shard::parse(&encode(&Batch::default())).unwrap().rows(), 0);
}

#[test]
fn corrupt_shards_are_refused() {
    let good = encode(&batch(4));
    let check = |bytes: &[u8], want: &str| {
        let err = Shard::parse(bytes).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    };
    check(&good[..10], "10 bytes, shorter than the 32-byte header");
    check(
        &good[..good.len() - 1],
        "header says 4 rows, so 1076 bytes, but the file has 1075",
    );
    let mut longer = good.clone();
    longer.push(0);
    check(&longer, "but the file has 1077");
    let mut bad = good.clone();
    bad[0] = b'X';
    check(&bad, "bad magic");
    let mut bad = good.clone();
    bad[8] = 3;
    check(&bad, "format version 3, this build reads versions 1 and 2");
    let mut bad = good.clone();
    bad[16] = 27;
    check(&bad, "13 dense and 27 sparse columns");
    let mut bad = good.clone();
    bad[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    check(&bad, &format!("header says {} rows", u64::MAX));
    let mut bad = good.clone();
    let at = bad.len() - 2;
    bad[at] = 7;
    check(&bad, "row 2: label byte 7");
}

/// C1 one-hot (table 0, capped at 1000), C2 multi-hot with 3 tokens (table 0), C5 multi-hot with 2 (table 4).
fn layout() -> FeatureLayout {
    let input = |column, table, hash_size, tokens| FeatureInput {
        ids: Default::default(),
        column,
        table,
        hash_size,
        tokens,
    };
    FeatureLayout {
        features: vec![input(0, 0, 1000, 1), input(1, 0, 0, 3), input(4, 4, 0, 2)],
    }
}

/// `n` rows of `layout()` with bags of 0 to 4 tokens (some truncated).
fn multi_hot_batch(n: u32) -> Batch {
    let layout = layout();
    let mut batch = Batch::with_layout(n as usize, &layout);
    let mut row = Row::default();
    for k in 0..n {
        let bag = |len: u32| {
            (0..len)
                .map(|t| format!("{:x}", k * 16 + t))
                .collect::<Vec<_>>()
                .join("|")
        };
        let line = format!(
            "{}{}\t{:x}\t{}\t\t\t{}",
            k % 2,
            "\t7".repeat(NUM_DENSE),
            k * 77,
            bag(k % 5),
            bag((k + 2) % 4)
        );
        parse_line(line.as_bytes(), &mut row).unwrap();
        batch.push_row_in(&row, &layout);
    }
    batch
}

fn encode_for(batch: &Batch, layout: &FeatureLayout) -> Vec<u8> {
    let mut bytes = Vec::new();
    write_shard_for(batch, layout, &mut bytes).unwrap();
    bytes
}

/// `rows` of `original`, one by one through [`Batch::bag`].
fn pick(original: &Batch, rows: &[usize]) -> Batch {
    let mut want = Batch::with_layout(0, &layout());
    for &r in rows {
        want.len += 1;
        want.labels.push(original.labels[r]);
        want.dense.extend_from_slice(original.dense_row(r));
        for f in 0..want.sparse.len() {
            want.sparse[f].extend_from_slice(original.bag(f, r));
            if original.is_multi_hot(f) {
                let end = want.sparse[f].len() as u32;
                want.offsets[f].push(end);
            }
        }
    }
    want
}

#[test]
fn default_layout_writes_version_1() {
    let original = batch(5);
    assert_eq!(
        encode_for(&original, &FeatureLayout::default()),
        encode(&original)
    );
    let shard_bytes = encode(&original);
    let shard = Shard::parse(&shard_bytes).unwrap();
    assert_eq!(shard.fingerprint(), FeatureLayout::default().fingerprint());
    shard.check_layout(&FeatureLayout::default()).unwrap();
    let err = shard.check_layout(&layout()).unwrap_err().to_string();
    assert!(
        err.contains(&format!("{:#018x}", layout().fingerprint())),
        "{err}"
    );
}

#[test]
fn version_2_round_trip_whole_strided_and_picked() {
    let layout = layout();
    let original = multi_hot_batch(23);
    assert!(original.truncated > 0);
    let bytes = encode_for(&original, &layout);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 2);
    let shard = Shard::parse(&bytes).unwrap();
    assert_eq!(shard.rows(), 23);
    assert_eq!(shard.fingerprint(), layout.fingerprint());
    shard.check_layout(&layout).unwrap();
    let mut whole = Batch::with_layout(0, &layout);
    shard.append_rows(0, 1, 10, &mut whole);
    shard.append_rows(10, 1, 13, &mut whole);
    // The shard does not record truncation (it happened when the rows were parsed).
    assert_eq!(
        Batch {
            truncated: 0,
            ..original.clone()
        },
        whole
    );
    let mut strided = Batch::with_layout(0, &layout);
    shard.append_rows(2, 5, 5, &mut strided);
    assert_eq!(strided, pick(&original, &[2, 7, 12, 17, 22]));
    let order = [9u32, 0, 22, 4, 4, 13];
    let mut picked = Batch::with_layout(0, &layout);
    shard.append_picked(&order, &mut picked);
    let rows: Vec<usize> = order.iter().map(|&r| r as usize).collect();
    assert_eq!(picked, pick(&original, &rows));
    // An empty shard of the layout.
    let empty = encode_for(&Batch::with_layout(0, &layout), &layout);
    assert_eq!(Shard::parse(&empty).unwrap().rows(), 0);
}

#[test]
fn version_2_refusals_name_the_values() {
    let layout = layout();
    let good = encode_for(&multi_hot_batch(6), &layout);
    let shard = Shard::parse(&good).unwrap();
    let err = shard
        .check_layout(&FeatureLayout::default())
        .unwrap_err()
        .to_string();
    let (ours, theirs) = (layout.fingerprint(), FeatureLayout::default().fingerprint());
    assert_eq!(
        err,
        format!("shard of feature layout {ours:#018x}, but the reader's layout is {theirs:#018x}")
    );
    let check = |bytes: &[u8], want: &str| {
        let err = Shard::parse(bytes).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    };
    check(&good[..good.len() - 1], "header says 6 rows");
    check(
        &good[..50],
        "header says 6 rows, so 88 bytes, but the file has 50",
    );
    let mut bad = good.clone();
    bad[16] = 0;
    check(&bad, "13 dense and 0 sparse columns");
    let mut bad = good.clone();
    bad[40 + 16] = 7; // feature 1's kind
    check(&bad, "feature 1: kind 7");
    // Feature 1's offsets follow the header (88 bytes) and feature 0's ids: make the first one 1.
    let mut bad = good.clone();
    bad[136] = 1;
    check(&bad, "feature 1: offset 1 at row 0");
    // Its last offset past the id count, then below the one before.
    let mut bad = good.clone();
    bad[160..164].copy_from_slice(&1000u32.to_le_bytes());
    check(
        &bad,
        "feature 1: offset 1000 at row 6 breaks 0 <= ... <= 9 (ids)",
    );
    let mut bad = good.clone();
    bad[156..160].copy_from_slice(&1000u32.to_le_bytes());
    check(&bad, "feature 1: offset 9 at row 6");
    let mut wrong = Vec::new();
    let err = write_shard_for(&batch(2), &layout, &mut wrong).unwrap_err();
    assert!(err.to_string().contains("26 features do not fit"), "{err}");
    let err = write_shard(&multi_hot_batch(2), &mut wrong).unwrap_err();
    assert!(
        err.to_string().contains("the batch has 3 features"),
        "{err}"
    );
}

#[test]
#[should_panic(expected = "batch of another layout than the shard")]
fn appending_to_a_batch_of_another_layout_panics() {
    let bytes = encode_for(&multi_hot_batch(3), &layout());
    Shard::parse(&bytes)
        .unwrap()
        .append_rows(0, 1, 1, &mut Batch::default());
}
