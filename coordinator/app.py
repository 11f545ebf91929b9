"""The FastAPI app factory: wires settings, store, metrics, launcher and the supervisor,
mounts one router per resource and maps domain errors to status codes.

Importing this module does not import torch or Ray (a test checks ``sys.modules``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from coordinator.accesslog import tune_access_log
from coordinator.api import dashboard, health, jobs, metrics, policy, worker
from coordinator.auth import check_bind
from coordinator.datadir import DataDirLock
from coordinator.fastpath import TelemetryFastPath
from coordinator.launcher import Launcher
from coordinator.launchers import make_launcher
from coordinator.metrics import CoordinatorMetrics
from coordinator.openapi import openapi_document
from coordinator.service import Conflict, Forbidden, InvalidSpec, JobNotFound, JobService
from coordinator.settings import Settings
from coordinator.store import Store, StoreUnavailable
from coordinator.supervisor import Supervisor

log = logging.getLogger(__name__)


def _version() -> str:
    try:
        return metadata.version("gradwire")
    except metadata.PackageNotFoundError:  # pragma: no cover - source checkout without install
        return "0.0.0"


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413, before anything parses them: at once by
    ``Content-Length``, and for chunked bodies (no length) by counting bytes as they arrive,
    so no more than ``limit`` bytes are ever read. Pure ASGI: it wraps ``receive``, and once
    the limit is crossed it answers 413 itself (and closes the connection, whose unread body
    is left behind) whatever the app was about to say."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _refusal(self) -> JSONResponse:
        return JSONResponse({"detail": f"request body too large (limit {self.limit} bytes)"},
                            status_code=413, headers={"Connection": "close"})

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refusal()(scope, receive, send)
            return
        received = 0
        crossed = False
        started = False

        async def counted_receive() -> dict:
            nonlocal received, crossed
            if crossed:
                raise _BodyTooLarge()
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    crossed = True
                    raise _BodyTooLarge()
            return message

        async def guarded_send(message: dict) -> None:
            nonlocal started
            if crossed:
                return  # the app's own answer to the cut-off body is replaced by the 413
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except _BodyTooLarge:
            pass
        except Exception:
            if not crossed:
                raise
        if crossed and not started:
            await self._refusal()(scope, receive, send)


def create_app(settings: Settings | None = None, *, launcher: Launcher | None = None,
               clock: Callable[[], float] = time.time) -> FastAPI:
    """Build the coordinator. ``launcher`` replaces the one ``settings`` asks for (tests)."""
    settings = settings or Settings()
    check_bind(settings.host, settings.token_value)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    data_dir_lock = DataDirLock(settings.data_dir).acquire()
    tune_access_log()

    try:
        store = Store(settings.db_url)
    except Exception:
        data_dir_lock.release()
        raise
    launcher = launcher or make_launcher(settings)
    job_metrics = CoordinatorMetrics(store.counts_by_state, settings.metrics_grace_s)
    supervisor_box: list[Supervisor] = []
    def wake_supervisor() -> None:
        if supervisor_box:
            supervisor_box[0].wake()

    service = JobService(store, job_metrics, launcher, settings, clock=clock, on_submit=wake_supervisor)
    supervisor = Supervisor(service, launcher, settings.poll_interval_s)
    supervisor_box.append(supervisor)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        supervisor.start()
        try:
            yield
        finally:
            supervisor.stop()
            launcher.close()
            store.close()
            data_dir_lock.release()

    app = FastAPI(
        title="gradwire coordinator",
        version=_version(),
        description="Jobs, telemetry, adaptive compression decisions and metrics for gradwire.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.service = service
    app.state.supervisor = supervisor

    for router in (jobs.router, jobs.stream_router, policy.router, worker.router, health.router, metrics.router, dashboard.router):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC_DIR), name="static")
    app.add_middleware(TelemetryFastPath, service=service, concise=_concise)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)  # added last: the outer one
    _error_handlers(app)
    app.openapi = lambda: openapi_document(app, operator_auth=settings.token_value is not None)  # type: ignore[method-assign]
    return app


def _json_safe(value: Any) -> Any:
    """Echoed inputs may hold inf/nan (JSON ``1e999``), which JSON cannot carry: quote them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


#: An echoed input longer than this (as JSON) is left out of a 422: a response must never
#: carry a huge request back.
ECHO_LIMIT = 200


def _concise(error: dict[str, Any]) -> dict[str, Any]:
    """One validation error with its echoed ``input`` kept only when short."""
    out = {k: v for k, v in error.items() if k not in ("input", "url", "ctx")}
    if "input" in error:
        try:
            text = json.dumps(error["input"], default=str)
        except (TypeError, ValueError):
            text = "x" * (ECHO_LIMIT + 1)
        if len(text) <= ECHO_LIMIT:
            out["input"] = error["input"]
    return out


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = jsonable_encoder([_concise(e) for e in exc.errors()[:20]])
        return JSONResponse({"detail": _json_safe(errors)}, status_code=422)

    @app.exception_handler(InvalidSpec)
    async def _cannot_run(_request: Request, exc: InvalidSpec) -> JSONResponse:
        return JSONResponse({"detail": [{"type": "value_error", "loc": ["body"], "msg": str(exc)}]},
                            status_code=422)

    @app.exception_handler(StoreUnavailable)
    async def _store_down(_request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "10"})

    @app.exception_handler(JobNotFound)
    async def _not_found(_request: Request, exc: JobNotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Conflict)
    async def _conflict(_request: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(Forbidden)
    async def _forbidden(_request: Request, exc: Forbidden) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse({"detail": "internal error"}, status_code=500)
