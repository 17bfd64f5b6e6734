//! Issue 39 regression tests, one per item of the issue, against real `ps-server` processes on loopback with
//! certificates like production's: a CA, a server certificate naming only the production names (no
//! `localhost`, no `127.0.0.1`), and one client certificate per role (`protocol::auth`).
//!
//! 1. `prod_overlay_replicates_with_production_certificates`: the prod overlay's rendered configuration
//!    replicates (it once dropped `replica-server-name`, and every replica-to-replica TLS connection failed).
//! 2. `every_request_is_authorized_by_the_role_of_its_certificate`.
//! 3. `one_message_cannot_disable_a_shard`: joins with absurd epochs, a replicate stream nobody joined.
//! 4. `rows_and_dense_parameters_are_written_only_through_the_protocol`: moved rows without a reshard, a
//!    dense version that would pin serving.
//!
//! And the start-up rule that replaces a timer's promotion: `a_replica_that_cannot_verify_its_peers_is_loud_and_never_primary`.
//!
//! No test sleeps in place of a condition: every wait polls a metric, a log line or an answer until a deadline
//! far above what any machine needs, and fails naming what it waited for.

mod support;

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use local_cluster::{free_ports, http_get, metric};
use protocol::transport::tls;
use protocol::wire::layout::put_ids;
use protocol::{
    Encoding, ErrorCode, PsClient, PsClientConfig, Request, Response, Role, TableConfig, TableCount,
};
use support::wait_for;

/// The names production's server certificate carries (k8s/overlays/prod/certificates.yaml): the name
/// clients dial (`ps`) and the pods' names, never `localhost`.
fn prod_names() -> Vec<String> {
    [
        "ps",
        "*.ps",
        "*.ps.pstrain.svc",
        "*.ps.pstrain.svc.cluster.local",
    ]
    .map(String::from)
    .to_vec()
}

/// The TLS name clients and peers verify.
const SERVER_NAME: &str = "ps";

/// A TLS directory like production's: a CA, a server certificate naming `names` only, and a client
/// certificate per role.
fn prod_like_tls(dir: &Path, names: &[String]) {
    tls::init_certs(dir, names).unwrap();
    let server = tls::certificate_names(&dir.join(tls::files::SERVER_CERT)).unwrap();
    assert!(
        !server.iter().any(|n| n == "localhost" || n == "127.0.0.1"),
        "{server:?}"
    );
}

/// One `ps-server` process, killed when dropped.
struct Server {
    child: Child,
    quic: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Server {
    /// Starts `ps-server` with `args` plus its listen, metrics, data and TLS flags; output to `dir/<name>.log`.
    fn start(dir: &Path, name: &str, ports: (u16, u16), tls: &Path, args: &[String]) -> Server {
        let (quic, metrics): (SocketAddr, SocketAddr) = (
            format!("127.0.0.1:{}", ports.0).parse().unwrap(),
            format!("127.0.0.1:{}", ports.1).parse().unwrap(),
        );
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bench::bins::path("ps-server"))
            .args(args)
            .arg("--listen")
            .arg(quic.to_string())
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            .arg("--data-dir")
            .arg(dir.join(name))
            .arg("--tls-dir")
            .arg(tls)
            .arg("--checkpoint-root")
            .arg(dir.join("checkpoints"))
            .env("RUST_LOG", "info")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Server {
            child,
            quic,
            metrics,
            log,
        }
    }

    /// The value of sample `name` (labels included) on its metrics page, if it serves one yet.
    fn metric(&self, name: &str) -> Option<f64> {
        http_get(self.metrics, "/metrics")
            .ok()
            .and_then(|page| metric(&page, name))
    }

    fn log_text(&self) -> String {
        let mut s = String::new();
        std::fs::File::open(&self.log)
            .and_then(|mut f| f.read_to_string(&mut s))
            .ok();
        s
    }

