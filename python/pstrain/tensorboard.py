"""TensorBoard event files without TensorFlow or the ``tensorboard`` package: scalars only, as the Rust
trainer writes them (``trainer --tensorboard-dir``, trainer/src/tensorboard.rs).

An event file is a sequence of TFRecords (length as little-endian u64, masked CRC-32C of the length, the
payload, masked CRC-32C of the payload) whose payloads are ``Event`` protobufs: ``wall_time`` (field 1,
double), ``step`` (2, int64), and ``file_version`` (3, ``brain.Event:2``) in the first record, a ``Summary``
(5) of ``value`` entries (1) with ``tag`` (1) and ``simple_value`` (2, float) in the others. Each record is
flushed as it is written, so a running TensorBoard sees it at once::

    from pstrain.tensorboard import EventWriter
    with EventWriter("runs/exp1") as tb:
        tb.scalars(step, {"train/loss": 0.47, "train/samples_per_sec": 31000.0})
"""

import math
import os
import socket
import struct
import time

__all__ = ["EventWriter", "crc32c"]


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``."""
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _field_bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _event(step: int, wall_time: float) -> bytes:
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(int(step))


class EventWriter:
    """Writes one event file in ``logdir`` (created if missing; an unusable directory raises ``OSError``
    naming it)."""

    def __init__(self, logdir):
        self.logdir = os.fspath(logdir)
        try:
            os.makedirs(self.logdir, exist_ok=True)
            host = "".join(ch if ch.isalnum() or ch == "-" else "_" for ch in socket.gethostname()) or "localhost"
            base = os.path.join(self.logdir, f"events.out.tfevents.{int(time.time())}.{host}.{os.getpid()}.pstrain-py")
            path, n = base, 0
            while True:
                try:
                    self._file = open(path, "xb")
                    break
                except FileExistsError:
                    n += 1
                    path = f"{base}.{n}"
        except OSError as e:
            raise OSError(e.errno, f"tensorboard dir {self.logdir}: {e.strerror}") from e
        self.path = path
        self._write(_event(0, time.time()) + _field_bytes(3, b"brain.Event:2"))

    def scalars(self, step: int, values: dict):
        """One event at ``step`` holding every ``tag: value`` of ``values`` (non-finite values left out)."""
        summary = b""
        for tag, v in values.items():
            v = float(v)
            if not math.isfinite(v):
                continue
            value = _field_bytes(1, tag.encode()) + b"\x15" + struct.pack("<f", v)
            summary += _field_bytes(1, value)
        self._write(_event(step, time.time()) + _field_bytes(5, summary))

    def _write(self, payload: bytes):
        n = struct.pack("<Q", len(payload))
        self._file.write(n + struct.pack("<I", _masked(n)) + payload + struct.pack("<I", _masked(payload)))
        self._file.flush()

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
