"""The worker process's state: the engines it keeps loaded, its registration, its queues.

One Celery worker per board, solo pool: tasks run one at a time in the main thread, which is the only
thread that computes with an engine. A heartbeat thread re-registers the worker in Redis (what it
serves, what is loaded, what runs, what it did with the saved settings), applies the settings the
administrator saved (`live_settings`: keep-alive at once, engine options at the next load) and
unloads models idle past their keep-alive. While no task runs it also fills a newly loaded model's
expert caches with the experts most used before (`warm`, from `POPULARITY_DIR/NAME.npz`), and saves
that popularity after use (at most once a minute, at unload and at shutdown). It keeps each model's
last verify (`verify/NAME.json` beside `prompt-cache/`), which its description in the registration
carries. A stats thread (`stats.Sampler`) publishes the live view's `WorkerStats` once a second; it
reads the board's fields below (`state`, `prefill`, `tokens`, `last_ttft`, which the tasks keep
current) and the engines' counters, and never takes `lock`.

Celery signals wire it up: `worker_init` scans the models directory and subscribes to one queue per
model (`model.NAME`) and one for the board (`board.NAME`); `worker_ready` preloads a model and starts
the heartbeat; `worker_shutdown` unregisters.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from celery import signals
from django.conf import settings

from . import bus, live_settings
from .promptcache import PromptCache
from .stats import Sampler

log = logging.getLogger("rkmojo.worker")
POPULARITY_EVERY = 60.0  # s between saves of a used model's expert popularity
CHECK_SLICE = 0.2  # s of expert digest checks per idle heartbeat (a task arriving waits at most this long)
_BOARD: "Board | None" = None


def board() -> "Board":
    if _BOARD is None:
        raise RuntimeError("not inside an rkmojo worker (appliance.worker sets the board up at worker_init)")
    return _BOARD


@dataclass
class Loaded:
    engine: object
    size: int  # estimated bytes it holds
    loaded_at: float
    expires_at: float | None  # None: kept until something else needs the memory
    dirty: bool = False  # its KV holds a sequence not yet saved as a prompt-cache file
    prompt: int = 0  # the last request's prompt length (a request that extends it continues its conversation)
    session: str | None = None
    keep_alive: float | None = None  # the last request's own keep-alive; None: the worker's default
    used_at: float = 0.0  # when the last request finished (its expiry counts from here)
    warmed: bool = False  # its expert caches were filled from saved popularity (or there was none)
    unchecked: int | None = None  # experts whose digest is still to check while idle (None: not asked yet)
    popularity_saved: float = 0.0  # when its expert popularity was last written
    batcher: object = None  # its `inference.batch.Batcher` when the worker steps several requests together

    def __post_init__(self):
        self.used_at = self.used_at or self.loaded_at


@dataclass
class Board:
    """Everything one worker process owns. `lock` is held while a task uses an engine."""

    name: str
    hostname: str
    redis_url: str
    models_dir: Path
    cfg: dict
    boot: str = field(default_factory=lambda: uuid.uuid4().hex)
    models: dict = field(default_factory=dict)  # name → description (see `describe_model`)
    loaded: dict = field(default_factory=dict)  # name → Loaded
    caches: dict = field(default_factory=dict)  # name → PromptCache
    running: str | None = None
    installing: dict | None = None
    shutting_down: bool = False  # set on SIGTERM: the running generation stops at its next token
    lock: threading.RLock = field(default_factory=threading.RLock)
    # what the live view shows (`stats`); written by the task running, read by the stats thread
    state: str = "idle"  # idle, loading, prefill, decoding, embedding (`events.WorkerStats.state`)
    prefill: tuple[int, int] | None = None  # in state prefill: (prompt tokens computed, to compute)
    running_model: str | None = None
    active: dict = field(default_factory=dict)  # with parallel > 1: request id → model of every one running
    tokens: int = 0  # tokens generated since the worker started
    last_ttft: float | None = None  # the last finished generation's time to first token, s

    def __post_init__(self):
        self.r = bus.connect(self.redis_url)
        self.started = time.time()
        self._stop = threading.Event()
        self.settings = live_settings.Resolved()  # nothing saved applied yet
        self._settings_raw: str | None = None
        self._base: dict | None = None  # the configuration from the environment, before saved settings

    # --- models --------------------------------------------------------------------------------
    def scan(self) -> dict:
        """Re-read the models directory; returns {name: description}."""
        from inference.models_dir import list_models

        found = {}
        for m in list_models(self.models_dir)[0]:
            d = describe_model(m)
            found[m.name] = {**d, "verified": self.last_verify(m.name, d["digest"])}
        self.models = found
        return found

    def parallel(self) -> int:
        """How many generations this worker steps together (`EngineConfig.parallel`, RKMOJO_PARALLEL)."""
        return int(self.cfg["ENGINE"].get("parallel") or 1)

    def batcher(self, name: str):
        """The running batcher of loaded model `name` (`inference.batch.Batcher`), started at first use."""
        from inference.batch import Batcher

        with self.lock:
            ld = self.loaded[name]
            if ld.batcher is None:  # its slots' conversations saved and restored as the engine's own are
                ld.batcher = Batcher(ld.engine, saved=self.prompt_cache(name))
                ld.batcher.start()
            return ld.batcher

    def busy(self, name: str) -> bool:
        """Whether loaded model `name` has generations running or waiting in its batcher."""
        ld = self.loaded.get(name)
        b = ld.batcher if ld is not None else None
        return b is not None and bool(b.running or b.waiting)

    def budget(self) -> int:
        return self.cfg["ENGINE"].get("memory_budget") or int(_mem_total() * 0.8)

    def engine(self, name: str, keep_alive: float | None = None):
        """The loaded engine of `name`, loading it (and unloading what does not fit) when needed.

        Returns (engine, seconds spent loading).
        Raises:
            KeyError: this worker does not serve `name`.
        """
        with self.lock:
            if name in self.loaded:
                return self.loaded[name].engine, 0.0
            if name not in self.models:
                self.scan()
            info = self.models[name]
            need = info["footprint"]
            for other in sorted(self.loaded, key=lambda n: self.loaded[n].loaded_at):
                if sum(l.size for l in self.loaded.values()) + need <= self.budget():
                    break
                log.info("unloading %s to make room for %s", other, name)
                self.unload(other)
            from inference.engine import Engine

            t0 = time.perf_counter()
            state, self.state = self.state, "loading"
            try:
                eng = Engine.open(info["path"], **self.cfg["ENGINE"])
                _ = eng.tokenizer  # load it now: part of the load, not of the first request
            finally:
                self.state = state
            self.loaded[name] = Loaded(eng, need, time.time(), self._expiry(keep_alive), keep_alive=keep_alive)
            log.info("loaded %s in %.2fs", name, time.perf_counter() - t0)
            self.heartbeat()
            return eng, time.perf_counter() - t0

    def prompt_cache(self, name: str) -> PromptCache:
        if name not in self.caches:
            self.caches[name] = PromptCache(
                Path(self.cfg["PROMPT_CACHE_DIR"]),
                name,
                max_bytes=self.cfg["PROMPT_CACHE_MAX"],
                max_age=self.cfg["PROMPT_CACHE_DAYS"] * 86400,
            )
        return self.caches[name]

    def save_state(self, name: str) -> None:
        """Save the engine's current conversation as a prompt-cache file if it is not saved yet (its rows
        are copied now and written by the cache's writer thread)."""
        ld = self.loaded.get(name)
        if ld is not None and ld.dirty:
            try:
                self.prompt_cache(name).save(ld.engine, ld.session, ld.prompt)
            except OSError as e:
                log.warning("could not save the prompt cache of %s: %s", name, e)
            ld.dirty = False

    def close_caches(self, *names: str) -> None:
        """Finish the writes of these models' prompt caches (all when none is named) and forget them: they
        open again, with the limits then in force, at their next use."""
        for name in names or list(self.caches):
            pc = self.caches.pop(name, None)
            if pc is not None:
                pc.close()

    def unload(self, name: str) -> bool:
        with self.lock:
            ld = self.loaded.get(name)
            if ld is None:
                return False
            if ld.batcher is not None:  # its sequences end as cancelled; their clients are told to retry
                ld.batcher.stop()
            self.save_state(name)
            if ld.used_at > ld.popularity_saved:
                self.save_popularity(name)
            del self.loaded[name]
            ld.engine.close()
            log.info("unloaded %s", name)
            self.heartbeat()
            return True

    def touch(self, name: str, keep_alive: float | None) -> None:
        """After a request: keep `name` loaded for `keep_alive` seconds (None: the default; 0: unload now)."""
        ld = self.loaded.get(name)
        if ld is None:
            return
        ld.keep_alive, ld.used_at = keep_alive, time.time()
        ld.expires_at = self._expiry(keep_alive, ld.used_at)
        if ld.expires_at is not None and ld.expires_at <= time.time() and not self.busy(name):
            self.unload(name)

    def _expiry(self, keep_alive: float | None, since: float | None = None) -> float | None:
        ka = self.cfg["KEEP_ALIVE"] if keep_alive is None else keep_alive
        return None if ka < 0 else (time.time() if since is None else since) + ka

    def unload_idle(self) -> None:
        """Heartbeat thread, while no task uses an engine: unload what is idle past its keep-alive, fill a
        newly loaded model's expert caches from its saved popularity, save the popularity of the others."""
        if not self.lock.acquire(blocking=False):
            return  # a task is using the engines; the next beat checks again
        try:
            now = time.time()
            for name, ld in list(self.loaded.items()):
                if self.busy(name):  # generations in its batcher: the engine is in use
                    continue
                if ld.expires_at is not None and ld.expires_at <= now:
                    log.info("%s idle past its keep-alive", name)
                    self.unload(name)
                elif not ld.warmed:
                    self.warm(name)
                elif ld.unchecked != 0:
                    self.check(name)
                elif now - ld.popularity_saved >= POPULARITY_EVERY and ld.used_at > ld.popularity_saved:
                    self.save_popularity(name)
        finally:
            self.lock.release()

    # --- the last verify of each model: the model page shows it ----------------------------------------
    def verify_path(self, name: str) -> Path:
        return Path(self.cfg["PROMPT_CACHE_DIR"]).parent / "verify" / f"{name}.json"

    def save_verify(self, name: str, digest: str, *, ok: bool, message: str) -> None:
        """Keep a verify's result ({at, ok, message}) for the model's description, and register it now."""
        path = self.verify_path(name)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump({"digest": digest, "at": time.time(), "ok": ok, "message": message}, f)
            os.replace(tmp, path)
        except OSError as e:  # a full disk: the result was shown, it is not remembered
            log.warning("%s: the verify result was not saved: %s", name, e)
        if name in self.models:
            self.models[name]["verified"] = self.last_verify(name, digest)
        self.heartbeat()

    def last_verify(self, name: str, digest: str) -> dict | None:
        """The last verify of the store `name` holds now ({at, ok, message}); None if never (or of an
        earlier install: another digest)."""
        try:
            info = json.loads(self.verify_path(name).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or info.get("digest") != digest:
            return None
        return {k: info.get(k) for k in ("at", "ok", "message")}

    # --- expert popularity: warm caches after a restart -------------------------------------------
    def popularity_path(self, name: str) -> Path:
        return (
            Path(self.cfg.get("POPULARITY_DIR") or Path(self.cfg["PROMPT_CACHE_DIR"]).parent / "popularity")
            / f"{name}.npz"
        )

    def warm(self, name: str) -> None:
        """Fill `name`'s expert caches with its most popular experts of earlier runs (while idle)."""
        from inference.errors import RkmojoError

        ld = self.loaded[name]
        ld.warmed = True
        t0 = time.perf_counter()
        try:
            n = ld.engine.warm_experts(self.popularity_path(name))
        except (RkmojoError, OSError) as e:  # a cold cache is slower, never wrong
            log.warning("%s: expert caches not warmed: %s", name, e)
            return
        if n:
            log.info("%s: warmed its expert caches with %d popular experts in %.2fs", name, n, time.perf_counter() - t0)

    def check(self, name: str) -> None:
        """Check the digests of `name`'s experts that no read has checked yet, a slice per heartbeat (while
        idle): the first prompt after a load then reads them without hashing them. A task waits at most
        one slice for the worker."""
        from inference.errors import RkmojoError

        ld = self.loaded[name]
        try:
            ld.unchecked = ld.engine.check_experts(CHECK_SLICE)
        except (RkmojoError, OSError) as e:  # the prompt that reads them checks them instead
            log.warning("%s: expert digests not checked while idle: %s", name, e)
            ld.unchecked = 0
            return
        if ld.unchecked == 0:
            log.info("%s: every expert's digest checked while idle", name)

    def save_popularity(self, name: str) -> None:
        ld = self.loaded[name]
        ld.popularity_saved = time.time()
        try:
            ld.engine.save_popularity(self.popularity_path(name))
        except OSError as e:  # a full disk: the next save tries again
            log.warning("%s: expert popularity not saved: %s", name, e)

    # --- saved settings --------------------------------------------------------------------------
    def read_settings(self) -> None:
        """Apply the settings the administrator saved (`bus.K_SETTINGS`) when they changed (heartbeat thread).

        The keep-alive applies at once, to the loaded models that follow the default too, and so do the
        prompt-cache limits; engine options at the next load (`self.cfg["ENGINE"]` is what `engine()` opens with).
        """
        raw = self.r.get(bus.K_SETTINGS)
        if raw == self._settings_raw:
            return
        if self._base is None:
            self._base = {
                k: self.cfg[k] for k in ("KEEP_ALIVE", "PROMPT_CACHE_DAYS", "PROMPT_CACHE_MAX", "PULL_FROM_LAN")
            }
            self._base["ENGINE"] = dict(self.cfg["ENGINE"])
        self._settings_raw = raw
        res = live_settings.resolve(raw, self._base, os.environ)
        for name, why in res.invalid.items():
            log.warning("saved setting %s ignored: %s", name, why)
        self.cfg["ENGINE"] = res.engine
        self.cfg["PULL_FROM_LAN"] = res.pull_from_lan  # the next install's pull policy
        if res.keep_alive != self.cfg["KEEP_ALIVE"]:
            self.cfg["KEEP_ALIVE"] = res.keep_alive
            for ld in list(self.loaded.values()):
                if ld.keep_alive is None:
                    ld.expires_at = self._expiry(None, ld.used_at)
        if any(self.cfg[k] != v for k, v in res.prompt_cache.items()):
            self.cfg.update(res.prompt_cache)
            for pc in list(self.caches.values()):  # the open ones prune to the new limits in their writer thread
                pc.limit(self.cfg["PROMPT_CACHE_MAX"], self.cfg["PROMPT_CACHE_DAYS"] * 86400)
        self.settings = res

    # --- registration --------------------------------------------------------------------------
    def info(self) -> dict:
        return {
            "name": self.name,
            "hostname": self.hostname,
            "boot": self.boot,
            "pid": os.getpid(),
            "started": self.started,
            "running": self.running,
            "parallel": self.parallel(),
            "active": len(self.active) if self.active else int(self.running is not None),
            "installing": self.installing,
            "state": self.state,
            "prefill": self.prefill,
            "models": [{k: v for k, v in m.items() if k != "path"} for m in self.models.values()],
            "context": self.configured_context(),  # the KV length the next load opens a model with
            "loaded": [
                {
                    "name": n,
                    "size": ld.size,
                    "loaded_at": ld.loaded_at,
                    "expires_at": ld.expires_at,
                    "context": ld.engine.context_length,  # the limit its overflow errors name
                    "configured_context": ld.engine.cfg.context,  # what it was opened with
                    **_backend(ld.engine),
                }
                for n, ld in list(self.loaded.items())
            ],
            "settings": self.settings.status([getattr(ld.engine, "cfg", None) for ld in list(self.loaded.values())]),
        }

    def configured_context(self) -> int:
        """The context the next load opens a model with (RKMOJO_CONTEXT, Settings → Context, else the default)."""
        from inference.engine import EngineConfig

        return int(self.cfg["ENGINE"].get("context") or EngineConfig.__dataclass_fields__["context"].default)

    def heartbeat(self) -> None:
        bus.register(self.r, self.name, self.info(), self.cfg["HEARTBEAT_TTL"])

    def start_heartbeat(self) -> None:
        def loop():
            while not self._stop.wait(self.cfg["HEARTBEAT"]):
                try:
                    self.read_settings()
                    self.heartbeat()
                    self.unload_idle()
                except Exception:  # Redis restarting: keep beating, the TTL tells the web side meanwhile
                    log.exception("heartbeat failed")

        self.heartbeat()
        threading.Thread(target=loop, name="rkmojo-heartbeat", daemon=True).start()

    def start_stats(self, **kw) -> Sampler:
        """Publish the live view's `WorkerStats` once a second from a thread of its own (`stats.Sampler`)."""
        sampler = Sampler(self, **kw)
        threading.Thread(target=sampler.run, args=(self._stop,), name="rkmojo-stats", daemon=True).start()
        return sampler

    def stop(self) -> None:
        self._stop.set()
        try:
            bus.unregister(self.r, self.name, self.boot)
        except Exception:
            pass
        for name, ld in list(self.loaded.items()):  # the next start warms its caches from these
            if ld.used_at > ld.popularity_saved:
                self.save_popularity(name)
            self.save_state(name)  # and a returning conversation restores its KV
        self.close_caches()

    def queues(self) -> list[str]:
        return [bus.board_queue(self.name)] + [bus.model_queue(m) for m in sorted(self.models)]


def _backend(engine) -> dict:
    """What runs a loaded engine's dense prefill matmuls (cpu, rknpu) and why (the NPU's self-test result)."""
    choice = getattr(engine, "backend", None)
    return {"backend": choice.name, "backend_reason": choice.reason} if choice is not None else {}


def describe_model(m) -> dict:
    """What the registry says about one installed model (`inference.models_dir.ModelInfo`)."""
    from inference.engine import RUNTIME_OVERHEAD
    from inference.store import Store

    st = Store(m.path)
    dense = st.manifest["dense"].get("size", 0)
    experts = sum(l.stride * l.n_experts for l in st.expert_layers.values())
    heads = int(st.config.get("num_attention_heads") or 1)
    kv_heads = int(st.config.get("num_key_value_heads") or heads)
    kv = 2 * 4 * m.layers * 4096 * m.hidden * kv_heads // heads  # float32 K and V at a 4K context
    return {
        "name": m.name,
        "path": str(m.path),
        "architecture": m.architecture,
        "digest": st.digest,
        "size": m.disk_bytes,
        "params": m.params,
        "active_params": m.active_params,
        "quant": m.quant,
        "context": m.context,
        "modified": (m.path / "manifest.json").stat().st_mtime,
        "footprint": dense + experts + kv + RUNTIME_OVERHEAD,
        "has_template": m.has_template,
        "family": m.architecture,
        "layers": m.layers,
        "hidden": m.hidden,
        "vocab": m.vocab,
        "generation": m.generation,
    }


def _mem_total() -> int:
    from inference.sysmem import meminfo

    return meminfo().get("MemTotal", 8 * 2**30)


def _config() -> dict:
    cfg = dict(settings.RKMOJO)
    cfg["PROMPT_CACHE_DIR"] = str(settings.PROMPT_CACHE_DIR)
    cfg["POPULARITY_DIR"] = str(settings.DATA_DIR / "popularity")
    return cfg


# --- Celery signals ---------------------------------------------------------------------------------
@signals.worker_init.connect
def _on_init(sender=None, **_):
    global _BOARD
    import socket

    cfg = _config()
    _BOARD = Board(
        name=cfg["WORKER_NAME"],
        hostname=socket.gethostname(),
        redis_url=settings.REDIS_URL,
        models_dir=settings.MODELS_DIR,
        cfg=cfg,
    )
    _BOARD.scan()
    queues = sender.app.amqp.queues
    for q in _BOARD.queues():
        queues.select_add(q)
    queues.deselect("celery")  # the default queue: nothing is routed there
    log.info("worker %s serves %s", _BOARD.name, ", ".join(sorted(_BOARD.models)) or "no model yet")


@signals.worker_ready.connect
def _on_ready(**_):
    b = board()
    try:
        b.read_settings()  # before the preload: it opens the model with them
    except Exception:
        log.exception("could not read the saved settings")
    preload = b.cfg["PRELOAD"]
    if preload and preload in b.models:
        try:
            b.engine(preload, keep_alive=-1 if b.cfg["KEEP_ALIVE"] < 0 else None)
        except Exception:
            log.exception("could not preload %s", preload)
    b.start_heartbeat()
    try:
        b.start_stats()
    except Exception:  # the live view is not worth a worker
        log.exception("could not start the live stats")


@signals.worker_shutting_down.connect
def _on_shutting_down(**_):
    # runs in the signal handler, between two tokens: only set a flag (the generation loop checks it)
    if _BOARD is not None:
        _BOARD.shutting_down = True


@signals.worker_shutdown.connect
def _on_shutdown(**_):
    if _BOARD is not None:
        _BOARD.stop()
