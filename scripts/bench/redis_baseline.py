#!/usr/bin/env python3
"""Redis as a naive parameter server: the `ps-bench` workload against one redis-server.

Each table row is one key (2-byte table + 8-byte rank, big-endian) whose value is `dim` f16 values (2*dim bytes).
A pull is a pipeline of one MGET per table over the batch's unique ids (one round trip); a push is the same MGETs,
SGD on the client (w -= lr * g, missing rows start at 0), then one MSET per table, pipelined (two round trips).
Batches are drawn like ps-bench's (per table `--ids-per-table` draws, Zipf by rejection from numpy's unbounded Zipf,
i.e. exactly the truncated Zipf, or uniform; deduplicated), pre-generated before the run and cycled through.
`--concurrency` client processes each keep one batch in flight. Requests are pre-encoded as RESP bytes and replies
parsed by hiredis (when installed), so the client's Python is kept off the measured path as far as possible.

Starts redis-server (persistence off) on loopback on a free port if `--redis` is not given; prints a note and
exits 0 with {"skipped": ...} in the JSON if redis-server or the redis Python package is missing.
Writes the same JSON keys as ps-bench (`pull_rows_per_sec`, `push_rows_per_sec`, `pull_p50_ms`, ...), transport
"redis". Wire bytes are the RESP bytes sent plus the RESP bytes of the replies (computed from the reply sizes).
"""

import argparse
import json
import multiprocessing as mp
import multiprocessing.queues
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None
try:
    import redis
except ImportError:  # pragma: no cover
    redis = None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--redis", help="HOST:PORT of a running redis (default: start one on loopback)")
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--ids-per-table", type=int, default=2048)
    p.add_argument("--distribution", choices=["zipf", "uniform"], default="zipf")
    p.add_argument("--zipf-s", type=float, default=1.1)
    p.add_argument("--vocab", type=int, default=10_000_000)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--mix", choices=["pull", "push", "both"], default="both")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup-seconds", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pool-batches", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--json", help="write the report here")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args()


def gen_batch(args, index):
    """Sorted unique ranks of each table for batch `index` (a function of seed and index)."""
    rng = np.random.default_rng([args.seed, index])
    out = []
    for _ in range(args.tables):
        if args.distribution == "uniform":
            ranks = rng.integers(1, args.vocab + 1, size=args.ids_per_table, dtype=np.uint64)
        else:
            ranks = np.empty(0, dtype=np.uint64)
            while ranks.size < args.ids_per_table:
                draw = rng.zipf(args.zipf_s, size=args.ids_per_table * 2)
                draw = draw[(draw >= 1) & (draw <= args.vocab)].astype(np.uint64)
                ranks = np.concatenate([ranks, draw])
            ranks = ranks[: args.ids_per_table]
        out.append(np.unique(ranks))
    return out


def key_chunks(table, ranks):
    """RESP bulk strings `$10\\r\\n<key>\\r\\n` of each key, as an (n, 17) uint8 array."""
    n = ranks.size
    chunk = np.empty((n, 17), dtype=np.uint8)
    chunk[:, 0:5] = np.frombuffer(b"$10\r\n", dtype=np.uint8)
    chunk[:, 5:7] = np.frombuffer(table.to_bytes(2, "big"), dtype=np.uint8)
    chunk[:, 7:15] = ranks.astype(">u8").view(np.uint8).reshape(n, 8)
    chunk[:, 15:17] = np.frombuffer(b"\r\n", dtype=np.uint8)
    return chunk


def command(name, n_args, body):
    return b"*%d\r\n$%d\r\n%s\r\n" % (n_args + 1, len(name), name) + body


class Prepared:
    """One batch's pre-encoded MGET commands and key chunks."""

    def __init__(self, args, ranks_per_table):
        self.rows = int(sum(r.size for r in ranks_per_table))
        self.keys = [key_chunks(t, r) for t, r in enumerate(ranks_per_table)]
        self.mget = b"".join(command(b"MGET", k.shape[0], k.tobytes()) for k in self.keys)
        vb = 2 * args.dim
        # Reply bytes if every key exists: array header + per value "$<len>\r\n<value>\r\n".
        self.mget_reply = sum(
            len(b"*%d\r\n" % k.shape[0]) + k.shape[0] * (len(b"$%d\r\n" % vb) + vb + 2) for k in self.keys
        )


