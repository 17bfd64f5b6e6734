//! Synthetic Criteo-format data with a planted teacher (the `gen-criteo` binary).
//!
//! Rows follow the Criteo Kaggle `train.txt` layout (see [`mod@format`]): Zipf-distributed categoricals over
//! Criteo-sized vocabularies (or larger ones, [`scale`]), heavy-tailed integer counts and correlated missing
//! fields ([`schema`]). Each label is drawn from the click probability of a [`Teacher`], which is also written
//! to an optional oracle file so the best achievable AUC is known.
//!
//! # Determinism
//!
//! Rows are made in chunks of [`CHUNK_ROWS`]; chunk `c` draws from a generator seeded by `(seed, c)` and the
//! chunks are written in order. The output bytes are therefore a function of `(rows, seed, teacher seed)`
//! (and the vocabulary scale and [`BagSizes`], if given) only, not of the thread count. Changing [`CHUNK_ROWS`] or any table in [`schema`] changes the bytes.
//!
//! # Use
//!
//! Build a [`Generator`], wrap the outputs in [`Sink`]s, call [`Generator::write`] (it runs on the current
//! rayon pool), then [`Sink::finish`] each sink.

pub mod format;
pub mod multi_hot;
pub mod rng;
pub mod row;
pub mod scale;
pub mod schema;
pub mod sink;
pub mod teacher;
pub mod zipf;

use std::io::{self, Write};

use rayon::prelude::*;

pub use multi_hot::{BagSizes, BagSizesError, MLPERF_SIZES_TEXT};
pub use row::{Row, RowSampler};
pub use scale::{ScaleError, VocabScale};
pub use sink::{Encoding, Piece, Sink};
pub use teacher::{LogitParts, Teacher};
pub use zipf::Zipf;

use rng::{hash3, Rng};

/// Rows per chunk: the unit of seeding, parallel work and compression.
pub const CHUNK_ROWS: u64 = 4096;

/// Salt of the chunk seeds.
const SALT_CHUNK: u64 = 0x0063_6875_6e6b;

/// Which output failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Encoding or writing the data file.
    #[error("data output")]
    Data(#[source] io::Error),
    /// Encoding or writing the oracle file.
    #[error("oracle output")]
    Oracle(#[source] io::Error),
}

/// What was written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Rows written.
    pub rows: u64,
    /// Rows labelled 1.
    pub positives: u64,
}

impl Summary {
    /// Fraction of rows labelled 1 (0 for no rows).
    pub fn positive_rate(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.positives as f64 / self.rows as f64
        }
    }
}

/// One chunk of generated text.
#[derive(Debug, Clone, Default)]
pub struct Chunk {
    /// Criteo lines.
    pub data: Vec<u8>,
    /// One probability line per row (empty unless asked for).
    pub oracle: Vec<u8>,
    /// Rows in the chunk.
    pub rows: u64,
    /// Rows labelled 1.
    pub positives: u64,
}

/// An encoded chunk, ready to write.
struct EncodedChunk {
    data: Piece,
    oracle: Option<Piece>,
    rows: u64,
    positives: u64,
}

/// Makes rows, labels and oracle probabilities for one `(seed, teacher seed)`.
#[derive(Debug, Clone)]
pub struct Generator {
    seed: u64,
    teacher: Teacher,
    sampler: RowSampler,
}

impl Generator {
    /// A generator of rows from `seed`, labelled by the teacher drawn from `teacher_seed`.
    pub fn new(seed: u64, teacher_seed: u64) -> Self {
        Generator {
            seed,
            teacher: Teacher::new(teacher_seed),
            sampler: RowSampler::new(),
        }
    }

    /// [`Generator::new`] with the large columns' vocabularies scaled ([`scale`]); the teacher is calibrated
    /// on the scaled rows. `VocabScale::NONE` gives [`Generator::new`]'s output.
    pub fn scaled(seed: u64, teacher_seed: u64, scale: VocabScale) -> Result<Self, ScaleError> {
        let sampler = RowSampler::scaled(scale.validated()?);
        Ok(Generator {
            seed,
            teacher: Teacher::calibrated_on(teacher_seed, &sampler),
            sampler,
        })
    }

    /// [`Generator::scaled`] writing multi-hot rows ([`multi_hot`]): each field of a column of size `n > 1`
    /// holds `n` `|`-separated tokens; the teacher pools their contributions and is calibrated on such rows.
    pub fn multi_hot(
        seed: u64,
        teacher_seed: u64,
        scale: VocabScale,
        bags: BagSizes,
    ) -> Result<Self, ScaleError> {
        let sampler = RowSampler::scaled(scale.validated()?).with_bags(bags);
        Ok(Generator {
            seed,
            teacher: Teacher::calibrated_on(teacher_seed, &sampler),
            sampler,
        })
    }

