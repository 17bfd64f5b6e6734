//! The training loop against real shards in this process ([`ps_server::testing::MemoryCluster`], the
//! in-memory transport): the staleness gate, the acknowledgement prefix, replay of the trainer's own pushes,
//! faults surfacing as errors, and a primary's crash mid-pass failing over to its backup
//! ([`MemoryCluster::replicated`]).
//!
//! A [`Tap`] dialer sits between the client and the memory transport: it records, when each pull is sent, how
//! many push replies the client has been handed so far, and it holds push replies back (by yielding, not by
//! sleeping) and out of order, so pushes really are in flight while later batches pull. The assertions are
//! on that order of events, never on durations.
//!
//! Real time, not tokio's paused clock: the loop waits for its plan stage with `block_in_place`, which needs the
//! multi-thread runtime, and paused time needs the current-thread one; the loop also waits on its own threads
//! (parse, plan, push encoding), during which a paused clock would jump to the next timer (a request's
//! timeout) and fail requests depending on how fast those threads are. The only waits on the clock here are
//! the client's own timeouts in the dropped-reply test, and a guard that turns a hang into a failure.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use protocol::transport::memory::{Fault, MemoryConn, MemoryDialer};
use protocol::transport::{Connection, Dialer};
use protocol::{Encoding, ErrorCode, ProtocolError, PsClient, Request, Response};
use ps_server::config::Durability;
use ps_server::testing::{Killer, MemoryCluster};
use std::sync::atomic::Ordering;

use super::stages::AckPrefix;
use super::{Event, PassOptions, TrainError, Trainer};
use crate::config::ModelArgs;
use crate::criteo::ReaderConfig;
use model::spec::OptimizerKind;

/// Rows per batch, and batches per pass.
const BATCH: usize = 32;
const BATCHES: usize = 12;

/// What the [`Tap`] saw.
#[derive(Debug, Default)]
struct Events {
    /// For each pull (embedding rows, with or without their state) in the order they were sent: the push
    /// replies handed to the client before it.
    pulls: Vec<u64>,
    /// Push replies handed to the client so far.
    acks: u64,
    /// Pushes sent so far.
    pushes: u64,
}

/// A dialer wrapping the memory transport's: records [`Events`] and delays push replies.
struct Tap {
    inner: MemoryDialer,
    events: Arc<Mutex<Events>>,
    /// Yields before a push reply is handed over; every third push waits four times as long, so later
    /// pushes' replies overtake it.
    hold: usize,
    /// Crashes this dialer's server once it has answered that many pushes (before the last reply is handed
    /// over).
    crash: Option<Crash>,
}

/// A crash of the server behind a [`Tap`] after its `after`-th push.
#[derive(Clone)]
struct Crash {
    after: u64,
    pushes: Arc<std::sync::atomic::AtomicU64>,
    killer: Killer,
}

#[derive(Clone)]
struct TapConn {
    inner: MemoryConn,
    events: Arc<Mutex<Events>>,
    hold: usize,
    crash: Option<Crash>,
}

impl Dialer for Tap {
    type Conn = TapConn;

    async fn connect(
        &self,
        addr: std::net::SocketAddr,
        server_name: &str,
        max_frame: u64,
    ) -> Result<TapConn, ProtocolError> {
        let inner = self.inner.connect(addr, server_name, max_frame).await?;
        Ok(TapConn {
            inner,
            events: self.events.clone(),
            hold: self.hold,
            crash: self.crash.clone(),
        })
    }

    async fn wait_idle(&self) {}
}

impl Connection for TapConn {
    async fn call(
        &self,
        server: std::net::SocketAddr,
        req: &Request,
        payload: &Bytes,
    ) -> Result<(Response, Bytes), ProtocolError> {
        match req {
            Request::Pull { .. } | Request::PullWithState { .. } => {
                {
                    let mut e = self.events.lock().unwrap();
                    let acks = e.acks;
                    e.pulls.push(acks);
                }
                self.inner.call(server, req, payload).await
            }
            Request::Push { .. } => {
                let j = {
                    let mut e = self.events.lock().unwrap();
                    e.pushes += 1;
                    e.pushes - 1
                };
                // The server applies the push before its reply is held back (as a real one does).
                let reply = self.inner.call(server, req, payload).await;
                if let Some(c) = &self.crash {
                    if reply.is_ok() && c.pushes.fetch_add(1, Ordering::AcqRel) + 1 == c.after {
                        c.killer.kill();
                    }
                }
                let hold = if j % 3 == 0 { 4 * self.hold } else { self.hold };
                for _ in 0..hold {
                    tokio::task::yield_now().await;
                }
                self.events.lock().unwrap().acks += 1;
                reply
            }
            _ => self.inner.call(server, req, payload).await,
        }
    }

