"""daphne's memory while it serves a conversation of 100k messages: three page views at once, then three exports.

A private stack without a worker (redis-server, daphne through `appliance.serve`, a fresh data directory)
holds one conversation of `--messages` short messages, written straight into the database as an import
would. After a warm-up on a conversation of 10 messages, `--views` clients ask for the page at the same time, then for its JSON
export, then its Markdown export; daphne's RSS (psutil) is sampled every 10 ms. Printed per phase: the
time each request took, the bytes it got, daphne's RSS before, its peak growth and what is left 3 s after.

    .venv/bin/python benchmarks/page_memory.py [--messages 100000] [--views 3] [--source DIR] [--json out.json]

`--source DIR` serves another checkout's web app (say the commit before, `git archive HEAD | tar -x -C DIR`)
against the same database and the same clients, to set the two side by side.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from appliance import processes  # noqa: E402


class Sampler(threading.Thread):
    """The peak RSS of one process while running, sampled every `interval` seconds."""

    def __init__(self, proc: psutil.Process, interval: float = 0.01):
        super().__init__(daemon=True)
        self.proc, self.interval, self.peak, self.stop = proc, interval, proc.memory_info().rss, threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)


def setup_data(messages: int) -> tuple[str, str, str]:
    """The user's session cookie, the long conversation's id and a short one's (to warm up on), in the
    database of RKMOJO_DATA."""
    import django

    django.setup()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Django's logging config says INFO: a line per request
    from django.contrib.auth import get_user_model
    from django.test import Client

    from webui.models import ChatMessage, ChatSession

    user = get_user_model().objects.create(username="reader")
    made = []
    for n in (messages, 10):
        s = ChatSession.objects.create(owner=user, source="web", model="smollm2", title=f"{n} messages")
        ChatMessage.objects.bulk_create(
            (
                ChatMessage(session=s, index=i, role=("user", "assistant")[i % 2], content=f"message number {i}")
                for i in range(n)
            ),
            batch_size=5000,
        )
        made.append(str(s.pk))
    c = Client()
    c.force_login(user)
    return f"sessionid={c.cookies['sessionid'].value}", *made


def phase(url: str, path: str, cookie: str, clients: int, daphne: psutil.Process) -> dict:
    before = daphne.memory_info().rss
    sampler = Sampler(daphne)
    sampler.start()
    results: list[tuple[float, int, int]] = []

    def one():
        t0 = time.perf_counter()
        size = 0
        with httpx.Client(timeout=600) as c, c.stream("GET", url + path, headers={"Cookie": cookie}) as r:
            for chunk in r.iter_bytes():
                size += len(chunk)
        results.append((time.perf_counter() - t0, size, r.status_code))

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(3)
    sampler.stop.set()
    sampler.join()
    after = daphne.memory_info().rss
    mb = 2**20
    return {
        "path": path,
        "status": sorted({s for _, _, s in results}),
        "seconds": [round(t, 2) for t, _, _ in results],
        "bytes": results[0][1],
        "rss_before_mb": round(before / mb, 1),
        "peak_growth_mb": round((sampler.peak - before) / mb, 1),
        "after_growth_mb": round((after - before) / mb, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--views", type=int, default=3, help="clients at once")
    ap.add_argument("--source", type=Path, default=ROOT, help="the checkout whose web app daphne serves")
    ap.add_argument("--json", type=Path, help="write the results here too")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="page-memory-") as tmp:
        data = Path(tmp)
        (data / "logs").mkdir()
        argv, redis_url = processes.redis_argv(data)
        redis = processes.Child("redis", argv, processes.base_env(), data / "logs" / "redis.log").start()
        daphne = None
        try:
            processes.wait_for(lambda: processes.redis_ready(redis_url), 10, "redis-server", child=redis)
            env = processes.base_env(RKMOJO_DATA=str(data), REDIS_URL=redis_url)
            os.environ.update(env, DJANGO_SETTINGS_MODULE="appliance.settings")
            subprocess.run(processes.migrate_argv(), env=env, cwd=ROOT, check=True)
            t0 = time.perf_counter()
            cookie, pk, short = setup_data(a.messages)
            print(f"{a.messages} messages written in {time.perf_counter() - t0:.1f} s")
            port = processes.free_port()
            url = f"http://127.0.0.1:{port}"
            daphne = processes.Child(
                "daphne", processes.daphne_argv("127.0.0.1", port), env, data / "logs" / "daphne.log", cwd=str(a.source)
            ).start()
            processes.wait_for(lambda: processes.tcp_open("127.0.0.1", port), 30, "daphne", child=daphne)
            proc = psutil.Process(daphne.pid)
            with httpx.Client(timeout=600) as c:  # warm: imports, templates, the first database connection
                for path in (f"/chat/{short}/", f"/chat/{short}/export/", f"/chat/{short}/export/?format=md"):
                    assert c.get(url + path, headers={"Cookie": cookie}).status_code == 200
            results = [
                phase(url, path, cookie, a.views, proc)
                for path in (f"/chat/{pk}/", f"/chat/{pk}/export/?format=json", f"/chat/{pk}/export/?format=md")
            ]
        finally:
            if daphne is not None:
                daphne.stop(15)
            redis.stop()
    for r in results:
        print(json.dumps(r))
    if a.json:
        a.json.write_text(json.dumps({"messages": a.messages, "views": a.views, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
