//! `SyncDeltas` and `PublishDense`: the delta sync from training servers to serving (docs/serving.md, "Delta
//! sync"). A subscriber holds one standing long-poll per training server; the server answers with the current
//! values of the rows changed since the subscriber's cursor, or waits for its next cut.
//!
//! # Cursors
//! A [`SyncCursor`] is `(incarnation, seq)`: everything up to delta `seq` of the server process `incarnation`
//! (a random `u64` it drew at start) is applied. [`SyncCursor::START`] (incarnation 0, never drawn) asks for a
//! full scan. A cursor may also carry where a paged answer stopped ([`SyncResume`]); the subscriber never
//! builds one, it sends back the cursor of the last answer.
//!
//! # Payload of `Deltas`
//! 1. one id section per table of [`DeltasHeader::tables`] ([`IdCoding::Plain`], ascending ids, as in a pull);
//! 2. one id section per table of [`DeltasHeader::deleted`]: ids whose rows the server no longer holds
//!    (expired, past a row cap, never admitted), which the subscriber deletes;
//! 3. the rows of every table of `tables` in header order, in the request's encoding ([`Encoding::F32`],
//!    [`Encoding::F16`] or [`Encoding::Bf16`]);
//! 4. when [`DeltasHeader::dense`] is set, its `len` dense values, f32 LE.
//!
//! A delta's rows and deletions are the state at the answer: an id is in one list or the other, never both,
//! so a row deleted and created again arrives as a row, one updated then deleted as a deletion. A scan carries
//! no deletions: a subscriber deletes the rows it holds in the key range a scan page covers that the page does
//! not list ([`SyncResume::Scan`]).
//!
//! A `PublishDense` request's payload is `len` f32 LE values.
//!
//! | side | call |
//! | --- | --- |
//! | subscriber, request | [`request`] (or [`crate::PsClient::sync_deltas`]) |
//! | server, request | [`validate_request`], then [`put_ids`] (rows' ids, then deletions), [`put_rows`], [`put_dense`] |
//! | subscriber, reply | [`decode`] into a [`DeltaBatch`] |
//! | trainer, publish | [`publish_request`] + [`put_dense`] (or [`crate::PsClient::publish_dense`]) |
//! | server, publish | [`decode_dense`] |
//! | snapshot | [`SyncPoint`] in `sync.json` of a shard directory ([`SyncPoint::read`]) |

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::compression::codec::{self, Encoding};
use crate::error::ProtocolError;
use crate::wire::ids::{get_sections, IdCoding};
use crate::wire::layout::{check_len, PayloadLayout, TableCount};
use crate::wire::message::Request;

/// Longest wait a server grants a long-poll; a longer `wait_ms` is cut to it (below the client's default
/// request timeout of 30 s, so that a default client also waits its full wait).
pub const MAX_WAIT_MS: u32 = 25_000;

/// Most rows one answer may carry (`max_rows` above it is refused).
pub const MAX_ROWS: u32 = 1 << 20;

/// Most tables one answer may name.
pub const MAX_TABLES: usize = 1 << 16;

/// Largest row dimension an answer may carry (`embedding::MAX_DIM`).
pub const MAX_DIM: u32 = embedding::MAX_DIM as u32;

/// Most dense values a `PublishDense` (and so an answer) may carry.
pub const MAX_DENSE_VALUES: u32 = 64 << 20;

/// How far ahead of the server's clock a dense version (Unix microseconds) may be: 10 minutes. A later
/// version is refused, so no publisher can pin a version that later publications cannot pass.
pub const MAX_DENSE_CLOCK_SKEW_US: u64 = 600_000_000;

/// File name of the sync point in a snapshot's shard directory ([`SyncPoint`]).
pub const SYNC_FILE: &str = "sync.json";

/// Where a subscriber stands with one server: every delta up to `seq` of the process `incarnation` applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncCursor {
    /// The server process the cursor belongs to (0: none; a server never draws 0).
    pub incarnation: u64,
    /// The newest delta applied (0: none).
    pub seq: u64,
    /// Where a paged answer stopped; `None` between answers that were complete.
    pub resume: Option<SyncResume>,
}

