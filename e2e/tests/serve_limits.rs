//! Issue 40 regression tests for `ps-serve`'s listener, against a real `ps-serve` process on loopback:
//!
//! 1. `idle_connections_cannot_lock_out_serving`: connections that never send a request held their slot for
//!    ever and there was no cap (200 half-sent requests held 35 s). Now `--max-connections` closes one more at
//!    accept, and `--header-timeout-secs` closes a connection whose request headers do not arrive.
//! 2. `the_api_needs_its_token_and_the_embedding_route_is_off`: `/v1/` routes (and `/v1/embedding`, a read of
//!    the model's rows) answered anyone. Now `--api-token-file` makes every `/v1/` request carry
//!    `Authorization: Bearer <token>` (401 otherwise; probes and `/metrics` stay open), and `/v1/embedding`
//!    answers only with `--enable-embedding-api`.
//! 3. `one_client_cannot_hold_every_slot`: 1024 half-sent requests from one client held every slot and locked
//!    everyone else out (`scripts/bench/attack_memory.py`). Now `--max-connections-per-client` caps one address.
//!
//! The server runs with an export directory that holds no export yet: its HTTP endpoint answers while it waits
//! for one, which is all these tests need. No test sleeps in place of a condition: waits block on a socket or
//! poll an answer until a deadline far above what any machine needs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

mod support;

use support::Serve;

/// `ps-serve --export <a folder with no export yet> ARGS`, listening; the folder lives as long as the pair.
fn start(args: &[&str]) -> (Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("exports");
    std::fs::create_dir(&export).unwrap();
    let mut all = vec!["--export", export.to_str().unwrap()];
    all.extend_from_slice(args);
    (Serve::spawn(&all), dir)
}

/// One request on a fresh connection with `headers`; `(status, body)`, status 0 when closed first.
fn request(addr: SocketAddr, method: &str, path: &str, headers: &[&str]) -> (u16, String) {
    support::http_with(addr, method, path, headers, b"")
}

/// Blocks until the server closes `s` (EOF or reset); panics if it sends anything or is still open at `limit`.
fn wait_closed(s: &mut TcpStream, limit: Duration, what: &str) {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!(
            "{what}: the server answered instead of closing: {:?}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ) => {}
        Err(e) => panic!("{what}: still open after {limit:?} ({e})"),
    }
}

/// The value of an unlabelled series in the server's `/metrics`.
fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (status, text) = request(addr, "GET", "/metrics", &[]);
    assert_eq!(status, 200, "GET /metrics: {text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Polls `f` until it is true; panics naming `what` after a minute.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn idle_connections_cannot_lock_out_serving() {
    // Slots: a long header timeout, so only the cap can close connections here.
    let (serve, _dir) = start(&["--max-connections", "2", "--header-timeout-secs", "600"]);
    let idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(serve.addr).unwrap())
        .collect();
    // The server takes connections in order: the two idle ones hold both slots, so the third is closed at once.
    let mut third = TcpStream::connect(serve.addr).unwrap();
    wait_closed(
        &mut third,
        Duration::from_secs(60),
        "a connection over --max-connections 2",
    );
    // Once an idle client goes, its slot serves others again.
    drop(idle);
    eventually("a slot to free after the idle clients left", || {
        request(serve.addr, "GET", "/healthz", &[]).0 == 200
    });
    assert!(
        metric(serve.addr, "serving_connections_refused_total") >= 1.0,
        "the refusal is counted"
    );
    drop(serve);

    // Headers that never come: the connection is closed after --header-timeout-secs, and counted.
    let (serve, _dir) = start(&["--header-timeout-secs", "1"]);
    let mut silent = TcpStream::connect(serve.addr).unwrap();
    wait_closed(
        &mut silent,
        Duration::from_secs(60),
        "a connection that sends nothing",
    );
    let mut trickle = TcpStream::connect(serve.addr).unwrap();
    trickle
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    wait_closed(
        &mut trickle,
        Duration::from_secs(60),
        "a request whose headers never end",
    );
    eventually("the header timeouts to be counted", || {
        metric(serve.addr, "serving_header_timeouts_total") >= 2.0
    });
    assert_eq!(request(serve.addr, "GET", "/healthz", &[]).0, 200);
}

