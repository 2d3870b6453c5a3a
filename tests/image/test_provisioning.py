"""image.yml applied a second time to the root filesystem the image build provisioned changes nothing."""
from __future__ import annotations

import re
import subprocess

import pytest

from imagetest import CACHE, IMAGE, build, read_env


@pytest.mark.slow
def test_a_second_run_of_the_image_playbook_reports_no_change():
    out = build("qemu-arm64")
    stages = read_env(out / "rkmojo-qemu-arm64.build.env")
    work = CACHE / "test-idempotence"
    remove_tree(work)
    work.mkdir(parents=True)
    try:
        subprocess.run(["nice", "-n", "19", "tar", "-C", str(work), "--numeric-owner", "--xattrs", "--xattrs-include=*", "-xf",
                        stages["STAGE_30_PROVISION"]], check=True)
        r = subprocess.run([str(IMAGE / "stages" / "30-provision" / "provision.sh"), str(work),
                            stages["STAGE_20_WHEELHOUSE"],
                            stages["STAGE_30_PROVISION"].removesuffix(".tar") + ".vars.json"], capture_output=True, text=True)
        recap = re.search(r"rootfs\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", r.stdout)
        assert r.returncode == 0 and recap, r.stdout[-5000:] + r.stderr[-3000:]
        changed = re.findall(r"^changed: \[rootfs\].*$|^TASK \[.*$", r.stdout, re.M)
        assert recap.group(2) == "0", "\n".join(changed)
        assert recap.group(4) == "0"
    finally:
        remove_tree(work)


def remove_tree(path) -> None:
    """rm -rf of a root filesystem copy, after unmounting what a killed run left mounted in it (its
    /proc, /sys, /dev bind mount: removing through those would empty the host's /dev)."""
    subprocess.run(["bash", "-c", f'. "{IMAGE}/lib/common.sh"; remove_tree "$1"', "-", str(path)], check=True)
