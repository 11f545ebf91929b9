"""``GET /``: the live page (static HTML + JS from coordinator/static, no CDN). It reads
``/v1/jobs`` and the job's event stream itself; the page holds no data."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(tags=["dashboard"])


@router.get("/", include_in_schema=False)
def live_page() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")
