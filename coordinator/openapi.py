"""The OpenAPI document as the server really behaves: every status code a route answers,
and bearer auth declared where it is required (worker routes always, operator routes only
when ``GRADWIRE_TOKEN`` is set). Schemathesis checks responses against this document in the
test suite, so a route that starts answering a new code must declare it here."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorDetail"}}}
_ERROR_SCHEMA = {
    "title": "ErrorDetail",
    "type": "object",
    "required": ["detail"],
    "properties": {"detail": {"title": "Detail", "anyOf": [{"type": "string"}, {"type": "array", "items": {}}]}},
}

DESCRIPTIONS = {
    "400": "Malformed request",
    "401": "Missing or wrong bearer token",
    "404": "No such job",
    "409": "The job's state forbids this (e.g. it already ended)",
    "413": "Request body too large",
    "422": "Validation error",
    "503": "The database cannot be written right now (disk full, read-only); retry later",
}
WORKER_TAG = "workers"
_STATE_CHANGES = ("/cancel", "/policy", "/telemetry")


def _codes(path: str, method: str, operation: dict[str, Any], operator_auth: bool) -> list[str]:
    worker = WORKER_TAG in operation.get("tags", [])
    codes = ["400", "413", "422", "503"]  # any route may meet a bad or huge request, or a store fault
    if worker or (operator_auth and path.startswith("/v1")):
        codes.append("401")
    if "{job_id}" in path:
        codes.append("404")
        if method in ("post", "put") and path.endswith(_STATE_CHANGES):
            codes.append("409")
    return codes


def openapi_document(app: FastAPI, *, operator_auth: bool) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = doc.setdefault("components", {})
    components.setdefault("schemas", {})["ErrorDetail"] = _ERROR_SCHEMA
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            worker = WORKER_TAG in operation.get("tags", [])
            if not worker and not (operator_auth and path.startswith("/v1")):
                operation.pop("security", None)
            responses = operation.setdefault("responses", {})
            for code in _codes(path, method, operation, operator_auth):
                if code == "422" and code in responses:
                    continue  # FastAPI's own, with the validation error schema
                responses.setdefault(code, {"description": DESCRIPTIONS[code], "content": _ERROR})
    if not any("security" in op for item in doc.get("paths", {}).values() for op in item.values()):
        components.pop("securitySchemes", None)
    app.openapi_schema = doc
    return doc
