//! TensorBoard event files (`--tensorboard-dir`): the scalars of a run — training loss, calibration,
//! progressive AUC, samples/s, where the time went, rows per table, evaluations — in the format TensorBoard
//! (and `tensorboard.backend.event_processing`) reads.
//!
//! # Format
//! An event file is a sequence of TFRecords (tensorflow `core/lib/io/record_writer.cc`): the payload length as
//! a little-endian `u64`, the masked CRC-32C of those 8 bytes, the payload, the masked CRC-32C of the
//! payload. Each payload is an `Event` protobuf (tensorflow `core/util/event.proto`): `wall_time` (field 1,
//! double), `step` (2, int64), and either `file_version` (3, the string `brain.Event:2`, the first record)
//! or `summary` (5), a `Summary` (`core/framework/summary.proto`) whose repeated `value` (1) each hold a
//! `tag` (1, string) and a `simple_value` (2, float). These few fields are encoded by hand here: a protobuf
//! and CRC crate would add two dependencies for about a hundred lines.
//!
//! A file is named `events.out.tfevents.<unix seconds>.<host>.<pid>.pstrain` (TensorBoard picks up files
//! with `tfevents` in the name); records are flushed as they are written, so a running TensorBoard sees
//! them at once.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::model::eval::EvalReport;
use crate::timing::TimeReport;
use crate::train::{Event, Progress};

/// Errors of the event writer, naming the directory or file.
#[derive(Debug, thiserror::Error)]
pub enum TensorBoardError {
    /// The directory could not be created, or a file in it could not be created.
    #[error("--tensorboard-dir {path}: {source}")]
    Create {
        /// The directory or file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A record could not be written.
    #[error("write TensorBoard events to {path}: {source}")]
    Write {
        /// The event file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Writes one event file.
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
    buf: Vec<u8>,
}

impl EventWriter {
    /// Creates `dir` (and its parents) and a new event file in it, and writes the file-version record.
    pub fn create(dir: &Path) -> Result<EventWriter, TensorBoardError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TensorBoardError::Create { path, source }
        };
        std::fs::create_dir_all(dir).map_err(err(dir))?;
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let host = hostname();
        let pid = std::process::id();
        // Two writers of one process in one second (tests) get distinct names.
        let mut n = 0;
        let (file, path) = loop {
            let suffix = if n == 0 {
                String::new()
            } else {
                format!(".{n}")
            };
            let path = dir.join(format!(
                "events.out.tfevents.{secs}.{host}.{pid}.pstrain{suffix}"
            ));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(f) => break (f, path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(err(&path)(e)),
            }
        };
        let mut w = EventWriter {
            out: BufWriter::new(file),
            path,
            buf: Vec::new(),
        };
        w.buf.clear();
        encode_event_header(&mut w.buf, wall_time(), 0);
        put_bytes(&mut w.buf, 3, b"brain.Event:2");
        w.write_record().map_err(|e| match e {
            TensorBoardError::Write { path, source } => TensorBoardError::Create { path, source },
            e => e,
        })?;
        Ok(w)
    }

    /// The event file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one event at `step` holding every `(tag, value)` of `values` as a scalar, and flushes it.
    /// Non-finite values are left out (TensorBoard would draw them as gaps anyway).
    pub fn scalars<S: AsRef<str>>(
        &mut self,
        step: u64,
        values: &[(S, f64)],
    ) -> Result<(), TensorBoardError> {
        self.buf.clear();
        encode_event_header(&mut self.buf, wall_time(), step as i64);
        let mut summary = Vec::new();
        let mut value = Vec::new();
        for (tag, v) in values.iter().filter(|(_, v)| v.is_finite()) {
            value.clear();
            put_bytes(&mut value, 1, tag.as_ref().as_bytes());
            put_key(&mut value, 2, WIRE_FIXED32);
            value.extend_from_slice(&(*v as f32).to_le_bytes());
            put_bytes(&mut summary, 1, &value);
        }
        put_bytes(&mut self.buf, 5, &summary);
        self.write_record()
    }

    /// Frames `self.buf` as a record, writes and flushes it.
    fn write_record(&mut self) -> Result<(), TensorBoardError> {
        let len = (self.buf.len() as u64).to_le_bytes();
        let r = (|| {
            self.out.write_all(&len)?;
            self.out.write_all(&masked_crc32c(&len).to_le_bytes())?;
            self.out.write_all(&self.buf)?;
            self.out
                .write_all(&masked_crc32c(&self.buf).to_le_bytes())?;
            self.out.flush()
        })();
        r.map_err(|source| TensorBoardError::Write {
            path: self.path.clone(),
            source,
        })
    }
}

