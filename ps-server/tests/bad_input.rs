//! Bad input over the wire against a real `ps-server` process: each bad request gets a typed error (or, for
//! non-finite gradients and an empty batch, a defined answer), and well-behaved clients keep being served
//! during (a pusher runs throughout, its acknowledged pushes all applied) and after each one.
//!
//! Defined behaviours (not errors): a gradient row with NaN or infinity is skipped, the rest of the push is
//! applied, and the reply counts it in `rejected_nonfinite`; an empty batch (no tables, or tables with zero ids)
//! is a no-op answered `Pushed { rows: 0 }` / `Pulled` with an empty payload.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::{counter_table, error_code, raw_connection, raw_request, sigterm_and_wait, start};
use protocol::compression::codec;
use protocol::wire::frame::{encode_frame, MAGIC, PREFIX_LEN};
use protocol::wire::layout::put_ids;
use protocol::{Encoding, ErrorCode, PsClient, Request, Response, TableCount};

const TABLE: u32 = 5;
const DIM: u32 = 4;

fn counts(n: usize, dim: u32) -> Vec<TableCount> {
    vec![TableCount {
        table: TABLE,
        count: n as u32,
        dim,
    }]
}

/// A push payload: the id section of `ids` (ascending), then f32 gradient rows.
fn push_payload(ids: &[u64], grads: &[f32]) -> Vec<u8> {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    codec::encode(grads, Encoding::F32, &mut payload);
    payload
}

fn push_frame(ids: &[u64], dim: u32, grads: &[f32], grad_scale: f32) -> Vec<u8> {
    let req = Request::Push {
        lr_scale: 1.0,
        epoch: 1,
        encoding: Encoding::F32,
        grad_scale,
        tables: counts(ids.len(), dim),
        id: protocol::wire::message::push::PushId::NONE,
    };
    encode_frame(&req, &push_payload(ids, grads)).unwrap()
}

fn pull_frame(table: u32, ids: &[u64], dim: u32) -> Vec<u8> {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    let req = Request::Pull {
        epoch: 1,
        encoding: Encoding::F32,
        tables: vec![TableCount {
            table,
            count: ids.len() as u32,
            dim,
        }],
    };
    encode_frame(&req, &payload).unwrap()
}

async fn pull_rows(c: &PsClient, ids: &[u64]) -> Vec<f32> {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    let rows = c
        .pull(0, Encoding::F32, counts(ids.len(), DIM), payload.into())
        .await
        .unwrap();
    let mut out = vec![0.0; ids.len() * DIM as usize];
    codec::decode(&rows, Encoding::F32, &mut out).unwrap();
    out
}

async fn push_ones(c: &PsClient, ids: &[u64]) -> Result<(u64, u64), protocol::ProtocolError> {
    let grads = vec![1.0; ids.len() * DIM as usize];
    c.push(
        0,
        Encoding::F32,
        1.0,
        counts(ids.len(), DIM),
        push_payload(ids, &grads).into(),
    )
    .await
}

/// The well-behaved client is served: a push is applied exactly once and read back (`round` pushes so far).
async fn check_served(c: &PsClient, round: &mut u32, what: &str) {
    assert_eq!(
        push_ones(c, &[1, 2, 3]).await.unwrap(),
        (3, 0),
        "after {what}"
    );
    *round += 1;
    let want = vec![-(*round as f32); 3 * DIM as usize];
    assert_eq!(pull_rows(c, &[1, 2, 3]).await, want, "after {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors_while_other_clients_keep_being_served() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    // A 1 MiB frame cap keeps the oversized cases small.
    let s = start(&data, &tls, &["--max-frame-bytes", "1048576"]);
    let good = common::client(&s, &tls).await;
    good.register_tables(&[counter_table(TABLE, DIM)])
        .await
        .unwrap();
    let pusher = Pusher::start(common::client(&s, &tls).await);

    let (_endpoint, bad) = raw_connection(&s, &tls).await;
    let mut round = 0;
    check_served(&good, &mut round, "start").await;
    announced_oversized_frame(&bad).await;
    check_served(&good, &mut round, "an announced oversized frame").await;
    sent_oversized_frame(&bad).await;
    check_served(&good, &mut round, "a sent oversized frame").await;
    pull_with_oversized_response(&bad).await;
    check_served(&good, &mut round, "a pull with an oversized response").await;
    truncated_frames(&bad).await;
    check_served(&good, &mut round, "a truncated frame").await;
    wrong_versions(&bad).await;
    check_served(&good, &mut round, "wrong versions").await;
    unknown_table_and_wrong_dimension(&bad).await;
    check_served(&good, &mut round, "unknown table and wrong dimension").await;
    nonfinite_gradients(&bad, &good).await;
    check_served(&good, &mut round, "non-finite gradients").await;
    duplicate_ids(&bad, &good).await;
    check_served(&good, &mut round, "duplicate ids").await;
    empty_batches(&bad).await;
    check_served(&good, &mut round, "empty batches").await;
    random_bytes(&bad).await;
    check_served(&good, &mut round, "random bytes").await;

    // The bad client's own connection still works for a good request.
    let hello = Request::Hello {
        version: protocol::PROTOCOL_VERSION,
    };
    let answer = raw_request(&bad, &encode_frame(&hello, &[]).unwrap()).await;
    assert!(
        matches!(answer, Ok((Response::Hello { .. }, _))),
        "{answer:?}"
    );

    let n = pusher.stop().await;
    assert!(n > 0);
    assert_eq!(
        pull_rows(&good, &[100, 101]).await,
        vec![-(n as f32); 2 * DIM as usize],
        "pushes acknowledged during the bad input were not all applied"
    );
    let metrics = common::http_get(s.metrics, "/metrics");
    for code in [
        "FrameTooLarge",
        "BadRequest",
        "UnsupportedVersion",
        "UnknownTable",
        "WrongDimension",
    ] {
        assert!(
            metrics.contains(&format!("ps_request_errors_total{{code=\"{code}\"}}")),
            "no {code} count in /metrics"
        );
    }
    good.close().await;
    drop(bad);
    sigterm_and_wait(s);
}

/// A client that pushes to rows 100 and 101 until stopped, counting acknowledged pushes; each must be applied.
struct Pusher {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Pusher {
    fn start(client: PsClient) -> Pusher {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let task = {
            let (stop, acked) = (stop.clone(), acked.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    push_ones(&client, &[100, 101]).await.unwrap();
                    acked.fetch_add(1, Ordering::SeqCst);
                }
                client.close().await;
            })
        };
        Pusher { stop, acked, task }
    }

    /// Stops pushing; returns how many pushes were acknowledged.
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        self.acked.load(Ordering::SeqCst)
    }
}