impl SyncCursor {
    /// The cursor of a subscriber that holds nothing: its first answer is a full scan.
    pub const START: SyncCursor = SyncCursor {
        incarnation: 0,
        seq: 0,
        resume: None,
    };

    /// The cursor of a snapshot's [`SyncPoint`]: everything up to `seq` of `incarnation`.
    pub fn at(point: SyncPoint) -> SyncCursor {
        SyncCursor {
            incarnation: point.incarnation,
            seq: point.seq,
            resume: None,
        }
    }
}

/// Where a paged answer stopped (module docs, "Cursors").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncResume {
    /// Paging through the union of the deltas `cursor.seq + 1 ..= upto`; the next page starts after row
    /// `(table, after)` in (table, id) order.
    Deltas {
        /// The newest delta of the union.
        upto: u64,
        /// Table of the last row sent.
        table: u32,
        /// Id of the last row sent.
        after: u64,
    },
    /// A full scan that began when `cursor.seq` was the newest delta; the next page starts at table `table`
    /// after id `after` (`None`: at the table's first row).
    Scan {
        /// The table the next page starts in.
        table: u32,
        /// The last id sent of that table, if any.
        after: Option<u64>,
    },
}

/// The dense parameters an answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseInfo {
    /// The publisher's version (newer is larger).
    pub version: u64,
    /// The training step the values are of.
    pub step: u64,
    /// When the server received them, Unix microseconds.
    pub published_unix_us: u64,
    /// Values in the payload (f32 LE).
    pub len: u32,
}

/// The header of an answer to [`Request::SyncDeltas`] (`Response::Deltas`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltasHeader {
    /// The answering server's incarnation.
    pub incarnation: u64,
    /// The cursor to send next.
    pub cursor: SyncCursor,
    /// `false`: more pages follow; ask again at once with `cursor`.
    pub complete: bool,
    /// This answer is part of a full scan (the subscriber's cursor was of another incarnation, or its deltas
    /// were dropped): every row the server holds, in pages.
    pub scan: bool,
    /// Encoding of the rows.
    pub encoding: Encoding,
    /// Per-table counts of rows, in payload order.
    pub tables: Vec<TableCount>,
    /// Per-table counts of deleted ids, in payload order after the rows' id sections.
    pub deleted: Vec<DeletedCount>,
    /// Time of the oldest change in the deltas answered, Unix microseconds (0: no delta in the answer).
    pub oldest_change_unix_us: u64,
    /// Cut time of the newest delta answered, Unix microseconds (0: no delta in the answer).
    pub cut_unix_us: u64,
    /// The dense parameters, when the server holds a version newer than the request's `dense_version`.
    pub dense: Option<DenseInfo>,
}

/// The number of deleted ids of one table in a `Deltas` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedCount {
    /// Table id.
    pub table: u32,
    /// Ids in its section.
    pub count: u32,
}

/// `sync.json` of a snapshot's shard directory: the snapshot holds every change of the deltas up to `seq` of
/// the server process `incarnation`, so a subscriber loading it resumes from [`SyncCursor::at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncPoint {
    /// The server process that took the snapshot.
    pub incarnation: u64,
    /// The delta cut while the snapshot held the push gate.
    pub seq: u64,
}

impl SyncPoint {
    /// The JSON written to [`SYNC_FILE`].
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("two integers serialize")
    }

    /// Parses [`SYNC_FILE`]'s contents; the error names what was wrong.
    pub fn from_json(bytes: &[u8]) -> Result<SyncPoint, ProtocolError> {
        serde_json::from_slice(bytes)
            .map_err(|e| ProtocolError::BadPayload(format!("{SYNC_FILE}: {e}")))
    }

    /// Reads `shard_dir/sync.json` (e.g. `export/v.../ps/shard-0-of-2`); errors name the file.
    pub fn read(shard_dir: &Path) -> Result<SyncPoint, ProtocolError> {
        let path = shard_dir.join(SYNC_FILE);
        let bytes = std::fs::read(&path).map_err(|source| ProtocolError::Io {
            context: format!("read {}", path.display()),
            source,
        })?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ProtocolError::BadPayload(format!("{}: {e}", path.display())))
    }
}

