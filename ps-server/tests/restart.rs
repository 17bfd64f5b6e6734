//! Real processes on loopback: rows survive SIGTERM and restart bit for bit; oversized frames are refused with a
//! typed error; /metrics, /healthz and /readyz answer.
mod common;

use std::time::Duration;

use common::{
    client, dirs_with_foreign_client, http_get, pull, push, sigterm_and_wait, start, table,
};
use protocol::wire::layout::put_ids;
use protocol::{Encoding, ErrorCode, ProtocolError, PsClient, PsClientConfig, TableCount};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_survive_sigterm_and_restart_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    // A long flush interval: only the shutdown write-back can have saved the rows.
    let s = start(&data, &tls, &["--flush-interval-secs", "3600"]);
    let c = client(&s, &tls).await;
    c.register_tables(&[table()]).await.unwrap();
    let ids: Vec<u64> = (0..500).map(|i| i * 1_000_003).collect();
    let grads: Vec<f32> = (0..ids.len() * 8)
        .map(|i| ((i % 17) as f32 - 8.0) * 0.37)
        .collect();
    assert_eq!(push(&c, &ids, &grads).await, (500, 0));
    let before = pull(&c, &ids).await.unwrap();

    assert!(http_get(s.metrics, "/healthz").starts_with("HTTP/1.0 200"));
    assert!(http_get(s.metrics, "/readyz").starts_with("HTTP/1.0 200"));
    let metrics = http_get(s.metrics, "/metrics");
    assert!(metrics.contains("ps_rows_pushed_total 500"), "{metrics}");
    assert!(
        metrics.contains("# HELP ps_rows_pushed_total"),
        "no HELP text: {metrics}"
    );
    assert!(
        metrics.contains("ps_request_duration_seconds_bucket"),
        "{metrics}"
    );

    c.close().await;
    sigterm_and_wait(s);

    let s = start(&data, &tls, &[]);
    let c = client(&s, &tls).await;
    assert_eq!(c.known_tables(), &[table()], "table config recovered");
    let after = pull(&c, &ids).await.unwrap();
    assert_eq!(before, after, "rows differ after restart");
    // A never-pushed id reads as the initializer, identical across restarts too.
    let metrics = http_get(s.metrics, "/metrics");
    assert!(metrics.contains("ps_rows_recovered_total 500"), "{metrics}");
    assert!(
        metrics.contains("ps_rows_on_disk{table=\"C3\"} 500"),
        "{metrics}"
    );
    c.close().await;
    sigterm_and_wait(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_and_unknown_table_get_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let s = start(&data, &tls, &["--max-frame-bytes", "4096"]);
    let c = client(&s, &tls).await;
    c.register_tables(&[table()]).await.unwrap();
    let ids: Vec<u64> = (0..1000).map(|i| i << 40).collect(); // 6 varint bytes each
    match pull(&c, &ids).await {
        Err(ProtocolError::Remote {
            code: ErrorCode::FrameTooLarge,
            message,
            ..
        }) => {
            assert!(
                message.contains("exceeds the cap of 4096 bytes"),
                "{message}"
            )
        }
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }
    // The connection is still usable afterwards.
    assert_eq!(pull(&c, &[1, 2]).await.unwrap().len(), 2 * 8 * 4);
    let mut payload = Vec::new();
    put_ids(&[1], &mut payload);
    let t = vec![TableCount {
        table: 77,
        count: 1,
        dim: 8,
    }];
    match c.pull(0, Encoding::F16, t, payload.into()).await {
        Err(ProtocolError::Remote {
            code: ErrorCode::UnknownTable,
            message,
            ..
        }) => {
            assert!(message.contains("unknown table 77"), "{message}")
        }
        other => panic!("expected UnknownTable, got {other:?}"),
    }
    c.close().await;
    sigterm_and_wait(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_with_a_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // The foreign client trusts the cluster CA (so it accepts the server) but presents a certificate signed by
    // its own CA, which the server must refuse.
    let (data, tls, foreign) = dirs_with_foreign_client(dir.path());
    let s = start(&data, &tls, &[]);
    let mut cfg = PsClientConfig::new(vec![s.quic], foreign);
    cfg.retry_for = Duration::from_millis(500);
    cfg.request_timeout = Duration::from_secs(5);
    let err = PsClient::connect(cfg)
        .await
        .err()
        .expect("a client with a foreign certificate was served");
    let msg = err.to_string();
    assert!(msg.contains("invalid peer certificate"), "{msg}");
    // The legitimate client is still served.
    let c = client(&s, &tls).await;
    c.close().await;
    sigterm_and_wait(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_dev_accepts_a_client_the_cluster_ca_did_not_sign() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls, foreign) = dirs_with_foreign_client(dir.path());
    let s = start(&data, &tls, &["--insecure-dev"]);
    let c = PsClient::connect(PsClientConfig::new(vec![s.quic], foreign))
        .await
        .expect("--insecure-dev must accept any client");
    c.register_tables(&[table()]).await.unwrap();
    assert_eq!(pull(&c, &[1]).await.unwrap().len(), 8 * 4);
    c.close().await;
    sigterm_and_wait(s);
}
