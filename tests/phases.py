"""Where a run of the suite spends its time: seconds per phase, printed at the end of every run.

Phases: set-up (scripts/test passes RKMOJO_SETUP_SECONDS), quick tests, slow tests, the image builds
(the ones scripts/test starts ahead in the background, and what the image tests still build
themselves, with the seconds of each stage built), the QEMU boot, the image playbook's idempotence
check, the RK3588 image checks. A slow phase is then visible in every CI log.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

PHASES = (
    "set-up",
    "quick tests",
    "slow tests",
    "image builds (tests wait)",
    "QEMU boot",
    "image idempotence",
    "RK3588 image checks",
    "image: other tests",
)


def phase_of(nodeid: str, slow: bool) -> str:
    path = nodeid.split("::")[0]
    if path.startswith("tests/image/"):
        named = {
            "tests/image/test_qemu_boot.py": "QEMU boot",
            "tests/image/test_provisioning.py": "image idempotence",
            "tests/image/test_rk3588_images.py": "RK3588 image checks",
        }
        if path in named:
            return named[path]
        if slow:
            return "image: other tests"
    return "slow tests" if slow else "quick tests"


class Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.slow: set[str] = set()

    def collected(self, items) -> None:
        self.slow = {i.nodeid for i in items if i.get_closest_marker("slow")}

    def report(self, rep) -> None:
        self.seconds[phase_of(rep.nodeid, rep.nodeid in self.slow)] += rep.duration

    def lines(self) -> list[str]:
        seconds = dict(self.seconds)
        if os.environ.get("RKMOJO_SETUP_SECONDS"):
            seconds["set-up"] = float(os.environ["RKMOJO_SETUP_SECONDS"])
        # the image tests' own builds are counted apart from what the test then did with the image
        try:
            from imagetest import BUILD_SECONDS, stage_seconds
        except ImportError:
            BUILD_SECONDS, stage_seconds = {}, lambda board: {}
        for board, s in BUILD_SECONDS.items():
            test_phase = "QEMU boot" if board == "qemu-arm64" else "RK3588 image checks"
            seconds["image builds (tests wait)"] = seconds.get("image builds (tests wait)", 0.0) + s
            seconds[test_phase] = max(0.0, seconds.get(test_phase, 0.0) - s)
        out = [f"{name:<24} {seconds[name]:7.0f} s" for name in PHASES if name in seconds]
        if "qemu-arm64" in BUILD_SECONDS:
            out += boot_step_lines()
        out += ahead_lines()
        for board in sorted(BUILD_SECONDS):
            if built(stage_seconds(board)):
                out.append(f"  stages built for {board} by the tests: {built(stage_seconds(board))}")
        return out


def built(stages: dict[str, int]) -> str:
    """The stages a build ran (one found in the cache takes about 0 s), with their seconds."""
    return ", ".join(f"{k} {v} s" for k, v in stages.items() if k != "TOTAL" and v > 1)


def boot_step_lines() -> list[str]:
    """The QEMU boot test's steps (test_qemu_boot.py writes them beside the image it booted)."""
    from imagetest import OUT

    steps = OUT / "qemu-arm64" / "boot-steps.tsv"
    if not steps.exists():
        return []
    return [
        f"  {name:<66} {float(sec):5.0f} s"
        for name, sec in (line.split("\t") for line in steps.read_text().splitlines() if "\t" in line)
    ]


def ahead_lines() -> list[str]:
    """What the background build (scripts/test starts it before the tests) printed: per board its
    seconds and the stages it built."""
    log = os.environ.get("RKMOJO_IMAGE_AHEAD_LOG")
    if not log or not Path(log).exists():
        return []
    out = []
    for line in Path(log).read_text(errors="replace").splitlines():
        m = re.match(r"image builds ahead: (\S+) in (\d+) s, stages (\{.*\})$", line)
        if m:
            stages = built(json.loads(m.group(3)))
            out.append(
                f"image build ahead, {m.group(1):<15} {int(m.group(2)):5d} s (in the background)"
                + (f": {stages}" if stages else "")
            )
        elif line.startswith("image builds ahead:"):
            out.append(line)
    return out
