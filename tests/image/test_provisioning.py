"""image.yml run a second time on the root filesystem the image build provisioned would change nothing.

Stage 30 runs the play again right after provisioning, in Ansible's check mode, on the very tree that
becomes the image, and keeps its output beside the cache entry: a task that is not idempotent reports
`changed` there. (Re-applying the play for real to an unpacked copy proved the same at the cost of a
second copy and a second emulated run of every task.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from imagetest import build, read_env


@pytest.mark.slow
def test_a_second_run_of_the_image_playbook_reports_no_change():
    out = build("qemu-arm64")
    stages = read_env(out / "rkmojo-qemu-arm64.build.env")
    log = Path(stages["STAGE_30_PROVISION"].removesuffix(".tar") + ".second-run.log").read_text()
    recap = re.search(r"rootfs\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", log)
    assert recap, log[-5000:]
    changed = re.findall(r"^changed: \[rootfs\].*$|^TASK \[.*$", log, re.M)
    assert log.startswith("provision.sh: check mode")  # a real second run would have changed the image
    assert recap.group(2) == "0", "\n".join(changed)
    assert recap.group(4) == "0" and recap.group(3) == "0"