/// The rows of one table in a [`DeltaBatch`], decoded to f32.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncedRows {
    /// Table id.
    pub table: u32,
    /// Row dimension.
    pub dim: u32,
    /// Ascending ids.
    pub ids: Vec<u64>,
    /// `ids.len() x dim` values, row after row.
    pub rows: Vec<f32>,
}

/// The ids of one table whose rows the server no longer holds, in a [`DeltaBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletedIds {
    /// Table id.
    pub table: u32,
    /// Ascending ids.
    pub ids: Vec<u64>,
}

/// One decoded answer to [`Request::SyncDeltas`].
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaBatch {
    /// The header (next cursor, completeness, times).
    pub header: DeltasHeader,
    /// Rows per table, in header order.
    pub tables: Vec<SyncedRows>,
    /// Deleted ids per table, in header order.
    pub deleted: Vec<DeletedIds>,
    /// The dense values, when the header announces them.
    pub dense: Option<Vec<f32>>,
}

impl DeltaBatch {
    /// Rows over all tables.
    pub fn rows(&self) -> usize {
        self.tables.iter().map(|t| t.ids.len()).sum()
    }

    /// Deleted ids over all tables.
    pub fn deletions(&self) -> usize {
        self.deleted.iter().map(|t| t.ids.len()).sum()
    }
}

/// The header of a sync request: rows changed after `cursor`, in `encoding`, at most `max_rows` of them,
/// waiting up to `wait_ms` (cut to [`MAX_WAIT_MS`]) when there are none; the dense parameters too if the
/// server holds a version newer than `dense_version` (0: any).
pub fn request(
    cursor: SyncCursor,
    encoding: Encoding,
    max_rows: u32,
    wait_ms: u32,
    dense_version: u64,
) -> Request {
    Request::SyncDeltas {
        cursor,
        encoding,
        max_rows,
        wait_ms,
        dense_version,
    }
}

/// The header of a publication by `job` of `len` dense values (payload: [`put_dense`]) of `version` at
/// `step`.
pub fn publish_request(job: u64, version: u64, step: u64, len: u32) -> Request {
    Request::PublishDense {
        job,
        version,
        step,
        len,
    }
}

/// Checks a sync request's encoding and row limit; the message names the offending value.
pub fn validate_request(encoding: Encoding, max_rows: u32) -> Result<(), ProtocolError> {
    let bad = |m: String| Err(ProtocolError::BadPayload(format!("sync: {m}")));
    if !matches!(encoding, Encoding::F32 | Encoding::F16 | Encoding::Bf16) {
        return bad(format!("encoding {encoding} (f32, f16 or bf16)"));
    }
    if max_rows == 0 || max_rows > MAX_ROWS {
        return bad(format!("max_rows {max_rows} outside 1..={MAX_ROWS}"));
    }
    Ok(())
}

/// Appends the id section of one table's ids (ascending), as the payload starts with.
pub fn put_ids(ids: &[u64], out: &mut Vec<u8>) {
    crate::wire::ids::put_ids(IdCoding::Plain, ids, out)
}

/// Appends one table's rows (`dim` values each) in `encoding`, after every table's id section.
pub fn put_rows(rows: &[f32], dim: usize, encoding: Encoding, out: &mut Vec<u8>) {
    codec::encode_rows(rows, dim, encoding, out)
}

/// Appends dense values, f32 LE (a `PublishDense` payload, or the end of a `Deltas` payload).
pub fn put_dense(values: &[f32], out: &mut Vec<u8>) {
    codec::encode(values, Encoding::F32, out)
}

