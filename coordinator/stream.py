"""The live event stream of one job (served as server-sent events by ``api/jobs.py``).

On connect the client gets a ``snapshot`` (the job and its whole stored history), then
``state``, ``decision`` and ``policy`` events — every one, in order, with its event id — and
a final ``end`` once the job is finished. ``telemetry`` is sampled, not a log: at most one
event per poll (``sse_poll_s``, 0.5 s by default) carrying the *latest* report, with
``reports`` (how many the job has sent) and ``skipped`` (how many arrived since the previous
telemetry event and are not sent on their own; the downsampled ones are in the history). A
live page wants the current numbers, not a backlog it would have to replay. The stream
reads the database rather than an in-process bus, so it works unchanged after a restart and
with any number of watchers; a reconnecting client simply gets a fresh snapshot.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Awaitable, Callable

from coordinator.service import JobService


def _message(event: str, data: Any, event_id: int | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"event": event, "data": json.dumps(data, separators=(",", ":"))}
    if event_id is not None:
        message["id"] = str(event_id)
    return message


async def job_events(service: JobService, job_id: str, poll_s: float,
                     disconnected: Callable[[], Awaitable[bool]]) -> AsyncIterator[dict[str, Any]]:
    last_event = await asyncio.to_thread(service.store.last_event_id, job_id)
    history = await asyncio.to_thread(service.history, job_id)
    yield _message("snapshot", history.model_dump(mode="json"), last_event)
    seq = (await asyncio.to_thread(service.get, job_id)).report_seq
    while not await disconnected():
        job = await asyncio.to_thread(service.get, job_id)
        events = await asyncio.to_thread(service.store.events_after, job_id, last_event)
        for e in events:
            last_event = e.id
            yield _message(e.kind, e.data, e.id)
        if job.report_seq != seq:
            skipped, seq = job.report_seq - seq - 1, job.report_seq
            point = job.live_point()
            yield _message("telemetry", {"job": job.status().model_dump(mode="json"),
                                         "point": point.model_dump(mode="json") if point else None,
                                         "reports": seq, "skipped": skipped})
        if job.terminal:
            yield _message("end", job.status().model_dump(mode="json"))
            return
        await asyncio.sleep(poll_s)