/// A training job's TensorBoard log: the scalars of its progress lines, evaluations and summary. A write
/// that fails mid-run is logged once and ends the log; training goes on.
pub struct TrainLog {
    writer: Option<EventWriter>,
    tables: Vec<String>,
}

impl TrainLog {
    /// Creates the log's event file in `dir` for a model with `tables` (their names tag the rows scalars).
    pub fn create(dir: &Path, tables: Vec<String>) -> Result<TrainLog, TensorBoardError> {
        let writer = EventWriter::create(dir)?;
        tracing::info!(path = %writer.path().display(), "writing TensorBoard events");
        Ok(TrainLog {
            writer: Some(writer),
            tables,
        })
    }

    /// Writes what a pass's event reports (progress lines and evaluations; checkpoints and exports are not
    /// scalars).
    pub fn event(&mut self, e: &Event) {
        match e {
            Event::Progress(p) => {
                let values = self.progress_scalars(p);
                self.write(p.step, &values);
            }
            Event::Eval { step, report } => self.eval(*step, report),
            Event::Checkpoint { .. } | Event::CheckpointSkipped { .. } | Event::Export { .. } => {}
        }
    }

    /// Writes an evaluation's AUC, logloss and calibration at `step`.
    pub fn eval(&mut self, step: u64, r: &EvalReport) {
        let values = [
            ("eval/auc", r.auc.unwrap_or(f64::NAN)),
            ("eval/logloss", r.logloss),
            ("eval/calibration", r.calibration().unwrap_or(f64::NAN)),
        ];
        self.write(step, &values);
    }

    /// Writes the run's summary (`run::Summary`) at its last step `step`: samples/s, the final train loss and
    /// the whole run's time by phase and CPU.
    pub fn summary(&mut self, step: u64, samples_per_sec: f64, train_loss: f64, time: &TimeReport) {
        let mut values = vec![
            ("summary/samples_per_sec".to_string(), samples_per_sec),
            ("summary/train_loss".to_string(), train_loss),
        ];
        time_scalars("summary/", time, &mut values);
        self.write(step, &values);
    }

    fn progress_scalars(&self, p: &Progress) -> Vec<(String, f64)> {
        let mut v = vec![
            ("train/loss".to_string(), p.loss),
            ("train/calibration".to_string(), p.calibration),
            ("train/samples_per_sec".to_string(), p.samples_per_sec),
        ];
        if let Some(r) = &p.progressive {
            v.push(("train/progressive_auc".into(), r.auc.unwrap_or(f64::NAN)));
            v.push(("train/progressive_logloss".into(), r.logloss));
        }
        time_scalars("", &p.time, &mut v);
        let steps = p.time.steps.max(1) as f64;
        for (t, name) in self.tables.iter().enumerate() {
            if let (Some(&pulled), Some(&pushed)) = (p.rows_pulled.get(t), p.rows_pushed.get(t)) {
                v.push((
                    format!("rows_pulled_per_step/{name}"),
                    pulled as f64 / steps,
                ));
                v.push((
                    format!("rows_pushed_per_step/{name}"),
                    pushed as f64 / steps,
                ));
            }
        }
        v
    }

    fn write<S: AsRef<str>>(&mut self, step: u64, values: &[(S, f64)]) {
        let Some(w) = &mut self.writer else {
            return;
        };
        if let Err(e) = w.scalars(step, values) {
            tracing::warn!(error = %e, "TensorBoard events stop here");
            self.writer = None;
        }
    }
}

/// The scalars of a time report, tagged under `prefix`: milliseconds per step of the loop's phases
/// (`time/<phase>_ms`, phases never entered left out) and of the stage threads (`threads/<name>_ms`), and
/// the cores each process used (`cpu/trainer_cores`, `cpu/server<i>_cores`).
fn time_scalars(prefix: &str, t: &TimeReport, out: &mut Vec<(String, f64)>) {
    if t.steps == 0 {
        return;
    }
    out.push((format!("{prefix}time/step_ms"), t.per_step_ms(t.seconds)));
    for (phase, secs) in t.critical.iter().filter(|p| p.1 != 0.0) {
        out.push((
            format!("{prefix}time/{}_ms", phase.name()),
            t.per_step_ms(secs),
        ));
    }
    for (name, secs) in t.background.iter() {
        out.push((format!("{prefix}threads/{name}_ms"), t.per_step_ms(secs)));
    }
    let wall = t.seconds.max(1e-9);
    out.push((format!("{prefix}cpu/trainer_cores"), t.cpu.trainer / wall));
    for (i, s) in t.cpu.servers.iter().enumerate() {
        out.push((format!("{prefix}cpu/server{i}_cores"), s / wall));
    }
}

