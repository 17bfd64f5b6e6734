//! The acknowledgement log: a header line, then one line per acknowledged push, `<unix ms> <server> <mask
//! hex>`, appended with a single `write` after the acknowledgement arrives and before the next push to that
//! server. Each push is announced first by a line `s <unix ms> <server> <mask hex>` written before it is sent
//! ([`Record::Sent`]), so the verifier knows which pushes were sent and never acknowledged (their increments
//! may or may not be in the counters) and counts as duplicates only what exceeds them. A SIGKILL of the auditor leaves every completed `write` in the file (the page cache outlives the
//! process); a torn last line is cut off when the log is reopened and ignored when it is read.
//!
//! Every [`AckLog::open`] appends a marker line `# open <unix ms>` (after the header of a new log), and an
//! orderly stop appends `# close <unix ms>` ([`AckLog::close`]), so a reader can tell the auditor's lives
//! apart (the pause between two acknowledgements that span a restart of the auditor is the auditor's own
//! downtime, not the servers'). [`read`] skips marker lines, [`read_records`] returns them; logs written
//! before the markers existed read as one life. Lines starting with `#` that are not markers are skipped.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Errors of the audit log and of the audit's shape.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// Reading or writing the log failed.
    #[error("audit log {path}: {source}")]
    Io {
        /// The log's path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line of the log does not parse.
    #[error("audit log {path}:{line}: {detail}")]
    BadLine {
        /// The log's path.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        detail: String,
    },
    /// The log was written for another audit shape than the one asked for.
    #[error("audit log {path} is for {found}, but this run uses {expected}")]
    HeaderMismatch {
        /// The log's path.
        path: PathBuf,
        /// The log's header.
        found: String,
        /// This run's header.
        expected: String,
    },
    /// Server or row count out of range.
    #[error(
        "audit of {servers} servers x {rows} rows: need >= 1 server and 1..=64 rows per server"
    )]
    Shape {
        /// Servers.
        servers: usize,
        /// Rows per server.
        rows: usize,
    },
}

/// What a log is for: the number of servers and counter rows per server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHeader {
    /// Servers in the cluster.
    pub servers: usize,
    /// Counter rows per server.
    pub rows_per_server: usize,
}

impl LogHeader {
    fn line(&self) -> String {
        format!(
            "# ps-audit v1 servers={} rows-per-server={}",
            self.servers, self.rows_per_server
        )
    }
}

/// One acknowledged push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// When the acknowledgement was logged, ms since the Unix epoch (after it arrived).
    pub t_ms: u64,
    /// Server index.
    pub server: usize,
    /// Which of the server's counter rows the push incremented.
    pub mask: u64,
}

/// One line of the log after the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// An acknowledged push.
    Ack(Ack),
    /// A push about to be sent (its time is when it was logged, before sending).
    Sent(Ack),
    /// The auditor opened the log (a new life of the auditor starts), ms since the Unix epoch.
    Open(u64),
    /// The auditor stopped in order (every push in flight finished), ms since the Unix epoch.
    Close(u64),
}