    /// Waits until its log has the ready line.
    fn await_ready(&self) {
        wait_for(
            "the ready line",
            || self.log_text().contains("ps-server ready"),
            || self.log_text(),
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--replicas` and `--replica-index` of replica `r` of a shard on `ports`.
fn replica_args(ports: &[u16], r: usize) -> Vec<String> {
    let list: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    vec![
        "--replicas".into(),
        list.join(","),
        "--replica-index".into(),
        r.to_string(),
    ]
}

/// Sends `req` to `addr` as `role` ([`support::call_as`]), dialing `ps`.
async fn call_as(
    addr: SocketAddr,
    tls_dir: &Path,
    role: Role,
    req: &Request,
    payload: Vec<u8>,
) -> Response {
    support::call_as(addr, tls_dir, SERVER_NAME, role, req, payload).await
}

/// The typed error of `resp` (panics on anything else).
fn error(resp: Response) -> (ErrorCode, String) {
    match resp {
        Response::Error { code, message } => (code, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// A trainer-role client of the servers at `shards` (replicas of a shard in order), dialing `ps`.
async fn trainer(shards: Vec<Vec<SocketAddr>>, tls_dir: &Path) -> PsClient {
    let mut cfg = PsClientConfig::replicated(shards, tls_dir.to_owned());
    cfg.server_name = SERVER_NAME.into();
    cfg.retry_for = Duration::from_secs(30);
    let client = PsClient::connect(cfg).await.unwrap();
    client.register_tables(&[table()]).await.unwrap();
    client
}

/// The counter table: SGD at rate 1 from zero rows, so rows count what was pushed.
fn table() -> TableConfig {
    TableConfig::counter(1, 2)
}

/// A pull or push payload of `ids` (ascending), and its table counts.
fn ids_payload(ids: &[u64]) -> (Vec<TableCount>, Vec<u8>) {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    (
        vec![TableCount {
            table: 1,
            count: ids.len() as u32,
            dim: 2,
        }],
        payload,
    )
}

/// Pushes `-1` to every element of `ids`' rows (each row counts +1) through `client`.
async fn bump(client: &PsClient, ids: &[u64]) {
    let (counts, mut payload) = ids_payload(ids);
    protocol::compression::codec::encode(&vec![-1.0; ids.len() * 2], Encoding::F32, &mut payload);
    client
        .push(0, Encoding::F32, 1.0, counts, payload.into())
        .await
        .unwrap();
}

/// The rows of `ids` as `client` pulls them.
async fn rows(client: &PsClient, ids: &[u64]) -> Vec<f32> {
    let (counts, payload) = ids_payload(ids);
    let bytes = client
        .pull(0, Encoding::F32, counts, payload.into())
        .await
        .unwrap();
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// One JSON object per rendered Kubernetes object of `overlay` (`kubectl kustomize`, then `kubectl label
/// --local -o json`, which converts without a cluster).
fn render(overlay: &str) -> Vec<serde_json::Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../k8s/overlays")
        .join(overlay);
    let yaml = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect(
        "kubectl (with its built-in kustomize) renders the overlays: install it (scripts/k8s/validate.sh)",
    );
    assert!(
        yaml.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&yaml.stderr)
    );
    let mut json = Command::new("kubectl")
        .args(["label", "--local", "-f", "-", "rendered=1", "-o", "json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    json.stdin.take().unwrap().write_all(&yaml.stdout).unwrap();
    let out = json.wait_with_output().unwrap();
    assert!(out.status.success(), "kubectl label --local -o json");
    serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<serde_json::Value>()
        .map(Result::unwrap)
        .collect()
}

/// The rendered object of `kind` named `name`.
fn object<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// Issue 39, item 1: the prod overlay's configuration, as kustomize renders it, with the prod server
/// certificate's names: the replicas of a shard verify each other and replicate. (The overlay once replaced
/// the base file and lost `replica-server-name`: the replicas verified `localhost`, every TLS connection
/// between them failed, and after 30 s each made itself primary.)
#[test]
fn prod_overlay_replicates_with_production_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let docs = render("prod");
    let config = &object(&docs, "ConfigMap", "pstrain-config")["data"];
    let sts = object(&docs, "StatefulSet", "ps-0");
    let args: Vec<String> = sts["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    // Every --config file the pods read, from the ConfigMap, in the pods' order.
    let mut flags = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if a == "--config" {
            let name = Path::new(&args[i + 1])
                .file_name()
                .unwrap()
                .to_str()
                .unwrap();
            let text = config[name]
                .as_str()
                .unwrap_or_else(|| panic!("the pods read --config {name}, the ConfigMap lacks it"));
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            flags.extend(["--config".to_owned(), path.display().to_string()]);
        }
    }
    assert!(flags.len() >= 2, "no --config in {args:?}");
    let names: Vec<String> = object(&docs, "Certificate", "pstrain-ps-tls")["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect();
    let tls_dir = dir.path().join("tls");
    prod_like_tls(&tls_dir, &names);
    // Two replicas of shard 0 of a one-shard cluster (the file's own shard count is prod's).
    let ports = free_ports(4).unwrap();
    let servers: Vec<Server> = (0..2)
        .map(|r| {
            let mut a = flags.clone();
            a.extend(["--num-shards", "1", "--shard-index", "0"].map(String::from));
            a.extend(replica_args(&ports[..2], r));
            Server::start(
                dir.path(),
                &format!("ps-0-{r}"),
                (ports[r], ports[2 + r]),
                &tls_dir,
                &a,
            )
        })
        .collect();
    let diagnose = || {
        servers
            .iter()
            .map(|s| s.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    // One primary, one backup in sync with it.
    let roles = || {
        servers
            .iter()
            .map(|s| {
                (
                    s.metric("ps_replica_primary"),
                    s.metric("ps_replica_in_sync"),
                )
            })
            .collect::<Vec<_>>()
    };
    wait_for(
        "a primary and an in-sync backup",
        || {
            let r = roles();
            r.contains(&(Some(1.0), Some(1.0))) && r.contains(&(Some(0.0), Some(1.0)))
        },
        diagnose,
    );
    let primary = servers
        .iter()
        .position(|s| s.metric("ps_replica_primary") == Some(1.0))
        .unwrap();
    let backup = &servers[1 - primary];
    // A push is acknowledged (replicated durability: once the backup holds it) and the backup stored it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = trainer(vec![vec![servers[0].quic, servers[1].quic]], &tls_dir).await;
        bump(&client, &[1, 2, 3]).await;
        assert_eq!(rows(&client, &[1, 2, 3]).await, [1.0; 6]);
        client.close().await;
    });
    wait_for(
        "the backup to store the push",
        || {
            backup
                .metric("ps_replication_rows_stored_total")
                .unwrap_or(0.0)
                >= 3.0
        },
        diagnose,
    );
    for s in &servers {
        assert!(
            !s.log_text().contains("TLS with a peer server failed"),
            "{}",
            s.log_text()
        );
    }
}

/// The start-up rule (issue 39, "no silent second primary"): two replicas that cannot verify each other's
/// certificate (they check a name the certificate lacks) never make themselves primary. Each says so at
/// error level naming the name it expected and the names the certificate carries, and exports it; after the
/// start-up wait each reports it cannot elect a primary; pushes are refused. An operator's forced promotion
/// (admin certificate) makes one the primary; the other stays out.
#[test]
fn a_replica_that_cannot_verify_its_peers_is_loud_and_never_primary() {
    let dir = tempfile::tempdir().unwrap();
    let tls_dir = dir.path().join("tls");
    prod_like_tls(&tls_dir, &prod_names());
    let ports = free_ports(4).unwrap();
    let servers: Vec<Server> = (0..2)
        .map(|r| {
            let mut a: Vec<String> = [
                "--durability",
                "replicated",
                "--replica-server-name",
                "ps-peers.example",
                "--replica-startup-wait-secs",
                "1",
            ]
            .map(String::from)
            .to_vec();
            a.extend(replica_args(&ports[..2], r));
            Server::start(
                dir.path(),
                &format!("ps-0-{r}"),
                (ports[r], ports[2 + r]),
                &tls_dir,
                &a,
            )
        })
        .collect();
    let diagnose = || {
        servers
            .iter()
            .map(|s| s.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    for (r, s) in servers.iter().enumerate() {
        let peer = format!("ps_peer_tls_failing{{peer=\"{}\"}}", 1 - r);
        wait_for(
            "the peer TLS failure gauge",
            || s.metric(&peer) == Some(1.0),
            diagnose,
        );
        wait_for(
            "the blocked start-up gauge",
            || s.metric("ps_replica_startup_blocked") == Some(1.0),
            diagnose,
        );
        let log = s.log_text();
        let failure = log
            .lines()
            .find(|l| l.contains("TLS with a peer server failed"))
            .unwrap_or_else(|| panic!("no error line: {log}"));
        assert!(failure.contains("ERROR"), "{failure}");
        assert!(failure.contains("ps-peers.example"), "{failure}");
        // rustls names what the certificate carries.
        assert!(failure.contains("DnsName(\"ps\")"), "{failure}");
        assert!(
            log.contains("too few replicas answer to elect one"),
            "{log}"
        );
        assert_eq!(s.metric("ps_replica_primary"), Some(0.0), "{log}");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // No primary: a push is refused, not acknowledged by a second primary.
        let mut cfg = PsClientConfig::new(vec![servers[0].quic], tls_dir.clone());
        cfg.server_name = SERVER_NAME.into();
        cfg.retry_for = Duration::ZERO;
        match PsClient::connect(cfg).await {
            Err(e) => assert!(
                e.to_string().contains("not the primary") || e.to_string().contains("starting"),
                "{e}"
            ),
            Ok(c) => {
                let err = c.register_tables(&[table()]).await.unwrap_err().to_string();
                assert!(
                    err.contains("NotPrimary") || err.contains("starting"),
                    "{err}"
                );
            }
        }
        // A trainer may not force a cold start; an operator may.
        let force = Request::Promote {
            shard_epoch: 0,
            force: true,
        };
        let (code, message) =
            error(call_as(servers[0].quic, &tls_dir, Role::Trainer, &force, Vec::new()).await);
        assert_eq!(code, ErrorCode::Forbidden, "{message}");
    });
    let out = bench::bins::command("ps-server")
        .args(["promote", "--force", "--server-name", SERVER_NAME, "--ps"])
        .arg(servers[0].quic.to_string())
        .arg("--tls-dir")
        .arg(&tls_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ps-server promote: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("is the primary"));
    wait_for(
        "the forced primary",
        || servers[0].metric("ps_replica_primary") == Some(1.0),
        diagnose,
    );
    assert_eq!(servers[1].metric("ps_replica_primary"), Some(0.0));
    servers[0].await_ready();
}

/// Issue 39, item 2: every request is authorized by the role its certificate names; a refusal is typed
/// (`Forbidden`), names the role and the request, is counted by role and kind, and changes nothing.
#[test]
fn every_request_is_authorized_by_the_role_of_its_certificate() {
    use protocol::wire::message::replicate::ReplicateHeader;
    use protocol::wire::message::reshard::{MoveHeader, ReshardStep};
    let dir = tempfile::tempdir().unwrap();
    let tls_dir = dir.path().join("tls");
    prod_like_tls(&tls_dir, &prod_names());
    let ports = free_ports(2).unwrap();
    let server = Server::start(dir.path(), "ps-0", (ports[0], ports[1]), &tls_dir, &[]);
    server.await_ready();
    let addr = server.quic;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = trainer(vec![vec![addr]], &tls_dir).await;
        bump(&client, &[7]).await;
        let (counts, ids) = ids_payload(&[7]);
        let pull = protocol::wire::message::pull::request(1, Encoding::F32, counts.clone());
        let replicate = Request::Replicate {
            header: ReplicateHeader {
                shard_epoch: 1,
                session: 1,
                seq: 1,
                messages: 1,
                kind: protocol::wire::message::replicate::ReplicateKind::Stream,
                new_tables: Vec::new(),
                tables: Vec::new(),
                pushes: Vec::new(),
            },
        };
        let move_rows = Request::MoveRows {
            header: MoveHeader {
                target_epoch: 2,
                source: 1,
                seq: 1,
                messages: 1,
                new_tables: Vec::new(),
                tables: Vec::new(),
            },
        };
        let join = Request::Join {
            shard_epoch: 1,
            replica_index: 1,
            session: 9,
        };
        let sync = protocol::wire::message::sync::request(
            protocol::wire::message::sync::SyncCursor::START,
            Encoding::F32,
            16,
            0,
            0,
        );
        let reshard = Request::Reshard {
            step: ReshardStep::Status,
        };
        let register = Request::RegisterTables {
            tables: vec![table()],
        };
        let mut push_payload = ids.clone();
        protocol::compression::codec::encode(&[5.0, 5.0], Encoding::F32, &mut push_payload);
        let push = Request::Push {
            lr_scale: 1.0,
            epoch: 1,
            encoding: Encoding::F32,
            grad_scale: 1.0,
            tables: counts.clone(),
            id: protocol::wire::message::push::PushId::NONE,
        };
        // (role, request, payload, forbidden?)
        let cases: Vec<(Role, &Request, &[u8], bool)> = vec![
            (Role::Trainer, &join, &[], true),
            (Role::Trainer, &replicate, &[], true),
            (Role::Trainer, &move_rows, &[], true),
            (Role::Trainer, &reshard, &[], true),
            (Role::Trainer, &sync, &[], true),
            (Role::Serving, &push, &push_payload, true),
            (Role::Serving, &register, &[], true),
            (Role::Serving, &sync, &[], false),
            (Role::Serving, &pull, &ids, false),
            (Role::Peer, &push, &push_payload, true),
            (Role::Peer, &pull, &ids, true),
            (Role::Peer, &reshard, &[], true),
            (Role::Admin, &push, &push_payload, true),
            (Role::Admin, &join, &[], true),
            (Role::Admin, &reshard, &[], false),
            (Role::Admin, &pull, &ids, false),
        ];
        for (role, req, payload, forbidden) in cases {
            let resp = call_as(addr, &tls_dir, role, req, payload.to_vec()).await;
            match (&resp, forbidden) {
                (Response::Error { code, message }, true) => {
                    assert_eq!(*code, ErrorCode::Forbidden, "{role} {req:?}: {message}");
                    assert!(
                        message.contains(&format!("role {role}"))
                            && message.contains(req.kind().name()),
                        "{message}"
                    );
                }
                (Response::Error { code, message }, false) => {
                    assert_ne!(*code, ErrorCode::Forbidden, "{role} {req:?}: {message}")
                }
                (_, true) => panic!("{role} sent {req:?} and got {resp:?}"),
                (_, false) => {}
            }
        }
        // Nothing the refused pushes carried was applied.
        assert_eq!(rows(&client, &[7]).await, [1.0, 1.0]);
        // Checkpoints go under the root only, whoever asks.
        let outside = Request::Checkpoint {
            dir: dir.path().join("elsewhere").display().to_string(),
            step: 1,
            tensors: false,
            prune: None,
        };
        let (code, message) =
            error(call_as(addr, &tls_dir, Role::Admin, &outside, Vec::new()).await);
        assert_eq!(code, ErrorCode::BadRequest);
        assert!(message.contains("checkpoint root"), "{message}");
        assert!(!dir.path().join("elsewhere").exists());
        let named = Request::Checkpoint {
            dir: "job-1/step-1".into(),
            step: 1,
            tensors: true,
            prune: None,
        };
        match call_as(addr, &tls_dir, Role::Trainer, &named, Vec::new()).await {
            Response::Checkpointed { dir: written, .. } => {
                assert!(Path::new(&written).starts_with(dir.path().join("checkpoints")))
            }
            other => panic!("{other:?}"),
        }
        client.close().await;
    });
    assert!(
        server
            .metric("ps_requests_forbidden_total{role=\"trainer\",kind=\"join\"}")
            .unwrap_or(0.0)
            >= 1.0
    );
    assert!(
        server
            .metric("ps_requests_forbidden_total{role=\"serving\",kind=\"push\"}")
            .unwrap_or(0.0)
            >= 1.0
    );
}

/// Issue 39, item 3: a join claiming an absurd shard epoch cannot make a primary step down (an unreplicated
/// shard took no request after it while `/readyz` said ready), a replicate stream nobody joined is refused,
/// and a trainer's certificate cannot send either.
#[test]
fn one_message_cannot_disable_a_shard() {
    use protocol::wire::message::replicate::{ReplicateHeader, ReplicateKind};
    let dir = tempfile::tempdir().unwrap();
    let tls_dir = dir.path().join("tls");
    prod_like_tls(&tls_dir, &prod_names());
    // An unreplicated server.
    let ports = free_ports(6).unwrap();
    let single = Server::start(dir.path(), "single", (ports[0], ports[1]), &tls_dir, &[]);
    // A replicated pair.
    let pair: Vec<Server> = (0..2)
        .map(|r| {
            let mut a: Vec<String> = ["--durability", "replicated", "--replica-server-name", "ps"]
                .map(String::from)
                .to_vec();
            a.extend(replica_args(&ports[2..4], r));
            Server::start(
                dir.path(),
                &format!("pair-{r}"),
                (ports[2 + r], ports[4 + r]),
                &tls_dir,
                &a,
            )
        })
        .collect();
    single.await_ready();
    let diagnose = || {
        pair.iter()
            .map(|s| s.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    wait_for(
        "the pair's primary and in-sync backup",
        || {
            pair.iter()
                .any(|s| s.metric("ps_replica_primary") == Some(1.0))
                && pair.iter().any(|s| {
                    s.metric("ps_replica_primary") == Some(0.0)
                        && s.metric("ps_replica_in_sync") == Some(1.0)
                })
        },
        diagnose,
    );
    let p = pair
        .iter()
        .position(|s| s.metric("ps_replica_primary") == Some(1.0))
        .unwrap();
    let (primary, backup) = (&pair[p], &pair[1 - p]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let join = |epoch, replica| Request::Join {
            shard_epoch: epoch,
            replica_index: replica,
            session: 9,
        };
        // The unreplicated server: a trainer may not join; a peer's join is refused, and it stays primary.
        let (code, _) = error(
            call_as(
                single.quic,
                &tls_dir,
                Role::Trainer,
                &join(u64::MAX, 1),
                Vec::new(),
            )
            .await,
        );
        assert_eq!(code, ErrorCode::Forbidden);
        let (code, message) = error(
            call_as(
                single.quic,
                &tls_dir,
                Role::Peer,
                &join(u64::MAX, 1),
                Vec::new(),
            )
            .await,
        );
        assert_eq!(code, ErrorCode::BadRequest);
        assert!(message.contains("not replicated"), "{message}");
        let client = trainer(vec![vec![single.quic]], &tls_dir).await;
        bump(&client, &[1]).await;
        assert_eq!(rows(&client, &[1]).await, [1.0, 1.0]);
        client.close().await;
        assert_eq!(single.metric("ps_replica_primary"), Some(1.0));
        // The pair's primary: an epoch no failover can reach is refused, and it stays primary.
        let other = (1 - p) as u32;
        let (code, message) = error(
            call_as(
                primary.quic,
                &tls_dir,
                Role::Peer,
                &join(u64::MAX, other),
                Vec::new(),
            )
            .await,
        );
        assert_eq!(code, ErrorCode::BadRequest, "{message}");
        assert!(message.contains("shard epoch"), "{message}");
        // The backup: a replicate stream of a session it did not join is refused, its rows unchanged.
        let header = ReplicateHeader {
            shard_epoch: u64::MAX,
            session: 0,
            seq: 1,
            messages: 1,
            kind: ReplicateKind::CaughtUp,
            new_tables: Vec::new(),
            tables: vec![protocol::wire::message::replicate::RowsTable {
                table: 1,
                count: 1,
                row_len: 2,
            }],
            pushes: Vec::new(),
        };
        let mut payload = Vec::new();
        protocol::wire::message::replicate::put_rows(&[1], &[f32::NAN, f32::NAN], &mut payload);
        let (code, message) = error(
            call_as(
                backup.quic,
                &tls_dir,
                Role::Peer,
                &Request::Replicate { header },
                payload,
            )
            .await,
        );
        assert_eq!(code, ErrorCode::BadRequest, "{message}");
        // A trainer's promotion of a backup that hears its primary is refused.
        let promote = Request::Promote {
            shard_epoch: 0,
            force: false,
        };
        let (code, message) =
            error(call_as(backup.quic, &tls_dir, Role::Trainer, &promote, Vec::new()).await);
        assert_eq!(code, ErrorCode::NotInSync, "{message}");
        // Still one primary at its epoch, taking pushes; the backup still in sync.
        let client = trainer(vec![vec![pair[0].quic, pair[1].quic]], &tls_dir).await;
        bump(&client, &[1]).await;
        assert_eq!(rows(&client, &[1]).await, [1.0, 1.0]);
        client.close().await;
    });
    assert_eq!(primary.metric("ps_replica_primary"), Some(1.0));
    assert_eq!(backup.metric("ps_replica_in_sync"), Some(1.0));
    assert_eq!(
        primary.metric("ps_shard_epoch"),
        backup.metric("ps_shard_epoch")
    );
    assert!(http_get(single.metrics, "/readyz").is_ok());
}

/// Issue 39, item 4: rows move only during a prepared reshard and from its sources (a `MoveRows` without one
/// once overwrote whole rows, leaving NaN), and a dense version cannot be pinned past later publications
/// (`u64::MAX` once hid every later publication of the trainer from serving).
#[test]
fn rows_and_dense_parameters_are_written_only_through_the_protocol() {
    use protocol::wire::message::replicate::RowsTable;
    use protocol::wire::message::reshard::MoveHeader;
    let dir = tempfile::tempdir().unwrap();
    let tls_dir = dir.path().join("tls");
    prod_like_tls(&tls_dir, &prod_names());
    let ports = free_ports(2).unwrap();
    let server = Server::start(dir.path(), "ps-0", (ports[0], ports[1]), &tls_dir, &[]);
    server.await_ready();
    let addr = server.quic;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = trainer(vec![vec![addr]], &tls_dir).await;
        bump(&client, &[5]).await;
        let mut payload = Vec::new();
        protocol::wire::message::replicate::put_rows(&[5], &[f32::NAN, f32::NAN], &mut payload);
        for (epoch, source) in [(1, 1), (2, 1), (u64::MAX, 0)] {
            let move_rows = Request::MoveRows {
                header: MoveHeader {
                    target_epoch: epoch,
                    source,
                    seq: 1,
                    messages: 1,
                    new_tables: Vec::new(),
                    tables: vec![RowsTable {
                        table: 1,
                        count: 1,
                        row_len: 2,
                    }],
                },
            };
            let (code, message) =
                error(call_as(addr, &tls_dir, Role::Peer, &move_rows, payload.clone()).await);
            assert_eq!(code, ErrorCode::WrongEpoch, "{message}");
            assert!(message.contains("no reshard is prepared"), "{message}");
        }
        assert_eq!(rows(&client, &[5]).await, [1.0, 1.0]);
        // Dense versions: u64::MAX is refused; the trainer's next publication is what serving sees.
        let mut dense = Vec::new();
        protocol::wire::message::sync::put_dense(&[9.0, 9.0], &mut dense);
        let pin = protocol::wire::message::sync::publish_request(1, u64::MAX, 1, 2);
        let (code, message) = error(call_as(addr, &tls_dir, Role::Trainer, &pin, dense).await);
        assert_eq!(code, ErrorCode::BadRequest);
        assert!(
            message.contains("ahead of this server's clock"),
            "{message}"
        );
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        let held = client.publish_dense(now_us, 3, &[1.0, 2.0]).await.unwrap();
        assert_eq!(held, now_us);
        let mut serving = PsClientConfig::new(vec![addr], tls_dir.clone());
        serving.server_name = SERVER_NAME.into();
        serving.role = Role::Serving;
        let serving = PsClient::connect(serving).await.unwrap();
        let batch = serving
            .sync_deltas(
                0,
                protocol::wire::message::sync::SyncCursor::START,
                Encoding::F32,
                16,
                0,
                0,
            )
            .await
            .unwrap();
        assert_eq!(batch.dense.as_deref(), Some(&[1.0f32, 2.0][..]));
        assert_eq!(batch.header.dense.unwrap().version, now_us);
        serving.close().await;
        client.close().await;
    });
}
