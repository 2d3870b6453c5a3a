"""`rkmojo up`: the whole service on one machine, in the foreground.

Starts a private redis-server on a unix socket in the data directory (unless `REDIS_URL` is set),
applies the database migrations, installs the demo model on first start, then runs daphne and one
Celery worker as child processes and prints the URL. A worker that dies is restarted; Ctrl-C or
SIGTERM stops every child (web and worker first, Redis last) and waits for each. The children also
get SIGTERM from the kernel should this process die without stopping them (`processes.Child`).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import processes

RESTARTS = 5  # worker restarts allowed within RESTART_WINDOW seconds before giving up
RESTART_WINDOW = 120.0


def _say(msg: str) -> None:
    print(f"rkmojo up: {msg}", flush=True)


def install_demo(models_dir: Path) -> str | None:
    """Convert the bundled demo model into `models_dir` when no model is installed; its name (or None)."""
    from inference import demo
    from inference.errors import RkmojoError

    if any((d / "manifest.json").is_file() for d in models_dir.glob("*")):
        return demo.DEMO_NAME if (models_dir / demo.DEMO_NAME / "manifest.json").is_file() else None
    try:
        demo.demo_gguf()
    except RkmojoError as e:
        _say(f"no model installed and no demo model to install ({e}); install one with `rkmojo pull`")
        return None
    _say(f"installing the demo model {demo.DEMO_NAME} (first start)")
    demo.install(models_dir, progress=sys.stderr.isatty())
    return demo.DEMO_NAME


def add_command(sub) -> None:
    """Register `rkmojo up` on the engine's command line (the `rkmojo.commands` entry point)."""
    up = sub.add_parser("up", help="run the appliance: web API (OpenAI and Ollama), a worker, Redis; Ctrl-C stops")
    up.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0: the LAN)")
    up.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    up.add_argument("--worker-name", default=None, help="this board's name (default $RKMOJO_WORKER_NAME, the host name)")
    up.add_argument("--no-demo", action="store_true", help="do not install the demo model on first start")
    up.add_argument("--create-api-key", metavar="NAME", help="create an API key, print it once, and exit")
    up.set_defaults(fn=_cmd_up)


def _cmd_up(a) -> int:
    if a.create_api_key:
        return create_api_key(a.create_api_key)
    return run(a.host, a.port, demo=not a.no_demo, worker_name=a.worker_name)


def create_api_key(name: str) -> int:
    env = processes.base_env()
    subprocess.run(processes.migrate_argv(), env=env, check=True)
    return subprocess.run([sys.executable, "-m", "django", "apikey", "create", name], env=env).returncode


def run(host: str, port: int, *, demo: bool = True, worker_name: str | None = None) -> int:
    """Run the service until SIGINT/SIGTERM; 0 on a clean stop, 1 when a part of it failed."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")
    from . import settings as s

    data = s.DATA_DIR
    logs = data / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stopping = {"signal": None}

    def on_signal(signum, _frame):
        stopping["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    children: list[processes.Child] = []
    try:
        redis_url = os.environ.get("REDIS_URL")
        if not redis_url:
            argv, redis_url = processes.redis_argv(data)
            Path(processes.unix_socket_path(redis_url)).unlink(missing_ok=True)
            redis = processes.Child("redis-server", argv, processes.base_env(), None).start()
            children.append(redis)
            processes.wait_for(lambda: processes.redis_ready(redis_url), 15, "redis-server", child=redis)
        elif not processes.redis_ready(redis_url):
            _say(f"REDIS_URL={redis_url} does not answer; start that Redis or unset REDIS_URL")
            return 1
        preload = s.RKMOJO["PRELOAD"] or (install_demo(s.MODELS_DIR) if demo else None) or ""
        env = processes.base_env(REDIS_URL=redis_url, RKMOJO_DATA=str(data), RKMOJO_PRELOAD=preload,
                                 RKMOJO_WORKER_NAME=worker_name)
        subprocess.run(processes.migrate_argv(), env=env, check=True)
        web = processes.Child("daphne", processes.daphne_argv(host, port), env, logs / "daphne.log").start()
        children.append(web)
        name = worker_name or s.RKMOJO["WORKER_NAME"]
        worker = processes.Child("worker", processes.worker_argv(name), env, logs / "worker.log").start()
        children.append(worker)
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        processes.wait_for(lambda: processes.tcp_open(shown, port) or bool(stopping["signal"]), 60,
                           f"daphne on port {port}", child=web)
        processes.wait_for(lambda: _registered(redis_url, name) or bool(stopping["signal"]), 120,
                           "the worker to start", child=worker)
        if not stopping["signal"]:
            _say(f"serving on http://{shown}:{port}  (OpenAI base URL http://{shown}:{port}/v1, Ollama host "
                 f"http://{shown}:{port}); data in {data}, logs in {logs}; Ctrl-C stops")
        return _supervise(children, stopping)
    except RuntimeError as e:
        _say(str(e))
        return 1
    finally:
        _stop_all(children)


def _registered(redis_url: str, name: str) -> bool:
    import redis

    from . import bus

    try:
        return redis.Redis.from_url(redis_url, socket_connect_timeout=1).exists(bus.k_worker(name)) == 1
    except redis.RedisError:
        return False


def _supervise(children: list, stopping: dict) -> int:
    restarts: list[float] = []
    while not stopping["signal"]:
        time.sleep(0.2)
        for child in children:
            if child.alive() or stopping["signal"]:
                continue
            if child.name != "worker":
                _say(f"{child.name} exited with status {child.proc.returncode}; stopping"
                     + (f" (see {child.log})" if child.log else ""))
                return 1
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < RESTART_WINDOW] + [now]
            if len(restarts) > RESTARTS:
                _say(f"the worker keeps dying (see {child.log}); stopping")
                return 1
            _say(f"the worker exited with status {child.proc.returncode}; restarting it")
            child.start()
    _say("stopping")
    return 0


def _stop_all(children: list) -> None:
    # web and worker first (they talk to Redis while stopping), Redis last
    for child in reversed(children):
        if child.name != "redis-server":
            child.stop(timeout=15)
    for child in children:
        if child.name == "redis-server":
            child.stop(timeout=10)