/// The error code and message `frame` is answered with.
async fn refusal(bad: &quinn::Connection, frame: &[u8]) -> (ErrorCode, String) {
    error_code(raw_request(bad, frame).await)
}

/// Oversized, announced by the prefix alone: refused before any body byte is read.
async fn announced_oversized_frame(bad: &quinn::Connection) {
    let mut prefix = Vec::new();
    prefix.extend_from_slice(&MAGIC.to_le_bytes());
    prefix.extend_from_slice(&16u32.to_le_bytes());
    prefix.extend_from_slice(&(64u32 << 20).to_le_bytes());
    let (code, msg) = refusal(bad, &prefix).await;
    assert_eq!(code, ErrorCode::FrameTooLarge, "{msg}");
    assert!(msg.contains("exceeds the cap of 1048576 bytes"), "{msg}");
}

/// Oversized and actually sent: 2 MiB of gradients.
async fn sent_oversized_frame(bad: &quinn::Connection) {
    let ids: Vec<u64> = (0..131_072).collect();
    let big = push_frame(&ids, DIM, &vec![1.0; ids.len() * DIM as usize], 1.0);
    let (code, msg) = refusal(bad, &big).await;
    assert_eq!(code, ErrorCode::FrameTooLarge, "{msg}");
}

/// A pull whose response would exceed the cap (80k rows x 16 bytes), though its request is small.
async fn pull_with_oversized_response(bad: &quinn::Connection) {
    let ids: Vec<u64> = (0..80_000).collect();
    let (code, msg) = refusal(bad, &pull_frame(TABLE, &ids, DIM)).await;
    assert_eq!(code, ErrorCode::FrameTooLarge, "{msg}");
    assert!(msg.contains("pull response of 1280000 bytes"), "{msg}");
}

/// Truncated: half a frame, or part of the prefix, then the stream is finished.
async fn truncated_frames(bad: &quinn::Connection) {
    let frame = push_frame(&[1, 2], DIM, &[1.0; 8], 1.0);
    for part in [&frame[..frame.len() / 2], &frame[..PREFIX_LEN - 3]] {
        let (code, msg) = refusal(bad, part).await;
        assert_eq!(code, ErrorCode::BadRequest, "{msg}");
        assert!(msg.contains("truncated frame"), "{msg}");
    }
}

/// Wrong protocol version: in the frame prefix, and in Hello; and a frame that is not ours at all.
async fn wrong_versions(bad: &quinn::Connection) {
    let mut v2 = push_frame(&[1], DIM, &[1.0; 4], 1.0);
    v2[..4].copy_from_slice(b"PS02");
    let (code, msg) = refusal(bad, &v2).await;
    assert_eq!(code, ErrorCode::UnsupportedVersion, "{msg}");
    assert!(msg.contains("\"02\""), "{msg}");
    let version = protocol::PROTOCOL_VERSION + 1;
    let hello = encode_frame(&Request::Hello { version }, &[]).unwrap();
    let (code, msg) = refusal(bad, &hello).await;
    assert_eq!(code, ErrorCode::UnsupportedVersion, "{msg}");
    assert!(
        msg.contains(&format!("protocol version {version}")),
        "{msg}"
    );
    let (code, msg) = refusal(bad, b"GET / HTTP/1.1\r\n\r\n").await;
    assert_eq!(code, ErrorCode::BadRequest, "{msg}");
    assert!(msg.contains("bad frame magic"), "{msg}");
}

