//! Tests of [`super::LocalCluster`] with a shell stand-in for `ps-server`.

use super::*;

#[test]
fn free_ports_are_distinct_and_nonzero() {
    // Whether a released port binds again is a race with every other process (and the other tests of this
    // binary, which pick ports too), so it is not asserted; `free_ports` held each for UDP and TCP at once.
    let ports = free_ports(6).unwrap();
    let mut sorted = ports.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 6, "{ports:?}");
    assert!(ports.iter().all(|&p| p != 0), "{ports:?}");
}

#[test]
fn metric_reads_unlabelled_samples_only() {
    let text = "# TYPE ps_replica_primary gauge\nps_replica_primary 1\nps_replica_primary_x 5\n\
                ps_shard_epoch 3\nps_replication_rows_total{phase=\"stream\"} 9\n";
    assert_eq!(metric(text, "ps_replica_primary"), Some(1.0));
    assert_eq!(metric(text, "ps_shard_epoch"), Some(3.0));
    assert_eq!(metric(text, "ps_replication_rows_total"), None);
    assert_eq!(metric(text, "ps_failovers_total"), None);
}

/// A stand-in for `ps-server`: `certs init` succeeds; otherwise it appends its flags to `<data-dir>.args`,
/// prints a ready line (role `primary` for replica 0's first life, else `backup`) and sleeps.
const FAKE_SERVER: &str = r#"
    [ "$1" = certs ] && exit 0
    all="$*"; listen=; data=; replica=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --listen) listen=$2; shift 2 ;;
            --data-dir) data=$2; shift 2 ;;
            --replica-index) replica=$2; shift 2 ;;
            *) shift ;;
        esac
    done
    role=backup
    [ "$replica" = 0 ] && [ ! -f "$data.args" ] && role=primary
    echo "$all" >> "$data.args"
    echo "ps-server ready quic=$listen tcp=$listen metrics=127.0.0.1:9 role=$role"
    echo "a later stdout line"
    exec sleep 600
"#;

fn fake() -> anyhow::Result<Command> {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", FAKE_SERVER, "fake-ps-server"]);
    Ok(cmd)
}

#[test]
fn replicated_start_passes_replica_flags_and_restarts_on_the_same_port() {
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--durability".to_owned(), "replicated".to_owned()];
    let mut c = LocalCluster::start_replicated_with(&fake, 2, 2, dir.path(), &extra).unwrap();
    assert_eq!(c.replicas.len(), 2);
    assert_eq!(c.replicas_per_shard(), 2);
    assert_eq!(c.quic, vec![c.replicas[0][0], c.replicas[1][0]]);
    let all: Vec<SocketAddr> = c.replicas.iter().flatten().copied().collect();
    assert!(all.iter().all(|a| a.ip().is_loopback() && a.port() != 0));
    let mut ports: Vec<u16> = all.iter().map(SocketAddr::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 4);
    let (a, b) = (&c.replicas[0], &c.replicas[1]);
    assert_eq!(c.ps_arg(), format!("{}/{},{}/{}", a[0], a[1], b[0], b[1]));
    assert_eq!(c.ready_role(0, 0), Some("primary"));
    assert_eq!(c.ready_role(1, 1), Some("backup"));
    let args =
        |name: &str| std::fs::read_to_string(dir.path().join(format!("{name}.args"))).unwrap();
    let first = args("ps-1-r1");
    for want in [
        format!("--listen {}", b[1]),
        "--shard-index 1 --num-shards 2".to_owned(),
        format!("--replica-index 1 --replicas {},{}", b[0], b[1]),
        "--durability replicated".to_owned(),
        format!("--data-dir {}", dir.path().join("ps-1-r1").display()),
    ] {
        assert!(first.contains(&want), "{want:?} not in {first:?}");
    }
    // Primary killed, restarted on its port and data dir: it comes back (here: as the fake's backup).
    let pid = c.pids()[2];
    c.kill_replica(1, 0).unwrap();
    assert!(!c.is_running(1, 0));
    assert_eq!(c.pids()[2], 0);
    assert!(
        c.restart_replica(1, 1).is_err(),
        "a running replica is not restarted"
    );
    let before = c.replicas[1][0];
    assert_eq!(c.restart_replica(1, 0).unwrap().as_deref(), Some("backup"));
    assert_eq!(c.replicas[1][0], before);
    assert_ne!(c.pids()[2], pid);
    let lives: Vec<String> = args("ps-1-r0").lines().map(str::to_owned).collect();
    assert_eq!(lives.len(), 2);
    assert_eq!(lives[0], lives[1], "restarted with the same flags");
    // Nobody answers on the fake's metrics address.
    assert_eq!(c.primary_of(0), None);
    // Later stdout lines go to the log.
    std::thread::sleep(Duration::from_millis(200));
    let log = std::fs::read_to_string(dir.path().join("ps-0-r0.log")).unwrap();
    assert!(log.contains("stdout: a later stdout line"), "{log:?}");
    drop(c);
}

#[test]
fn one_replica_per_shard_keeps_the_old_flags_and_names() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start_replicated_with(&fake, 2, 1, dir.path(), &[]).unwrap();
    assert_eq!(c.ps_arg(), format!("{},{}", c.quic[0], c.quic[1]));
    let args = std::fs::read_to_string(dir.path().join("ps-0.args")).unwrap();
    assert!(!args.contains("--replica"), "{args}");
    let c2 = LocalCluster::start_with(&fake, 1, &dir.path().join("b"), &[]).unwrap();
    assert_eq!(c2.replicas, vec![vec![c2.quic[0]]]);
    assert_eq!(
        c2.quic[0].to_string(),
        "127.0.0.1:0",
        "the fake echoes --listen"
    );
    assert!(
        c2.shutdown(Duration::from_secs(5)).is_err(),
        "sleep dies of SIGTERM"
    );
    drop(c);
}

#[test]
fn command_template_rebuilds_program_args_and_env() {
    let mut cmd = Command::new("/bin/echo");
    cmd.arg("-n").env("A", "1").env_remove("B").current_dir("/");
    let t = CommandTemplate::of(&cmd);
    let again = t.build();
    assert_eq!(again.get_program(), "/bin/echo");
    assert_eq!(again.get_args().collect::<Vec<_>>(), ["-n"]);
    assert_eq!(again.get_current_dir(), Some(Path::new("/")));
    let envs: Vec<_> = again.get_envs().collect();
    assert!(envs.contains(&(OsStr::new("A"), Some(OsStr::new("1")))));
    assert!(envs.contains(&(OsStr::new("B"), None)));
}
