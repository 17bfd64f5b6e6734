//! Local parameter-server processes on loopback, for the demo, load generators, the Python package and
//! end-to-end tests; the one launcher, in a crate of its own: `ops` holds no domain logic, and the Python
//! wheel links this without `ops`'s HTTP server and Prometheus exporter.
//!
//! Each server is a real `ps-server` process ([`ps_server_binary`], or whatever command the caller gives)
//! with its own RocksDB directory, free ports (port 0, read back from the server's
//! "ps-server ready quic=.. metrics=.." line) and logs in `<run-dir>/ps-<i>.log`; the dev CA and certificates
//! come from the binary's own `certs init`. [`LocalCluster::shutdown`] sends SIGTERM and checks that every
//! server exits cleanly; dropping the cluster kills what is left. This crate starts the binary: it does not
//! link the server, so a trainer using it carries no server code and no RocksDB.
//!
//! [`LocalCluster::start_replicated`] starts R replicas of every shard (docs/replication.md): their listen
//! ports are picked before the start (each replica is told every replica's address with `--replicas`), data
//! directories `<run-dir>/ps-<shard>-r<replica>`, logs `<run-dir>/ps-<shard>-r<replica>.log`. One replica can
//! be SIGKILLed ([`LocalCluster::kill_replica`]) and restarted on the same port and data directory
//! ([`LocalCluster::restart_replica`]); [`LocalCluster::primary_of`] asks the replicas' metrics which one is
//! primary.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Environment variable naming the `ps-server` binary to start; unset, [`ps_server_binary`] looks beside
/// the running executable.
pub const PS_SERVER_ENV: &str = "PSTRAIN_PS_SERVER";

/// The `ps-server` binary: [`PS_SERVER_ENV`] if set, else `ps-server` in the running executable's directory
/// or its parent (a test binary runs from `target/<profile>/deps/`, the binaries sit in `target/<profile>/`).
pub fn ps_server_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(PS_SERVER_ENV) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{PS_SERVER_ENV}={} is not a file", path.display());
        }
        return Ok(path);
    }
    let exe = std::env::current_exe().context("locate the running binary")?;
    let dir = exe
        .parent()
        .context("the running binary has no directory")?;
    let candidates = [Some(dir), dir.parent()];
    for dir in candidates.into_iter().flatten() {
        let path = dir.join("ps-server");
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!(
        "ps-server binary not found beside {}: build it with `cargo build --release -p ps-server` (or \
         `cargo build --release --workspace --bins`), or name it in {PS_SERVER_ENV}",
        exe.display()
    )
}

/// How long a server has to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Lines of a failed server's log an error quotes.
const LOG_TAIL_LINES: usize = 15;

/// A running set of local servers.
pub struct LocalCluster {
    /// Every server process, shard-major (`shard * replicas_per_shard + replica`).
    servers: Vec<Server>,
    /// How to build the command of one server again (for [`LocalCluster::restart_replica`]).
    template: CommandTemplate,
    /// QUIC addresses, in shard order (with replicas: replica 0 of each shard).
    pub quic: Vec<SocketAddr>,
    /// Metrics (HTTP) addresses, in shard order (with replicas: replica 0 of each shard, as first started).
    pub metrics: Vec<SocketAddr>,
    /// QUIC addresses of every replica, `[shard][replica]` (one replica per shard unless started with
    /// [`LocalCluster::start_replicated`]); the `--ps` argument is [`LocalCluster::ps_arg`].
    pub replicas: Vec<Vec<SocketAddr>>,
    /// Metrics (HTTP) addresses of every replica, `[shard][replica]`, updated when a replica is restarted.
    pub replica_metrics: Vec<Vec<SocketAddr>>,
    /// TLS directory shared by servers and clients.
    pub tls_dir: PathBuf,
}

/// One server process and what it takes to start it again.
struct Server {
    /// `None` once killed and not restarted.
    child: Option<Child>,
    /// Every flag the server was started with.
    args: Vec<OsString>,
    log_path: PathBuf,
    name: String,
    /// The `role=` of its last ready line (`None`: the line had none, a server without replication).
    role: Option<String>,
}