    /// The teacher that labels the rows.
    pub fn teacher(&self) -> &Teacher {
        &self.teacher
    }

    /// Calls `f(row, probability, label)` for each row of chunk `index` of a file of `total_rows` rows.
    pub fn for_each_row(&self, index: u64, total_rows: u64, mut f: impl FnMut(&Row, f64, bool)) {
        let start = index.saturating_mul(CHUNK_ROWS);
        let n = total_rows.saturating_sub(start).min(CHUNK_ROWS);
        let mut rng = Rng::new(hash3(self.seed, SALT_CHUNK, index));
        let mut row = Row::default();
        for _ in 0..n {
            self.sampler.sample(&mut rng, &mut row);
            let p = self.teacher.probability(&row);
            let label = rng.bernoulli(p);
            f(&row, p, label);
        }
    }

    /// Chunk `index` of a file of `total_rows` rows as text; the oracle text only if `with_oracle`.
    pub fn chunk(&self, index: u64, total_rows: u64, with_oracle: bool) -> Chunk {
        // One-hot lines average about 245 bytes; a bag adds 9 bytes per token past the first.
        let extra = self.sampler.bags().map_or(0, |b| 9 * b.extra_tokens());
        let mut chunk = Chunk {
            data: Vec::with_capacity(CHUNK_ROWS as usize * (256 + extra)),
            oracle: Vec::with_capacity(if with_oracle {
                CHUNK_ROWS as usize * 9
            } else {
                0
            }),
            ..Chunk::default()
        };
        self.for_each_row(index, total_rows, |row, p, label| {
            format::push_row_with(&mut chunk.data, label, row, |j, r| self.sampler.token(j, r));
            if with_oracle {
                format::push_probability(&mut chunk.oracle, p);
            }
            chunk.rows += 1;
            chunk.positives += u64::from(label);
        });
        chunk
    }

    /// Writes `rows` rows to `data` (and their probabilities to `oracle`), generating and encoding chunks on
    /// the current rayon pool while the previous batch is written.
    pub fn write<W: Write + Send, O: Write + Send>(
        &self,
        rows: u64,
        data: &mut Sink<W>,
        mut oracle: Option<&mut Sink<O>>,
    ) -> Result<Summary, WriteError> {
        let chunks = rows.div_ceil(CHUNK_ROWS);
        // Chunks per batch: enough to keep every thread busy; only memory depends on it, not the bytes.
        let batch = 4 * rayon::current_num_threads().max(1) as u64;
        let data_encoding = data.encoding();
        let oracle_encoding = oracle.as_ref().map(|o| o.encoding());
        let mut summary = Summary::default();
        let mut pending: Vec<EncodedChunk> = Vec::new();
        let mut next = 0;
        while next < chunks || !pending.is_empty() {
            let end = (next + batch).min(chunks);
            let to_write = std::mem::take(&mut pending);
            let oracle_sink = oracle.as_deref_mut();
            let (written, produced) = rayon::join(
                || write_batch(&to_write, data, oracle_sink),
                || {
                    (next..end)
                        .into_par_iter()
                        .map(|c| self.encoded_chunk(c, rows, data_encoding, oracle_encoding))
                        .collect::<Result<Vec<_>, _>>()
                },
            );
            written?;
            for c in &to_write {
                summary.rows += c.rows;
                summary.positives += c.positives;
            }
            pending = produced?;
            next = end;
        }
        Ok(summary)
    }

    fn encoded_chunk(
        &self,
        index: u64,
        rows: u64,
        data: Encoding,
        oracle: Option<Encoding>,
    ) -> Result<EncodedChunk, WriteError> {
        let chunk = self.chunk(index, rows, oracle.is_some());
        Ok(EncodedChunk {
            data: data.encode(chunk.data).map_err(WriteError::Data)?,
            oracle: oracle
                .map(|e| e.encode(chunk.oracle))
                .transpose()
                .map_err(WriteError::Oracle)?,
            rows: chunk.rows,
            positives: chunk.positives,
        })
    }
}

fn write_batch<W: Write, O: Write>(
    batch: &[EncodedChunk],
    data: &mut Sink<W>,
    mut oracle: Option<&mut Sink<O>>,
) -> Result<(), WriteError> {
    for c in batch {
        data.write_piece(&c.data).map_err(WriteError::Data)?;
        if let (Some(sink), Some(piece)) = (oracle.as_deref_mut(), &c.oracle) {
            sink.write_piece(piece).map_err(WriteError::Oracle)?;
        }
    }
    Ok(())
}
