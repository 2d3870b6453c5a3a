"""The Celery app: Redis broker, one queue per model (`model.NAME`) and one per board (`board.NAME`).

Workers run in the process that owns the engines (`appliance.processes.worker_argv`): with the solo
pool, one task at a time; with RKMOJO_PARALLEL > 1, a thread per task, whose generations of one model
its batcher steps together. `appliance.worker` connects the worker's start-up and shut-down.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")

app = Celery("rkmojo")
app.config_from_object("django.conf:settings", namespace="CELERY")


def _broker_url() -> str:
    from django.conf import settings

    from .bus import kombu_url

    return kombu_url(settings.REDIS_URL)


app.conf.broker_url = _broker_url()
app.conf.include = ["appliance.tasks"]
