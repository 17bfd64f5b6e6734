//! The Criteo input pipeline: click logs in, columnar [`Batch`]es of labels, dense features and feature ids
//! out (DESIGN.md, "Read"). A crate of its own, below the trainer, because the Python package (and serving,
//! which answers Criteo-format rows) read the same rows into the same feature ids.
//!
//! Input is the Criteo TSV format (Kaggle `train.txt`, Terabyte `day_N`): no header, 40 tab-separated
//! fields `label, I1..I13, C1..C26`; or the Kaggle CSV form (`Id,Label,...` header, an id column first);
//! either plain, gzip or zstd (detected by content). `trainer preprocess` turns these into columnar shards
//! ([`columnar`]), which the reader also takes, memory-mapped. Text may also come as a stream: a file
//! followed as it grows, or standard input ([`lines`]). This module does not shuffle,
//! dedup ids, or talk to parameter servers: planning a batch is the training loop's job.
//!
//! # Layout
//! - [`parse`]: the sans-IO line parser ([`parse_line`] into a reusable [`Row`]), tolerant of what real logs
//!   hold (empty fields, negative integers, stripped trailing fields, CRLF) and precise about what it refuses
//!   ([`ParseError`] names the column and the text).
//! - [`ids`]: [`feature_id`], the bijective (feature, token) -> `u64` mix the embedding tables are keyed by.
//! - [`layout`]: [`FeatureLayout`], which columns become which features: one-hot or multi-hot (`|`-separated
//!   tokens, at most `tokens` kept), table salt, hash-size cap (docs/model-spec.md). The default is 26
//!   one-hot features with today's ids.
//! - [`batch`]: [`Batch`], columnar: labels `[B]`, dense `[B x 13]`, ids `[features][B]`, and per
//!   multi-hot feature its bag offsets `[B + 1]`.
//! - [`columnar`]: the preprocessed shard format: [`columnar::write_shard_for`], and [`Shard`] to check
//!   and decode one (sans-IO); version 2 records the layout's fingerprint and the bags' offsets.
//! - `source` (private): directory expansion, gzip/zstd/shard detection, line splitting without copies.
//! - [`lines`]: the [`Source`] trait the reader takes text lines from (a file, a stream, later a Kafka
//!   partition), [`StreamEnd`] to end a stream cleanly; [`Follow`] (`follow`: a growing file, `--follow`)
//!   and [`Piped`] (`piped`: standard input or any byte stream, on a thread of its own) implement it.
//! - [`error`]: [`ReadError`], why reading failed.
//! - [`reader`]: [`BatchReader`], parsing ahead on its own thread over a bounded channel, with the rank split
//!   and the error budget; [`read_all`] for small evaluation sets.
//!
//! # Example
//! ```no_run
//! use criteo::{BatchReader, ReaderConfig};
//! let cfg = ReaderConfig { rank: 0, world: 2, ..ReaderConfig::new(["data/day_0.gz"], 4096) };
//! let mut reader = BatchReader::spawn(cfg)?;
//! for batch in &mut reader {
//!     let batch = batch?;
//!     assert_eq!(batch.sparse.len(), criteo::NUM_SPARSE);
//! }
//! println!("{:?}", reader.stats());
//! # Ok::<(), criteo::ReadError>(())
//! ```

pub mod batch;
pub mod columnar;
pub mod error;
mod follow;
pub mod ids;
pub mod layout;
pub mod lines;
pub mod parse;
mod piped;
pub mod reader;
mod source;

pub use batch::Batch;
pub use columnar::{ColumnarError, Shard};
pub use error::ReadError;
pub use follow::Follow;
pub use ids::{decode_feature_id, feature_id};
pub use layout::{FeatureInput, FeatureLayout, IdScheme, LayoutError};
pub use lines::{Next, Source, StreamEnd};
pub use parse::{
    parse_csv_line, parse_line, parse_unlabeled_line, LineKind, ParseError, Row, TextFormat,
    NUM_DENSE, NUM_FIELDS, NUM_SPARSE,
};
pub use piped::Piped;
pub use reader::{read_all, BatchReader, ReadStats, ReaderConfig, STDIN};
pub use source::{count_rows, input_files};