/// Decodes `len` dense values of a `PublishDense` payload; refuses a length over [`MAX_DENSE_VALUES`] or a
/// payload of another size.
pub fn decode_dense(len: u32, payload: &[u8]) -> Result<Vec<f32>, ProtocolError> {
    if len > MAX_DENSE_VALUES {
        return Err(ProtocolError::BadPayload(format!(
            "publish dense: {len} values exceed the cap of {MAX_DENSE_VALUES}"
        )));
    }
    check_len("publish dense", payload.len(), len as usize * 4)?;
    let mut out = vec![0.0; len as usize];
    codec::decode(payload, Encoding::F32, &mut out)?;
    Ok(out)
}

/// Checks an answer's header against the limits; the message names the offending value.
pub fn check_header(h: &DeltasHeader) -> Result<(), ProtocolError> {
    let bad = |m: String| Err(ProtocolError::BadPayload(format!("deltas: {m}")));
    if !matches!(h.encoding, Encoding::F32 | Encoding::F16 | Encoding::Bf16) {
        return bad(format!("encoding {}", h.encoding));
    }
    if h.tables.len() > MAX_TABLES || h.deleted.len() > MAX_TABLES {
        return bad(format!(
            "{} tables of rows and {} of deletions: each list is capped at {MAX_TABLES}",
            h.tables.len(),
            h.deleted.len()
        ));
    }
    let mut rows = 0u64;
    for t in &h.tables {
        if t.dim == 0 || t.dim > MAX_DIM {
            return bad(format!(
                "table {}: dim {} outside 1..={MAX_DIM}",
                t.table, t.dim
            ));
        }
        rows += u64::from(t.count);
    }
    rows += h.deleted.iter().map(|d| u64::from(d.count)).sum::<u64>();
    if rows > u64::from(MAX_ROWS) {
        return bad(format!(
            "{rows} rows and deletions exceed the cap of {MAX_ROWS}"
        ));
    }
    if let Some(d) = h.dense {
        if d.len > MAX_DENSE_VALUES {
            return bad(format!(
                "{} dense values exceed the cap of {MAX_DENSE_VALUES}",
                d.len
            ));
        }
    }
    Ok(())
}

