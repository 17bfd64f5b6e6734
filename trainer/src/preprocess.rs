//! `trainer preprocess`: Criteo text (TSV or Kaggle CSV; plain, gzip or zstd) into columnar shards
//! ([`crate::criteo::columnar`]) that training then reads memory-mapped instead of parsing.
//!
//! Input goes through the ordinary [`BatchReader`] (one batch per shard, parsed on its own thread while the
//! previous shard is written), so the shards hold exactly the rows training on the text would see, in
//! order; bad lines count against the same error budget. Each shard is written to a hidden temporary name
//! and renamed into place, so a crashed run leaves no half shard that a reader would take.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;

use crate::criteo::columnar::write_shard_for;
use crate::criteo::{BatchReader, FeatureLayout, ReadStats, ReaderConfig};

/// Flags of `trainer preprocess`.
#[derive(Debug, Clone, Args)]
pub struct PreprocessArgs {
    /// Input files or directories (TSV or Kaggle CSV; plain, gzip or zstd), in order.
    #[arg(long, num_args = 1.., required = true)]
    pub input: Vec<PathBuf>,
    /// Output directory for the shards `part-NNNNN.dlrmcol`; created if missing, must hold no files.
    #[arg(long)]
    pub out: PathBuf,
    /// Rows per shard (the last may be shorter); a shard takes 261 bytes per row, in memory while written.
    #[arg(long, default_value_t = 1 << 18)]
    pub rows_per_shard: usize,
    /// Bad lines skipped before failing.
    #[arg(long, default_value_t = 1000)]
    pub max_bad_lines: u64,
    /// The model spec whose features the shards hold (a file or a shipped name; docs/model-spec.md): which
    /// columns, tables, caps and bags. Training must use the same spec; without it, the default features.
    #[arg(long)]
    pub model_spec: Option<String>,
}

impl PreprocessArgs {
    /// The feature layout the shards are written with: `--model-spec`'s, or the default.
    pub fn layout(&self) -> anyhow::Result<FeatureLayout> {
        match &self.model_spec {
            None => Ok(FeatureLayout::default()),
            Some(name) => Ok(crate::model::spec::ModelSpec::load(name)
                .with_context(|| format!("model spec {name}"))?
                .feature_layout()),
        }
    }
}

/// What a preprocessing run wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreprocessSummary {
    /// The shard files, in order.
    pub shards: Vec<PathBuf>,
    /// The reader's counts (rows written, lines skipped).
    pub stats: ReadStats,
}

impl PreprocessSummary {
    /// A one-line human summary.
    pub fn render(&self) -> String {
        let s = &self.stats;
        format!(
            "preprocess: {} rows in {} shards ({} lines, {} bad, {} empty, {} padded)\n",
            s.rows,
            self.shards.len(),
            s.lines,
            s.bad_lines,
            s.empty_lines,
            s.padded_lines
        )
    }
}

/// The name of shard `n`.
fn shard_name(n: usize) -> String {
    format!("part-{n:05}.dlrmcol")
}

/// Reads `args.input` with the feature `layout` and writes shards of it into `args.out` (version 1 for the
/// default layout, version 2 with the layout's fingerprint otherwise: training must read them with the
/// same layout).
pub fn preprocess(
    args: &PreprocessArgs,
    layout: &FeatureLayout,
) -> anyhow::Result<PreprocessSummary> {
    if args.rows_per_shard == 0 {
        bail!("--rows-per-shard 0: a shard needs at least one row");
    }
    let out = &args.out;
    fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let occupied = fs::read_dir(out)
        .with_context(|| format!("list {}", out.display()))?
        .next()
        .is_some();
    if occupied {
        bail!(
            "output directory {} is not empty: shards of two runs would mix",
            out.display()
        );
    }
    let cfg = ReaderConfig {
        max_bad_lines: args.max_bad_lines,
        queue_depth: 1,
        layout: layout.clone(),
        ..ReaderConfig::new(args.input.iter(), args.rows_per_shard)
    };
    let mut reader = BatchReader::spawn(cfg).context("open the input")?;
    let mut shards = Vec::new();
    for batch in reader.by_ref() {
        let batch = batch.context("read the input")?;
        let path = out.join(shard_name(shards.len()));
        write_atomically(&path, |w| write_shard_for(&batch, layout, w))?;
        shards.push(path);
    }
    Ok(PreprocessSummary {
        shards,
        stats: reader.stats(),
    })
}

/// Writes `path` through a hidden temporary file in the same directory, then renames it into place.
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    let name = path.file_name().context("shard path has no file name")?;
    let tmp = path.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    let file = File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write(&mut w)
        .and_then(|()| w.flush())
        .with_context(|| format!("write {}", tmp.display()))?;
    fs::rename(&tmp, path)
        .with_context(|| format!("rename {} to {}", tmp.display(), path.display()))?;
    Ok(())
}
