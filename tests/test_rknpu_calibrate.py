"""`rkmojo npu calibrate` and the backend following it, against the librknnrt stand-in. The stand-in computes
on the CPU, so its timings mean nothing: these tests check the mechanism (the file written atomically,
keyed, read back; thresholds applied; a stale entry ignored), never a timing."""

import hashlib
import json
import logging
import os
import platform

import numpy as np
import pytest

from inference import backends
from inference.backends.rknpu import calibrate, calibration
from inference.backends.rknpu.calibrate import DENSE, EXPERT, Shape
from inference.backends.rknpu.calibration import Calibration, Timing
from inference.cli import main
from inference.errors import RkmojoError
from inference.quant import quantize

DRIVER = "0.9.8 (stand-in)"


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    """A data directory of the test's own: the calibration file never lands in the real one."""
    monkeypatch.setenv("RKMOJO_HOME", str(tmp_path / "data"))
    return tmp_path / "data"


def small_shapes():
    rng = np.random.default_rng(0)

    def q4(n, k):
        return quantize(rng.standard_normal((n, k)).astype(np.float32) / 8, "q4")

    return [
        Shape("q", DENSE, q4(96, 128)),
        Shape("expert", EXPERT, {"gate": q4(64, 128), "up": q4(64, 128), "down": q4(128, 64)}),
    ]


def write(path, **fields):
    entry = Calibration(
        library="/usr/lib/librknnrt.so",
        library_sha256=fields.pop("sha", "0" * 64),
        runtime="2.5.0",
        driver=fields.pop("driver", DRIVER),
        precision=fields.pop("precision", "fp16"),
        chunk=64,
        repeats=3,
        rows=[1, 8, 32],
        **fields,
    )
    from dataclasses import asdict

    calibration.write_entries(path, {entry.key: asdict(entry)})


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "inference.backends" and r.levelno >= logging.WARNING]


def test_a_calibration_is_stored_keyed_by_library_driver_and_precision(rknnrt_standin, data_dir):
    cal = calibrate.run_calibration(rknnrt_standin, shapes=small_shapes(), rows=(1, 8, 32, 128), repeats=1, chunk=32)
    path = data_dir / "npu-calibration.json"
    data = json.loads(path.read_text())
    assert data["format"] == 1 and list(data["entries"]) == [f"{sha(rknnrt_standin)}|{DRIVER}|fp16"]
    entry = data["entries"][cal.key]
    assert entry["rows"] == [1, 8, 32]  # rows above the chunk are not timed
    assert [(s["name"], s["kind"], len(s["cpu_s"]), len(s["npu_s"])) for s in entry["shapes"]] == [
        ("q", "dense", 3, 3),
        ("expert", "expert", 3, 3),
    ]
    assert all(t > 0 for s in entry["shapes"] for t in s["cpu_s"] + s["npu_s"])
    assert [p.name for p in data_dir.iterdir()] == ["npu-calibration.json"]  # no temp file left
    assert calibration.lookup(path, rknnrt_standin, DRIVER, "fp16") == cal  # read back as written


def test_another_precision_is_kept_beside_the_first(rknnrt_standin, data_dir):
    for precision in ("fp16", "int8"):
        calibrate.run_calibration(
            rknnrt_standin, precision=precision, shapes=small_shapes()[:1], rows=(8,), repeats=1, chunk=8
        )
    entries = calibration.read_entries(data_dir / "npu-calibration.json")
    assert sorted(k.rsplit("|", 1)[1] for k in entries) == ["fp16", "int8"]


def test_the_threshold_is_the_smallest_row_count_from_which_the_npu_always_won():
    rows = [1, 8, 16, 32, 64]

    def t(kind, cpu, npu):
        return Timing("x", kind, "", cpu, npu)

    flat = [1.0] * 5
    assert calibrate.threshold([t(DENSE, flat, [2, 0.5, 2, 0.5, 0.5])], rows, DENSE) == 32
    assert calibrate.threshold([t(DENSE, flat, [2] * 5)], rows, DENSE) is None
    assert calibrate.threshold([t(DENSE, flat, [0.5] * 5)], rows, DENSE) == 1
    assert calibrate.threshold([t(DENSE, flat, [0.5] * 5)], rows, EXPERT) is None  # nothing measured
    # summed over the kind's shapes: one shape's big loss outweighs another's small win
    two = [t(DENSE, flat, [0.9] * 5), t(DENSE, flat, [1.0, 1.0, 1.0, 1.5, 1.05])]
    assert calibrate.threshold(two, rows, DENSE) == 64


def test_rknpu_follows_the_boards_calibration(rknnrt_standin, data_dir, caplog):
    write(data_dir / "npu-calibration.json", sha=sha(rknnrt_standin), min_rows=8, expert_min_rows=16)
    with caplog.at_level(logging.WARNING, logger="inference.backends"):
        choice = backends.select("rknpu", library=rknnrt_standin, rows=64)
    try:
        npu = choice.backend
        assert (npu.min_rows, npu.expert_min_rows) == (8, 16)
        assert "calibrated: dense from 8 rows, experts from 16 rows" in choice.reason
        assert warnings(caplog) == []
    finally:
        npu.close()


