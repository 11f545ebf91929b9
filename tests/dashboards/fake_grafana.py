"""A stand-in for Grafana's HTTP API, for testing ``gradwire dashboards push`` where no Grafana
server can run. It implements only the endpoints the push uses, with the request and answer
shapes of Grafana's HTTP API documentation (api/data_source, api/dashboard, api/other):

- ``GET /api/health`` (no auth): ``{"database": "ok", "version": ...}``
- ``GET /api/datasources/uid/:uid``: the datasource, or 404 ``{"message": "Data source not found"}``
- ``POST /api/datasources``: ``{"datasource": {...}, "id", "message": "Datasource added", "name"}``;
  409 when the name is taken
- ``PUT /api/datasources/uid/:uid``: ``{"datasource": {...}, "id", "message": "Datasource updated", "name"}``
- ``POST /api/dashboards/db`` with ``{"dashboard", "overwrite", "message"}``:
  ``{"id", "uid", "url": "/d/:uid/:slug", "status": "success", "version", "slug"}``; 412 when the
  uid exists and ``overwrite`` is false
- 401 ``{"message": "Invalid API key"}`` without ``Authorization: Bearer <a known token>``;
  403 for a viewer's token on writes.

Every request is recorded (method, path, headers, JSON body) for the test to inspect.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class GrafanaState:
    admin_tokens: set[str]
    viewer_tokens: set[str] = field(default_factory=set)
    datasources: dict[str, dict[str, Any]] = field(default_factory=dict)  # by uid
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)  # by uid: {"dashboard", "version", "id"}
    requests: list[Recorded] = field(default_factory=list)
    next_id: int = 1


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


class _Handler(BaseHTTPRequestHandler):
    server: "FakeGrafana"

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        state = self.server.state
        with self.server.lock:
            state.requests.append(Recorded(method, self.path, dict(self.headers.items()), body))
            status, answer = self._route(method, self.path.split("?")[0], body, state)
        self._answer(status, answer)

    def _route(self, method: str, path: str, body: Any, state: GrafanaState) -> tuple[int, Any]:
        if method == "GET" and path == "/api/health":
            return 200, {"commit": "fake", "database": "ok", "version": "11.6.0"}
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        if token not in state.admin_tokens | state.viewer_tokens:
            return 401, {"message": "Invalid API key", "messageId": "auth.unauthorized", "statusCode": 401}
        writing = method in ("POST", "PUT", "DELETE")
        if writing and token in state.viewer_tokens:
            return 403, {"message": "You'll need additional permissions to perform this action. "
                                    "Permissions needed: datasources:create"}
        match = re.fullmatch(r"/api/datasources/uid/([^/]+)", path)
        if match and method == "GET":
            found = state.datasources.get(match.group(1))
            return (200, found) if found else (404, {"message": "Data source not found"})
        if match and method == "PUT":
            found = state.datasources.get(match.group(1))
            if not found:
                return 404, {"message": "Data source not found"}
            found.update({k: v for k, v in body.items() if k != "id"})
            found["version"] += 1
            return 200, {"datasource": found, "id": found["id"], "message": "Datasource updated", "name": found["name"]}
        if path == "/api/datasources" and method == "POST":
            if any(d["name"] == body["name"] for d in state.datasources.values()):
                return 409, {"message": "data source with the same name already exists"}
            uid = body.get("uid") or f"ds{state.next_id}"
            created = {**body, "id": state.next_id, "uid": uid, "orgId": 1, "version": 1, "readOnly": False}
            state.next_id += 1
            state.datasources[uid] = created
            return 200, {"datasource": created, "id": created["id"], "message": "Datasource added",
                         "name": created["name"]}
        if path == "/api/dashboards/db" and method == "POST":
            dashboard = body.get("dashboard") or {}
            uid, title = dashboard.get("uid"), dashboard.get("title")
            if not uid or not title:
                return 400, {"message": "Dashboard title cannot be empty"}
            existing = state.dashboards.get(uid)
            if existing and not body.get("overwrite"):
                return 412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
            if existing:
                existing.update(dashboard=dashboard, version=existing["version"] + 1)
            else:
                existing = state.dashboards[uid] = {"dashboard": dashboard, "version": 1, "id": state.next_id}
                state.next_id += 1
            slug = _slug(title)
            return 200, {"id": existing["id"], "uid": uid, "url": f"/d/{uid}/{slug}", "status": "success",
                         "version": existing["version"], "slug": slug}
        return 404, {"message": "Not found"}

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


class FakeGrafana(ThreadingHTTPServer):
    """``with FakeGrafana(state) as grafana: ... grafana.url``; serves in a daemon thread."""

    daemon_threads = True

    def __init__(self, state: GrafanaState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        self.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, name="fake-grafana", daemon=True)

    def __enter__(self) -> "FakeGrafana":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.server_close()