    fn close_reason(&self, server: std::net::SocketAddr) -> Option<ProtocolError> {
        self.inner.close_reason(server)
    }

    fn packets_received(&self) -> Option<u64> {
        self.inner.packets_received()
    }

    fn close(&self) {
        self.inner.close()
    }
}

/// `BATCHES` batches of Criteo TSV rows from a fixed seed, over a small vocabulary so ids repeat across
/// batches (the rows a stale pull misses are ones the trainer just pushed).
fn write_data(dir: &Path) -> PathBuf {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut text = String::new();
    for _ in 0..BATCH * BATCHES {
        let label = u64::from(next() % 4 == 0);
        text.push_str(&label.to_string());
        for _ in 0..13 {
            text.push_str(&format!("\t{}", next() % 100));
        }
        for _ in 0..26 {
            text.push_str(&format!("\t{:08x}", next() % 40));
        }
        text.push('\n');
    }
    let path = dir.join("train.tsv");
    std::fs::write(&path, text).unwrap();
    path
}

/// A small model at staleness bound `k`, rows and gradients as f32 on the wire, no warm-up, no prefetch.
fn args(k: usize) -> ModelArgs {
    ModelArgs {
        batch_size: BATCH,
        emb_dim: 4,
        bottom_mlp: vec![8, 4],
        top_mlp: vec![8, 1],
        encoding: Encoding::F32,
        max_in_flight: Some(k),
        staleness_warmup_steps: Some(0),
        prefetch_distance: 0,
        replay_own_updates: true,
        eval_batch_size: 64,
        ..ModelArgs::default()
    }
}

/// A trainer on `cluster` through a [`Tap`] holding push replies for `hold` yields.
async fn trainer(
    cluster: &MemoryCluster,
    cfg: protocol::PsClientConfig,
    args: ModelArgs,
    hold: usize,
) -> (Trainer<Tap>, Arc<Mutex<Events>>) {
    crashing_trainer(cluster, cfg, args, hold, None).await
}

/// [`trainer`], server `crash.0` killed after its `crash.1`-th push.
async fn crashing_trainer(
    cluster: &MemoryCluster,
    cfg: protocol::PsClientConfig,
    args: ModelArgs,
    hold: usize,
    crash: Option<(usize, u64)>,
) -> (Trainer<Tap>, Arc<Mutex<Events>>) {
    let events = Arc::new(Mutex::new(Events::default()));
    let dialers = cluster
        .dialers()
        .into_iter()
        .enumerate()
        .map(|(i, inner)| Tap {
            inner,
            events: events.clone(),
            hold,
            crash: crash.filter(|c| c.0 == i).map(|(_, after)| Crash {
                after,
                pushes: Default::default(),
                killer: cluster.killer(i),
            }),
        })
        .collect();
    let client = Arc::new(PsClient::connect_with(cfg, dialers).await.unwrap());
    (Trainer::new(client, args).await.unwrap(), events)
}

/// One pass over `data`, failing the test if it does not end within a minute (a hang, not a slow machine:
/// a pass here takes well under a second).
async fn pass(t: &mut Trainer<Tap>, data: &Path) -> Result<super::TrainReport, TrainError> {
    let opts = PassOptions::default();
    let run = t.train_pass(ReaderConfig::new([data], BATCH), &opts, |_| {});
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the pass hung")
}

#[test]
fn acknowledgements_count_as_a_prefix() {
    let (acks, rx) = AckPrefix::new();
    acks.ack(1);
    acks.ack(2);
    assert_eq!(
        *rx.borrow(),
        0,
        "push 0 is not acknowledged: no pull may count 1 or 2"
    );
    acks.ack(0);
    assert_eq!(*rx.borrow(), 3);
    acks.ack(4);
    assert_eq!(*rx.borrow(), 3);
    acks.ack(3);
    assert_eq!(*rx.borrow(), 5);
}

/// The `m`-th pull sent (in any order of batches) belongs with some batch `b >= m` sent by then, whose gate
/// needed the pushes `0..b-k` acknowledged: so at least `m - k` push replies preceded it. At k = 0 every push
/// is acknowledged before the next pull; at k = 2 the first three pulls go before any push (the pull window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_pull_runs_more_than_k_pushes_ahead_of_the_acknowledgements() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_data(dir.path());
    for k in [0usize, 2] {
        let cluster = MemoryCluster::new(1);
        let (mut t, events) = trainer(&cluster, cluster.config(), args(k), 64).await;
        let report = pass(&mut t, &data).await.unwrap();
        assert_eq!(report.batches, BATCHES as u64);
        let e = events.lock().unwrap();
        assert_eq!(e.pulls.len(), BATCHES, "one pull per batch on one server");
        assert_eq!(e.pushes, BATCHES as u64);
        for (m, &acks) in e.pulls.iter().enumerate() {
            assert!(
                acks >= (m as u64).saturating_sub(k as u64),
                "k = {k}: pull {m} sent after {acks} push replies: {:?}",
                e.pulls
            );
        }
        if k == 2 {
            assert_eq!(e.pulls[..3], [0, 0, 0], "the pull window: {:?}", e.pulls);
        }
    }
}