def mset_command(keys, values, dim):
    """MSET key value ... with `values` an (n, dim) f16 array, vectorized into one RESP command."""
    n = keys.shape[0]
    vb = 2 * dim
    head = b"$%d\r\n" % vb
    row = np.empty((n, 17 + len(head) + vb + 2), dtype=np.uint8)
    row[:, :17] = keys
    row[:, 17 : 17 + len(head)] = np.frombuffer(head, dtype=np.uint8)
    row[:, 17 + len(head) : 17 + len(head) + vb] = values.view(np.uint8).reshape(n, vb)
    row[:, -2:] = np.frombuffer(b"\r\n", dtype=np.uint8)
    return command(b"MSET", 2 * n, row.tobytes())


def decode_values(reply, dim):
    zero = bytes(2 * dim)
    return np.frombuffer(b"".join(v if v is not None else zero for v in reply), dtype=np.float16).reshape(-1, dim)


def worker(w, args, host, port, barrier, counters):
    # The pool's batches w, w + C, w + 2C, ... (the pool is split between the workers).
    count = max(1, args.pool_batches // args.concurrency)
    batches = [Prepared(args, gen_batch(args, w + j * args.concurrency)) for j in range(count)]
    grad_rng = np.random.default_rng([args.seed, 0x67AD])
    grads = (grad_rng.standard_normal((args.ids_per_table, args.dim)) * 0.01).astype(np.float32)
    conn = redis.Connection(host=host, port=port)
    conn.connect()
    barrier.wait()
    start = time.monotonic()
    measure_from = start + args.warmup_seconds
    end = measure_from + args.seconds
    st = {"pull": [], "push": [], "pull_rows": 0, "push_rows": 0, "wire": 0, "batches": 0}
    k = 0
    while time.monotonic() < end:
        b = batches[k % len(batches)]
        k += 1
        whole = True
        if args.mix in ("pull", "both"):
            t0 = time.monotonic()
            conn.send_packed_command([b.mget], check_health=False)
            for _ in b.keys:
                conn.read_response()
            t1 = time.monotonic()
            counters[0] += b.rows
            if t0 >= measure_from and t1 <= end:
                st["pull"].append(t1 - t0)
                st["pull_rows"] += b.rows
                st["wire"] += len(b.mget) + b.mget_reply
            else:
                whole = False
        if args.mix in ("push", "both"):
            t0 = time.monotonic()
            conn.send_packed_command([b.mget], check_health=False)
            replies = [conn.read_response() for _ in b.keys]
            msets = []
            for keys, reply in zip(b.keys, replies):
                w_old = decode_values(reply, args.dim).astype(np.float32)
                w_new = (w_old - args.lr * grads[: w_old.shape[0]]).astype(np.float16)
                msets.append(mset_command(keys, w_new, args.dim))
            out = b"".join(msets)
            conn.send_packed_command([out], check_health=False)
            for _ in b.keys:
                conn.read_response()
            t1 = time.monotonic()
            counters[1] += b.rows
            if t0 >= measure_from and t1 <= end:
                st["push"].append(t1 - t0)
                st["push_rows"] += b.rows
                st["wire"] += len(b.mget) + b.mget_reply + len(out) + 5 * len(b.keys)
            else:
                whole = False
        if whole:
            st["batches"] += 1
    conn.disconnect()
    return st


def quantile_ms(sorted_secs, q):
    """Nearest rank, as ps-bench's stats."""
    n = len(sorted_secs)
    if n == 0:
        return 0.0
    import math

    rank = min(max(math.ceil(q * n), 1), n)
    return sorted_secs[rank - 1] * 1e3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis():
    exe = shutil.which("redis-server")
    if exe is None:
        return None, None, "redis-server is not installed (Debian: apt-get install redis-server)"
    port = free_port()
    d = tempfile.mkdtemp(prefix="redis-baseline-")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d,
         "--protected-mode", "no", "--logfile", os.path.join(d, "redis.log")],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            redis.Redis(host="127.0.0.1", port=port).ping()
            return proc, port, None
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    return None, None, "redis-server did not answer PING within 10 s"


