"""`rkmojo up`: the whole service on one machine, in the foreground.

Starts a private redis-server on a unix socket in the data directory (unless `REDIS_URL` is set),
applies the database migrations, installs the demo model on first start, then runs daphne and one
Celery worker as child processes and prints where it listens, the API key rule and, while no
administrator exists, the setup URL with its one-time token. A worker or private redis-server that
dies is restarted (web and worker reconnect to Redis by themselves); Ctrl-C or
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

RESTARTS = 5  # restarts of one child allowed within RESTART_WINDOW seconds before giving up
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
    up.add_argument(
        "--worker-name", default=None, help="this board's name (default $RKMOJO_WORKER_NAME, the host name)"
    )
    up.add_argument("--no-demo", action="store_true", help="do not install the demo model on first start")
    up.add_argument("--create-api-key", metavar="NAME", help="create an API key, print it once, and exit")
    up.add_argument(  # the scopes are webui.models.Scope's; `apikey create` checks the name
        "--scope",
        default="chat",
        help="with --create-api-key: chat (generate and list; the default) or admin (also pull, delete, load, unload)",
    )
    up.set_defaults(fn=_cmd_up)


def _cmd_up(a) -> int:
    if a.create_api_key:
        return create_api_key(a.create_api_key, a.scope)
    return run(a.host, a.port, demo=not a.no_demo, worker_name=a.worker_name)


def create_api_key(name: str, scope: str = "chat") -> int:
    os.umask(0o077)  # it may be the first start: the database it creates is private
    env = processes.base_env()
    subprocess.run(processes.migrate_argv(), env=env, check=True)
    argv = [sys.executable, "-m", "django", "apikey", "create", name, "--scope", scope]
    return subprocess.run(argv, env=env).returncode


def run(host: str, port: int, *, demo: bool = True, worker_name: str | None = None) -> int:
    """Run the service until SIGINT/SIGTERM; 0 on a clean stop, 1 when a part of it failed."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")
    from . import settings as s

    data = s.DATA_DIR
    logs = data / "logs"
    os.umask(0o077)  # every file the service and its children write is the service user's alone
    logs.mkdir(parents=True, exist_ok=True)
    data.chmod(0o700)
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
            redis = processes.Child("redis-server", argv, processes.base_env(), None)
            redis.before_start = lambda: Path(processes.unix_socket_path(redis_url)).unlink(missing_ok=True)
            children.append(redis.start())
            processes.wait_for(lambda: processes.redis_ready(redis_url), 15, "redis-server", child=redis)
        elif not processes.redis_ready(redis_url):
            _say(f"REDIS_URL={redis_url} does not answer; start that Redis or unset REDIS_URL")
            return 1
        preload = s.RKMOJO["PRELOAD"] or (install_demo(s.MODELS_DIR) if demo else None) or ""
        # RKMOJO_HOME too: the engine's own data (models/, the NPU calibration) is this data directory
        env = processes.base_env(
            REDIS_URL=redis_url,
            RKMOJO_DATA=str(data),
            RKMOJO_HOME=str(data),
            RKMOJO_PRELOAD=preload,
            RKMOJO_WORKER_NAME=worker_name,
        )
        subprocess.run(processes.migrate_argv(), env=env, check=True)
        private_files(data)
        token = subprocess.run(
            processes.setup_token_argv(), env=env, check=True, capture_output=True, text=True
        ).stdout.strip()
        web = processes.Child("daphne", processes.daphne_argv(host, port), env, logs / "daphne.log").start()
        children.append(web)
        name = worker_name or s.RKMOJO["WORKER_NAME"]
        worker = processes.Child("worker", processes.worker_argv(name, env=env), env, logs / "worker.log").start()
        children.append(worker)
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        processes.wait_for(
            lambda: processes.tcp_open(shown, port) or bool(stopping["signal"]), 60, f"daphne on port {port}", child=web
        )
        processes.wait_for(
            lambda: _registered(redis_url, name) or bool(stopping["signal"]), 120, "the worker to start", child=worker
        )
        if not stopping["signal"]:
            for line in startup_lines(host, port, s.RKMOJO["API_KEYS"], token, data):
                _say(line)
        return _supervise(children, stopping)
    except RuntimeError as e:
        _say(str(e))
        return 1
    finally:
        _stop_all(children)


def private_files(data: Path) -> None:
    """The data directory and its folders 0700; the database, secret key and prompt caches 0600 (older
    installs made them 0644 and 0755)."""
    data.chmod(0o700)
    for f in [data / "db.sqlite3", data / "secret_key", *data.glob("*/"), *data.glob("prompt-cache/**/*")]:
        if f.is_file():
            f.chmod(0o600)
        elif f.is_dir():
            f.chmod(0o700)


def startup_lines(host: str, port: int, key_policy: str, setup_token: str, data: Path) -> list[str]:
    """What `rkmojo up` tells its user at start: where it listens, the key rule, the setup URL."""
    from .hosts import machine_names

    if host in ("0.0.0.0", "::", ""):
        addrs = [a for a in machine_names() if a[0].isdigit() or (host == "::" and a.startswith("["))]
        where = f"all addresses ({host or '0.0.0.0'}), port {port}: this machine and the LAN"
    else:
        addrs = [f"[{host}]" if ":" in host else host]
        where = f"{host}, port {port}"
    urls = [f"http://{a}:{port}" for a in sorted(addrs, key=lambda a: (not a.startswith("127."), a))]
    first = urls[0]
    keys = {
        "remote": "clients on other machines need an API key (this machine's do not)",
        "always": "every client needs an API key",
        "never": "no client needs an API key (RKMOJO_API_KEYS=never)",
    }
    lines = [
        f"listening on {where}",
        "  " + "  ".join(urls),
        f"OpenAI base URL {first}/v1, Ollama host {first}",
        f"API keys: {keys[key_policy]}"
        + ("" if key_policy == "never" else "; make one with `rkmojo up --create-api-key NAME` or in the admin pages"),
    ]
    if setup_token:
        lines.append(
            f"no administrator yet: open {first}/setup/?token={setup_token} to create one (the token works once)"
        )
    lines.append(f"data in {data}, logs in {data / 'logs'}; Ctrl-C stops")
    return lines


def _registered(redis_url: str, name: str) -> bool:
    import redis

    from . import bus

    try:
        return redis.Redis.from_url(redis_url, socket_connect_timeout=1).exists(bus.k_worker(name)) == 1
    except redis.RedisError:
        return False


RESTARTED = ("worker", "redis-server")  # daphne's exit is a bug or a taken port: `rkmojo up` stops


def _supervise(children: list, stopping: dict) -> int:
    restarts: dict[str, list[float]] = {}
    while not stopping["signal"]:
        time.sleep(0.2)
        for child in children:
            if child.alive() or stopping["signal"]:
                continue
            if child.name not in RESTARTED:
                _say(
                    f"{child.name} exited with status {child.proc.returncode}; stopping"
                    + (f" (see {child.log})" if child.log else "")
                )
                return 1
            now = time.monotonic()
            times = [t for t in restarts.get(child.name, []) if now - t < RESTART_WINDOW] + [now]
            restarts[child.name] = times
            if len(times) > RESTARTS:
                _say(f"the {child.name} keeps dying" + (f" (see {child.log})" if child.log else "") + "; stopping")
                return 1
            _say(f"the {child.name} exited with status {child.proc.returncode}; restarting it")
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
