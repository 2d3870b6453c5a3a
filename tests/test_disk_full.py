"""A full disk in each writer: convert, pull, prompt-cache files, the database (command line and web page).

Each test mounts a small tmpfs, fills it, and checks the error says the disk is full and that nothing
half-written is left. tmpfs mounts need root: skipped otherwise.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inference.errors import DiskFullError

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(mb)`: a fresh tmpfs of that size; unmounted at the end."""
    mounts = []

    def mount(mb: int) -> Path:
        d = tmp_path / f"disk{len(mounts)}"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m,mode=0700", "tmpfs", str(d)], check=True)
        mounts.append(d)
        return d

    yield mount
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Write a filler file until the disk is full (less `leave` bytes); its path."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def test_a_conversion_that_fills_the_disk_says_so_and_leaves_nothing(small_disk, smollm2_gguf):
    from inference.convert import convert

    disk = small_disk(8)  # the demo store needs ~100 MB
    with pytest.raises(DiskFullError, match="disk filled up while converting"):
        convert(smollm2_gguf, disk / "smollm2", progress=False)
    assert list(disk.iterdir()) == []


def test_a_prompt_cache_write_on_a_full_disk_says_so_and_leaves_nothing(small_disk, smollm2_store):
    from appliance.promptcache import PromptCache
    from inference.engine import Engine

    engine = Engine.open(smollm2_store, context=256, threads=1)
    engine.forward(np.arange(1, 200))
    disk = small_disk(2)  # the KV rows of 199 positions are ~4.6 MB
    with pytest.raises(DiskFullError, match="the disk is full; the prompt cache was not saved"):
        engine.save_prompt_cache(disk / "a.pc")
    assert list(disk.iterdir()) == []
    # the worker's index of prompt caches: no .kv without its .json, no half-written .json
    cache = PromptCache(disk, "smollm2", max_bytes=2**30, max_age=3600)
    cache.save(engine, "session-1")  # written by the cache's writer thread, which logs the failure
    cache.flush()
    assert [p.name for p in (disk / "smollm2").iterdir()] == [] and not cache.entries


def django(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "django", *args], env=env, cwd=ROOT, capture_output=True, text=True)


@pytest.mark.slow  # ~14 s: four Django processes and a daphne
def test_the_database_on_a_full_disk_refuses_clearly_and_stays_whole(small_disk):
    from appliance import processes

    data = small_disk(3)
    env = processes.base_env(
        RKMOJO_DATA=str(data), REDIS_URL="redis://127.0.0.1:6379/15", RKMOJO_SETUP_TOKEN_FILE=str(data / "setup-token")
    )
    env = {k: v for k, v in env.items() if k != "DATABASE_URL"}
    assert django(env, "migrate", "--noinput", "-v", "0").returncode == 0
    token = django(env, "setuptoken").stdout.strip()
    port = processes.free_port()
    web = processes.Child("daphne", processes.daphne_argv("127.0.0.1", port), env, None, cwd=str(ROOT)).start()
    try:
        processes.wait_for(lambda: processes.tcp_open("127.0.0.1", port), 30, "daphne", child=web)
        import httpx

        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            page = c.get("/setup/")
            csrf = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
            filler = fill(data)
            r = c.post(
                "/setup/",
                data={
                    "csrfmiddlewaretoken": csrf,
                    "token": token,
                    "username": "admin",
                    "password1": "a long pass 42",
                    "password2": "a long pass 42",
                },
            )
            assert r.status_code == 507 and "data disk is full" in r.text, r.text
        key = django(env, "apikey", "create", "home")
        assert key.returncode != 0 and "the data disk is full: no key was created" in key.stderr
        filler.unlink()
        check = django(
            env,
            "shell",
            "-v",
            "0",
            "-c",
            "from django.db import connection; c = connection.cursor(); "
            "print(c.execute('PRAGMA integrity_check').fetchone()[0]); "
            "from django.contrib.auth.models import User; from webui.models import ApiKey; "
            "print(User.objects.count(), ApiKey.objects.count())",
        )
        assert check.stdout.split() == ["ok", "0", "0"], check.stderr  # whole, and nothing half-written
    finally:
        web.stop()


def test_a_pull_that_fills_the_disk_says_so_and_installs_nothing(small_disk, smollm2_gguf, tmp_path):
    from inference.pull import pull
    from test_pull import HubServer

    root = tmp_path / "hub" / "files" / "demo"
    root.mkdir(parents=True)
    (root / smollm2_gguf.name).symlink_to(smollm2_gguf)
    server = HubServer(tmp_path / "hub")
    disk = small_disk(8)
    try:
        with pytest.raises(DiskFullError, match="the disk is full; nothing is installed") as e:
            pull(f"{server.url}/files/demo/resolve/main/{smollm2_gguf.name}", disk, progress=False)
    finally:
        server.close()
    assert "kept" in str(e.value) and "resume" in str(e.value)
    assert not (disk / "smollm2-135m-instruct.q4_1").exists()
