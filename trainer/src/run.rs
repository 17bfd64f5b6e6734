//! One training job end to end, shared by `trainer train` and `trainer demo`: connect, train one pass with
//! progress lines, evaluate, and summarize.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use protocol::{PsClient, PsClientConfig};
use serde::Serialize;

use crate::config::{ClusterArgs, ModelArgs};
use crate::criteo::ReaderConfig;
use crate::train::{Progress, Trainer};

/// The end-of-run summary, printed and written as JSON by `--summary-json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Training samples.
    pub samples: u64,
    /// Seconds of the training pass.
    pub seconds: f64,
    /// Training samples per second.
    pub samples_per_sec: f64,
    /// Mean training loss over the last 10% of the samples.
    pub train_loss: f64,
    /// Test AUC (absent without test data, or with a single class).
    pub auc: Option<f64>,
    /// Test logloss.
    pub logloss: Option<f64>,
    /// AUC of the generator's true click probabilities on the same test rows (generated data only).
    pub oracle_auc: Option<f64>,
    /// Test samples.
    pub test_samples: u64,
    /// Mean prediction over positive rate on the test rows.
    pub calibration: Option<f64>,
    /// Malformed training lines skipped.
    pub bad_lines: u64,
    /// Gradient rows the servers rejected as non-finite.
    pub rejected_nonfinite: u64,
}

impl Summary {
    /// Human-readable lines.
    pub fn render(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.4}"));
        format!(
            "samples         {}\nseconds         {:.2}\nsamples/s       {:.0}\nfinal train loss {:.4}\ntest AUC        {}\ntest logloss    {}\noracle AUC      {}\ntest samples    {}\ncalibration     {}\nbad lines       {}\n",
            self.samples,
            self.seconds,
            self.samples_per_sec,
            self.train_loss,
            opt(self.auc),
            opt(self.logloss),
            opt(self.oracle_auc),
            self.test_samples,
            opt(self.calibration),
            self.bad_lines,
        )
    }

    /// Writes the summary as JSON.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("write summary {}", path.display()))
    }
}

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
}

/// Connects to the cluster, trains one pass and evaluates.
pub async fn train_and_evaluate(
    cluster: &ClusterArgs,
    model: &ModelArgs,
    inputs: &Inputs,
) -> anyhow::Result<Summary> {
    anyhow::ensure!(
        cluster.resolve_timeout_secs.is_finite() && cluster.resolve_timeout_secs >= 0.0,
        "resolve-timeout-secs = {}, expected a number of seconds >= 0",
        cluster.resolve_timeout_secs
    );
    let servers = crate::config::resolve_servers(
        &cluster.ps,
        std::time::Duration::from_secs_f64(cluster.resolve_timeout_secs),
    )
    .await
    .map_err(anyhow::Error::msg)?;
    let mut cfg = PsClientConfig::new(servers, cluster.tls_dir.clone());
    cfg.server_name = cluster.server_name.clone();
    let client = Arc::new(
        PsClient::connect(cfg)
            .await
            .context("connect to the parameter servers")?,
    );
    let mut trainer = Trainer::new(client.clone(), model.clone()).await?;
    let reader = ReaderConfig {
        max_bad_lines: model.max_bad_lines,
        rank: inputs.rank,
        world: inputs.world,
        ..ReaderConfig::new(inputs.train.iter().cloned(), model.batch_size)
    };
    eprintln!(
        "training: {} servers, batch {}, dense {:?} lr {}, embeddings {:?} lr {}, {} on the wire, staleness bound {}",
        client.num_servers(),
        model.batch_size,
        model.dense_kind(),
        model.dense_lr(),
        model.optimizer,
        model.emb_lr(),
        model.encoding,
        model.max_in_flight
    );
    let report = trainer
        .train_pass(reader, |p: Progress| {
            eprintln!(
                "[{:>6.1}s] rows {:>9}  samples/s {:>8.0}  loss {:.4}",
                p.seconds, p.samples, p.samples_per_sec, p.loss
            );
        })
        .await?;
    if report.read.bad_lines > 0 {
        eprintln!(
            "skipped {} malformed lines; first: {:?}",
            report.read.bad_lines, report.read.first_errors
        );
    }
    let mut summary = Summary {
        samples: report.samples,
        seconds: report.seconds,
        samples_per_sec: report.samples as f64 / report.seconds.max(1e-9),
        train_loss: report.final_loss,
        auc: None,
        logloss: None,
        oracle_auc: None,
        test_samples: 0,
        calibration: None,
        bad_lines: report.read.bad_lines,
        rejected_nonfinite: report.rejected_nonfinite,
    };
    if !inputs.test.is_empty() {
        eprintln!("evaluating on {:?}", inputs.test);
        let eval_cfg = ReaderConfig {
            max_bad_lines: model.max_bad_lines,
            ..ReaderConfig::new(inputs.test.iter().cloned(), model.eval_batch_size)
        };
        let eval = trainer.evaluate(eval_cfg).await?;
        summary.auc = eval.auc;
        summary.logloss = Some(eval.logloss);
        summary.test_samples = eval.count;
        if eval.positive_rate > 0.0 {
            summary.calibration = Some(eval.mean_prediction / eval.positive_rate);
        }
    }
    client.close().await;
    Ok(summary)
}

/// AUC of the probabilities in `oracle` (one per line) against the labels of the Criteo file `data`.
pub fn oracle_auc(data: &Path, oracle: &Path) -> anyhow::Result<Option<f64>> {
    use std::io::BufRead;
    let labels: Vec<f32> = std::io::BufReader::new(
        std::fs::File::open(data).with_context(|| format!("open {}", data.display()))?,
    )
    .split(b'\n')
    .map(|line| line.map(|l| if l.first() == Some(&b'1') { 1.0 } else { 0.0 }))
    .collect::<Result<_, _>>()
    .with_context(|| format!("read {}", data.display()))?;
    let probs: Vec<f32> = std::fs::read_to_string(oracle)
        .with_context(|| format!("read {}", oracle.display()))?
        .lines()
        .map(|l| {
            l.trim()
                .parse::<f32>()
                .with_context(|| format!("{}: bad probability {l:?}", oracle.display()))
        })
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(
        labels.len() == probs.len(),
        "{} has {} rows but {} has {} probabilities",
        data.display(),
        labels.len(),
        oracle.display(),
        probs.len()
    );
    Ok(crate::eval::auc(&probs, &labels))
}

/// Loads model settings from a TOML file.
pub fn load_model(path: &Path) -> anyhow::Result<ModelArgs> {
    crate::config::load_model_file(path).map_err(anyhow::Error::msg)
}
