//! Helpers shared by the Criteo input tests: synthetic lines and files.
// Each test target uses its own subset.
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;
use trainer::criteo::{feature_id, Batch, NUM_DENSE, NUM_SPARSE};

/// A deterministic, Criteo-looking line: the `k`-th of a synthetic log. C1 holds `k` so tests can tell
/// lines apart; about one field in eight is empty, and some integers are negative.
pub fn line(k: u64) -> String {
    let mut state = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = String::with_capacity(256);
    out.push_str(if next() % 4 == 0 { "1" } else { "0" });
    for _ in 0..NUM_DENSE {
        out.push('\t');
        let r = next();
        match r % 8 {
            0 => {}
            1 => out.push_str(&format!("-{}", r % 3)),
            _ => out.push_str(&((r >> 8) % (1 << (r % 16))).to_string()),
        }
    }
    out.push_str(&format!("\t{:08x}", k as u32));
    for _ in 1..NUM_SPARSE {
        out.push('\t');
        let r = next();
        if r % 8 != 0 {
            out.push_str(&format!("{:08x}", (r >> 16) as u32 % 100_000 * 40_503));
        }
    }
    out
}

/// Lines `range`, each ending in `\n`.
pub fn lines(range: std::ops::Range<u64>) -> String {
    range.map(|k| line(k) + "\n").collect()
}

pub fn write(path: &Path, text: &str) -> PathBuf {
    fs::write(path, text).unwrap();
    path.to_path_buf()
}

pub fn write_gz(path: &Path, text: &str) -> PathBuf {
    let mut gz = GzEncoder::new(fs::File::create(path).unwrap(), Compression::fast());
    gz.write_all(text.as_bytes()).unwrap();
    gz.finish().unwrap();
    path.to_path_buf()
}

/// The `k` of each row (C1's token), in order.
pub fn keys(batches: &[Batch]) -> Vec<u64> {
    let ids: std::collections::HashMap<u64, u64> = (0..10_000)
        .map(|k| (feature_id(0, Some(k as u32)), k))
        .collect();
    batches
        .iter()
        .flat_map(|b| b.sparse[0].iter().map(|id| ids[id]))
        .collect()
}

pub fn write_zst(path: &Path, text: &str) -> PathBuf {
    fs::write(path, zstd::encode_all(text.as_bytes(), 1).unwrap()).unwrap();
    path.to_path_buf()
}