const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_FIXED32: u8 = 5;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An `Event`'s `wall_time` and `step` fields.
fn encode_event_header(out: &mut Vec<u8>, wall_time: f64, step: i64) {
    put_key(out, 1, WIRE_FIXED64);
    out.extend_from_slice(&wall_time.to_le_bytes());
    put_key(out, 2, WIRE_VARINT);
    put_varint(out, step as u64);
}

fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The host name (`gethostname`), for the file name; `localhost` if it cannot be read.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; gethostname NUL-terminates within it or fails.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
    let name = String::from_utf8_lossy(&buf[..end]);
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if ok && !clean.is_empty() {
        clean
    } else {
        "localhost".into()
    }
}

/// CRC-32C (Castagnoli), as TFRecord checksums its length and payload.
pub fn crc32c(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        std::array::from_fn(|i| {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
            c
        })
    });
    !bytes.iter().fold(!0u32, |c, &b| {
        table[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}

/// TFRecord's masked CRC: rotated right by 15 bits plus a constant (a CRC of data holding CRCs stays
/// meaningful).
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let c = crc32c(bytes);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads back the records of an event file, checking both checksums of each.
    fn records(path: &Path) -> Vec<Vec<u8>> {
        let bytes = std::fs::read(path).unwrap();
        let mut at = 0;
        let mut out = Vec::new();
        while at < bytes.len() {
            let len_bytes = &bytes[at..at + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(len_bytes));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data));
            out.push(data.to_vec());
            at += 16 + len;
        }
        out
    }

    /// A minimal protobuf reader: `(field, wire type, value bytes or varint)`.
    fn fields(mut b: &[u8]) -> Vec<(u64, u8, Vec<u8>, u64)> {
        fn varint(b: &mut &[u8]) -> u64 {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let byte = b[0];
                *b = &b[1..];
                v |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte < 0x80 {
                    return v;
                }
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let key = varint(&mut b);
            let (field, wire) = (key >> 3, (key & 7) as u8);
            match wire {
                WIRE_VARINT => out.push((field, wire, Vec::new(), varint(&mut b))),
                WIRE_FIXED64 => {
                    out.push((field, wire, b[..8].to_vec(), 0));
                    b = &b[8..];
                }
                WIRE_FIXED32 => {
                    out.push((field, wire, b[..4].to_vec(), 0));
                    b = &b[4..];
                }
                WIRE_LEN => {
                    let n = varint(&mut b) as usize;
                    out.push((field, wire, b[..n].to_vec(), 0));
                    b = &b[n..];
                }
                w => panic!("wire type {w}"),
            }
        }
        out
    }

    #[test]
    fn crc32c_known_values() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn events_decode_to_the_scalars_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(&dir.path().join("run")).unwrap();
        w.scalars(
            7,
            &[("train/loss", 0.5), ("nan", f64::NAN), ("eval/auc", 0.75)],
        )
        .unwrap();
        w.scalars(300, &[("train/loss", 0.25)]).unwrap();
        let path = w.path().to_path_buf();
        drop(w);
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .contains("tfevents"));
        let recs = records(&path);
        assert_eq!(recs.len(), 3);
        let first = fields(&recs[0]);
        assert_eq!(first[2].0, 3);
        assert_eq!(first[2].2, b"brain.Event:2");
        let mut seen = Vec::new();
        for rec in &recs[1..] {
            let f = fields(rec);
            assert_eq!((f[0].0, f[1].0), (1, 2));
            let step = f[1].3;
            let summary = fields(&f[2].2);
            for v in summary {
                let v = fields(&v.2);
                let tag = String::from_utf8(v[0].2.clone()).unwrap();
                let x = f32::from_le_bytes(v[1].2.clone().try_into().unwrap());
                seen.push((step, tag, x));
            }
        }
        assert_eq!(
            seen,
            [
                (7, "train/loss".to_string(), 0.5),
                (7, "eval/auc".to_string(), 0.75),
                (300, "train/loss".to_string(), 0.25)
            ]
        );
    }

    #[test]
    fn an_unwritable_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        let e = EventWriter::create(&file.join("sub")).err().unwrap();
        let text = e.to_string();
        assert!(
            text.contains("--tensorboard-dir") && text.contains("a-file"),
            "{text}"
        );
    }
}