def test_auto_on_an_rk3588_follows_it_too_and_an_option_overrides_the_experts(rknnrt_standin, data_dir, monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")  # as on the board
    write(data_dir / "npu-calibration.json", sha=sha(rknnrt_standin), min_rows=None, expert_min_rows=None)
    choice = backends.select("auto", library=rknnrt_standin, rows=64, expert_rows=4)
    try:
        assert (choice.name, choice.backend.min_rows, choice.backend.expert_min_rows) == ("rknpu", None, 4)
        assert "calibrated: dense on the CPU, experts from 4 rows" in choice.reason
        x = np.ones((64, 128), np.float32)
        w = quantize(np.ones((32, 128), np.float32), "q8")
        np.testing.assert_array_equal(choice.backend.linear(x, w), backends.CPU.linear(x, w))
        assert not choice.backend._weights  # the calibration said the NPU never won: no context made
    finally:
        choice.backend.close()


def test_without_a_calibration_dense_starts_at_32_rows_and_experts_stay_on_the_cpu(rknnrt_standin):
    choice = backends.select("rknpu", library=rknnrt_standin, rows=64)
    try:
        assert (choice.backend.min_rows, choice.backend.expert_min_rows) == (32, None)
        assert "not calibrated: dense from 32 rows, experts on the CPU" in choice.reason
    finally:
        choice.backend.close()


@pytest.mark.parametrize("other", ["library", "driver"])
def test_a_stale_calibration_is_ignored_with_one_log_line(rknnrt_standin, data_dir, caplog, other):
    key = {"sha": "f" * 64} if other == "library" else {"sha": sha(rknnrt_standin), "driver": "0.9.2"}
    write(data_dir / "npu-calibration.json", min_rows=1, expert_min_rows=1, **key)
    with caplog.at_level(logging.WARNING, logger="inference.backends"):
        choice = backends.select("rknpu", library=rknnrt_standin, rows=64)
    choice.backend.close()
    assert (choice.backend.min_rows, choice.backend.expert_min_rows) == (32, None)
    (line,) = warnings(caplog)
    assert "for another librknnrt or driver" in line and "rkmojo npu calibrate" in line


def test_a_failed_write_leaves_the_old_file(rknnrt_standin, data_dir, monkeypatch):
    path = data_dir / "npu-calibration.json"
    write(path, min_rows=8)
    before = path.read_bytes()

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        calibrate.run_calibration(rknnrt_standin, shapes=small_shapes()[:1], rows=(8,), repeats=1, chunk=8)
    assert path.read_bytes() == before and [p.name for p in data_dir.iterdir()] == [path.name]


def test_an_unreadable_file_is_named_with_the_fix(rknnrt_standin, data_dir, caplog):
    path = data_dir / "npu-calibration.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(RkmojoError, match=r"npu-calibration.json: not a readable NPU calibration .*delete it"):
        calibrate.run_calibration(rknnrt_standin, shapes=small_shapes(), repeats=1, chunk=8)
    with caplog.at_level(logging.WARNING, logger="inference.backends"):
        choice = backends.select("rknpu", library=rknnrt_standin, rows=64)  # the engine starts on the defaults
    choice.backend.close()
    assert choice.backend.min_rows == 32 and len(warnings(caplog)) == 1


def test_a_failed_self_test_writes_nothing(rknnrt_standin, data_dir, monkeypatch):
    monkeypatch.setenv("RKNN_STANDIN_FAULT", "create")
    with pytest.raises(RkmojoError, match="rknn_matmul_create"):
        calibrate.run_calibration(rknnrt_standin, shapes=small_shapes(), repeats=1, chunk=8)
    assert not (data_dir / "npu-calibration.json").exists()


def test_the_command_times_a_models_shapes_and_prints_the_table(rknnrt_standin, data_dir, tmp_path, capsys):
    from tiny_models import tiny_qwen3_moe

    from inference.convert import convert

    store = convert(tiny_qwen3_moe(tmp_path / "hf"), tmp_path / "store", "q8", progress=False)
    argv = ["npu", "calibrate", "--library", rknnrt_standin, "--model", str(store), "--rows", "1,8", "--repeats", "1"]
    assert main(argv + ["--chunk", "16"]) == 0
    out = capsys.readouterr().out
    assert "driver 0.9.8 (stand-in), fp16, chunk 16" in out
    assert "q, o" in out and "3 × 64×64 q8" in out  # shapes the model shares are timed once
    assert f"written to {data_dir / 'npu-calibration.json'}" in out
    assert main(argv + ["--repeats", "0"]) == 1
    assert "repeats 0" in capsys.readouterr().err
