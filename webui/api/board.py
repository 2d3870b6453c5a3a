"""Model management on the workers, shared by the Ollama API (`/api/pull`, `/api/delete`) and the admin panel:
install (pull), delete, verify, load and unload, each a `Job` on the worker's board queue or the model's queue.

Errors are `ApiError`s with one clear message (the worker's own, such as an unsupported architecture or a
full disk, comes through as its `Error` event says it).
"""

from __future__ import annotations

from django.conf import settings

from appliance import bus
from appliance.events import Error, Event
from appliance.sources import SourceError, local_path

from . import jobs
from .common import ApiError, ollama_model_name


def install_name(source: str) -> tuple[str, str]:
    """(the source as the worker takes it, the model name it installs as) for a repository id, GGUF URL or path.

    Raises:
        ApiError 400: a source the appliance does not install from (the message says what it takes).
    """
    from inference.pull import default_name

    if not source:
        raise ApiError(
            400, "model is required: a repository id (owner/name), a .gguf URL or a path on the worker", param="model"
        )
    try:
        local = local_path(source, settings.RKMOJO["IMPORT_DIR"])
    except SourceError as e:
        raise ApiError(400, str(e), param="model") from None
    if local is not None:  # a file in the import directory
        return str(local), local.name.removesuffix(".gguf").lower()
    return source, ollama_model_name(default_name(source))


async def start_install(source: str, worker: str | None = None) -> tuple[jobs.Job | None, str]:
    """Queue the install of `source` on `worker` (default: the first live one).

    Returns:
        (the job, or None when a model of that name is served already; the model's name).
    Raises:
        ApiError: 400 a bad source, 503 no such worker running.
    """
    source, name = install_name(source)
    if name in await jobs.catalog():
        return None, name
    workers = await bus.workers(jobs.redis())
    if worker:
        workers = [w for w in workers if w["name"] == worker]
    if not workers:
        raise ApiError(503, f"no worker {'named ' + worker + ' ' if worker else ''}is running to install it")
    job = await jobs.Job.submit_board("rkmojo.install", workers[0]["name"], {"source": source, "name": name})
    return job, name


async def finish(job: jobs.Job) -> list[Event]:
    """Every event of `job` to its end.

    Raises:
        ApiError: the job's error event.
    """
    out = []
    try:
        async for ev in job.events():
            if isinstance(ev, Error):
                raise ApiError.from_event(ev)
            out.append(ev)
    finally:
        await job.close()
    return out


async def delete(name: str) -> None:
    """Delete `name` from every worker that has it.

    Raises:
        ApiError: 404 no worker has it, or a worker's error.
    """
    try:
        workers, _ = await jobs.find_model(name)
    except ApiError:
        raise ApiError(404, f"model '{name}' not found") from None
    for w in workers:
        await finish(await jobs.Job.submit_board("rkmojo.delete", w["name"], {"name": name}))


async def load(name: str, *, unload: bool = False) -> None:
    """Load `name` on a worker that serves it (and keep it for the keep-alive), or unload it.

    Raises:
        ApiError: 404 unknown model, 429 its queue is full, or the worker's error.
    """
    payload = {"kind": "unload" if unload else "load", "model": name}
    await finish(await jobs.Job.submit("rkmojo.generate", name, payload))
