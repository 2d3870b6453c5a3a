"""Helpers of the image tests: the build (cached under RKMOJO_IMAGE_CACHE), a test SSH key, skips.

The slow tests build images with image/build, which needs root, mmdebstrap, qemu-user-static and
binfmt (scripts/setup --test installs them). Every build here uses the same inputs (the test key, a
stand-in vendor U-Boot, no NPU runtime by the explicit --no-npu-runtime), so the stages they share are
built once and reused from the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGE = REPO / "image"
PROVISIONING = REPO / "provisioning"
CACHE = Path(os.environ.get("RKMOJO_IMAGE_CACHE", "/var/cache/rkmojo-image"))
OUT = CACHE / "test-out"
BUILD_TOOLS = ("mmdebstrap", "sgdisk", "bmaptool", "mkfs.ext4", "debugfs", "e2fsck", "xz", "chroot")


def test_ssh_key() -> Path:
    """An ed25519 key kept in the cache (a new key would rebuild the provisioned root filesystem)."""
    key = CACHE / "test-ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rkmojo-image-test", "-f", str(key)], check=True
        )
    return key


test_ssh_key.__test__ = False  # a helper, not a test


def stand_in_uboot() -> Path:
    """A stand-in for the vendor's u-boot-rockchip.bin: fixed pseudo-random bytes of a plausible size.

    It proves the assembly (bytes land at sector 64, nothing overlaps the root partition), not that a
    board boots: Debian has no U-Boot for RK3588 (see docs/image.md).
    """
    d = CACHE / "test-vendor-uboot"
    f = d / "u-boot-rockchip.bin"
    if not f.exists():
        import random

        d.mkdir(parents=True, exist_ok=True)
        f.write_bytes(random.Random(3588).randbytes(9 * 2**20 + 12345))
    return d


BOARDS = ("qemu-arm64", "rock5b", "orangepi5-plus")  # the order scripts/test builds them in ahead
BUILD_SECONDS: dict[str, float] = {}  # seconds this process spent in image/build, by board (tests/phases.py)


def missing_build_tools() -> str | None:
    if os.geteuid() != 0:
        return "image builds need root (chroot, mounts)"
    missing = [t for t in BUILD_TOOLS if shutil.which(t) is None]
    return f"missing {', '.join(missing)}: run scripts/setup --test" if missing else None


def need_build_tools() -> None:
    reason = missing_build_tools()
    if reason:
        pytest.skip(reason)


def build(board: str, *extra: str) -> Path:
    """Run image/build for `board` into OUT/board (cached stages make a repeat cheap); the out dir.

    No image the tests use is compressed: the qemu-arm64 one is booted raw, the RK3588 ones are checked
    raw, and stage 50 is tested on a small image (test_flash.py), which is all it would prove here.
    """
    need_build_tools()
    t0 = time.monotonic()
    try:
        return _build(board, *extra)
    finally:
        BUILD_SECONDS[board] = BUILD_SECONDS.get(board, 0.0) + time.monotonic() - t0


def _build(board: str, *extra: str) -> Path:
    out = OUT / board
    argv = [str(IMAGE / "build"), "--board", board, "--ssh-key", str(test_ssh_key()) + ".pub", *extra, str(out)]
    argv[1:1] = ["--no-compress"]
    if board != "qemu-arm64":
        # no librknnrt.so here (a vendor input, not redistributable): the explicit opt-out; the refusal
        # without it is tested in test_static.py
        argv[1:1] = ["--vendor-uboot", str(stand_in_uboot()), "--no-npu-runtime"]
    out.mkdir(parents=True, exist_ok=True)
    # a file, not a pipe: a killed test leaves the build to clean up. Appended to: another build of the
    # same board may be running (image/build waits for the cache's lock) and writing to it.
    log = out / f"rkmojo-{board}.build.log"
    start = log.stat().st_size if log.exists() else 0
    with log.open("a") as f:
        f.write(f"--- {time.strftime('%F %T')} {' '.join(argv)}\n")
        f.flush()
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with log.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        raise AssertionError(f"image/build --board {board} failed ({r.returncode}), {log}:\n{text[-6000:]}")
    return out


def raw_image(out: Path, board: str) -> Path:
    """The build's raw disk image in the cache (read it, never write it: copy it to boot it)."""
    stages = read_env(out / f"rkmojo-{board}.build.env")
    return Path(stages["STAGE_40_DISK"]) / f"rkmojo-{board}.img"


def read_env(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v.strip('"')
    return out


def stage_seconds(board: str) -> dict[str, int]:
    """Each stage's seconds in the latest build of `board` (a stage found in the cache takes ~0 s)."""
    env = OUT / board / f"rkmojo-{board}.build.env"
    if not env.exists():
        return {}
    return {k.removesuffix("_SECONDS"): int(v) for k, v in read_env(env).items() if k.endswith("_SECONDS")}


def build_ahead() -> int:
    """`python tests/image/imagetest.py ahead`: scripts/test builds the images in the background while
    the other tests run, with the very arguments the tests use, so that the image tests (run last)
    find every stage in the cache. A failure here is reported by the test that builds it again."""
    reason = missing_build_tools()
    if reason:
        print(f"image builds ahead: skipped ({reason})")
        return 0
    for board in BOARDS:
        t0 = time.monotonic()
        try:
            _build(board)
            print(
                f"image builds ahead: {board} in {time.monotonic() - t0:.0f} s, stages {json.dumps(stage_seconds(board))}",
                flush=True,
            )
        except AssertionError as e:
            print(
                f"image builds ahead: {board} failed after {time.monotonic() - t0:.0f} s "
                f"(the image tests build it again and report it):\n{str(e)[-2000:]}",
                flush=True,
            )
            return 1
    return 0


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["ahead"]:
        sys.exit("usage: imagetest.py ahead")
    sys.exit(build_ahead())
