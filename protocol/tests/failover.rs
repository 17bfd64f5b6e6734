//! The client's failover state machine (`protocol::client::replicas`, docs/replication.md) against in-memory
//! replicas under tokio's paused time: a replica is a small model of the server's rules (who answers pushes,
//! when a backup accepts `Promote`), and faults (a dead primary, a partition, a deposed primary coming back)
//! are injected with the memory transport.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use protocol::transport::memory::{self, Fault, MemoryServer};
use protocol::wire::message::replicate::{ReplicaInfo, Role};
use protocol::{Encoding, ErrorCode, ProtocolError, PsClient, PsClientConfig, Request, Response};

/// One simulated replica: its role, epoch and sync state, and the pushes it took.
#[derive(Debug, Clone, Copy)]
struct State {
    role: Role,
    epoch: u64,
    in_sync: bool,
    pushes: u64,
}

fn replica(index: u32, state: Arc<Mutex<State>>) -> MemoryServer {
    MemoryServer::new(move |req, _payload| {
        let mut st = state.lock().unwrap();
        let reply = match req {
            Request::Hello { .. } => {
                let Response::Hello {
                    shard_index,
                    num_shards,
                    epoch,
                    routing,
                    tables,
                    ..
                } = memory::hello_reply(0, 1)
                else {
                    unreachable!()
                };
                Response::Hello {
                    shard_index,
                    num_shards,
                    epoch,
                    routing,
                    tables,
                    replica: ReplicaInfo {
                        replica_index: index,
                        replicas: 2,
                        role: st.role,
                        shard_epoch: st.epoch,
                        in_sync: st.in_sync,
                        in_sync_backups: 0,
                    },
                }
            }
            Request::Push { .. } if st.role == Role::Primary => {
                st.pushes += 1;
                Response::Pushed {
                    rows: 1,
                    rejected_nonfinite: 0,
                }
            }
            Request::Push { .. } => Response::Error {
                code: ErrorCode::NotPrimary,
                message: format!("replica {index} is not the primary"),
            },
            Request::Promote { .. } if st.role == Role::Backup && st.in_sync => {
                st.role = Role::Primary;
                st.epoch += 1;
                Response::Promoted {
                    shard_epoch: st.epoch,
                }
            }
            Request::Promote { .. } if st.role == Role::Primary => Response::Promoted {
                shard_epoch: st.epoch,
            },
            Request::Promote { .. } => Response::Error {
                code: ErrorCode::NotInSync,
                message: format!("replica {index} is catching up"),
            },
            other => Response::Error {
                code: ErrorCode::BadRequest,
                message: format!("unexpected {other:?}"),
            },
        };
        (reply, Bytes::new())
    })
}

struct Shard {
    states: Vec<Arc<Mutex<State>>>,
    servers: Vec<MemoryServer>,
}

fn shard(primary_in_sync_backup: bool) -> Shard {
    let states = vec![
        Arc::new(Mutex::new(State {
            role: Role::Primary,
            epoch: 1,
            in_sync: true,
            pushes: 0,
        })),
        Arc::new(Mutex::new(State {
            role: Role::Backup,
            epoch: 1,
            in_sync: primary_in_sync_backup,
            pushes: 0,
        })),
    ];
    let servers = states
        .iter()
        .enumerate()
        .map(|(i, s)| replica(i as u32, s.clone()))
        .collect();
    Shard { states, servers }
}

async fn client(s: &Shard, retry_for: Duration) -> PsClient<memory::MemoryDialer> {
    let addrs = vec![vec![
        "10.0.0.1:7000".parse().unwrap(),
        "10.0.0.2:7000".parse().unwrap(),
    ]];
    let mut cfg = PsClientConfig::replicated(addrs, "/nonexistent".into());
    cfg.retry_for = retry_for;
    cfg.request_timeout = Duration::from_secs(5);
    PsClient::connect_with(cfg, s.servers.iter().map(|m| m.dialer()).collect())
        .await
        .unwrap()
}

async fn push(c: &PsClient<memory::MemoryDialer>) -> Result<(u64, u64), ProtocolError> {
    c.push(0, Encoding::F32, 1.0, Vec::new(), Bytes::new())
        .await
}