/// Unknown table, wrong dimension.
async fn unknown_table_and_wrong_dimension(bad: &quinn::Connection) {
    let (code, msg) = refusal(bad, &pull_frame(99, &[1], DIM)).await;
    assert_eq!(code, ErrorCode::UnknownTable, "{msg}");
    assert!(msg.contains("unknown table 99"), "{msg}");
    let (code, msg) = refusal(bad, &push_frame(&[1], 8, &[1.0; 8], 1.0)).await;
    assert_eq!(code, ErrorCode::WrongDimension, "{msg}");
    assert!(msg.contains("request dim 8, table dim 4"), "{msg}");
}

/// NaN and infinite gradients: those rows are skipped (and counted), the finite row is applied. A non-finite
/// loss scale refuses the whole push.
async fn nonfinite_gradients(bad: &quinn::Connection, good: &PsClient) {
    let mut grads = vec![1.0; 12];
    grads[1] = f32::NAN;
    grads[6] = f32::INFINITY;
    let answer = raw_request(bad, &push_frame(&[20, 21, 22], DIM, &grads, 1.0)).await;
    assert!(
        matches!(
            answer,
            Ok((
                Response::Pushed {
                    rows: 1,
                    rejected_nonfinite: 2
                },
                _
            ))
        ),
        "{answer:?}"
    );
    let rows = pull_rows(good, &[20, 21, 22]).await;
    assert_eq!(rows, [[0.0; 4], [0.0; 4], [-1.0; 4]].concat());
    let (code, msg) = refusal(bad, &push_frame(&[20], DIM, &[1.0; 4], f32::NAN)).await;
    assert_eq!(code, ErrorCode::BadRequest, "{msg}");
    assert!(msg.contains("grad_scale = NaN"), "{msg}");
}

/// Duplicate ids in one push: refused whole (the sender must sum them), nothing applied.
async fn duplicate_ids(bad: &quinn::Connection, good: &PsClient) {
    let mut payload = Vec::new();
    protocol::wire::ids::put_ids(
        protocol::wire::ids::IdCoding::Plain,
        &[30, 30],
        &mut payload,
    );
    codec::encode(&[1.0; 8], Encoding::F32, &mut payload);
    let req = Request::Push {
        lr_scale: 1.0,
        epoch: 1,
        encoding: Encoding::F32,
        grad_scale: 1.0,
        tables: counts(2, DIM),
        id: protocol::wire::message::push::PushId::NONE,
    };
    let (code, msg) = refusal(bad, &encode_frame(&req, &payload).unwrap()).await;
    assert_eq!(code, ErrorCode::BadRequest, "{msg}");
    assert!(msg.contains("duplicate id 30"), "{msg}");
    assert_eq!(pull_rows(good, &[30]).await, [0.0; 4]);
}

/// Empty batches: no tables, or a table with zero ids.
async fn empty_batches(bad: &quinn::Connection) {
    let empty = Request::Push {
        lr_scale: 1.0,
        epoch: 1,
        encoding: Encoding::F32,
        grad_scale: 1.0,
        tables: vec![],
        id: protocol::wire::message::push::PushId::NONE,
    };
    let answer = raw_request(bad, &encode_frame(&empty, &[]).unwrap()).await;
    assert!(
        matches!(
            answer,
            Ok((
                Response::Pushed {
                    rows: 0,
                    rejected_nonfinite: 0
                },
                _
            ))
        ),
        "{answer:?}"
    );
    let answer = raw_request(bad, &push_frame(&[], DIM, &[], 1.0)).await;
    assert!(
        matches!(answer, Ok((Response::Pushed { rows: 0, .. }, _))),
        "{answer:?}"
    );
    let answer = raw_request(bad, &pull_frame(TABLE, &[], DIM)).await;
    match answer {
        Ok((Response::Pulled { .. }, rows)) => assert!(rows.is_empty()),
        other => panic!("{other:?}"),
    }
}

/// Random bytes, many streams at once on the bad connection.
async fn random_bytes(bad: &quinn::Connection) {
    let mut junk = Vec::new();
    for i in 0..64u64 {
        let bytes: Vec<u8> = (0..(i * 37 % 300))
            .map(|j| (protocol::routing::mix64(i * 1000 + j) & 0xff) as u8)
            .collect();
        junk.push(tokio::spawn({
            let bad = bad.clone();
            async move { raw_request(&bad, &bytes).await }
        }));
    }
    for j in junk {
        match j.await.unwrap() {
            Ok((Response::Error { code, .. }, _)) => assert_eq!(code, ErrorCode::BadRequest),
            other => panic!("junk answered {other:?}"),
        }
    }
}