def main():
    args = parse_args()
    config = {k: v for k, v in vars(args).items() if k not in ("json", "quiet")}
    missing = [m for m, mod in (("numpy", np), ("redis", redis)) if mod is None]
    proc = None
    if missing:
        skip = f"python packages missing: {', '.join(missing)} (pip install redis numpy hiredis)"
    elif args.redis:
        host, port = args.redis.rsplit(":", 1)
        port, skip = int(port), None
    else:
        proc, port, skip = start_redis()
        host = "127.0.0.1"
    if skip:
        print(f"redis_baseline: skipped: {skip}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"transport": "redis", "skipped": skip, "config": config}, f, indent=2)
        return 0
    try:
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(args.concurrency + 1)
        counters = ctx.Array("q", 2, lock=False)
        results = ctx.Queue()

        def child(w):
            try:
                results.put((w, worker(w, args, host, port, barrier, counters)))
            except BaseException as e:  # report instead of leaving the parent waiting
                import traceback

                results.put((w, traceback.format_exc()))
                barrier.abort()

        procs = [ctx.Process(target=child, args=(w,)) for w in range(args.concurrency)]
        for p in procs:
            p.start()
        barrier.wait(timeout=300)
        start = time.monotonic()
        last, lp, lu = start, 0, 0
        stats = []
        while len(stats) < args.concurrency:
            try:
                w, st = results.get(timeout=1.0)
                if isinstance(st, str):
                    raise RuntimeError(f"worker {w} failed: {st}")
                stats.append(st)
                continue
            except mp.queues.Empty:
                pass
            now = time.monotonic()
            if not args.quiet:
                p, u = counters[0], counters[1]
                print(f"[{now - start:5.1f} s] pull {(p - lp) / (now - last):10.0f} rows/s  "
                      f"push {(u - lu) / (now - last):10.0f} rows/s", file=sys.stderr)
                last, lp, lu = now, p, u
            if now - start > args.warmup_seconds + args.seconds + 120:
                raise RuntimeError("workers did not finish 120 s after the end of the run")
        for p in procs:
            p.join()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    pull = sorted(x for s in stats for x in s["pull"])
    push = sorted(x for s in stats for x in s["push"])
    pull_rows = sum(s["pull_rows"] for s in stats)
    push_rows = sum(s["push_rows"] for s in stats)
    wire = sum(s["wire"] for s in stats)
    secs = args.seconds
    report = {
        "transport": "redis",
        "codec": "f16",
        "seconds": secs,
        "batches": sum(s["batches"] for s in stats),
        "pull_rows_per_sec": pull_rows / secs,
        "push_rows_per_sec": push_rows / secs,
        "pull_p50_ms": quantile_ms(pull, 0.5),
        "pull_p99_ms": quantile_ms(pull, 0.99),
        "pull_p999_ms": quantile_ms(pull, 0.999),
        "push_p50_ms": quantile_ms(push, 0.5),
        "push_p99_ms": quantile_ms(push, 0.99),
        "push_p999_ms": quantile_ms(push, 0.999),
        "pull_requests": len(pull),
        "push_requests": len(push),
        "wire_bytes": wire,
        "wire_bytes_per_pulled_row": wire / pull_rows if pull_rows else 0.0,
        "wire_mb_per_sec": wire / secs / 1e6,
        "config": config,
    }
    print(f"redis_baseline: {args.tables} tables x {args.ids_per_table} ids, dim {args.dim}, "
          f"concurrency {args.concurrency}, mix {args.mix}, {secs:.1f} s")
    print(f"pull: {report['pull_rows_per_sec']:12.0f} rows/s  p50 {report['pull_p50_ms']:.2f} ms  "
          f"p99 {report['pull_p99_ms']:.2f} ms  p999 {report['pull_p999_ms']:.2f} ms  ({len(pull)} requests)")
    print(f"push: {report['push_rows_per_sec']:12.0f} rows/s  p50 {report['push_p50_ms']:.2f} ms  "
          f"p99 {report['push_p99_ms']:.2f} ms  p999 {report['push_p999_ms']:.2f} ms  ({len(push)} requests)")
    print(f"wire: {report['wire_mb_per_sec']:.1f} MB/s, {report['wire_bytes_per_pulled_row']:.1f} bytes per pulled row")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