/// The primary dies (its connections hang, new ones are refused): the client promotes the in-sync backup and
/// the push goes through there, once.
#[tokio::test(start_paused = true)]
async fn a_dead_primary_is_replaced_by_its_in_sync_backup() {
    let s = shard(true);
    let c = client(&s, Duration::from_secs(20)).await;
    push(&c).await.unwrap();
    s.servers[0].hang_connections();
    s.servers[0].refuse_connections(u64::MAX);
    push(&c).await.unwrap();
    assert_eq!(c.failovers(), 1);
    assert_eq!(c.shard_epoch(0), 2);
    assert_eq!(c.addr(0), "10.0.0.2:7000".parse().unwrap());
    assert_eq!(s.states[1].lock().unwrap().pushes, 1);
    assert_eq!(s.states[0].lock().unwrap().pushes, 1);
}

/// A deposed primary that comes back still claiming to be primary at the old epoch is never used again:
/// the client's check of a fresh connection refuses it, and a failover picks the newer epoch.
#[tokio::test(start_paused = true)]
async fn a_deposed_primary_with_an_older_epoch_is_fenced() {
    let s = shard(true);
    let c = client(&s, Duration::from_secs(20)).await;
    s.servers[0].fail_next(1, Fault::Lost);
    s.servers[0].refuse_connections(u64::MAX);
    push(&c).await.unwrap();
    assert_eq!(c.shard_epoch(0), 2);
    // Replica 0 "restarts" believing it is still the primary of epoch 1, and replica 1 drops a connection.
    s.servers[0].refuse_connections(0);
    s.servers[1].fail_next(1, Fault::Lost);
    for _ in 0..5 {
        push(&c).await.unwrap();
    }
    assert_eq!(
        s.states[0].lock().unwrap().pushes,
        0,
        "no push reached the deposed primary"
    );
    assert_eq!(s.states[1].lock().unwrap().pushes, 6);
    assert_eq!(c.addr(0), "10.0.0.2:7000".parse().unwrap());
}

/// A backup still catching up is never promoted: with the primary gone the push fails after `retry_for`
/// with a transient error (no silent success), and succeeds once the primary is back.
#[tokio::test(start_paused = true)]
async fn a_backup_catching_up_is_not_promoted() {
    let s = shard(false);
    let c = client(&s, Duration::from_secs(3)).await;
    s.servers[0].hang_connections();
    s.servers[0].refuse_connections(u64::MAX);
    let err = push(&c).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(s.states[1].lock().unwrap().role, Role::Backup);
    assert_eq!(c.failovers(), 0);
    s.servers[0].refuse_connections(0);
    push(&c).await.unwrap();
    assert_eq!(s.states[0].lock().unwrap().pushes, 1);
}

/// A partition from both replicas: requests fail after `retry_for` instead of hanging; when it heals, the
/// client resumes on the primary it had (no promotion happened: the backup was unreachable too).
#[tokio::test(start_paused = true)]
async fn a_partition_from_every_replica_fails_then_heals() {
    let s = shard(true);
    let c = client(&s, Duration::from_secs(4)).await;
    for m in &s.servers {
        m.hang_connections();
        m.refuse_connections(u64::MAX);
    }
    let started = tokio::time::Instant::now();
    let err = push(&c).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    for m in &s.servers {
        m.refuse_connections(0);
    }
    push(&c).await.unwrap();
    assert_eq!(c.failovers(), 0);
    assert_eq!(s.states[1].lock().unwrap().role, Role::Backup);
}

/// The replica the client starts with may be the backup (after an earlier failover): connecting finds the
/// primary.
#[tokio::test(start_paused = true)]
async fn connecting_finds_the_primary_wherever_it_is() {
    let s = shard(true);
    {
        let mut a = s.states[0].lock().unwrap();
        a.role = Role::Backup;
        a.epoch = 3;
        let mut b = s.states[1].lock().unwrap();
        b.role = Role::Primary;
        b.epoch = 3;
    }
    let c = client(&s, Duration::from_secs(5)).await;
    assert_eq!(c.addr(0), "10.0.0.2:7000".parse().unwrap());
    assert_eq!(c.shard_epoch(0), 3);
    push(&c).await.unwrap();
    assert_eq!(s.states[1].lock().unwrap().pushes, 1);
}
