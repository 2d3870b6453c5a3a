"""The real stack for the appliance tests: a private redis-server, daphne, Celery workers (solo pool).

One stack per test session (`stack`), built from the same commands `rkmojo up` runs
(`appliance.processes`), with the demo SmolLM2 store. API keys are required from every client
(`RKMOJO_API_KEYS=always`) so the tests prove the key check through the real clients; the stack's key is an
admin key (the tests pull, delete, load and unload with it); the context is 512 tokens so that "prompt
longer than the context" is cheap to provoke.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance import processes

MODEL = "smollm2"
ROOT = Path(__file__).resolve().parents[2]


class Stack:
    def __init__(self, base: Path, store: Path, *, more_models: dict[str, Path] | None = None, **env: str):
        """`more_models`: stores installed beside the demo model, by name; `env`: RKMOJO_* variables over the
        tests' own (a benchmark's RKMOJO_CONTEXT, say)."""
        self.base = base
        self.data = base / "data"
        (self.data / "models").mkdir(parents=True)
        (self.data / "logs").mkdir()
        for name, path in {MODEL: store, **(more_models or {})}.items():
            (self.data / "models" / name).symlink_to(path)
        self.store = store
        argv, self.redis_url = processes.redis_argv(self.data)
        self.redis = processes.Child("redis", argv, processes.base_env(), self.data / "logs" / "redis.log").start()
        processes.wait_for(lambda: processes.redis_ready(self.redis_url), 10, "redis-server", child=self.redis)
        self.env = processes.base_env(
            RKMOJO_DATA=str(self.data),
            REDIS_URL=self.redis_url,
            RKMOJO_API_KEYS="always",
            RKMOJO_THREADS="1",
            OMP_NUM_THREADS="1",
            RKMOJO_CONTEXT="512",
            RKMOJO_PRELOAD=MODEL,
            RKMOJO_WORKER_NAME="board-a",
            RKMOJO_NO_WORKER_TIMEOUT="30",
            RKMOJO_SETUP_TOKEN_FILE=str(base / "setup-token"),
        )
        self.env.update(env)
        subprocess.run(processes.migrate_argv(), env=self.env, cwd=ROOT, check=True)
        self.key = subprocess.run(
            [sys.executable, "-m", "django", "apikey", "create", "tests", "--scope", "admin"],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        self.port = processes.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.daphne = processes.Child(
            "daphne",
            processes.daphne_argv("127.0.0.1", self.port),
            self.env,
            self.data / "logs" / "daphne.log",
            cwd=str(ROOT),
        ).start()
        self.workers: dict[str, processes.Child] = {}
        self.start_worker("board-a", self.env)
        processes.wait_for(lambda: processes.tcp_open("127.0.0.1", self.port), 30, "daphne", child=self.daphne)

    # --- workers ---------------------------------------------------------------------------------
    def start_worker(self, name: str, env: dict, wait: bool = True) -> processes.Child:
        child = processes.Child(
            f"worker {name}",
            processes.worker_argv(name, env=env),
            {**env, "RKMOJO_WORKER_NAME": name},
            Path(env["RKMOJO_DATA"]) / "logs" / f"worker-{name}.log",
            cwd=str(ROOT),
        ).start()
        self.workers[name] = child
        if wait:
            self.wait_registered(name, child)
        return child

    def registration(self, name: str) -> dict | None:
        raw = self.r().get(f"rkmojo:worker:{name}")
        return json.loads(raw) if raw else None

    def wait_registered(self, name: str, child: processes.Child, timeout: float = 60) -> dict:
        def ready():
            reg = self.registration(name)
            return reg is not None and reg["pid"] == child.pid

        processes.wait_for(ready, timeout, f"worker {name} to register", child=child)
        return self.registration(name)

    def r(self):
        import redis

        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    # --- clients ---------------------------------------------------------------------------------
    def openai(self, **kw):
        import openai

        return openai.OpenAI(**{"base_url": f"{self.url}/v1", "api_key": self.key, **kw})

    def ollama(self, **kw):
        import ollama

        return ollama.Client(host=self.url, headers={"Authorization": f"Bearer {self.key}"}, **kw)

    def idle(self, timeout: float = 30) -> None:
        """Wait until no request is queued or running on any model."""

        def empty():
            r = self.r()
            return all(r.zcard(k) == 0 for k in r.scan_iter("rkmojo:queue:*"))

        processes.wait_for(empty, timeout, "the queues to drain")

    @staticmethod
    def wait_until(check, timeout: float = 10.0, interval: float = 0.05):
        """Poll `check()` until it returns something true; that value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(interval)
        raise AssertionError(f"condition not met within {timeout} s")

    def stop(self) -> None:
        for child in [*self.workers.values(), self.daphne]:
            child.stop(15)
        self.redis.stop()


