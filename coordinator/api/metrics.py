"""``/metrics`` in the Prometheus text format (the collectors live in coordinator.metrics)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from coordinator.api.deps import get_service
from coordinator.service import JobService

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def metrics(service: JobService = Depends(get_service)) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
