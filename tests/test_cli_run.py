"""`rkmojo run` as a person uses it: an interactive chat in a real terminal (pexpect), and `-p` one-shot."""

import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

ROOT = Path(__file__).resolve().parents[1]
STATS = r"\[\d+ tokens · (stop|length|cancelled) · TTFT [\d.]+ s · prefill \d+ tok/s.* · decode [\d.]+ tok/s\]"


@pytest.fixture(scope="module")
def home(smollm2_store, tmp_path_factory):
    """A models directory where the demo store is installed under its stable name."""
    home = tmp_path_factory.mktemp("home")
    (home / "models").mkdir()
    (home / "models" / "smollm2-135m-instruct").symlink_to(smollm2_store)
    return home


def env(home: Path) -> dict:
    return dict(os.environ, RKMOJO_HOME=str(home), PYTHONUNBUFFERED="1")


def run(home, *args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "inference.cli", "run", "smollm2-135m-instruct", *args],
        cwd=ROOT,
        env=env(home),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_one_shot_prints_only_the_answer(home):
    r = run(home, "-p", "What is the capital of France?", "--temperature", "0", "--max-tokens", "24")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "The capital of France is Paris.\n"
    assert r.stderr == ""
    r = run(
        home, "-p", "-", "--temperature", "0", "--max-tokens", "24", "--stats", stdin="What is the capital of France?"
    )
    assert r.stdout == "The capital of France is Paris.\n"
    assert r.stderr.count("\n") == 1 and "tokens · stop" in r.stderr


def test_bad_parameters_and_overflow_are_one_line_errors(home):
    r = run(home, "-p", "hi", "--top-p", "2")
    assert r.returncode == 1 and r.stderr == "rkmojo: error: --top-p=2.0 is out of range; allowed: (0, 1]\n"
    r = run(home, "-p", "hi", "--max-tokens", "100000", "--context", "2048")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "max_tokens is 100000" in r.stderr and "context of 2048 tokens" in r.stderr


def test_the_interactive_chat_streams_keeps_history_and_survives_ctrl_c(home):
    child = pexpect.spawn(
        sys.executable,
        ["-m", "inference.cli", "run", "smollm2-135m-instruct", "--temperature", "0", "--max-tokens", "120"],
        cwd=str(ROOT),
        env=env(home),
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 200),
    )
    try:
        child.expect("/help for commands")
        child.expect(">>> ")
        child.sendline("What is the capital of France?")
        child.expect("The capital of France is Paris.")
        child.expect(STATS)
        child.expect(">>> ")

        child.sendline("/stats")
        child.expect(r"context\s+\d+ of \d+ tokens in the KV cache; 2 messages, 1 answers")
        child.expect(">>> ")

        child.sendline("Write a long story about a dragon who learns to bake bread.")
        child.expect("bread.\r\n")  # the echo of the line typed
        child.expect(r"\w+ \w+ \w+")  # the answer is streaming
        child.sendintr()
        child.expect(r"\[cancelled\]")
        child.expect(r"\[\d+ tokens · cancelled")
        child.expect(">>> ")

        child.sendline("/reset")
        child.expect(r"\[conversation reset\]")
        child.expect(">>> ")
        child.sendline("/stats")
        child.expect(r"0 messages, 2 answers")
        child.expect(">>> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
