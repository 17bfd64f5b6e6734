//! `PsClient` over the in-memory transport (`protocol::transport::memory`) under tokio's paused time: retries,
//! backoff, liveness probes and shard routing, with faults injected on command. Every wait is a tokio timer and
//! the runtime jumps to the next one when all tasks are idle, so the (virtual) times asserted below are exact
//! and do not depend on the machine's speed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use protocol::client::{INITIAL_BACKOFF, MAX_BACKOFF, PROBE_AFTER, PROBE_TIMEOUT};
use protocol::transport::memory::{self, Fault, MemoryDialer, MemoryServer};
use protocol::wire::ids::{sort_for_wire, IdCoding};
use protocol::wire::message::pull::{self, IdSections};
use protocol::{
    Encoding, ErrorCode, ProtocolError, PsClient, PsClientConfig, Request, Response, ShardMap,
};
use tokio::time::Instant;

const ROWS_FLUSHED: u64 = 7;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 7000))
}

/// `n` servers, server `i` answering `Hello` as shard `i` of `n` and everything else with `answer(i, ..)`.
fn cluster(
    n: usize,
    answer: impl Fn(usize, &Request, Bytes) -> (Response, Bytes) + Clone + Send + Sync + 'static,
) -> Vec<MemoryServer> {
    (0..n)
        .map(|i| {
            let answer = answer.clone();
            MemoryServer::new(move |req, payload| match req {
                Request::Hello { .. } => (memory::hello_reply(i as u32, n as u32), Bytes::new()),
                other => answer(i, other, payload),
            })
        })
        .collect()
}

/// Answers flushes and pushes.
fn healthy(_server: usize, req: &Request, _payload: Bytes) -> (Response, Bytes) {
    let reply = match req {
        Request::Flush => Response::Flushed { rows: ROWS_FLUSHED },
        Request::Push { tables, .. } => Response::Pushed {
            rows: tables.iter().map(|t| t.count as u64).sum(),
            rejected_nonfinite: 0,
        },
        other => Response::Error {
            code: ErrorCode::Internal,
            message: format!("unexpected {other:?}"),
        },
    };
    (reply, Bytes::new())
}

fn config(n: usize) -> PsClientConfig {
    // The defaults: a 30 s request timeout, 20 s of retries.
    PsClientConfig::new((0..n).map(addr).collect(), Default::default())
}

async fn connect(servers: &[MemoryServer], cfg: PsClientConfig) -> PsClient<MemoryDialer> {
    PsClient::connect_with(cfg, servers.iter().map(MemoryServer::dialer).collect())
        .await
        .expect("connect")
}

/// The requests that reached `server` after the first `skip`, as (time since `t0`, connection, request kind).
fn requests_since(
    server: &MemoryServer,
    skip: usize,
    t0: Instant,
) -> Vec<(Duration, u64, &'static str)> {
    server.log().requests[skip..]
        .iter()
        .map(|(at, conn, req)| {
            let kind = match req {
                Request::Hello { .. } => "Hello",
                Request::Flush => "Flush",
                Request::Push { .. } => "Push",
                _ => "other",
            };
            (*at - t0, *conn, kind)
        })
        .collect()
}

fn push_request() -> (Vec<protocol::TableCount>, Bytes) {
    let mut s = IdSections::new();
    s.table(1, 4, IdCoding::Plain, &[3, 9]);
    (s.counts, Bytes::from(s.payload))
}