/// One trainer replaying its own pushes at k = 2, its push replies held back and out of order, computes with
/// the rows of a synchronous run: every step's rows are the same bit for bit, so the dense parameters after
/// the pass are too. With row-wise Adagrad on the rows (their optimizer state pulled with them and replayed)
/// and with SGD.
///
/// The servers' rows after the pass can differ: within the pass, push `j + 1` is sent only once the pull of
/// batch `j + k + 1` is answered, and that pull waited for push `j`'s acknowledgement, so pushes reach a
/// server in order; but the last `k` pushes of a pass have no later pull to order them, and a server may apply
/// them in either order. Adagrad's updates do not commute (the evaluation on the final rows then differs by
/// about 5e-4 in log loss, in a few runs of a hundred under load); SGD's do up to f32 rounding, so with SGD
/// the evaluation on the final rows is compared too, to 1e-6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_at_k2_matches_a_synchronous_run_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_data(dir.path());
    for optimizer in [OptimizerKind::Adagrad, OptimizerKind::Sgd] {
        let mut outcomes = Vec::new();
        for (k, hold) in [(0usize, 0usize), (2, 64)] {
            let cluster = MemoryCluster::new(2);
            let args = ModelArgs {
                optimizer,
                ..args(k)
            };
            let (mut t, events) = trainer(&cluster, cluster.config(), args, hold).await;
            pass(&mut t, &data).await.unwrap();
            if k > 0 {
                let e = events.lock().unwrap();
                assert!(
                    e.pulls.iter().enumerate().any(|(m, &a)| a < m as u64 / 2),
                    "no pull was stale, nothing was replayed: {:?}",
                    e.pulls
                );
            }
            let eval = t.evaluate(ReaderConfig::new([&data], 64)).await.unwrap();
            let params: Vec<Vec<u32>> = t
                .model()
                .params()
                .iter()
                .map(|p| p.iter().map(|v| v.to_bits()).collect())
                .collect();
            outcomes.push((params, eval.logloss, eval.count));
        }
        assert_eq!(outcomes[0].2, (BATCH * BATCHES) as u64);
        assert!(
            outcomes[0].0 == outcomes[1].0,
            "{optimizer:?}: dense parameters differ in some bit"
        );
        if optimizer == OptimizerKind::Sgd {
            let (a, b) = (outcomes[0].1, outcomes[1].1);
            assert!(
                (a - b).abs() <= 1e-6 * a.abs(),
                "evaluation log loss {a} vs {b}"
            );
        }
    }
}

/// A server answering a non-transient error to a training request ends the pass with an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_ends_the_pass_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_data(dir.path());
    let cluster = MemoryCluster::new(2);
    let (mut t, _) = trainer(&cluster, cluster.config(), args(2), 0).await;
    cluster
        .server(1)
        .fail_next(1, Fault::Answer(ErrorCode::Internal));
    let err = pass(&mut t, &data).await.unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("Internal"), "{text}");
}

/// A server that stops replying (its requests applied, replies lost) ends the pass with the client's timeout
/// once its retries run out, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_dropping_replies_ends_the_pass_with_a_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_data(dir.path());
    let cluster = MemoryCluster::new(2);
    let mut cfg = cluster.config();
    cfg.request_timeout = Duration::from_millis(200);
    cfg.retry_for = Duration::from_millis(200);
    let (mut t, _) = trainer(&cluster, cfg, args(2), 0).await;
    cluster.server(0).drop_replies(u64::MAX);
    let err = pass(&mut t, &data).await.unwrap_err();
    let text = format!("{err:#}");
    assert!(matches!(&err, TrainError::Servers { .. }), "{text}");
    assert!(text.contains(&cluster.addrs()[0].to_string()), "{text}");
}

