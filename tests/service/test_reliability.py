"""Issue 17: the coordinator holds under bad input and faults of what lies below it.

Each test drives the real component: uvicorn on a real socket, `gradwire serve` processes,
SQLite on a real (tiny, or read-only) file system.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.api import SMALLEST_SPEC, submit, telemetry, worker_headers
from support.servers import REPO_ROOT, CoordinatorProcess, wait_for

TOKEN = "s3cret-operator-token"


def _serve_env(data_dir: Path, **extra: str) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("GRADWIRE_")}
    return {**inherited, "GRADWIRE_DATA_DIR": str(data_dir), "GRADWIRE_LAUNCHER": "none", **extra}


def _serve(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", *args], cwd=REPO_ROOT,
                          env=_serve_env(data_dir, **env), capture_output=True, text=True, timeout=60)


# ---- bodies -------------------------------------------------------------------------------


def _send_chunked(port: int, path: str, headers: dict[str, str], total: int,
                  chunk: int = 64 * 1024) -> tuple[bytes, int]:
    """POST a chunked body of up to ``total`` bytes over a raw socket, stopping as soon as the
    server answers; returns (response head, bytes of body sent)."""
    sock = socket.create_connection(("127.0.0.1", port))
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Transfer-Encoding: chunked",
             "Content-Type: application/json", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    piece = f"{chunk:x}\r\n".encode() + b"[" * chunk + b"\r\n"
    sent = 0
    try:
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += chunk
        sock.settimeout(30)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        return answer, sent
    finally:
        sock.close()


@pytest.mark.parametrize("token", [None, TOKEN], ids=["open", "with-token-but-none-sent"])
def test_a_chunked_body_over_the_limit_is_cut_off_with_413(start_coordinator, token):
    coordinator = start_coordinator(token=token)
    limit = coordinator.app.state.settings.max_body_bytes
    answer, sent = _send_chunked(coordinator.port, "/v1/jobs", {}, total=200 * 2**20)
    status = int(answer.split(b" ", 2)[1])
    assert status == 413, answer[:300]
    assert b"request body too large" in answer or b"connection: close" in answer.lower()
    assert sent < 50 * 2**20, "the server kept reading a body it had to refuse"
    assert limit < 2**20 + 1
    # and it keeps serving
    assert httpx.get(f"{coordinator.url}/healthz").status_code == 200


def test_a_chunked_body_under_the_limit_is_read(coordinator):
    body = json.dumps(SMALLEST_SPEC).encode()
    sock = socket.create_connection(("127.0.0.1", coordinator.port))
    head = ("POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            "Content-Type: application/json\r\nConnection: close\r\n\r\n").encode()
    sock.sendall(head + b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n"
                                 for part in (body[:10], body[10:])) + b"0\r\n\r\n")
    answer = b""
    while data := sock.recv(65536):
        answer += data
    sock.close()
    assert answer.startswith(b"HTTP/1.1 201"), answer[:300]


def test_a_422_does_not_echo_a_huge_input(coordinator):
    response = httpx.post(f"{coordinator.url}/v1/jobs", json={**SMALLEST_SPEC, "name": "n" * 900_000})
    assert response.status_code == 422
    assert len(response.content) < 2000
    assert response.json()["detail"][0]["loc"] == ["body", "name"]
    small = httpx.post(f"{coordinator.url}/v1/jobs", json={**SMALLEST_SPEC, "steps": -5})
    assert small.json()["detail"][0]["input"] == -5  # short inputs are still shown


# ---- names --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../../../../elsewhere/ESCAPED", "a/b", "..", ".hidden", "two\nlines",
                                  "nul\x00byte", "tab\there", "spaced name", ""])
def test_a_job_name_cannot_be_a_path_or_forge_a_log_line(coordinator, name):
    response = httpx.post(f"{coordinator.url}/v1/jobs", json={**SMALLEST_SPEC, "name": name})
    assert response.status_code == 422, name
    assert response.json()["detail"][0]["loc"] == ["body", "name"]
    assert httpx.get(f"{coordinator.url}/v1/jobs").json() == []


def test_ordinary_job_names_are_accepted(coordinator):
    for name in ("resnet50-acpsgd_r4", "run.2", "A1"):
        assert submit(coordinator.url, {**SMALLEST_SPEC, "name": name})["name"] == name


def _first_event(lines) -> str:
    for line in lines:
        if line.startswith("event:"):
            return line.removeprefix("event:").strip()
    return ""


# ---- tokens -------------------------------------------------------------------------------


def test_the_query_token_opens_only_the_event_stream(start_coordinator):
    coordinator = start_coordinator(token=TOKEN)
    job = submit(coordinator.url, token=TOKEN)
    for path in ("/v1/jobs", f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/history",
                 f"/v1/jobs/{job['id']}/policy"):
        assert httpx.get(f"{coordinator.url}{path}", params={"access_token": TOKEN}).status_code == 401, path
    assert httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/cancel",
                      params={"access_token": TOKEN}).status_code == 401
    with httpx.stream("GET", f"{coordinator.url}/v1/jobs/{job['id']}/events",
                      params={"access_token": TOKEN}, timeout=10) as stream:
        assert stream.status_code == 200
        assert _first_event(stream.iter_lines()) == "snapshot"


@pytest.mark.slow
def test_the_access_log_never_holds_the_token(tmp_path):
    coordinator = CoordinatorProcess(tmp_path / "coord", env={"GRADWIRE_LAUNCHER": "none",
                                                             "GRADWIRE_TOKEN": TOKEN})
    try:
        coordinator.start(wait_ray=False)
        job = submit(coordinator.url, token=TOKEN)
        with httpx.stream("GET", f"{coordinator.url}/v1/jobs/{job['id']}/events",
                          params={"access_token": TOKEN}, timeout=10) as stream:
            assert stream.status_code == 200
            next(stream.iter_lines())
        httpx.get(f"{coordinator.url}/v1/jobs", params={"access_token": TOKEN})  # refused, and logged
        wait_for(lambda: coordinator.log().count("access_token=[redacted]") >= 2, 10, "the access log lines")
    finally:
        coordinator.stop()
    log = coordinator.log_path.read_text()
    assert TOKEN not in log
    assert "access_token=[redacted]" in log


@pytest.mark.parametrize("token", ["   ", "\t", " padded-token "], ids=["spaces", "tab", "padded"])
def test_a_blank_or_padded_token_is_refused_at_start(tmp_path, token):
    result = _serve(tmp_path, "--host", "0.0.0.0", "--port", "1", GRADWIRE_TOKEN=token)
    assert result.returncode == 2, result.stderr
    assert "invalid settings: token: GRADWIRE_TOKEN" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


# ---- telemetry ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        ({"step": 2**63}, ["body", "step"]),
        ({"step": 2**64 + 5}, ["body", "step"]),
        ({"world_size": 2**63}, ["body", "world_size"]),
        ({"steps": 2**70}, ["body", "steps"]),
        ({"compressor_rank": -1}, ["body", "compressor_rank"]),
        ({"compressor": "gzip; drop table jobs"}, ["body", "compressor"]),
        ({"ratio": 3.0}, ["body", "ratio"]),
        ({"decision_version": -1}, ["body", "decision_version"]),
        ({"loss": "NaN"}, ["body", "loss"]),
        ({"samples_per_second": "Infinity"}, ["body", "samples_per_second"]),
        ({"phase_seconds": {"data": "Infinity"}}, ["body", "phase_seconds", "data"]),
        ({"profile": {"shapes": [[2**63]]}}, ["body", "profile", "shapes", 0, 0]),
        ({"profile": {"shapes": [[4]], "forward_s": "Infinity"}}, ["body", "profile", "forward_s"]),
        ({"resumed_from_step": 2**63}, ["body", "resumed_from_step"]),
        ({"link_drop_step": 2**63}, ["body", "link_drop_step"]),
    ],
    ids=["step-2^63", "step-2^64", "world-2^63", "steps-2^70", "rank-1", "compressor", "ratio", "version-1",
         "nan-loss", "inf-rate", "inf-phase", "huge-shape", "inf-profile",
         "resumed-2^63", "drop-2^63"],
)
def test_telemetry_out_of_bounds_is_422_and_the_connection_lives_on(coordinator, raw, loc):
    job = submit(coordinator.url)
    body = {**telemetry(3), **raw}
    # NaN/Infinity as JSON's non-standard literals, the way a careless encoder sends them.
    text = json.dumps(body).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
    with httpx.Client(base_url=coordinator.url, headers=worker_headers(job)) as http:
        response = http.post(f"/v1/jobs/{job['id']}/telemetry", content=text,
                             headers={"Content-Type": "application/json"})
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == loc
        again = http.post(f"/v1/jobs/{job['id']}/telemetry", json=telemetry(3))  # same keep-alive connection
        assert again.status_code == 200
    assert httpx.get(f"{coordinator.url}/v1/jobs/{job['id']}").json()["step"] == 3


def test_history_rows_carry_when_a_report_was_measured(start_coordinator):
    coordinator = start_coordinator(history_interval_s=0)
    job = submit(coordinator.url)
    now = time.time()
    post = lambda step, at: httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/telemetry",  # noqa: E731
                                       json=telemetry(step, wall_time=at), headers=worker_headers(job))
    assert post(10, now - 30).status_code == 200
    assert post(12, now - 10).status_code == 200
    assert post(11, now - 20).status_code == 200  # arrived late (retried after a pause)
    assert post(13, now + 3600).status_code == 200  # a worker clock ahead of ours
    history = httpx.get(f"{coordinator.url}/v1/jobs/{job['id']}/history").json()
    points = history["telemetry"]
    assert [p["step"] for p in points] == [10, 11, 12, 13]
    assert points[0]["at"] == pytest.approx(now - 30) and points[1]["at"] == pytest.approx(now - 20)
    assert points[3]["at"] <= time.time()
    assert history["job"]["step"] == 13


def test_a_stale_report_does_not_overwrite_the_snapshot(start_coordinator):
    coordinator = start_coordinator(history_interval_s=0)
    job = submit(coordinator.url)
    now = time.time()
    for step, at in ((20, now - 5), (15, now - 50)):
        assert httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/telemetry",
                          json=telemetry(step, wall_time=at), headers=worker_headers(job)).status_code == 200
    assert httpx.get(f"{coordinator.url}/v1/jobs/{job['id']}").json()["step"] == 20


def test_the_event_stream_says_how_many_reports_it_folded(start_coordinator):
    coordinator = start_coordinator(sse_poll_s=1.0)
    job = submit(coordinator.url)
    with httpx.stream("GET", f"{coordinator.url}/v1/jobs/{job['id']}/events", timeout=20) as stream:
        lines = stream.iter_lines()
        assert _first_event(lines) == "snapshot"
        for step in range(1, 6):
            assert httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/telemetry", json=telemetry(step),
                              headers=worker_headers(job)).status_code == 200
        events = []
        for line in lines:
            if line.startswith("data:") and '"reports"' in line:
                events.append(json.loads(line.removeprefix("data:")))
                if events[-1]["reports"] == 5:
                    break
    assert sum(e["skipped"] + 1 for e in events) == 5
    assert events[-1]["job"]["step"] == 5


# ---- the store ----------------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path):
    """A 2 MiB tmpfs mounted for the test (root only; skipped elsewhere)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_503_with_the_reason_and_healthz_says_so(start_coordinator, tiny_fs):
    coordinator = start_coordinator(data_dir=tiny_fs / "data")
    first = submit(coordinator.url)
    filler = tiny_fs / "filler"
    with open(filler, "wb", buffering=0) as handle:  # fill the file system to the last byte
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
        try:
            while True:
                handle.write(b"\0")
                handle.flush()
        except OSError:
            pass

    # Before anything failed, /healthz already sees that no space is left.
    early = httpx.get(f"{coordinator.url}/healthz").json()
    assert early["status"] == "degraded" and early["database"].startswith("error: only "), early
    refused = [httpx.post(f"{coordinator.url}/v1/jobs", json={**SMALLEST_SPEC, "name": f"n{i}"}) for i in range(3)]
    assert {r.status_code for r in refused} == {503}, [r.text for r in refused]
    assert "database or disk is full" in refused[-1].json()["detail"]
    assert refused[-1].headers["retry-after"]
    cancel = httpx.post(f"{coordinator.url}/v1/jobs/{first['id']}/cancel")
    assert cancel.status_code == 503
    health = httpx.get(f"{coordinator.url}/healthz").json()
    assert health["status"] == "degraded" and "disk is full" in health["database"]
    assert [j["id"] for j in httpx.get(f"{coordinator.url}/v1/jobs").json()] == [first["id"]]  # nothing half-written
    assert httpx.get(f"{coordinator.url}/v1/jobs/{first['id']}").json()["state"] == "queued"

    filler.unlink()
    assert httpx.post(f"{coordinator.url}/v1/jobs", json=SMALLEST_SPEC).status_code == 201
    assert httpx.get(f"{coordinator.url}/healthz").json()["database"] == "ok"
    assert httpx.get(f"{coordinator.url}/healthz").json()["status"] == "ok"