/// What a caller's command builder gave: program, arguments, environment and directory, so the same command
/// can be built again after the builder is gone.
struct CommandTemplate {
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, Option<OsString>)>,
    cwd: Option<PathBuf>,
}

impl CommandTemplate {
    fn of(cmd: &Command) -> CommandTemplate {
        CommandTemplate {
            program: cmd.get_program().to_owned(),
            args: cmd.get_args().map(OsStr::to_owned).collect(),
            envs: cmd
                .get_envs()
                .map(|(k, v)| (k.to_owned(), v.map(OsStr::to_owned)))
                .collect(),
            cwd: cmd.get_current_dir().map(Path::to_owned),
        }
    }

    fn build(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, v) in &self.envs {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        cmd
    }
}

/// What a server's ready line says.
struct Ready {
    quic: SocketAddr,
    metrics: SocketAddr,
    role: Option<String>,
}

/// Picks `n` distinct loopback ports, each free for both UDP (QUIC) and TCP (the TCP transport, on the same
/// port) when picked: binds UDP on port 0, then TCP on the same port, keeps every socket until all are
/// picked, then releases them. Another process may still take one before the server binds it (a small race,
/// as with any pre-picked port).
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let mut held = Vec::with_capacity(n);
    let mut attempts = 0;
    while held.len() < n {
        attempts += 1;
        if attempts > 100 * n + 100 {
            bail!("no port free for both UDP and TCP on 127.0.0.1 after {attempts} attempts");
        }
        let udp = UdpSocket::bind("127.0.0.1:0").context("bind a UDP socket on 127.0.0.1")?;
        let port = udp.local_addr().context("UDP socket address")?.port();
        if let Ok(tcp) = TcpListener::bind(("127.0.0.1", port)) {
            held.push((port, udp, tcp));
        }
    }
    Ok(held.into_iter().map(|(port, _, _)| port).collect())
}

impl LocalCluster {
    /// Starts `n` [`ps_server_binary`] processes under `run_dir`: see [`LocalCluster::start_with`].
    pub fn start(n: usize, run_dir: &Path, extra: &[String]) -> anyhow::Result<LocalCluster> {
        let bin = ps_server_binary()?;
        LocalCluster::start_with(&|| Ok(Command::new(&bin)), n, run_dir, extra)
    }

    /// Starts `n` servers under `run_dir` (created; a dev CA and certificates in `run_dir/tls`, made by the
    /// command's `certs init`), with `extra` flags for every server, and waits until each reports ready.
    /// `command` builds the command that runs one server (the flags are appended to it). Each server listens
    /// on a port it picks (port 0).
    pub fn start_with(
        command: &dyn Fn() -> anyhow::Result<Command>,
        n: usize,
        run_dir: &Path,
        extra: &[String],
    ) -> anyhow::Result<LocalCluster> {
        LocalCluster::launch(command, n, 1, None, run_dir, extra)
    }

    /// Starts `shards` shards of `replicas` [`ps_server_binary`] processes each under `run_dir`: see
    /// [`LocalCluster::start_replicated_with`].
    pub fn start_replicated(
        shards: usize,
        replicas: usize,
        run_dir: &Path,
        extra: &[String],
    ) -> anyhow::Result<LocalCluster> {
        let bin = ps_server_binary()?;
        LocalCluster::start_replicated_with(
            &|| Ok(Command::new(&bin)),
            shards,
            replicas,
            run_dir,
            extra,
        )
    }

    /// Starts `replicas` servers for each of `shards` shards under `run_dir`, as [`LocalCluster::start_with`]
    /// does, on listen ports picked in advance ([`free_ports`]): replica `r` of shard `i` runs with `--listen
    /// 127.0.0.1:PORT --shard-index i --num-shards <shards> --replica-index r --replicas <the addresses of
    /// shard i's replicas, comma separated>` (the replica flags only when `replicas >= 2`; with 1 it is
    /// [`LocalCluster::start_with`] on pre-picked ports, so a killed server can restart on its port). Every
    /// server is started before any ready line is awaited (replicas look for their peers while starting).
    /// `extra` flags go to every server (e.g. `--durability replicated`).
    pub fn start_replicated_with(
        command: &dyn Fn() -> anyhow::Result<Command>,
        shards: usize,
        replicas: usize,
        run_dir: &Path,
        extra: &[String],
    ) -> anyhow::Result<LocalCluster> {
        if shards == 0 || replicas == 0 {
            bail!("a local cluster needs at least 1 shard and 1 replica per shard, got {shards} x {replicas}");
        }
        let ports = free_ports(shards * replicas)?;
        LocalCluster::launch(command, shards, replicas, Some(ports), run_dir, extra)
    }

