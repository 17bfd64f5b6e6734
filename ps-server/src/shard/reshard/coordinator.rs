//! `ps-server reshard`: grows or shrinks a running cluster by moving virtual shards between servers.
//!
//! Servers keep their indices: growing appends servers (started with `--standby`), shrinking removes the
//! last ones (stop them after the reshard). The coordinator reads the current map from server 0, computes
//! the target ([`ShardMap::resized`]: the fewest virtual shards move), then:
//! 1. `Prepare` every server (those receiving first, then the sources, which start copying at once);
//! 2. `Status` every server until all are ready (scans through, streams nearly drained), printing progress;
//! 3. `Commit` the sources (each switches maps, so training's requests of the old epoch are refused, and
//!    drains its streams), then every other server. Training pauses only for the rows of the moving virtual
//!    shards, between a source's switch and the last destination's.
//!
//! A failure before the commits aborts the reshard on every server (the old map stays); a commit that
//! times out is sent again. A reshard left half done by a coordinator that died is finished (some server
//! switched maps: the others commit) or aborted (none did) by the next `ps-server reshard`, before its own
//! plan.

use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::wire::message::reshard::{MapInfo, ReshardPhase, ReshardStatus, ReshardStep};
use protocol::{Request, Response};

use super::PeerSettings;
use crate::shard::replica::peer::Peers;

/// Time allowed for one step on one server (a commit drains its streams first).
const STEP_TIMEOUT: Duration = Duration::from_secs(90);
/// Commits sent to one server before giving up.
const COMMIT_ATTEMPTS: u32 = 5;

/// Why a reshard failed.
#[derive(Debug, thiserror::Error)]
pub enum ReshardError {
    /// The address lists do not describe a grow or a shrink.
    #[error("{0}")]
    Plan(String),
    /// A server could not be reached or refused a step.
    #[error("server {server} ({name}): {what}: {message}")]
    Server {
        /// Its index.
        server: usize,
        /// Its address.
        name: String,
        /// The step.
        what: &'static str,
        /// What happened.
        message: String,
    },
}

/// What a reshard did.
#[derive(Debug, Clone, PartialEq)]
pub struct ReshardReport {
    /// Servers before and after.
    pub servers: (usize, usize),
    /// Map epochs before and after.
    pub epochs: (u64, u64),
    /// Virtual shards moved.
    pub vshards_moved: usize,
    /// Rows the sources sent (scan and forwarded pushes).
    pub rows_moved: u64,
    /// Seconds from the first prepare until every server was ready.
    pub copy_secs: f64,
    /// Seconds the commits took (the window in which moving rows are unavailable).
    pub commit_secs: f64,
    /// Seconds in all.
    pub total_secs: f64,
}

impl std::fmt::Display for ReshardReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "resharded {} -> {} servers: epoch {} -> {}, vshards_moved={} rows_moved={} copy_s={:.3} commit_s={:.3} total_s={:.3} rows_per_s={:.0}",
            self.servers.0,
            self.servers.1,
            self.epochs.0,
            self.epochs.1,
            self.vshards_moved,
            self.rows_moved,
            self.copy_secs,
            self.commit_secs,
            self.total_secs,
            self.rows_moved as f64 / self.total_secs.max(1e-9)
        )
    }
}

/// Checks that `to` grows or shrinks `from` keeping indices: one is a prefix of the other.
pub fn check_plan(from: &[String], to: &[String]) -> Result<(), ReshardError> {
    if from.is_empty() || to.is_empty() {
        return Err(ReshardError::Plan(
            "--ps and --to must each name at least one server".into(),
        ));
    }
    if from == to {
        return Err(ReshardError::Plan(format!(
            "--to lists the same {} servers as --ps: nothing to move",
            from.len()
        )));
    }
    let n = from.len().min(to.len());
    if let Some(i) = (0..n).find(|&i| from[i] != to[i]) {
        return Err(ReshardError::Plan(format!(
            "server {i} is {} in --ps but {} in --to: servers keep their indices (add servers at the end, remove the last ones)",
            from[i], to[i]
        )));
    }
    if let Some(s) = to.iter().find(|s| s.contains('/')) {
        return Err(ReshardError::Plan(format!(
            "{s}: resharding replicated shards is not supported"
        )));
    }
    Ok(())
}

