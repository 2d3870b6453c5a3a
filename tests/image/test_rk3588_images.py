"""The RK3588 images are built and checked statically (no emulator models the board).

The vendor U-Boot is a stand-in (Debian has none for RK3588): the checks prove where the bytes go,
not that a board boots; docs/image.md has the serial-console checklist for that. The images are checked
raw: stage 50 (bmap, xz, checksums) is the same for every image and is tested on a small one.
"""

from __future__ import annotations

import subprocess

import pytest

from imagetest import IMAGE, build, raw_image, read_env, stand_in_uboot


@pytest.mark.slow
@pytest.mark.parametrize("board", ["rock5b", "orangepi5-plus"])
def test_the_rk3588_image_passes_the_static_checks(board):
    out = build(board)  # raw: the compression stage is tested on a small image (test_flash.py)
    name = f"rkmojo-{board}"
    r = subprocess.run(
        [
            str(IMAGE / "check"),
            str(raw_image(out, board)),
            str(out / f"{name}.layout.env"),
            "--bootloader-dir",
            str(stand_in_uboot()),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout
    layout = read_env(out / f"{name}.layout.env")
    assert layout["CONSOLE"] == "ttyS2,1500000" and layout["DTB"].startswith("rockchip/rk3588")
