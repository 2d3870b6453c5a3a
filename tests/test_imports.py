"""Layers import one way (webui → appliance → inference), no module circle exists, and the code passes ruff (lint and format)."""

import graphlib
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_the_import_linter_contracts_are_kept():
    r = subprocess.run([BIN / "lint-imports", "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_module_imports_itself_through_a_circle():
    graph = grimp.build_graph("inference", "appliance", "webui")
    deps = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    try:
        graphlib.TopologicalSorter(deps).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"import circle: {' → '.join(e.args[1])}") from None


def test_the_command_line_imports_no_django_and_still_offers_up():
    code = (
        "import sys; from inference.cli import build_parser; p = build_parser(); "
        "p.parse_args(['up', '--no-demo']); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'webui')); "
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_ruff_finds_nothing():
    r = subprocess.run([BIN / "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr


def test_the_code_is_formatted_as_ruff_formats_it():
    r = subprocess.run([BIN / "ruff", "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, "run `.venv/bin/ruff format`:\n" + r.stdout[-3000:] + r.stderr
