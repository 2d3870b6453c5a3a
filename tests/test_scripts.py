"""The README's commands: `scripts/run` starts with a plain `scripts/setup`, which must succeed once
everything is installed (the test command has just run `scripts/setup --test`)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_plain_setup_succeeds_where_everything_is_installed():
    r = subprocess.run(["scripts/setup"], cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "demo model:" in r.stdout
