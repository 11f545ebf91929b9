"""``/v1/jobs/{id}/policy``: read the policy, pin a compressor or hand back to adaptive."""

from __future__ import annotations

from typing import Annotated, Union

from fastapi import APIRouter, Body, Depends

from coordinator.api.deps import get_service, require_operator
from coordinator.schemas import AdaptivePolicy, PinnedPolicy, PolicyView
from coordinator.service import JobService

router = APIRouter(prefix="/v1/jobs", tags=["policy"], dependencies=[Depends(require_operator)])


@router.get("/{job_id}/policy", response_model=PolicyView)
def get_policy(job_id: str, service: JobService = Depends(get_service)) -> PolicyView:
    return service.policy(job_id)


@router.put("/{job_id}/policy", response_model=PolicyView)
def put_policy(job_id: str,
               update: Annotated[Union[PinnedPolicy, AdaptivePolicy], Body(discriminator="mode")],
               service: JobService = Depends(get_service)) -> PolicyView:
    """``{"mode": "pinned", "compressor": ..., "rank"|"ratio": ...}`` or ``{"mode": "adaptive"}``."""
    return service.set_policy(job_id, update)
