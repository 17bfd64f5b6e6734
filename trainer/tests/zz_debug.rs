use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use bench::gen::{Encoding, Generator, Sink};
use trainer::cluster::LocalCluster;
use trainer::config::{ModelArgs, OptimizerKind};
use trainer::criteo::ReaderConfig;
use trainer::train::{PassOptions, Trainer};

fn generate(rows: u64, seed: u64, path: &Path) {
    let mut data = Sink::new(File::create(path).unwrap(), Encoding::for_path(path)).unwrap();
    Generator::new(seed, 7).write(rows, &mut data, None::<&mut Sink<File>>).unwrap();
    data.finish().unwrap();
}
fn start_servers(run_dir: &Path) -> LocalCluster {
    let command = || { let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_trainer")); c.arg("ps-server"); Ok(c) };
    LocalCluster::start_with(&command, 2, run_dir, &[]).unwrap()
}
fn model_args() -> ModelArgs {
    ModelArgs { batch_size: 256, bottom_mlp: vec![32, 16], top_mlp: vec![32, 1], optimizer: OptimizerKind::Adagrad, max_in_flight: 0, eval_batch_size: 1000, ..ModelArgs::default() }
}
async fn run(c: &LocalCluster, train: &Path, opts: PassOptions, resume: Option<&Path>) -> Vec<Vec<f32>> {
    let cfg = protocol::PsClientConfig::new(c.quic.clone(), c.tls_dir.clone());
    let client = Arc::new(protocol::PsClient::connect(cfg).await.unwrap());
    let mut t = Trainer::new(client.clone(), model_args()).await.unwrap();
    if let Some(d) = resume { t.resume(d).unwrap(); }
    t.train_pass(ReaderConfig::new([train], 256), &opts, |_| {}).await.unwrap();
    let p = t.model().params().iter().map(|p| p.to_vec()).collect();
    client.close().await;
    p
}
fn diff(x: &[Vec<f32>], y: &[Vec<f32>]) -> f32 { x.iter().flatten().zip(y.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max) }

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dbg() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    generate(256 * 10, 11, &train);
    let ck = dir.path().join("ck");
    let stop = 3u64;
    let b = start_servers(&dir.path().join("b"));
    let _part = run(&b, &train, PassOptions { max_steps: stop, checkpoint_dir: Some(ck.clone()), ..Default::default() }, None).await;
    b.shutdown(Duration::from_secs(30)).unwrap();
    for extra in 1..=4u64 {
        let a = start_servers(&dir.path().join(format!("a{extra}")));
        let whole = run(&a, &train, PassOptions { max_steps: stop + extra, ..Default::default() }, None).await;
        a.shutdown(Duration::from_secs(30)).unwrap();
        let c_dir = dir.path().join(format!("c{extra}"));
        for i in 0..2u32 { ps_server::restore::restore(&ck.join("ps"), 2, i, &c_dir.join(format!("ps-{i}"))).unwrap(); }
        let c = start_servers(&c_dir);
        let res = run(&c, &train, PassOptions { max_steps: stop + extra, ..Default::default() }, Some(&ck)).await;
        c.shutdown(Duration::from_secs(30)).unwrap();
        eprintln!("DEBUG extra {extra}: whole vs res {}", diff(&whole, &res));
    }
}