/// Runs a reshard of the cluster at `from` onto `to`, calling `progress` with a line now and then.
pub async fn run(
    from: &[String],
    to: &[String],
    settings: &PeerSettings,
    poll: Duration,
    mut progress: impl FnMut(&str),
) -> Result<ReshardReport, ReshardError> {
    check_plan(from, to)?;
    let began = Instant::now();
    let all: &[String] = if to.len() > from.len() { to } else { from };
    let peers = Peers::new(all, u32::MAX, settings.clone());
    let ask = |server: usize, what: &'static str, req: Request| {
        let peers = &peers;
        async move {
            let failed = |message: String| ReshardError::Server {
                server,
                name: all[server].clone(),
                what,
                message,
            };
            match peers
                .call(server as u32, &req, Bytes::new(), STEP_TIMEOUT)
                .await
            {
                Ok(Response::Error { code, message }) => {
                    Err(failed(format!("{code:?}: {message}")))
                }
                Ok(resp) => Ok(resp),
                Err(e) => Err(failed(e.to_string())),
            }
        }
    };
    for (i, name) in all.iter().enumerate() {
        let hello = protocol::wire::message::hello::request();
        if let Response::Hello { shard_index, .. } = ask(i, "hello", hello).await? {
            if shard_index as usize != i {
                return Err(ReshardError::Plan(format!(
                    "{name} is shard {shard_index}, but it is listed at position {i}"
                )));
            }
        }
    }
    // A reshard whose coordinator died: finish its commits if a server already switched, else abort it.
    let mut statuses = Vec::with_capacity(all.len());
    for i in 0..all.len() {
        let step = ReshardStep::Status;
        let resp = ask(i, "status", Request::Reshard { step }).await?;
        statuses.push(status_of(i, all, "status", resp)?);
    }
    let newest = statuses.iter().map(|s| s.epoch).max().unwrap_or(0);
    let prepared: Vec<usize> = (0..all.len())
        .filter(|&i| statuses[i].phase == ReshardPhase::Moving)
        .collect();
    if prepared.iter().any(|&i| statuses[i].target_epoch == newest) {
        progress(&format!(
            "finishing an interrupted reshard to map epoch {newest} (servers {prepared:?} not committed)"
        ));
        let (sources, rest): (Vec<usize>, Vec<usize>) =
            prepared.iter().partition(|&&i| statuses[i].vshards_out > 0);
        for i in sources.into_iter().chain(rest) {
            let step = ReshardStep::Commit { epoch: newest };
            let resp = ask(i, "commit", Request::Reshard { step }).await?;
            status_of(i, all, "commit", resp)?;
        }
    } else if !prepared.is_empty() {
        progress(&format!(
            "aborting an interrupted reshard prepared on servers {prepared:?} (none switched maps)"
        ));
        for &i in &prepared {
            let step = ReshardStep::Abort;
            status_of(
                i,
                all,
                "abort",
                ask(i, "abort", Request::Reshard { step }).await?,
            )?;
        }
    }
    let current = match ask(0, "get shard map", Request::GetShardMap).await? {
        Response::ShardMap { map } => map,
        other => return Err(unexpected(0, all, "get shard map", &other)),
    };
    let map = current
        .map()
        .map_err(|e| ReshardError::Plan(e.to_string()))?;
    if map.num_servers as usize != from.len() {
        return Err(ReshardError::Plan(format!(
            "the cluster's map (epoch {}) has {} servers, --ps lists {}",
            map.epoch,
            map.num_servers,
            from.len()
        )));
    }
    let target = map
        .resized(to.len() as u32)
        .map_err(|e| ReshardError::Plan(e.to_string()))?;
    let moves = map.moves_to(&target);
    let mut sources: Vec<usize> = moves.iter().map(|&(_, f, _)| f as usize).collect();
    sources.sort_unstable();
    sources.dedup();
    let others: Vec<usize> = (0..all.len()).filter(|i| !sources.contains(i)).collect();
    let info = MapInfo::of(&target, to.to_vec());
    progress(&format!(
        "resharding {} -> {} servers: map epoch {} -> {}, {} virtual shards move (sources {:?})",
        from.len(),
        to.len(),
        map.epoch,
        target.epoch,
        moves.len(),
        sources
    ));
    let prepared = async {
        for &i in others.iter().chain(&sources) {
            let step = ReshardStep::Prepare {
                target: info.clone(),
            };
            status_of(
                i,
                all,
                "prepare",
                ask(i, "prepare", Request::Reshard { step }).await?,
            )?;
        }
        let mut last_print = Instant::now();
        loop {
            let mut ready = true;
            let (mut sent, mut acked) = (0, 0);
            for i in 0..all.len() {
                let step = ReshardStep::Status;
                let s = status_of(
                    i,
                    all,
                    "status",
                    ask(i, "status", Request::Reshard { step }).await?,
                )?;
                ready &= s.ready;
                sent += s.rows_sent;
                acked += s.rows_acked;
            }
            if ready {
                return Ok::<u64, ReshardError>(sent);
            }
            if last_print.elapsed() >= Duration::from_secs(1) {
                progress(&format!(
                    "copying: {acked} of {sent} rows stored ({:.1} s)",
                    began.elapsed().as_secs_f64()
                ));
                last_print = Instant::now();
            }
            tokio::time::sleep(poll).await;
        }
    };
    let copied = match prepared.await {
        Ok(rows) => rows,
        Err(e) => {
            for i in 0..all.len() {
                let step = ReshardStep::Abort;
                let _ = ask(i, "abort", Request::Reshard { step }).await;
            }
            progress("reshard aborted: every server keeps the old map");
            return Err(e);
        }
    };
    let copy_secs = began.elapsed().as_secs_f64();
    let commit_began = Instant::now();
    let commit = |i: usize| {
        let ask = &ask;
        async move {
            let mut attempt = 1;
            loop {
                let step = ReshardStep::Commit {
                    epoch: target.epoch,
                };
                match ask(i, "commit", Request::Reshard { step }).await {
                    Ok(resp) => return status_of(i, all, "commit", resp),
                    Err(e) if attempt < COMMIT_ATTEMPTS => {
                        tracing::warn!(server = i, error = %e, attempt, "commit failed; sending it again");
                        attempt += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    };
    let mut rows_moved = copied;
    for s in futures_util::future::join_all(sources.iter().map(|&i| commit(i))).await {
        rows_moved = rows_moved.max(s?.rows_sent);
    }
    for s in futures_util::future::join_all(others.iter().map(|&i| commit(i))).await {
        s?;
    }
    let report = ReshardReport {
        servers: (from.len(), to.len()),
        epochs: (map.epoch, target.epoch),
        vshards_moved: moves.len(),
        rows_moved,
        copy_secs,
        commit_secs: commit_began.elapsed().as_secs_f64(),
        total_secs: began.elapsed().as_secs_f64(),
    };
    peers.close();
    Ok(report)
}

fn status_of(
    server: usize,
    all: &[String],
    what: &'static str,
    resp: Response,
) -> Result<ReshardStatus, ReshardError> {
    match resp {
        Response::Resharding { status } => Ok(status),
        other => Err(unexpected(server, all, what, &other)),
    }
}

fn unexpected(server: usize, all: &[String], what: &'static str, got: &Response) -> ReshardError {
    ReshardError::Server {
        server,
        name: all[server].clone(),
        what,
        message: format!("unexpected answer {}", got.kind()),
    }
}
