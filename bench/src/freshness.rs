//! `freshness-probe`: how long a change acknowledged by a training server takes to be served (issue 21's
//! freshness figure). Each probe pushes a gradient to a row of its own (an id no data hashes to) through the
//! training cluster, notes the moment the push is acknowledged, then polls `ps-serve`'s
//! `GET /v1/embedding` until the served row differs from its value before the push. Probes start at random
//! phases of the servers' sync interval; run it while a trainer trains for the figure "under training load".

use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use protocol::compression::codec;
use protocol::{Encoding, PsClient, PsClientConfig, TableCount};

use crate::load::stats::Latencies;
use crate::serve_load::client::{Connection, Endpoint};

/// The flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "freshness-probe",
    about = "Push-acknowledged to served latency of delta sync"
)]
pub struct ProbeArgs {
    /// Training servers, `host:port` in shard order, comma separated; the replicas of one shard separated by
    /// `/` (docs/replication.md).
    #[arg(long, value_delimiter = ',', required = true)]
    pub ps: Vec<protocol::cluster::ShardAddrs>,
    /// TLS directory with the cluster's client certificate.
    #[arg(long)]
    pub tls_dir: std::path::PathBuf,
    /// The serving process, `http://host:port`.
    #[arg(long, default_value = "http://127.0.0.1:8500")]
    pub serve: String,
    /// The table probed (it must exist on the servers: a trainer registered it).
    #[arg(long, default_value_t = 0)]
    pub table: u32,
    /// Its row dimension.
    #[arg(long, default_value_t = 16)]
    pub dim: usize,
    /// Probes.
    #[arg(long, default_value_t = 50)]
    pub probes: usize,
    /// Longest random pause between probes, ms (spreads them over the sync interval's phases).
    #[arg(long, default_value_t = 2000)]
    pub max_gap_ms: u64,
    /// Give up on a probe after this many seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
}

/// Runs the probes; returns one summary line.
pub async fn run(args: &ProbeArgs) -> anyhow::Result<String> {
    let shards = protocol::cluster::shards(&args.ps);
    let client = PsClient::connect(PsClientConfig::replicated(shards, args.tls_dir.clone()))
        .await
        .context("connect to the training servers")?;
    let endpoint = Endpoint::parse(&args.serve)?;
    let addr = endpoint.resolve().await?;
    let mut http = Connection::open(&endpoint, addr, Duration::from_secs(10)).await?;
    let mut lat = Latencies::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let base = 0xf2e5_0000_0000_0000u64 ^ (std::process::id() as u64) << 20;
    for k in 0..args.probes {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        tokio::time::sleep(Duration::from_millis(rng % args.max_gap_ms.max(1))).await;
        let id = base + k as u64;
        let route = format!("/v1/embedding?table={}&id={id}", args.table);
        let before = row(&mut http, &route).await?;
        let mut payload = Vec::new();
        protocol::wire::layout::put_ids(&[id], &mut payload);
        codec::encode_rows(
            &vec![0.5f32; args.dim],
            args.dim,
            Encoding::F32,
            &mut payload,
        );
        let server = client.shard_map().server_of(id) as usize;
        let counts = vec![TableCount {
            table: args.table,
            count: 1,
            dim: args.dim as u32,
        }];
        client
            .push(server, Encoding::F32, 1.0, counts, Bytes::from(payload))
            .await
            .with_context(|| format!("push probe {k}"))?;
        let acked = Instant::now();
        let deadline = acked + Duration::from_secs(args.timeout_secs);
        loop {
            if row(&mut http, &route).await? != before {
                lat.record(acked.elapsed());
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "probe {k} (table {}, id {id}) not served after {} s",
                args.table,
                args.timeout_secs
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let s = lat.summary();
    Ok(format!(
        "freshness-probe probes={} p50_ms={:.1} p90_ms={:.1} p99_ms={:.1} max_ms={:.1} mean_ms={:.1}",
        s.count(),
        s.ms(0.5),
        s.ms(0.9),
        s.ms(0.99),
        s.ms(1.0),
        s.mean_ms()
    ))
}

/// The served row at `route`, as JSON text of its values.
async fn row(http: &mut Connection, route: &str) -> anyhow::Result<String> {
    let (status, body) = http.get(route).await?;
    let text = String::from_utf8_lossy(&body).into_owned();
    anyhow::ensure!(status == 200, "GET {route}: {status} {text}");
    let v: serde_json::Value = serde_json::from_str(&text).context("answer of /v1/embedding")?;
    Ok(v["row"].to_string())
}
