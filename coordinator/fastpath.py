"""The hot route without the framework: ``POST /v1/jobs/{id}/telemetry`` as plain ASGI.

Every rank 0 reports every few seconds; a large cluster sends the coordinator thousands of
reports a second. Routing, dependency solving and FastAPI's request/response machinery cost
about as much CPU per report as the work itself, so this middleware answers that one route
directly: the job's token first (401/404 before any parsing), then pydantic-core parses and
validates the JSON in one pass (``TelemetryReport.model_validate_json``), then
:meth:`JobService.ingest`. Answers and error bodies are the ones the FastAPI route in
:mod:`coordinator.api.worker` gives (that route stays, for the OpenAPI document and as the
reference; Schemathesis checks what this path answers against that document). It sits inside
:class:`coordinator.app.BodyLimit`, so the body limit holds here too.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from pydantic import ValidationError

from coordinator.auth import bearer_from_header
from coordinator.schemas import TelemetryReport
from coordinator.service import Conflict, Forbidden, JobNotFound, JobService
from coordinator.store import StoreUnavailable

_PATH = re.compile(r"^/v1/jobs/([^/]+)/telemetry$")
_JSON = [(b"content-type", b"application/json")]


def _answer(status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> list[dict[str, Any]]:
    headers = [*_JSON, (b"content-length", str(len(body)).encode()), *(extra or [])]
    return [{"type": "http.response.start", "status": status, "headers": headers},
            {"type": "http.response.body", "body": body}]


def _detail(status: int, detail: Any, extra: list[tuple[bytes, bytes]] | None = None) -> list[dict[str, Any]]:
    return _answer(status, json.dumps({"detail": detail}, separators=(",", ":")).encode(), extra)


class TelemetryFastPath:
    def __init__(self, app: Any, service: JobService, concise: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.app = app
        self.service = service
        self._concise = concise

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        match = _PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        for message in await self._handle(match.group(1), scope, receive):
            await send(message)

    async def _handle(self, job_id: str, scope: dict, receive: Callable) -> list[dict[str, Any]]:
        headers = dict(scope.get("headers") or [])
        token = bearer_from_header(headers.get(b"authorization", b"").decode("latin-1"))
        try:
            job = self.service.authorize_worker(job_id, token)
        except JobNotFound as exc:
            return _detail(404, str(exc))
        except Forbidden as exc:
            return _detail(401, str(exc), [(b"www-authenticate", b"Bearer")])
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return []
            body += message.get("body", b"")
            more = message.get("more_body", False)
        content_type = headers.get(b"content-type", b"application/json")
        if not body:
            return _detail(422, [{"type": "missing", "loc": ["body"], "msg": "Field required"}])
        if b"json" not in content_type:
            return _detail(422, [{"type": "model_attributes_type", "loc": ["body"],
                                  "msg": "Input should be a valid dictionary or object to extract fields from"}])
        try:
            report = TelemetryReport.model_validate_json(body)
        except ValidationError as exc:
            errors = [self._concise({**e, "loc": ("body", *e["loc"])}) for e in exc.errors()[:20]]
            return _detail(422, json.loads(json.dumps(errors, default=str)))
        try:
            decision = self.service.ingest(job.id, report)
        except JobNotFound as exc:
            return _detail(404, str(exc))
        except Conflict as exc:
            return _detail(409, str(exc))
        except StoreUnavailable as exc:
            return _detail(503, str(exc), [(b"retry-after", b"10")])
        return _answer(200, decision.model_dump_json().encode())