/// Decodes an answer's payload (module docs, "Payload"): checks the header ([`check_header`]), every id
/// section, and that the rows and dense values fill the rest exactly.
pub fn decode(header: DeltasHeader, payload: &[u8]) -> Result<DeltaBatch, ProtocolError> {
    check_header(&header)?;
    let layout = PayloadLayout::of(&header.tables)?;
    let mut ids = Vec::new();
    let used = get_sections(
        payload,
        header
            .tables
            .iter()
            .map(|t| t.count as usize)
            .chain(header.deleted.iter().map(|d| d.count as usize)),
        &mut ids,
    )
    .map_err(|e| ProtocolError::BadPayload(format!("deltas: {e}")))?;
    let rows_bytes = layout.rows_bytes(header.encoding);
    let dense_bytes = header.dense.map_or(0, |d| d.len as usize * 4);
    check_len(
        "deltas",
        payload.len() - used,
        rows_bytes.saturating_add(dense_bytes),
    )?;
    let mut tables = Vec::with_capacity(header.tables.len());
    let (mut id_at, mut row_at) = (0usize, used);
    for t in &header.tables {
        let (n, dim) = (t.count as usize, t.dim as usize);
        let width = n * header.encoding.row_bytes(dim);
        let mut rows = vec![0.0; n * dim];
        codec::decode_rows(
            &payload[row_at..row_at + width],
            dim,
            header.encoding,
            &mut rows,
        )?;
        tables.push(SyncedRows {
            table: t.table,
            dim: t.dim,
            ids: ids[id_at..id_at + n].to_vec(),
            rows,
        });
        id_at += n;
        row_at += width;
    }
    let deleted = header
        .deleted
        .iter()
        .map(|d| {
            let n = d.count as usize;
            id_at += n;
            DeletedIds {
                table: d.table,
                ids: ids[id_at - n..id_at].to_vec(),
            }
        })
        .collect();
    let dense = match header.dense {
        Some(d) => {
            let mut values = vec![0.0; d.len as usize];
            codec::decode(&payload[row_at..], Encoding::F32, &mut values)?;
            Some(values)
        }
        None => None,
    };
    Ok(DeltaBatch {
        header,
        tables,
        deleted,
        dense,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::{decode_frame, encode_frame, DEFAULT_MAX_FRAME};
    use crate::wire::message::Response;
    use proptest::prelude::*;

    fn header(tables: Vec<TableCount>, encoding: Encoding, dense: Option<u32>) -> DeltasHeader {
        DeltasHeader {
            incarnation: 7,
            cursor: SyncCursor {
                incarnation: 7,
                seq: 3,
                resume: Some(SyncResume::Deltas {
                    upto: 5,
                    table: 1,
                    after: 9,
                }),
            },
            complete: false,
            scan: false,
            encoding,
            tables,
            deleted: Vec::new(),
            oldest_change_unix_us: 10,
            cut_unix_us: 20,
            dense: dense.map(|len| DenseInfo {
                version: 2,
                step: 100,
                published_unix_us: 30,
                len,
            }),
        }
    }

    /// Encodes `tables` (table, dim, ids, rows) and dense values as a server does.
    fn payload(tables: &[(u32, u32, Vec<u64>, Vec<f32>)], enc: Encoding, dense: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for (_, _, ids, _) in tables {
            put_ids(ids, &mut out);
        }
        for (_, dim, _, rows) in tables {
            put_rows(rows, *dim as usize, enc, &mut out);
        }
        put_dense(dense, &mut out);
        out
    }

    fn counts(tables: &[(u32, u32, Vec<u64>, Vec<f32>)]) -> Vec<TableCount> {
        tables
            .iter()
            .map(|(t, d, ids, _)| TableCount {
                table: *t,
                count: ids.len() as u32,
                dim: *d,
            })
            .collect()
    }

    #[test]
    fn an_answer_round_trips_through_a_frame_in_f32_and_f16() {
        let tables = vec![
            (1u32, 2u32, vec![3u64, 9], vec![0.5f32, -1.0, 2.0, 0.25]),
            (4, 1, vec![u64::MAX], vec![8.0]),
        ];
        for enc in [Encoding::F32, Encoding::F16, Encoding::Bf16] {
            let h = header(counts(&tables), enc, Some(3));
            let body = payload(&tables, enc, &[1.0, 2.0, 3.0]);
            let frame = encode_frame(&Response::Deltas { header: h.clone() }, &body).unwrap();
            let (back, range, _) = decode_frame::<Response>(&frame, DEFAULT_MAX_FRAME)
                .unwrap()
                .unwrap();
            let Response::Deltas { header: back } = back else {
                panic!("{back:?}")
            };
            assert_eq!(back, h);
            let batch = decode(back, &frame[range]).unwrap();
            assert_eq!(batch.rows(), 3);
            assert_eq!(batch.tables[0].ids, [3, 9]);
            assert_eq!(batch.tables[0].rows, [0.5, -1.0, 2.0, 0.25]);
            assert_eq!(batch.tables[1].ids, [u64::MAX]);
            assert_eq!(batch.dense.as_deref(), Some(&[1.0f32, 2.0, 3.0][..]));
        }
    }

    #[test]
    fn deletions_travel_after_the_rows_ids_and_count_against_the_cap() {
        let tables = vec![(1u32, 2u32, vec![3u64, 9], vec![0.5f32, -1.0, 2.0, 0.25])];
        let mut h = header(counts(&tables), Encoding::Bf16, Some(1));
        h.deleted = vec![
            DeletedCount { table: 1, count: 2 },
            DeletedCount { table: 5, count: 1 },
        ];
        let mut body = Vec::new();
        put_ids(&[3, 9], &mut body);
        put_ids(&[4, 7], &mut body);
        put_ids(&[u64::MAX], &mut body);
        put_rows(&tables[0].3, 2, Encoding::Bf16, &mut body);
        put_dense(&[1.5], &mut body);
        let frame = encode_frame(&Response::Deltas { header: h.clone() }, &body).unwrap();
        let (back, range, _) = decode_frame::<Response>(&frame, DEFAULT_MAX_FRAME)
            .unwrap()
            .unwrap();
        let Response::Deltas { header: back } = back else {
            panic!("{back:?}")
        };
        let batch = decode(back, &frame[range]).unwrap();
        assert_eq!(batch.tables[0].ids, [3, 9]);
        assert_eq!(batch.tables[0].rows, [0.5, -1.0, 2.0, 0.25]);
        assert_eq!(
            batch.deleted,
            [
                DeletedIds {
                    table: 1,
                    ids: vec![4, 7]
                },
                DeletedIds {
                    table: 5,
                    ids: vec![u64::MAX]
                }
            ]
        );
        assert_eq!((batch.rows(), batch.deletions()), (2, 3));
        assert_eq!(batch.dense.as_deref(), Some(&[1.5f32][..]));
        // A deletion section one id short leaves bytes the rows do not fill.
        let mut short = h.clone();
        short.deleted[1].count = 0;
        assert!(decode(short, &body).is_err());
        // Deletions count against the row cap.
        let mut over = h;
        over.deleted[0].count = MAX_ROWS - 1;
        let err = decode(over, &body).unwrap_err().to_string();
        assert!(err.contains("rows and deletions exceed"), "{err}");
    }

    #[test]
    fn requests_round_trip_and_bad_ones_are_named() {
        for req in [
            request(SyncCursor::START, Encoding::F16, 100, 5000, 3),
            publish_request(9, 4, 1000, 2),
        ] {
            let frame = encode_frame(&req, &[]).unwrap();
            let (back, _, _) = decode_frame::<Request>(&frame, DEFAULT_MAX_FRAME)
                .unwrap()
                .unwrap();
            assert_eq!(back, req);
        }
        assert!(validate_request(Encoding::F32, 1).is_ok());
        let err = validate_request(Encoding::Int8, 10)
            .unwrap_err()
            .to_string();
        assert!(err.contains("encoding int8"), "{err}");
        let err = validate_request(Encoding::F32, 0).unwrap_err().to_string();
        assert!(err.contains("max_rows 0"), "{err}");
        let err = validate_request(Encoding::F32, MAX_ROWS + 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("max_rows {}", MAX_ROWS + 1)), "{err}");
    }

    #[test]
    fn dense_publications_are_checked_for_length() {
        let mut p = Vec::new();
        put_dense(&[1.5, -2.0], &mut p);
        assert_eq!(decode_dense(2, &p).unwrap(), [1.5, -2.0]);
        let err = decode_dense(3, &p).unwrap_err().to_string();
        assert!(err.contains("8 bytes, expected 12"), "{err}");
        let err = decode_dense(u32::MAX, &p).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{} values exceed", u32::MAX)),
            "{err}"
        );
    }

    #[test]
    fn answers_with_bad_sizes_or_counts_are_refused_by_name() {
        let tables = vec![(1u32, 2u32, vec![3u64, 9], vec![0.5f32, -1.0, 2.0, 0.25])];
        let body = payload(&tables, Encoding::F32, &[]);
        let h = header(counts(&tables), Encoding::F32, None);
        let err = decode(h.clone(), &body[..body.len() - 1]).unwrap_err();
        assert!(err.to_string().contains("deltas payload of"), "{err}");
        let mut long = body.clone();
        long.push(0);
        assert!(decode(h.clone(), &long).is_err());
        let err = decode(header(counts(&tables), Encoding::F32, Some(1)), &body).unwrap_err();
        assert!(err.to_string().contains("expected"), "{err}");
        let mut huge = h.clone();
        huge.tables[0].count = MAX_ROWS + 1;
        let err = decode(huge, &body).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{} rows and deletions exceed", MAX_ROWS + 1)),
            "{err}"
        );
        let mut wide = h.clone();
        wide.tables[0].dim = MAX_DIM + 1;
        let err = decode(wide, &body).unwrap_err().to_string();
        assert!(err.contains(&format!("dim {}", MAX_DIM + 1)), "{err}");
        let mut int8 = h.clone();
        int8.encoding = Encoding::Int8;
        let err = decode(int8, &body).unwrap_err().to_string();
        assert!(err.contains("encoding int8"), "{err}");
        let mut dense = h;
        dense.dense = Some(DenseInfo {
            version: 1,
            step: 1,
            published_unix_us: 1,
            len: u32::MAX,
        });
        let err = decode(dense, &body).unwrap_err().to_string();
        assert!(err.contains("dense values exceed"), "{err}");
    }

    #[test]
    fn sync_points_round_trip_as_json_and_bad_files_are_named() {
        let p = SyncPoint {
            incarnation: u64::MAX,
            seq: 42,
        };
        assert_eq!(SyncPoint::from_json(&p.to_json()).unwrap(), p);
        assert_eq!(
            String::from_utf8(p.to_json()).unwrap(),
            format!("{{\"incarnation\":{},\"seq\":42}}", u64::MAX)
        );
        let dir = std::env::temp_dir().join(format!("sync-point-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(SYNC_FILE), p.to_json()).unwrap();
        assert_eq!(SyncPoint::read(&dir).unwrap(), p);
        assert_eq!(SyncCursor::at(p).seq, 42);
        std::fs::write(dir.join(SYNC_FILE), b"{\"seq\":1}").unwrap();
        let err = SyncPoint::read(&dir).unwrap_err().to_string();
        assert!(err.contains("incarnation"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
        let err = SyncPoint::read(&dir).unwrap_err().to_string();
        assert!(err.contains(SYNC_FILE), "{err}");
    }

    proptest! {
        /// Any bytes after a valid header either decode into exactly the announced rows or are refused;
        /// never a panic.
        #[test]
        fn random_payloads_never_panic(
            counts in proptest::collection::vec((0u32..5, 1u32..4, 0u32..6), 0..4),
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            dense in proptest::option::of(0u32..4),
        ) {
            let tables = counts
                .iter()
                .map(|&(table, dim, count)| TableCount { table, count, dim })
                .collect::<Vec<_>>();
            let h = header(tables, Encoding::F16, dense);
            if let Ok(b) = decode(h.clone(), &bytes) {
                prop_assert_eq!(b.rows(), h.tables.iter().map(|t| t.count as usize).sum::<usize>());
                for (t, c) in b.tables.iter().zip(&h.tables) {
                    prop_assert_eq!(t.rows.len(), (c.count * c.dim) as usize);
                    prop_assert!(t.ids.windows(2).all(|w| w[0] < w[1]));
                }
            }
        }

        /// Encoded answers decode to what was encoded (f32 exactly).
        #[test]
        fn encoded_answers_round_trip(
            ids in proptest::collection::btree_set(any::<u64>(), 0..20),
            dim in 1u32..5,
            dense in proptest::collection::vec(-1e6f32..1e6, 0..5),
        ) {
            let ids: Vec<u64> = ids.into_iter().collect();
            let rows: Vec<f32> = (0..ids.len() * dim as usize).map(|i| i as f32 * 0.5).collect();
            let tables = vec![(3u32, dim, ids.clone(), rows.clone())];
            let h = header(counts(&tables), Encoding::F32, Some(dense.len() as u32));
            let b = decode(h, &payload(&tables, Encoding::F32, &dense)).unwrap();
            prop_assert_eq!(&b.tables[0].ids, &ids);
            prop_assert_eq!(&b.tables[0].rows, &rows);
            prop_assert_eq!(b.dense.unwrap(), dense);
        }
    }
}