/// An open log, appended to by every push task.
pub struct AckLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AckLog {
    /// Opens `path` for appending, creating it with `header`, or checking the header of an existing log and
    /// cutting off a torn last line.
    pub fn open(path: &Path, header: LogHeader) -> Result<AckLog, AuditError> {
        let io = |source| AuditError::Io {
            path: path.to_owned(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let mut text = Vec::new();
        file.read_to_end(&mut text).map_err(io)?;
        if text.is_empty() {
            file.write_all((header.line() + "\n").as_bytes())
                .map_err(io)?;
        } else {
            let found = text.split(|&b| b == b'\n').next().unwrap_or_default();
            if found != header.line().as_bytes() {
                return Err(AuditError::HeaderMismatch {
                    path: path.to_owned(),
                    found: String::from_utf8_lossy(found).into_owned(),
                    expected: header.line(),
                });
            }
            let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
            if complete < text.len() {
                file.set_len(complete as u64).map_err(io)?;
            }
            file.seek(SeekFrom::Start(complete as u64)).map_err(io)?;
        }
        let log = AckLog {
            path: path.to_owned(),
            file: Mutex::new(file),
        };
        log.write_line(&format!("# open {}\n", super::pusher::now_ms()))?;
        Ok(log)
    }

    /// Appends the `# close` marker: the auditor stops in order, every acknowledgement is logged.
    pub fn close(&self) -> Result<(), AuditError> {
        self.write_line(&format!("# close {}\n", super::pusher::now_ms()))
    }

    fn write_line(&self, line: &str) -> Result<(), AuditError> {
        self.file
            .lock()
            .expect("not poisoned")
            .write_all(line.as_bytes())
            .map_err(|source| AuditError::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// Appends a push about to be sent, with a single `write`.
    pub fn sent(&self, push: Ack) -> Result<(), AuditError> {
        self.write_line(&format!(
            "s {} {} {:x}\n",
            push.t_ms, push.server, push.mask
        ))
    }

    /// Appends one acknowledged push with a single `write`.
    pub fn append(&self, ack: Ack) -> Result<(), AuditError> {
        self.write_line(&format!("{} {} {:x}\n", ack.t_ms, ack.server, ack.mask))
    }
}

/// Reads a log: its header and every acknowledged push (a torn last line and marker lines are skipped).
pub fn read(path: &Path) -> Result<(LogHeader, Vec<Ack>), AuditError> {
    let (header, records) = read_records(path)?;
    Ok((header, acks(&records)))
}

/// The acknowledged pushes of `records`, in order.
pub fn acks(records: &[Record]) -> Vec<Ack> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Ack(a) => Some(*a),
            _ => None,
        })
        .collect()
}

/// Reads a log: its header and every complete record in order, acknowledgements and the auditor's open and
/// close markers (a torn last line is ignored, other `#` lines are skipped).
pub fn read_records(path: &Path) -> Result<(LogHeader, Vec<Record>), AuditError> {
    let text = std::fs::read_to_string(path).map_err(|source| AuditError::Io {
        path: path.to_owned(),
        source,
    })?;
    let bad = |line: usize, detail: String| AuditError::BadLine {
        path: path.to_owned(),
        line,
        detail,
    };
    let complete = text.rfind('\n').map_or("", |p| &text[..p]);
    let mut lines = complete.lines();
    let first = lines.next().unwrap_or_default();
    let header = parse_header(first).ok_or_else(|| bad(1, format!("bad header {first:?}")))?;
    let mut records = Vec::new();
    for (i, line) in lines.enumerate() {
        if let Some(comment) = line.strip_prefix('#') {
            let marker = |kind: &str| {
                comment
                    .trim_start()
                    .strip_prefix(kind)
                    .and_then(|t| t.strip_prefix(' '))
                    .map(|t| {
                        t.trim()
                            .parse::<u64>()
                            .map_err(|e| bad(i + 2, format!("{kind} marker {line:?}: {e}")))
                    })
            };
            if let Some(t) = marker("open") {
                records.push(Record::Open(t?));
            } else if let Some(t) = marker("close") {
                records.push(Record::Close(t?));
            }
            continue;
        }
        let (sent, fields) = match line.strip_prefix("s ") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let mut f = fields.split(' ');
        let (Some(t), Some(s), Some(m), None) = (f.next(), f.next(), f.next(), f.next()) else {
            return Err(bad(i + 2, format!("expected 3 fields in {line:?}")));
        };
        let ack = Ack {
            t_ms: t
                .parse()
                .map_err(|e| bad(i + 2, format!("time {t:?}: {e}")))?,
            server: s
                .parse()
                .map_err(|e| bad(i + 2, format!("server {s:?}: {e}")))?,
            mask: u64::from_str_radix(m, 16).map_err(|e| bad(i + 2, format!("mask {m:?}: {e}")))?,
        };
        if ack.server >= header.servers {
            return Err(bad(
                i + 2,
                format!("server {} of {}", ack.server, header.servers),
            ));
        }
        records.push(if sent {
            Record::Sent(ack)
        } else {
            Record::Ack(ack)
        });
    }
    Ok((header, records))
}

fn parse_header(line: &str) -> Option<LogHeader> {
    let rest = line.strip_prefix("# ps-audit v1 servers=")?;
    let (servers, rows) = rest.split_once(" rows-per-server=")?;
    Some(LogHeader {
        servers: servers.parse().ok()?,
        rows_per_server: rows.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: LogHeader = LogHeader {
        servers: 2,
        rows_per_server: 8,
    };

    #[test]
    fn appends_survive_reopen_and_a_torn_line_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acks.log");
        let log = AckLog::open(&path, HEADER).unwrap();
        let a = Ack {
            t_ms: 5,
            server: 1,
            mask: 0xff,
        };
        log.append(a).unwrap();
        drop(log);
        // A write torn by a kill.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"17 0 3").unwrap();
        assert_eq!(read(&path).unwrap(), (HEADER, vec![a]));
        let log = AckLog::open(&path, HEADER).unwrap();
        let b = Ack {
            t_ms: 9,
            server: 0,
            mask: 1,
        };
        log.sent(b).unwrap();
        log.append(b).unwrap();
        log.close().unwrap();
        assert_eq!(read(&path).unwrap().1, vec![a, b]);
        // Each open and the orderly stop are marked, in order.
        let records = read_records(&path).unwrap().1;
        assert!(
            matches!(
                records[..],
                [
                    Record::Open(_),
                    Record::Ack(x),
                    Record::Open(_),
                    Record::Sent(z),
                    Record::Ack(y),
                    Record::Close(_)
                ] if x == a && y == b && z == b
            ),
            "{records:?}"
        );
    }

    #[test]
    fn logs_without_markers_still_read_and_unknown_comments_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acks.log");
        // A log written before the markers existed.
        std::fs::write(
            &path,
            "# ps-audit v1 servers=2 rows-per-server=8\n5 1 ff\n# a note\n9 0 1\n",
        )
        .unwrap();
        let (header, records) = read_records(&path).unwrap();
        assert_eq!(header, HEADER);
        assert_eq!(records.len(), 2);
        assert_eq!(read(&path).unwrap().1.len(), 2);
        // Reopening it appends records after the old ones.
        drop(AckLog::open(&path, HEADER).unwrap());
        assert!(matches!(
            read_records(&path).unwrap().1[..],
            [Record::Ack(_), Record::Ack(_), Record::Open(_)]
        ));
        std::fs::write(
            &path,
            "# ps-audit v1 servers=2 rows-per-server=8\n# open soon\n",
        )
        .unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains(":2: open marker"), "{err}");
    }

    #[test]
    fn another_shape_and_bad_lines_are_refused_with_their_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acks.log");
        drop(AckLog::open(&path, HEADER).unwrap());
        let other = LogHeader {
            servers: 3,
            rows_per_server: 8,
        };
        let err = AckLog::open(&path, other).err().unwrap().to_string();
        assert!(err.contains("servers=3"), "{err}");
        std::fs::write(&path, "# ps-audit v1 servers=2 rows-per-server=8\n1 5 ff\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains(":2: server 5 of 2"), "{err}");
        std::fs::write(&path, "# ps-audit v1 servers=2 rows-per-server=8\n1 0 zz\n").unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("mask \"zz\""));
    }
}
