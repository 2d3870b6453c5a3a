"""image/flash writes an image to a real block device (a loop device over a file), asking first."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from imagetest import IMAGE

MIB = 2**20


@pytest.fixture
def loop_disk(tmp_path):
    """A 32 MiB block device full of 0xAA bytes (what was on the disk before)."""
    if os.geteuid() != 0 or shutil.which("losetup") is None or shutil.which("bmaptool") is None:
        pytest.skip("needs root, losetup and bmaptool (scripts/setup --test)")
    backing = tmp_path / "disk.bin"
    backing.write_bytes(b"\xaa" * (32 * MIB))
    r = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"no loop device here: {r.stderr.strip()}")
    dev = r.stdout.strip()
    yield dev, backing
    subprocess.run(["losetup", "-d", dev])


@pytest.fixture
def image(tmp_path):
    """A sparse 16 MiB image with data in three places, published by the build's stage 50 (bmap, xz,
    checksums) as a board's image is; the raw image stays beside the published files."""
    disk = tmp_path / "disk-test"
    disk.mkdir()
    raw = disk / "rkmojo-test.img"
    rng = random.Random(6)
    with raw.open("wb") as f:
        f.truncate(16 * MIB)
        for at in (64 * 512, 5 * MIB, 16 * MIB - 8192):
            f.seek(at)
            f.write(rng.randbytes(8192))
    env = {**os.environ, "CACHE": str(tmp_path / "cache")}
    r = subprocess.run(
        [str(IMAGE / "stages" / "50-compress" / "run.sh"), str(disk), "rkmojo-test"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    published = Path(r.stdout.strip())
    for f in ("rkmojo-test.img.xz", "rkmojo-test.img.bmap", "rkmojo-test.img.xz.sha256", "rkmojo-test.img.sha256"):
        shutil.copy(published / f, tmp_path / f)
    subprocess.run(["sha256sum", "--quiet", "-c", "rkmojo-test.img.xz.sha256"], cwd=tmp_path, check=True)
    shutil.copy(raw, tmp_path / "rkmojo-test.img")
    return tmp_path / "rkmojo-test.img"


def test_flash_writes_the_image_and_its_holes_to_the_device(loop_disk, image):
    dev, backing = loop_disk
    r = subprocess.run([str(IMAGE / "flash"), "--yes", f"{image}.xz", dev], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"target: {dev}" in r.stdout and "size: 32M" in r.stdout
    written = backing.read_bytes()
    # the mapped blocks are the image's; bmaptool leaves unmapped ones as they were, which is fine for
    # a disk (the image's holes are free space of its filesystems)
    want = image.read_bytes()
    for at in (64 * 512, 5 * MIB, 16 * MIB - 8192):
        assert written[at : at + 8192] == want[at : at + 8192]
    assert written[16 * MIB :] == b"\xaa" * (16 * MIB)  # nothing past the image


def test_flash_asks_and_writes_nothing_without_a_yes(loop_disk, image):
    dev, backing = loop_disk
    r = subprocess.run([str(IMAGE / "flash"), f"{image}.xz", dev], input="no\n", capture_output=True, text=True)
    assert r.returncode != 0 and "nothing written" in r.stderr
    assert "Erase everything on" in r.stdout + r.stderr
    assert backing.read_bytes() == b"\xaa" * (32 * MIB)


def test_flash_refuses_a_mounted_device(loop_disk, tmp_path):
    dev, _ = loop_disk
    subprocess.run(["mkfs.ext4", "-q", dev], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", dev, str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("this kernel does not mount a filesystem from a loop device")
    try:
        img = tmp_path / "x.img"
        img.write_bytes(b"\0" * 4096)
        r = subprocess.run([str(IMAGE / "flash"), "--yes", str(img), dev], capture_output=True, text=True)
        assert r.returncode != 0 and "has mounted filesystems" in r.stderr and "unmount them first" in r.stderr
    finally:
        subprocess.run(["umount", str(mnt)])
