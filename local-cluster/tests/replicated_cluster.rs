//! A real replicated local cluster (docs/replication.md): 1 shard x 2 replicas of the `ps-server` binary beside
//! the test executable (skipped when it is missing): one primary and one backup start, the primary is killed
//! and restarted on its port and data directory, and rejoins.

use std::time::{Duration, Instant};

use local_cluster::{ps_server_binary, LocalCluster};

#[test]
fn two_replicas_start_and_a_killed_primary_rejoins_on_its_port() {
    if ps_server_binary().is_err() {
        eprintln!(
            "skipped: ps-server is missing (build it, e.g. `cargo build --release -p ps-server`)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--durability".to_owned(), "replicated".to_owned()];
    let mut c = LocalCluster::start_replicated(1, 2, dir.path(), &extra).unwrap();
    let roles: Vec<_> = (0..2)
        .map(|r| c.ready_role(0, r).map(str::to_owned))
        .collect();
    assert!(
        roles
            .iter()
            .all(|r| matches!(r.as_deref(), Some("primary" | "backup"))),
        "{roles:?}"
    );
    // Exactly one primary, as the metrics say (the election may still be running when the ready lines come).
    let deadline = Instant::now() + Duration::from_secs(30);
    let primary = loop {
        if let Some(p) = c.primary_of(0) {
            break p;
        }
        assert!(Instant::now() < deadline, "no primary within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    let addr = c.replicas[0][primary];
    c.kill_replica(0, primary).unwrap();
    let role = c.restart_replica(0, primary).unwrap();
    assert_eq!(c.replicas[0][primary], addr, "restarted on its port");
    assert!(
        matches!(role.as_deref(), Some("primary" | "backup")),
        "{role:?}"
    );
    eprintln!(
        "replica {primary} was primary; restarted as {role:?}; primary now {:?}",
        c.primary_of(0)
    );
    c.shutdown(Duration::from_secs(60)).unwrap();
}
