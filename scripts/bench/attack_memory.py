#!/usr/bin/env python3
"""Resident memory of ps-server and ps-serve under the connection attacks of issue 40, against release binaries.

Starts one ps-server (development certificates, defaults otherwise), trains a tiny model through it with an
export, starts ps-serve on the export, then for each attack opens N connections at once, holds them for HOLD
seconds while sampling the target's VmRSS every 100 ms, closes them and reports: baseline RSS, peak RSS during
the attack, how many of the N connections the target had closed by the end of the hold, and whether a fresh
legitimate request (from 127.0.0.1; the attacker connects from 127.0.0.2) still got an answer during the attack.

Attacks (N each, default 2000):
  tcp-preauth      raw TCP sockets to ps-server's data port that never start TLS
  metrics-idle     TCP sockets to ps-server's /metrics port that never send a request
  serve-half-sent  ps-serve: POST /v1/predict with Content-Length 1 MB and 1 KB of body, then silence
  serve-idle       ps-serve: TCP sockets that never send a byte

Usage: scripts/bench/attack_memory.py BIN_DIR [--n 2000] [--hold 8]
"""
import argparse
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def wait_line(proc_out_path, pattern, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            text = open(proc_out_path).read()
        except FileNotFoundError:
            text = ""
        m = re.search(pattern, text)
        if m:
            return m
        time.sleep(0.1)
    sys.exit(f"attack_memory: no {pattern!r} in {proc_out_path}")


def closed(s):
    """Whether the peer closed `s` (a read returns EOF or an error without blocking)."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def attack(name, pid, addr, n, hold, first_bytes, probe):
    base = rss(pid)
    socks, refused = [], 0
    for _ in range(n):
        try:
            # From another loopback address than the legitimate probe's (127.0.0.1): one attacking client.
            s = socket.create_connection(addr, timeout=2, source_address=("127.0.0.2", 0))
            if first_bytes:
                s.sendall(first_bytes)
            socks.append(s)
        except OSError:
            refused += 1
    peak = base
    probe_ok = None
    began = time.time()
    while time.time() - began < hold:
        peak = max(peak, rss(pid))
        if probe_ok is None and time.time() - began > hold / 2:
            probe_ok = probe()
        time.sleep(0.1)
    gone = sum(closed(s) for s in socks)
    for s in socks:
        s.close()
    time.sleep(1)
    after = rss(pid)
    mib = lambda b: f"{b / 2**20:.1f}"
    print(
        f"{name:16} n={n} connect_refused={refused} closed_by_target={gone} rss_base_mib={mib(base)} "
        f"rss_peak_mib={mib(peak)} rss_after_mib={mib(after)} legit_request_ok={probe_ok}",
        flush=True,
    )


def http_ok(url):
    def probe():
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status == 200
        except Exception:
            return False

    return probe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--hold", type=float, default=8)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = tempfile.mkdtemp(prefix="attack-memory.")
    procs = []
    try:
        subprocess.run([f"{a.bin}/ps-server", "certs", "init", "--tls-dir", f"{tmp}/tls"], check=True,
                       stdout=subprocess.DEVNULL)
        out = os.path.join(tmp, "ps.out")
        procs.append(subprocess.Popen(
            [f"{a.bin}/ps-server", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--data-dir", f"{tmp}/data", "--tls-dir", f"{tmp}/tls", "--checkpoint-root", tmp],
            stdout=open(out, "w"), stderr=open(f"{tmp}/ps.log", "w")))
        m = wait_line(out, r"quic=(\S+):(\d+) .*metrics=(\S+):(\d+)")
        ps_addr = (m.group(1), int(m.group(2)))
        metrics_addr = (m.group(3), int(m.group(4)))
        ps_pid = procs[0].pid
        subprocess.run([f"{a.bin}/gen-criteo", "--rows", "20000", "--seed", "1", "--teacher-seed", "7", "--out", f"{tmp}/train.tsv"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([f"{a.bin}/trainer", "train", "--ps", f"{ps_addr[0]}:{ps_addr[1]}", "--tls-dir", f"{tmp}/tls",
                        "--train", f"{tmp}/train.tsv", "--export-dir", f"{tmp}/export"],
                       check=True, stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/train.log", "w"))
        sout = os.path.join(tmp, "serve.out")
        procs.append(subprocess.Popen(
            [f"{a.bin}/ps-serve", "--export", f"{tmp}/export", "--listen", "127.0.0.1:0"],
            stdout=open(sout, "w"), stderr=open(f"{tmp}/serve.log", "w")))
        m = wait_line(sout, r"http://(\S+):(\d+)")
        serve_addr = (m.group(1), int(m.group(2)))
        serve_url = f"http://{serve_addr[0]}:{serve_addr[1]}"
        deadline = time.time() + 60
        while not http_ok(f"{serve_url}/readyz")() and time.time() < deadline:
            time.sleep(0.2)
        print(f"machine: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}")
        metrics_url = f"http://{metrics_addr[0]}:{metrics_addr[1]}/metrics"

        def ps_probe():
            return http_ok(metrics_url)()  # the server is alive and answering while attacked

        attack("tcp-preauth", ps_pid, ps_addr, a.n, a.hold, b"", ps_probe)
        attack("metrics-idle", ps_pid, metrics_addr, a.n, a.hold, b"", ps_probe)
        half = (b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000000\r\n\r\n" + b"[" * 1024)
        attack("serve-half-sent", procs[1].pid, serve_addr, a.n, a.hold, half, http_ok(f"{serve_url}/healthz"))
        attack("serve-idle", procs[1].pid, serve_addr, a.n, a.hold, b"", http_ok(f"{serve_url}/healthz"))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
