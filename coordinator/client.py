"""A small HTTP client for the coordinator's REST API (used by the CLI and the demo)."""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx


class ApiError(RuntimeError):
    """A non-2xx answer; ``detail`` is the server's explanation (a string or a list of errors)."""

    def __init__(self, status: int, detail: Any) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"{status}: {format_detail(detail)}")


def format_detail(detail: Any) -> str:
    """FastAPI's validation errors as ``field.path: message`` lines; anything else as text."""
    if isinstance(detail, list):
        lines = []
        for err in detail:
            loc = [str(p) for p in err.get("loc", []) if p != "body"]
            lines.append(f"{'.'.join(loc) or 'body'}: {err.get('msg', err)}")
        return "; ".join(lines)
    return str(detail)


class Client:
    def __init__(self, url: str, token: str | None = None, timeout: float = 15.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail)
        return response.json()

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json=spec)

    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/jobs")

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def history(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}/history")

    def policy(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}/policy", **({"timeout": timeout} if timeout else {}))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def events(self, job_id: str) -> Iterator[tuple[str, Any]]:
        """Yield ``(event, data)`` from the job's server-sent event stream until it ends."""
        with self._http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=httpx.Timeout(15.0, read=60.0)) as r:
            if r.status_code >= 400:
                r.read()
                raise ApiError(r.status_code, r.json().get("detail", r.text))
            event, data = "message", list[str]()
            for line in r.iter_lines():
                if line == "":
                    if data:
                        yield event, json.loads("\n".join(data))
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
