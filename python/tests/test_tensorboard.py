"""TensorBoard event files (issue 44), read back with the ``tensorboard`` package: the Rust trainer's
(``trainer demo --tensorboard-dir``) and pstrain's own (``pstrain.tensorboard``, ``python -m pstrain.demo
--tensorboard-dir``)."""

import json
import math
import os
import subprocess
import sys

import pytest

import pstrain
from pstrain.tensorboard import EventWriter, crc32c

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def scalars(logdir):
    """``{tag: [(step, value), ...]}`` of every scalar in the event files of ``logdir``."""
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_crc32c_known_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_pstrain_writer_is_read_by_tensorboard(tmp_path):
    with EventWriter(tmp_path / "run") as tb:
        tb.scalars(3, {"train/loss": 0.5, "skipped": float("nan")})
        tb.scalars(4, {"train/loss": 0.25, "eval/auc": 0.75})
    s = scalars(tmp_path / "run")
    assert s == {"train/loss": [(3, 0.5), (4, 0.25)], "eval/auc": [(4, 0.75)]}


def test_pstrain_writer_names_a_bad_directory(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(OSError, match="a-file"):
        EventWriter(f / "sub")


def trainer_demo(tmp_path, *extra):
    trainer = pstrain.find_binary("trainer")
    cmd = [trainer, "demo", "--rows", "20000", "--test-rows", "4000", "--batch-size", "512",
           "--data-dir", str(tmp_path / "data"), "--progress-secs", "0.05", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_trainer_demo_writes_what_its_summary_says(tmp_path):
    tb_dir, summary_json = tmp_path / "tb", tmp_path / "summary.json"
    r = trainer_demo(tmp_path, "--tensorboard-dir", str(tb_dir), "--summary-json", str(summary_json))
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(summary_json.read_text())
    s = scalars(tb_dir)
    for tag in ["train/loss", "train/calibration", "train/progressive_auc", "train/progressive_logloss",
                "train/samples_per_sec", "time/step_ms", "time/forward_ms", "time/backward_ms",
                "time/optimizer_ms", "time/pull_wait_ms", "time/gather_ms", "threads/parse_ms", "threads/plan_ms",
                "threads/encode_ms", "cpu/trainer_cores", "cpu/server0_cores", "cpu/server1_cores",
                "eval/auc", "eval/logloss", "eval/calibration", "summary/samples_per_sec", "summary/time/step_ms"]:
        assert tag in s, (tag, sorted(s))
    for t in range(1, 27):
        pulled = s[f"rows_pulled_per_step/C{t}"]
        assert pulled == s[f"rows_pushed_per_step/C{t}"]
        assert all(0 < v <= 512 for _, v in pulled), pulled
    # The final evaluation at the last step, as the summary has it (float32 in the event file).
    step, auc = s["eval/auc"][-1]
    assert step == summary["step"] == 40
    assert auc == pytest.approx(summary["auc"], rel=1e-6)
    assert s["summary/samples_per_sec"][-1][1] == pytest.approx(summary["samples_per_sec"], rel=1e-6)
    # Several progress points, their steps increasing.
    steps = [st for st, _ in s["train/loss"]]
    assert len(steps) >= 2 and steps == sorted(steps)
    # The phases of a step add up to the step (written as float32).
    t = summary["time"]
    assert t["steps"] == 40
    assert sum(t["critical"].values()) == pytest.approx(t["seconds"], rel=1e-9)
    phases = [v for tag, v in ((k, s[k][-1][1]) for k in s if k.startswith("summary/time/") and k != "summary/time/step_ms")]
    assert sum(phases) == pytest.approx(s["summary/time/step_ms"][-1][1], rel=1e-4)
    assert len(t["cpu"]["servers"]) == 2 and t["cpu"]["trainer"] > 0
    assert [row["table"] for row in summary["table_rows"]] == [f"C{i}" for i in range(1, 27)]
    assert all(row["pulled"] == row["pushed"] > 0 for row in summary["table_rows"])
    # The closing lines say where the time went.
    assert "time per step" in r.stdout and "bound by" in r.stdout, r.stdout


def test_trainer_names_an_unwritable_tensorboard_dir(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    r = trainer_demo(tmp_path, "--tensorboard-dir", str(f / "tb"))
    assert r.returncode != 0
    assert "--tensorboard-dir" in r.stderr and str(f / "tb") in r.stderr, r.stderr[-2000:]


def test_pstrain_demo_writes_events(tmp_path):
    tb_dir, summary_json = tmp_path / "tb", tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "pstrain.demo", "--rows", "8192", "--test-rows", "2048", "--batch-size", "1024",
           "--servers", "1", "--data-dir", str(tmp_path / "data"), "--tensorboard-dir", str(tb_dir),
           "--progress-secs", "0", "--summary-json", str(summary_json)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(summary_json.read_text())
    s = scalars(tb_dir)
    assert [st for st, _ in s["train/loss"]] == list(range(1, 9))
    assert all(math.isfinite(v) and v > 0 for _, v in s["train/loss"])
    assert all(v >= 0 for _, v in s["time/pull_ms"])
    assert s["eval/auc"] == [(8, pytest.approx(summary["auc"], rel=1e-6))]