    fn launch(
        command: &dyn Fn() -> anyhow::Result<Command>,
        shards: usize,
        replicas: usize,
        ports: Option<Vec<u16>>,
        run_dir: &Path,
        extra: &[String],
    ) -> anyhow::Result<LocalCluster> {
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("create run dir {}", run_dir.display()))?;
        let tls_dir = run_dir.join("tls");
        let mut certs = command()?;
        let out = certs
            .args([OsString::from("certs"), "init".into(), "--tls-dir".into()])
            .arg(&tls_dir)
            .output()
            .context("run ps-server certs init")?;
        if !out.status.success() {
            bail!(
                "ps-server certs init --tls-dir {} failed ({}): {}",
                tls_dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let mut cluster = LocalCluster {
            servers: Vec::new(),
            template: CommandTemplate::of(&command()?),
            quic: Vec::new(),
            metrics: Vec::new(),
            replicas: Vec::new(),
            replica_metrics: Vec::new(),
            tls_dir: tls_dir.clone(),
        };
        let listen = |i: usize, r: usize| match &ports {
            Some(p) => format!("127.0.0.1:{}", p[i * replicas + r]),
            None => "127.0.0.1:0".to_owned(),
        };
        let mut pending = Vec::new();
        for i in 0..shards {
            let peers: Vec<String> = (0..replicas).map(|r| listen(i, r)).collect();
            for (r, addr) in peers.iter().enumerate() {
                // One replica per shard keeps today's names.
                let name = match replicas {
                    1 => format!("ps-{i}"),
                    _ => format!("ps-{i}-r{r}"),
                };
                let mut args: Vec<OsString> = vec![
                    "--listen".into(),
                    addr.into(),
                    "--metrics-listen".into(),
                    "127.0.0.1:0".into(),
                    "--data-dir".into(),
                    run_dir.join(&name).into(),
                    "--tls-dir".into(),
                    tls_dir.clone().into(),
                    "--shard-index".into(),
                    i.to_string().into(),
                    "--num-shards".into(),
                    shards.to_string().into(),
                ];
                if replicas > 1 {
                    args.extend([
                        "--replica-index".into(),
                        r.to_string().into(),
                        "--replicas".into(),
                        peers.join(",").into(),
                    ]);
                }
                args.extend(extra.iter().map(OsString::from));
                let mut server = Server {
                    child: None,
                    args,
                    log_path: run_dir.join(format!("{name}.log")),
                    name,
                    role: None,
                };
                let ready = server.spawn(&cluster.template)?;
                cluster.servers.push(server);
                pending.push(ready);
            }
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        for i in 0..shards {
            let mut quic = Vec::with_capacity(replicas);
            let mut metrics = Vec::with_capacity(replicas);
            for r in 0..replicas {
                let k = i * replicas + r;
                let ready = cluster.servers[k].await_ready(&pending[k], deadline)?;
                quic.push(ready.quic);
                metrics.push(ready.metrics);
            }
            cluster.quic.push(quic[0]);
            cluster.metrics.push(metrics[0]);
            cluster.replicas.push(quic);
            cluster.replica_metrics.push(metrics);
        }
        Ok(cluster)
    }

    /// Process ids, in shard order (with replicas: shard-major, `shard * replicas + replica`; 0 for a killed
    /// replica not restarted).
    pub fn pids(&self) -> Vec<u32> {
        self.servers
            .iter()
            .map(|s| s.child.as_ref().map_or(0, Child::id))
            .collect()
    }

    /// Replicas per shard.
    pub fn replicas_per_shard(&self) -> usize {
        self.replicas.first().map_or(0, Vec::len)
    }

    /// The `--ps` argument of clients: shards separated by `,`, the replicas of one shard by `/`
    /// (`a0/a1,b0/b1`; one replica: `a,b` as before).
    pub fn ps_arg(&self) -> String {
        self.replicas
            .iter()
            .map(|r| {
                r.iter()
                    .map(SocketAddr::to_string)
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The `role=` replica `replica` of shard `shard` printed in its last ready line (`primary` or `backup`;
    /// `None` for a server that prints none). The role may have changed since (a failover): see
    /// [`LocalCluster::primary_of`].
    pub fn ready_role(&self, shard: usize, replica: usize) -> Option<&str> {
        self.servers[self.index(shard, replica)].role.as_deref()
    }

    /// Whether replica `replica` of shard `shard` is running (started and not killed).
    pub fn is_running(&self, shard: usize, replica: usize) -> bool {
        self.servers[self.index(shard, replica)].child.is_some()
    }

    /// Which running replica of `shard` reports `ps_replica_primary 1` on its metrics endpoint now (`None` if
    /// none does; the replicas that do not answer are skipped). With several (a partition: docs/replication.md)
    /// the one with the highest `ps_shard_epoch`.
    pub fn primary_of(&self, shard: usize) -> Option<usize> {
        let mut best: Option<(f64, usize)> = None;
        for r in 0..self.replicas_per_shard() {
            if !self.is_running(shard, r) {
                continue;
            }
            let Ok(text) = http_get(self.replica_metrics[shard][r], "/metrics") else {
                continue;
            };
            if metric(&text, "ps_replica_primary") == Some(1.0) {
                let epoch = metric(&text, "ps_shard_epoch").unwrap_or(0.0);
                if best.is_none_or(|(e, _)| epoch > e) {
                    best = Some((epoch, r));
                }
            }
        }
        best.map(|(_, r)| r)
    }

    /// SIGKILLs replica `replica` of shard `shard` (shard `shard` of a cluster without replicas: replica 0)
    /// and reaps it. Killing a replica already killed does nothing.
    pub fn kill_replica(&mut self, shard: usize, replica: usize) -> anyhow::Result<()> {
        let k = self.index(shard, replica);
        if let Some(mut child) = self.servers[k].child.take() {
            child
                .kill()
                .with_context(|| format!("SIGKILL {}", self.servers[k].name))?;
            child
                .wait()
                .with_context(|| format!("reap {}", self.servers[k].name))?;
        }
        Ok(())
    }

    /// Restarts a killed replica with the flags it was first started with (same port, data directory and
    /// `--replicas`; its log is appended to), waits for its ready line and returns the `role=` in it. Fails if
    /// the replica is running. A cluster from [`LocalCluster::start_with`] (port 0) restarts on a new port,
    /// which is then in `quic` and `replicas`.
    pub fn restart_replica(
        &mut self,
        shard: usize,
        replica: usize,
    ) -> anyhow::Result<Option<String>> {
        let k = self.index(shard, replica);
        if self.servers[k].child.is_some() {
            bail!("{} is running: kill it first", self.servers[k].name);
        }
        let rx = self.servers[k].spawn(&self.template)?;
        let ready = self.servers[k].await_ready(&rx, Instant::now() + READY_TIMEOUT)?;
        self.replicas[shard][replica] = ready.quic;
        self.replica_metrics[shard][replica] = ready.metrics;
        if replica == 0 {
            self.quic[shard] = ready.quic;
        }
        Ok(ready.role)
    }

    fn index(&self, shard: usize, replica: usize) -> usize {
        let per = self.replicas_per_shard();
        assert!(
            shard < self.replicas.len() && replica < per,
            "replica {replica} of shard {shard}: the cluster has {} shards x {per} replicas",
            self.replicas.len()
        );
        shard * per + replica
    }

    /// Sends SIGTERM to every server and waits (up to `timeout`) for each to exit; fails unless all exit 0.
    pub fn shutdown(mut self, timeout: Duration) -> anyhow::Result<()> {
        for c in self.servers.iter().filter_map(|s| s.child.as_ref()) {
            // SAFETY: kill(2) with a pid we spawned and have not reaped; no memory is touched.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + timeout;
        let mut failures = Vec::new();
        for s in &mut self.servers {
            let Some(c) = s.child.as_mut() else { continue };
            loop {
                match c.try_wait().context("wait for ps-server")? {
                    Some(status) if status.success() => break,
                    Some(status) => {
                        // The log's end says why (a panic, an abort's message, the error it returned).
                        failures.push(format!(
                            "{} exited with {status}; the end of {}:\n{}",
                            s.name,
                            s.log_path.display(),
                            s.log_tail(LOG_TAIL_LINES)
                        ));
                        break;
                    }
                    None if Instant::now() > deadline => {
                        let _ = c.kill();
                        let _ = c.wait();
                        failures.push(format!(
                            "{} still running {timeout:?} after SIGTERM; killed",
                            s.name
                        ));
                        break;
                    }
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            s.child = None;
        }
        if !failures.is_empty() {
            bail!("{}", failures.join("; "));
        }
        Ok(())
    }
}

impl Server {
    /// Spawns the server (its log appended to); the receiver gets its first stdout line (the ready line).
    /// Later stdout lines are appended to the log, so the pipe never fills nor closes under the server.
    fn spawn(&mut self, template: &CommandTemplate) -> anyhow::Result<Receiver<String>> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("open {}", self.log_path.display()))?;
        let mut more = log.try_clone().context("clone the log file handle")?;
        let mut cmd = template.build();
        cmd.args(&self.args).stdout(Stdio::piped()).stderr(log);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawn {} ({:?})", self.name, template.program))?;
        let stdout = child.stdout.take().expect("piped");
        self.child = Some(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let mut rest = String::new();
            while matches!(reader.read_line(&mut rest), Ok(n) if n > 0) {
                let _ = write!(more, "stdout: {rest}");
                rest.clear();
            }
        });
        Ok(rx)
    }

    /// The last `lines` lines of the server's log (stdout after the ready line, and stderr: panics and
    /// aborts print there), for errors that should say why a server failed without the reader opening it.
    fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn await_ready(&mut self, rx: &Receiver<String>, deadline: Instant) -> anyhow::Result<Ready> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(wait).map_err(|_| {
            anyhow::anyhow!(
                "{} did not report ready within {} s; see {}",
                self.name,
                READY_TIMEOUT.as_secs(),
                self.log_path.display()
            )
        })?;
        if line.is_empty() {
            // The pipe closed: the server exited (or closed stdout) before its ready line.
            bail!(
                "{} exited before reporting ready; {}:\n{}",
                self.name,
                self.log_path.display(),
                self.log_tail(5)
            );
        }
        let word = |key: &str| line.split_whitespace().find_map(|w| w.strip_prefix(key));
        let field = |key: &str| -> anyhow::Result<SocketAddr> {
            word(key)
                .with_context(|| {
                    format!(
                        "{} printed {line:?} instead of its ready line; see {}",
                        self.name,
                        self.log_path.display()
                    )
                })?
                .parse()
                .with_context(|| format!("address in {line:?}"))
        };
        let ready = Ready {
            quic: field("quic=")?,
            metrics: field("metrics=")?,
            role: word("role=").map(str::to_owned),
        };
        self.role = ready.role.clone();
        Ok(ready)
    }
}

/// `GET path` over HTTP/1.0 from `addr` (a metrics endpoint), the body as text; 2 s timeouts.
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let timeout = Duration::from_secs(2);
    let mut s =
        TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connect to {addr}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .with_context(|| format!("read the answer of {addr}"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("{addr}: no HTTP header end"))?;
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1) != Some("200") {
        bail!(
            "GET {path} from {addr}: {}",
            head.lines().next().unwrap_or_default()
        );
    }
    Ok(body.to_owned())
}

/// The value of the sample `name` in Prometheus text (labels included in `name`, as rendered:
/// `ps_peer_tls_failing{peer="1"}`).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let value = rest.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for c in self.servers.iter_mut().filter_map(|s| s.child.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

mod grow;
#[cfg(test)]
mod tests;