/// Lost connections (before the server saw the request) are redialed and the requests retried: the pass ends
/// as a clean one does, bit for bit (k = 0), each connection's loss visible in the server's dial log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connections_are_redialed_and_the_pass_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_data(dir.path());
    let mut params = Vec::new();
    for lose in [0u64, 3] {
        let cluster = MemoryCluster::new(2);
        let (mut t, _) = trainer(&cluster, cluster.config(), args(0), 0).await;
        let dials = cluster.server(0).log().dials.len();
        cluster.server(0).fail_next(lose, Fault::Lost);
        pass(&mut t, &data).await.unwrap();
        assert_eq!(
            cluster.server(0).log().dials.len() - dials,
            lose as usize,
            "one redial per lost connection"
        );
        let p: Vec<Vec<u32>> = t
            .model()
            .params()
            .iter()
            .map(|p| p.iter().map(|v| v.to_bits()).collect())
            .collect();
        params.push(p);
    }
    assert!(
        params[0] == params[1],
        "dense parameters differ in some bit"
    );
}

/// Two shards of two replicas with replicated durability; shard 0's primary crashes mid-pass, right after
/// answering its fifth push: the client promotes the backup, the pass completes, and it is bit for bit a
/// clean run's (k = 0, every step's rows the same): no acknowledged push was lost, none applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_crashing_mid_pass_fails_over_and_the_pass_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_data(dir.path());
    let mut params = Vec::new();
    for crash in [None, Some((0usize, 5u64))] {
        let cluster = MemoryCluster::replicated(2, 2, Durability::Replicated).await;
        let (mut t, _) = crashing_trainer(&cluster, cluster.config(), args(0), 0, crash).await;
        let report = pass(&mut t, &data).await.unwrap();
        assert_eq!(report.batches, BATCHES as u64);
        if crash.is_some() {
            let role = |i: usize| cluster.shard(i).replica().role().name();
            assert_eq!(
                (role(0), role(1)),
                ("primary", "primary"),
                "replica 1 promoted; 0 is dead"
            );
            assert!(
                cluster
                    .server(1)
                    .log()
                    .work()
                    .iter()
                    .any(|(_, _, r)| matches!(r, Request::Push { .. })),
                "pushes reached the promoted backup"
            );
        }
        let p: Vec<Vec<u32>> = t
            .model()
            .params()
            .iter()
            .map(|p| p.iter().map(|v| v.to_bits()).collect())
            .collect();
        params.push(p);
    }
    assert!(
        params[0] == params[1],
        "dense parameters differ in some bit"
    );
}

/// A periodic checkpoint whose server snapshot fails with a storage error (a full disk) after the client's
/// retries is skipped: the pass goes on, the next checkpoints are written, and the latest checkpoint on disk
/// is the last one written. Any other checkpoint error still ends the pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_checkpoint_on_a_full_disk_is_skipped_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_data(dir.path());
    let ckpt = dir.path().join("ckpt");
    let cluster = MemoryCluster::new(2);
    let mut cfg = cluster.config();
    cfg.retry_for = Duration::from_millis(300);
    let (mut t, _) = trainer(&cluster, cfg.clone(), args(0), 0).await;
    let storage = Fault::Answer(ErrorCode::Storage);
    cluster
        .server(1)
        .fail_next_of(protocol::RequestKind::Checkpoint, u64::MAX, storage);
    let opts = PassOptions {
        checkpoint_dir: Some(ckpt.clone()),
        checkpoint_every: 4,
        ..PassOptions::default()
    };
    let mut events = Vec::new();
    let server = cluster.server(1);
    let run = t.train_pass(ReaderConfig::new([&data], BATCH), &opts, |e| {
        if matches!(e, Event::CheckpointSkipped { .. }) {
            // The disk has room again.
            server.fail_next(0, storage);
        }
        events.push(e);
    });
    let report = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the pass hung")
        .unwrap();
    assert_eq!(report.batches, BATCHES as u64);
    let steps = |skipped: bool| -> Vec<u64> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Checkpoint { step, .. } if !skipped => Some(*step),
                Event::CheckpointSkipped { step, error } if skipped => {
                    assert!(error.contains("Storage"), "{error}");
                    Some(*step)
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(steps(true), vec![4]);
    assert_eq!(steps(false), vec![8, 12]);
    let latest = crate::checkpoint::Checkpoint::read(&ckpt, 0).unwrap();
    assert_eq!(latest.meta.step, 12);

    // A refusal that is not a disk failure ends the pass.
    let cluster = MemoryCluster::new(2);
    let (mut t, _) = trainer(&cluster, cfg, args(0), 0).await;
    cluster.server(0).fail_next_of(
        protocol::RequestKind::Checkpoint,
        u64::MAX,
        Fault::Answer(ErrorCode::Internal),
    );
    let run = t.train_pass(ReaderConfig::new([&data], BATCH), &opts, |_| {});
    let err = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the pass hung")
        .unwrap_err();
    assert!(format!("{err:#}").contains("Internal"), "{err:#}");
}
