//! [`Inputs`]: where a job reads its data, and what a stream (`--follow`, `--train -`) refuses.

use std::path::PathBuf;

use anyhow::Context;

use crate::config::ModelArgs;
use crate::criteo::STDIN;

use super::JobArgs;

/// Where a job reads its data.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// Training files or directories.
    pub train: Vec<PathBuf>,
    /// Test files or directories (may be empty).
    pub test: Vec<PathBuf>,
    /// This trainer's rank.
    pub rank: usize,
    /// Number of trainers.
    pub world: usize,
    /// Follow the one training file as it grows (`--follow`).
    pub follow: bool,
}

impl Inputs {
    /// Whether the training data is a stream: a followed file, or standard input (`--train -`).
    pub fn is_stream(&self) -> bool {
        self.follow || self.stdin()
    }

    fn stdin(&self) -> bool {
        self.train.iter().any(|p| p.as_os_str() == STDIN)
    }

    /// Refuses what a stream cannot do, naming the flag.
    pub(super) fn check_stream(&self, model: &ModelArgs, job: &JobArgs) -> anyhow::Result<()> {
        let flag = if self.follow { "--follow" } else { "--train -" };
        if self.stdin() {
            anyhow::ensure!(
                self.train.len() == 1,
                "--train - (standard input) must be the only training input, got {} paths",
                self.train.len()
            );
            anyhow::ensure!(
                !self.follow,
                "--follow follows a file; --train - reads standard input until it closes without it"
            );
            anyhow::ensure!(
                self.world == 1,
                "--train - (standard input) feeds one trainer, got --world {}: split the stream into files \
                 and --follow one per trainer, or follow one file from every rank",
                self.world
            );
        }
        if self.follow {
            anyhow::ensure!(
                self.train.len() == 1,
                "--follow follows one text file, got {} --train paths",
                self.train.len()
            );
            let path = &self.train[0];
            let meta =
                std::fs::metadata(path).with_context(|| format!("--follow {}", path.display()))?;
            anyhow::ensure!(
                meta.is_file(),
                "--follow follows one text file; {} is not a file",
                path.display()
            );
            let mut head = Vec::new();
            use std::io::Read;
            std::fs::File::open(path)
                .and_then(|f| f.take(8).read_to_end(&mut head))
                .with_context(|| format!("--follow {}", path.display()))?;
            anyhow::ensure!(
                !criteo::Shard::is_shard(&head),
                "--follow reads text lines as they are appended; {} is a preprocessed columnar shard",
                path.display()
            );
            anyhow::ensure!(
                !head.starts_with(&[0x1f, 0x8b]) && !head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]),
                "--follow reads plain text lines as they are appended; {} is compressed",
                path.display()
            );
            let hybrid = self.world > 1 && model.dense_mode == crate::config::DenseMode::Hybrid;
            anyhow::ensure!(
                !hybrid,
                "--follow with --world {} needs --dense-mode async: the hybrid mode steps every trainer \
                 together, and ranks following a file get their rows at different times",
                self.world
            );
        }
        anyhow::ensure!(
            job.epochs() == 1,
            "--epochs {} with {flag}: a stream is read once, in arrival order (no epochs, no shuffle)",
            job.epochs()
        );
        Ok(())
    }
}