#[tokio::test(start_paused = true)]
async fn a_lost_connection_is_retried_on_a_fresh_one_and_succeeds() {
    let servers = cluster(1, healthy);
    let client = connect(&servers, config(1)).await;
    let s = &servers[0];
    s.fail_next(2, Fault::Lost);
    let t0 = Instant::now();
    assert_eq!(client.flush().await.unwrap(), ROWS_FLUSHED);
    // Two failures, two backoffs (20 ms, 40 ms), each retry on a newly dialed connection.
    assert_eq!(t0.elapsed(), INITIAL_BACKOFF + INITIAL_BACKOFF * 2);
    assert_eq!(s.log().dials.len(), 3);
    assert_eq!(
        requests_since(s, 1, t0),
        [
            (Duration::ZERO, 0, "Flush"),
            (Duration::from_millis(20), 1, "Flush"),
            (Duration::from_millis(60), 2, "Flush"),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_code_is_retried_on_the_same_connection() {
    let servers = cluster(1, healthy);
    let client = connect(&servers, config(1)).await;
    let s = &servers[0];
    s.fail_next(1, Fault::Answer(ErrorCode::ShuttingDown));
    let t0 = Instant::now();
    assert_eq!(client.flush().await.unwrap(), ROWS_FLUSHED);
    assert_eq!(
        requests_since(s, 1, t0),
        [
            (Duration::ZERO, 0, "Flush"),
            (Duration::from_millis(20), 0, "Flush")
        ]
    );
    assert_eq!(
        s.log().dials.len(),
        1,
        "an answered request keeps its connection"
    );
}

/// The documented schedule: attempt at 0, then after waits of 20 ms doubling to at most 1 s, while the next
/// attempt would start within `retry_for`.
fn documented_attempts(retry_for: Duration) -> Vec<Duration> {
    let (mut at, mut backoff, mut out) = (Duration::ZERO, Duration::from_millis(20), vec![]);
    out.push(at);
    while at + backoff <= retry_for {
        at += backoff;
        out.push(at);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
    out
}

/// The server loses the connection and then refuses every dial; returns the error and the attempts' times
/// (the request on the old connection, then every dial).
async fn fail_until_retries_stop() -> (ProtocolError, Duration, Vec<Duration>) {
    let servers = cluster(1, healthy);
    let cfg = config(1);
    let client = connect(&servers, cfg).await;
    let s = &servers[0];
    s.fail_next(1, Fault::Lost);
    s.refuse_connections(u64::MAX);
    let t0 = Instant::now();
    let err = client.flush().await.unwrap_err();
    let elapsed = t0.elapsed();
    let mut attempts: Vec<Duration> = requests_since(s, 1, t0).iter().map(|r| r.0).collect();
    assert_eq!(
        attempts.len(),
        1,
        "only the first attempt reached a connection"
    );
    attempts.extend(s.log().dials[1..].iter().map(|&at| at - t0));
    (err, elapsed, attempts)
}

#[tokio::test(start_paused = true)]
async fn retries_stop_after_retry_for_with_the_last_error() {
    let (err, elapsed, attempts) = fail_until_retries_stop().await;
    let retry_for = config(1).retry_for;
    match &err {
        ProtocolError::Connect { server, message } => {
            assert_eq!(server, &addr(0).to_string());
            assert!(message.contains("refused"), "{message}");
        }
        other => panic!("expected the last dial's error, got {other:?}"),
    }
    assert!(err.is_transient());
    // 20+40+80+160+320+640 ms, then 1 s waits: the last attempt at 19.26 s, as the next would start at 20.26 s.
    assert_eq!(elapsed, Duration::from_millis(19_260));
    assert_eq!(attempts, documented_attempts(retry_for));
    assert!(elapsed <= retry_for && elapsed + MAX_BACKOFF > retry_for);
}

#[tokio::test(start_paused = true)]
async fn backoff_doubles_from_20ms_to_at_most_1s() {
    let (_, _, attempts) = fail_until_retries_stop().await;
    let waits: Vec<u64> = attempts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis() as u64)
        .collect();
    assert_eq!(waits[..7], [20, 40, 80, 160, 320, 640, 1000]);
    assert!(waits[7..].iter().all(|&w| w == 1000), "{waits:?}");
    assert_eq!(INITIAL_BACKOFF, Duration::from_millis(20));
    assert_eq!(MAX_BACKOFF, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_hung_connection_is_probed_declared_dead_and_the_request_retried_on_a_fresh_one() {
    let servers = cluster(1, healthy);
    let client = connect(&servers, config(1)).await;
    let s = &servers[0];
    // As a QUIC connection to a server killed and restarted on the same port: nothing comes back on it.
    s.hang_connections();
    let t0 = Instant::now();
    assert_eq!(client.flush().await.unwrap(), ROWS_FLUSHED);
    assert_eq!(t0.elapsed(), PROBE_AFTER + PROBE_TIMEOUT + INITIAL_BACKOFF);
    assert_eq!(
        requests_since(s, 1, t0),
        [
            (Duration::ZERO, 0, "Flush"),
            (PROBE_AFTER, 0, "Hello"),
            (PROBE_AFTER + PROBE_TIMEOUT + INITIAL_BACKOFF, 1, "Flush"),
        ]
    );
    assert_eq!(s.log().dials.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_slow_but_live_server_is_probed_and_waited_for() {
    let servers = cluster(1, healthy);
    let client = connect(&servers, config(1)).await;
    let s = &servers[0];
    // Replies (probes' too) take 10 s, but the server acknowledges at once, so unanswered probes do not
    // condemn the connection.
    s.set_delay(Duration::from_secs(10));
    let t0 = Instant::now();
    assert_eq!(client.flush().await.unwrap(), ROWS_FLUSHED);
    assert_eq!(t0.elapsed(), Duration::from_secs(10));
    let probe_every = PROBE_TIMEOUT + PROBE_AFTER;
    assert_eq!(
        requests_since(s, 1, t0),
        [
            (Duration::ZERO, 0, "Flush"),
            (PROBE_AFTER, 0, "Hello"),
            (PROBE_AFTER + probe_every, 0, "Hello"),
            (PROBE_AFTER + probe_every * 2, 0, "Hello"),
        ]
    );
    assert_eq!(s.log().dials.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lost_reply_times_out_and_the_push_is_applied_again() {
    let servers = cluster(1, healthy);
    let mut cfg = config(1);
    cfg.request_timeout = Duration::from_secs(5);
    let client = connect(&servers, cfg).await;
    let s = &servers[0];
    s.drop_replies(1);
    let t0 = Instant::now();
    let (counts, payload) = push_request();
    assert_eq!(
        client
            .push(0, Encoding::F32, 1.0, counts, payload)
            .await
            .unwrap(),
        (2, 0)
    );
    // The live connection answers its probes, so the request waits for its timeout; the retry is at least once.
    assert_eq!(t0.elapsed(), Duration::from_secs(5) + INITIAL_BACKOFF);
    let pushes: Vec<_> = requests_since(s, 1, t0)
        .into_iter()
        .filter(|r| r.2 == "Push")
        .collect();
    assert_eq!(
        pushes,
        [
            (Duration::ZERO, 0, "Push"),
            (Duration::from_secs(5) + INITIAL_BACKOFF, 1, "Push")
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_timeout_beyond_retry_for_is_returned() {
    let servers = cluster(1, healthy);
    let client = connect(&servers, config(1)).await;
    servers[0].drop_replies(1);
    let t0 = Instant::now();
    let err = client.flush().await.unwrap_err();
    assert!(
        matches!(err, ProtocolError::Timeout { secs, .. } if secs == 30.0),
        "{err:?}"
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_is_not_retried() {
    let servers = cluster(1, healthy);
    let client = connect(&servers, config(1)).await;
    let s = &servers[0];
    s.fail_next(1, Fault::Answer(ErrorCode::UnknownTable));
    let t0 = Instant::now();
    let (counts, payload) = push_request();
    let err = client
        .push(0, Encoding::F32, 1.0, counts, payload)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::Remote {
                code: ErrorCode::UnknownTable,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(s.log().work().len(), 1);
}

/// `WrongShard` at the client's epoch means the ids were grouped by an older map (a live reshard): the
/// request is split by the current map and sent again, a bounded number of times.
#[tokio::test(start_paused = true)]
async fn a_wrong_shard_is_rerouted_by_the_current_map_a_bounded_number_of_times() {
    let servers = cluster(1, healthy);
    let client = connect(&servers, config(1)).await;
    let s = &servers[0];
    s.fail_next(1, Fault::Answer(ErrorCode::WrongShard));
    // A whole push: re-routing splits its rows too.
    let mut sections = IdSections::new();
    sections.table(1, 4, IdCoding::Plain, &[3, 9]);
    protocol::compression::codec::encode_rows(&[0.5; 8], 4, Encoding::F32, &mut sections.payload);
    let (counts, payload) = (sections.counts, Bytes::from(sections.payload));
    client
        .push(0, Encoding::F32, 1.0, counts.clone(), payload.clone())
        .await
        .unwrap();
    assert_eq!(s.log().work().len(), 2, "refused once, then sent again");
    s.fail_next(100, Fault::Answer(ErrorCode::WrongShard));
    let err = client
        .push(0, Encoding::F32, 1.0, counts, payload)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::Remote {
                code: ErrorCode::WrongShard,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        s.log().work().len(),
        2 + 5,
        "the first send and 4 re-routes"
    );
}

#[tokio::test(start_paused = true)]
async fn connect_refuses_a_server_listed_at_the_wrong_position() {
    let servers = cluster(2, healthy);
    let swapped = vec![servers[1].dialer(), servers[0].dialer()];
    let err = match PsClient::connect_with(config(2), swapped).await {
        Ok(_) => panic!("a swapped server list was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("shard 1 of 2, but it is listed at position 0"),
        "{err}"
    );
}

/// Ids of a pull that reached each server: `(server, table, id)`.
type Received = Arc<Mutex<Vec<(usize, u32, u64)>>>;

#[tokio::test(start_paused = true)]
async fn shard_routing_sends_each_tables_ids_to_their_server() {
    const N: usize = 3;
    let received = Received::default();
    let seen = received.clone();
    let servers = cluster(N, move |server, req, payload| {
        let Request::Pull {
            encoding, tables, ..
        } = req
        else {
            return healthy(server, req, payload);
        };
        let mut ids = Vec::new();
        let layout = pull::decode(tables, &payload, &mut ids).expect("well-formed pull");
        let mut ids = ids.into_iter();
        for t in tables {
            for id in ids.by_ref().take(t.count as usize) {
                seen.lock().unwrap().push((server, t.table, id));
            }
        }
        let rows = vec![0u8; layout.pull_response_bytes(*encoding)];
        let reply = Response::Pulled {
            encoding: *encoding,
            tables: tables.clone(),
        };
        (reply, Bytes::from(rows))
    });
    let client = connect(&servers, config(N)).await;
    let map = client.shard_map();
    assert_eq!(map, ShardMap::new(N as u32));

    let tables: [(u32, u32, Vec<u64>); 2] = [
        (1, 8, (0..500).collect()),
        (2, 4, (0..300u64).map(|i| i * 7919 + 5).collect()),
    ];
    let mut groups = Vec::new();
    let mut per_server = vec![IdSections::new(); N];
    for (table, dim, ids) in &tables {
        map.group(ids, &mut groups);
        for (s, positions) in groups.iter().enumerate() {
            let mut mine: Vec<u64> = positions.iter().map(|&p| ids[p as usize]).collect();
            sort_for_wire(IdCoding::Plain, &mut mine);
            per_server[s].table(*table, *dim, IdCoding::Plain, &mine);
        }
    }
    for (s, sections) in per_server.into_iter().enumerate() {
        assert!(!sections.is_empty(), "server {s} got no ids of any table");
        let rows = client
            .pull(
                s,
                Encoding::F32,
                sections.counts,
                Bytes::from(sections.payload),
            )
            .await
            .unwrap();
        assert!(!rows.is_empty());
    }

    let received = received.lock().unwrap();
    for &(server, table, id) in received.iter() {
        assert_eq!(
            map.server_of(id) as usize,
            server,
            "table {table} id {id} reached server {server}"
        );
    }
    for (table, _, ids) in &tables {
        let mut got: Vec<u64> = received
            .iter()
            .filter(|r| r.1 == *table)
            .map(|r| r.2)
            .collect();
        got.sort_unstable();
        assert_eq!(&got, ids, "table {table}: every id exactly once");
    }
}
