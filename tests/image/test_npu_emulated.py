"""The whole engine with the NPU backend on the board's own software, emulated: the image's arm64 root
filesystem (stage 30: bookworm, the appliance's venv, the wheel's NEON kernels) run under qemu-aarch64,
with the librknnrt stand-in (tests/rknnrt_standin.c, cross-compiled) at /usr/lib/librknnrt.so.

This is the closest to a board without one: `backend="auto"` on aarch64 finds the library, runs its
self-test and puts prefill's dense matmuls on it; greedy tokens must equal the CPU's. The stand-in
computes on the CPU, so nothing here says how fast the NPU is (docs/npu.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from imagetest import build, read_env

HERE = Path(__file__).parent
STANDIN = HERE.parent / "rknnrt_standin.c"


def unpack(tar: str, root: Path) -> None:
    root.mkdir()
    subprocess.run(["tar", "-xpf", tar, "-C", str(root), "--numeric-owner"], check=True)


def in_root(root: Path, *argv: str) -> subprocess.CompletedProcess:
    """argv in the arm64 root (binfmt runs it under qemu-aarch64), with its own /proc, in a private
    mount namespace so that nothing stays mounted after it."""
    script = f'mount -t proc proc "{root}/proc" && exec chroot "{root}" /usr/bin/env -i LANG=C.UTF-8 "$@"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.mark.slow
def test_the_board_software_under_emulation_uses_the_npu_and_answers_as_the_cpu(tmp_path, smollm2_store, moe_store):
    cc = shutil.which("aarch64-linux-gnu-gcc")
    if cc is None:
        pytest.skip("no aarch64 cross compiler: run scripts/setup --test")
    out = build("qemu-arm64")
    root = tmp_path / "root"
    unpack(read_env(out / "rkmojo-qemu-arm64.build.env")["STAGE_30_PROVISION"], root)
    # the runtime's place on a board (the npu role puts the vendor's file there)
    subprocess.run(
        [cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-march=armv8-a", str(STANDIN), "-o"]
        + [str(root / "usr/lib/librknnrt.so")],
        check=True,
    )
    work = root / "tmp/npu"
    shutil.copytree(smollm2_store, work / "dense")
    shutil.copytree(moe_store, work / "moe")
    shutil.copy(HERE / "npu_emulated_run.py", work / "run.py")

    r = in_root(root, "/opt/rkmojo/bin/python", "/tmp/npu/run.py", "/tmp/npu/dense", "/tmp/npu/moe")
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["machine"] == "aarch64"
    for model in ("dense", "moe"):
        runs = got[model]
        assert runs["cpu"]["backend"] == "cpu"
        # auto on aarch64 with the library present: the self-test passed and the NPU took prefill
        assert runs["auto"]["backend"] == "rknpu", runs["auto"]["reason"]
        assert runs["auto"]["reason"].startswith("matmuls: self-test passed")
        assert runs["auto"]["tokens"] == runs["cpu"]["tokens"], model
        assert runs["rknpu-int8"]["backend"] == "rknpu"
        same = sum(a == b for a, b in zip(runs["rknpu-int8"]["tokens"], runs["cpu"]["tokens"]))
        print(f"{model}: fp16 tokens = the CPU's; int8 {same}/{len(runs['cpu']['tokens'])} the same")