#[test]
fn the_api_needs_its_token_and_the_embedding_route_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let (serve, _dir) = start(&["--api-token-file", token.to_str().unwrap()]);
    let bearer = "Authorization: Bearer s3cret-token";

    let (status, text) = request(serve.addr, "GET", "/v1/model", &[]);
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("Bearer"), "{text}");
    let (status, _) = request(
        serve.addr,
        "GET",
        "/v1/model",
        &["Authorization: Bearer wrong-token!"],
    );
    assert_eq!(status, 401);
    let (status, _) = request(serve.addr, "POST", "/v1/predict", &[]);
    assert_eq!(status, 401);
    // With the token the request reaches the route (no export is loaded yet: 503).
    let (status, text) = request(serve.addr, "GET", "/v1/model", &[bearer]);
    assert_eq!(status, 503, "{text}");
    // Probes and scrapers need no token.
    assert_eq!(request(serve.addr, "GET", "/healthz", &[]).0, 200);
    assert_eq!(request(serve.addr, "GET", "/metrics", &[]).0, 200);
    // The embedding route is off unless asked for, and says how to turn it on.
    let (status, text) = request(serve.addr, "GET", "/v1/embedding?table=0&id=1", &[bearer]);
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("--enable-embedding-api"), "{text}");
    drop(serve);

    let (serve, _dir) = start(&["--enable-embedding-api"]);
    let (status, text) = request(serve.addr, "GET", "/v1/embedding?table=0&id=1", &[]);
    assert_eq!(
        status, 503,
        "on, it answers (the export is still loading): {text}"
    );
}

/// Half-sent requests from one client held every slot until the body timeout, and a legitimate request
/// meanwhile was closed at accept (`scripts/bench/attack_memory.py`, BENCHMARKS.md). With
/// `--max-connections-per-client` one address holds at most that many; others are still served.
#[test]
fn one_client_cannot_hold_every_slot() {
    let (serve, _dir) = start(&[
        "--max-connections",
        "16",
        "--max-connections-per-client",
        "4",
        "--header-timeout-secs",
        "600",
        "--body-timeout-secs",
        "600",
    ]);
    assert!(serve.addr.ip().is_loopback(), "{}", serve.addr);
    // The attacker: another loopback address (Linux routes all of 127.0.0.0/8 to lo).
    let attacker = || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::from(([127, 0, 0, 2], 0)).into())
            .unwrap();
        s.connect(&serve.addr.into()).unwrap();
        let mut s: TcpStream = s.into();
        // Headers that never end: the slot is held until the header timeout (a request with a body would be
        // answered at once here, 503 with no export loaded, and the connection closed).
        s.write_all(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        s
    };
    let held: Vec<TcpStream> = (0..4).map(|_| attacker()).collect();
    eventually("the attacker's 4 connections to be open", || {
        metric(serve.addr, "serving_connections_open") >= 4.0
    });
    let mut fifth = attacker();
    wait_closed(
        &mut fifth,
        Duration::from_secs(60),
        "a fifth connection from one address over --max-connections-per-client 4",
    );
    // Everyone else is served meanwhile.
    assert_eq!(request(serve.addr, "GET", "/healthz", &[]).0, 200);
    assert!(metric(serve.addr, "serving_connections_refused_per_client_total") >= 1.0);
    // Its connections gone, the attacker's address gets slots again (the metrics request is itself one open
    // connection).
    let refused = metric(serve.addr, "serving_connections_refused_per_client_total");
    drop(held);
    drop(fifth);
    eventually("the attacker's slots to free", || {
        metric(serve.addr, "serving_connections_open") <= 1.0
    });
    let _again = attacker();
    eventually("a new connection from that address to be held", || {
        metric(serve.addr, "serving_connections_open") >= 2.0
    });
    assert_eq!(
        metric(serve.addr, "serving_connections_refused_per_client_total"),
        refused,
        "a connection within the limit was refused"
    );
}