def test_serve_on_a_read_only_data_dir_says_so_without_a_traceback(tiny_fs):
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    result = _serve(tiny_fs / "data")
    assert result.returncode == 2
    assert "cannot use data dir" in result.stderr and "Read-only file system" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_second_coordinator_on_the_same_data_dir_is_refused(tmp_path):
    first = CoordinatorProcess(tmp_path / "shared", env={"GRADWIRE_LAUNCHER": "none"})
    try:
        first.start(wait_ray=False)
        second = _serve(tmp_path / "shared", "--port", "0")
        assert second.returncode == 2
        assert f"is in use by another coordinator (pid {first.proc.pid})" in " ".join(second.stderr.split())
        assert "Traceback" not in second.stderr
        assert httpx.get(f"{first.url}/healthz").status_code == 200
    finally:
        first.stop()
    # Once the first has gone, the data dir is free again (the kernel drops the lock).
    third = CoordinatorProcess(tmp_path / "shared", env={"GRADWIRE_LAUNCHER": "none"})
    try:
        third.start(wait_ray=False)
    finally:
        third.stop()


# ---- the OpenAPI document -----------------------------------------------------------------


@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token", "token"])
def test_the_openapi_document_declares_real_codes_and_auth(start_coordinator, token):
    coordinator = start_coordinator(token=token)
    doc = httpx.get(f"{coordinator.url}/openapi.json").json()
    paths = doc["paths"]
    submit_op = paths["/v1/jobs"]["post"]
    cancel_op = paths["/v1/jobs/{job_id}/cancel"]["post"]
    telemetry_op = paths["/v1/jobs/{job_id}/telemetry"]["post"]
    assert {"201", "413", "422", "503"} <= set(submit_op["responses"])
    assert {"200", "404", "409", "413", "422"} <= set(cancel_op["responses"])
    assert {"200", "401", "404", "409", "413", "422"} <= set(telemetry_op["responses"])
    assert "security" in telemetry_op  # worker routes always take their job's token
    assert ("security" in submit_op) is (token is not None)
    assert ("401" in submit_op["responses"]) is (token is not None)
    assert "security" not in paths["/healthz"]["get"]
    events = paths["/v1/jobs/{job_id}/events"]["get"]
    assert [p["name"] for p in events["parameters"] if p["in"] == "query"] == ["access_token"]
    assert not [p for p in paths["/v1/jobs/{job_id}"]["get"].get("parameters", []) if p["in"] == "query"]
