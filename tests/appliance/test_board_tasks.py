"""The board queue's tasks driven through Celery as the admin pages will: verify a model, refuse unknown ones."""

import asyncio

from appliance.events import Error, Final, Progress, Start


def run_board_task(task: str, worker: str, payload: dict) -> list:
    from webui.api.jobs import Job

    async def scenario():
        job = await Job.submit_board(task, worker, payload)
        try:
            return [ev async for ev in job.events()]
        finally:
            await job.close()

    return asyncio.run(scenario())


def test_verify_checks_every_digest_with_progress(django_for_stack, stack):
    events = run_board_task("rkmojo.verify", "board-a", {"name": "smollm2"})
    assert isinstance(events[0], Start) and isinstance(events[-1], Final)
    progress = [e for e in events if isinstance(e, Progress)]
    assert progress and progress[-1].completed == progress[-1].total


def test_board_tasks_refuse_a_model_the_board_does_not_have(django_for_stack, stack):
    for task in ("rkmojo.verify", "rkmojo.delete"):
        events = run_board_task(task, "board-a", {"name": "nope"})
        assert isinstance(events[-1], Error) and events[-1].status == 404