@pytest.fixture(scope="session")
def stack(smollm2_store, tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("appliance"), smollm2_store)
    try:
        yield s
    finally:
        s.stop()
        if os.environ.get("RKMOJO_KEEP_TEST_LOGS"):
            shutil.copytree(s.data / "logs", Path(os.environ["RKMOJO_KEEP_TEST_LOGS"]), dirs_exist_ok=True)


@pytest.fixture
def oai(stack):
    return stack.openai()


@pytest.fixture
def http(stack):
    """An HTTP client with the stack's key that sends JSON bodies (`content=` included)."""
    import httpx

    with httpx.Client(
        base_url=stack.url,
        headers={"Authorization": f"Bearer {stack.key}", "Content-Type": "application/json"},
        timeout=60,
    ) as c:
        yield c


@pytest.fixture
def oll(stack):
    return stack.ollama()


@pytest.fixture
def django_for_stack(stack):
    """Django set up in this process against the stack's data directory and Redis."""
    os.environ.update(
        DJANGO_SETTINGS_MODULE="appliance.settings", RKMOJO_DATA=str(stack.data), REDIS_URL=stack.redis_url
    )
    import django
    from django.conf import settings

    django.setup()
    assert settings.REDIS_URL == stack.redis_url, "Django was set up earlier in this process for another stack"


@pytest.fixture
def session_cookie(django_for_stack):
    """`session_cookie(username)`: a logged-in session of that (new) user, as a browser's Cookie header."""

    def make(username: str) -> str:
        from django.contrib.auth import get_user_model
        from django.test import Client

        user, _ = get_user_model().objects.get_or_create(username=username)
        c = Client()
        c.force_login(user)
        return f"sessionid={c.cookies['sessionid'].value}"

    return make


@pytest.fixture
def pull_from_lan(stack, django_for_stack):
    """`pull_from_lan(on)`: save the Settings switch as the panel does and wait for the worker to apply it;
    switched off again after the test."""
    from webui import config

    def switch(on: bool) -> None:
        config.save({"pull_from_lan": True if on else None})

        def applied():
            reg = stack.registration("board-a") or {}
            return ("pull_from_lan" in (reg.get("settings") or {}).get("applied", [])) == on

        stack.wait_until(applied, 10)

    yield switch
    switch(False)


@pytest.fixture
def no_failures(django_for_stack):
    """No failed sign-ins or API keys on record (`webui.throttle`) before the test or after it: the stack's
    clients all come from 127.0.0.1, which a lock left behind would shut out of every later test."""
    from webui import throttle

    def forget():
        for count in throttle.counts():
            throttle.clear(count.subject)

    forget()
    yield
    forget()


@pytest.fixture
def socket_of(session_cookie):
    """`socket_of(username, origin=…)`: a WebsocketCommunicator with that user's session (made ahead:
    a session is made through the ORM, which refuses to run inside the test's event loop)."""
    from channels.testing import WebsocketCommunicator

    from appliance.asgi import application

    cookies = {name: session_cookie(name).encode() for name in ("chatter",)}

    def make(username: str | None, origin: bytes = b"http://127.0.0.1"):
        headers = [(b"host", b"127.0.0.1"), (b"origin", origin)]
        if username:
            headers.append((b"cookie", cookies[username]))
        return WebsocketCommunicator(application, "/ws/chat/", headers=headers)

    return make
