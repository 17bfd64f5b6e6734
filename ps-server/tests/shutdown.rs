//! Graceful shutdown against a real `ps-server` process: SIGTERM while 16 pushes are in flight loses no
//! acknowledged update. Pushers count acknowledgements; SGD with learning rate 1 on zero rows with gradient 1
//! makes each row minus the number of pushes applied, exactly. After the restart the rows must equal the
//! acknowledged count: fewer would be a lost update, more an applied push whose reply the shutdown discarded.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{counter_table, sigterm_and_wait, start};
use protocol::compression::codec;
use protocol::wire::layout::put_ids;
use protocol::{Encoding, PsClient, TableCount};

const TABLE: u32 = 7;
const DIM: u32 = 4;
const IDS: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

fn counts() -> Vec<TableCount> {
    vec![TableCount {
        table: TABLE,
        count: IDS.len() as u32,
        dim: DIM,
    }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_pushes_loses_no_acknowledged_update() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    // Periodic durability with a long interval: what survives is what the shutdown drains and writes back.
    let s = start(&data, &tls, &["--flush-interval-secs", "3600"]);
    let setup = common::client(&s, &tls).await;
    setup
        .register_tables(&[counter_table(TABLE, DIM)])
        .await
        .unwrap();
    setup.close().await;

    let mut payload = Vec::new();
    put_ids(&IDS, &mut payload);
    codec::encode(
        &[1.0; IDS.len() * DIM as usize],
        Encoding::F32,
        &mut payload,
    );
    let payload = bytes::Bytes::from(payload);
    let acked = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    // 4 clients (connections) x 4 loops each: 16 pushes in flight.
    for _ in 0..4 {
        let c = Arc::new(common::client_retrying_for(&s, &tls, Duration::ZERO).await);
        for _ in 0..4 {
            let (c, payload, acked, failed) =
                (c.clone(), payload.clone(), acked.clone(), failed.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    match c
                        .push(0, Encoding::F32, 1.0, counts(), payload.clone())
                        .await
                    {
                        Ok((rows, 0)) if rows == IDS.len() as u64 => {
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(other) => panic!("push answered {other:?}"),
                        // The server is going away: stop (nothing is retried, so nothing is applied twice).
                        Err(_) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            }));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while acked.load(Ordering::SeqCst) < 300 {
        assert!(Instant::now() < deadline, "pushes too slow");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let at_sigterm = acked.load(Ordering::SeqCst);
    tokio::task::spawn_blocking(move || sigterm_and_wait(s))
        .await
        .unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let (acked, failed) = (acked.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    assert_eq!(failed, 16, "every pusher ends with one failed push");
    eprintln!("acknowledged {acked} pushes ({at_sigterm} before SIGTERM), 16 failed");

    let s = start(&data, &tls, &[]);
    let c: PsClient = common::client(&s, &tls).await;
    let mut ids = Vec::new();
    put_ids(&IDS, &mut ids);
    let rows = c
        .pull(0, Encoding::F32, counts(), ids.into())
        .await
        .unwrap();
    let mut values = vec![0.0f32; IDS.len() * DIM as usize];
    codec::decode(&rows, Encoding::F32, &mut values).unwrap();
    let applied: Vec<f32> = values.iter().map(|v| -v).collect();
    assert_eq!(
        applied,
        vec![acked as f32; values.len()],
        "rows after restart do not equal the acknowledged pushes ({acked})"
    );
    c.close().await;
    sigterm_and_wait(s);
}
