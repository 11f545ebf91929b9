"""``workers.session`` in one process (a one-rank gloo group): the user's loop is timed by
hooks, stepped, reported to a coordinator, and follows the coordinator's pin."""


import httpx
import pytest
import torch
from support.api import SMALLEST_SPEC, submit
from support.servers import wait_for
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from planning.sections import CompressionConfig
from workers.session import JobLink, compression_config, start


@pytest.fixture
def one_rank_group():
    from benchmarks.compressor_cost import single_process_group

    with single_process_group():
        yield


def train(session, model, steps, optimizer):
    for _ in range(steps):
        inputs, targets = torch.randn(16, 8), torch.randint(0, 4, (16,))
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.step(loss)


def test_compression_config_forms():
    assert compression_config("powersgd", rank=2) == CompressionConfig(mode="fixed", compressor="powersgd", rank=2)
    assert compression_config("adaptive").mode == "adaptive"
    assert compression_config({"mode": "fixed", "compressor": "topk", "ratio": 0.1}).ratio == 0.1
    assert compression_config(None).compressor == "acpsgd"


def test_a_users_loop_is_timed_by_hooks_and_ends_after_its_steps(one_rank_group):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    session = start(model, device=torch.device("cpu"), wrap=DistributedDataParallel, compression="acpsgd",
                    rank=2, steps=6)
    ddp = session.ddp
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with torch.no_grad():
        ddp(torch.randn(4, 8))  # an evaluation forward is not a training step's
    train(session, ddp, 6, optimizer)
    assert session.closed and session.step_index == 6
    assert len(session.timer.recent) == 6
    for timing in session.timer.recent:
        for phase in ("data", "forward", "backward", "optimizer"):
            assert timing.seconds[phase] > 0, phase
    assert session.reporter.batch_size == 16  # read from the batches
    assert session.sync.stats().steps == 6
    optimizer.step()  # after close the global optimizer hook is gone: nothing is timed any more
    assert len(session.timer.recent) == 6 and not session._open


def test_a_users_loop_writes_the_step_trace_when_asked(one_rank_group, tmp_path, monkeypatch):
    """``GRADWIRE_STEP_TRACE`` in the user's own loop, as in the built-in one: a header naming
    the job, then every step with its user's step (``train``: data, forward, backward and
    optimizer), rank 0's reporting after it, and the agreement before it; read back by the
    benchmark's reader. No drop of the link was read: the list the built-in summary shows is empty."""
    from benchmarks.step_trace import load
    from workers.step_trace import TRACE_ENV

    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "steps"))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    session = start(model, device=torch.device("cpu"), wrap=DistributedDataParallel, compression="powersgd",
                    rank=2, steps=7, name="mine", sync_every=3)
    optimizer = torch.optim.SGD(session.ddp.parameters(), lr=0.1)
    train(session, session.ddp, 7, optimizer)
    (trace,) = load(tmp_path / "steps")
    assert trace.rank == 0
    assert trace.job == {"name": "mine", "mode": "fixed", "compressor": "powersgd-r2", "seed": session.cfg.seed}
    assert sorted(trace.steps) == list(range(7))
    for step, line in trace.steps.items():
        phases = line["phases"]
        assert line["compressor"] == "powersgd-r2" and line["bytes"] > 0
        assert line["train"] >= phases["data"] + phases["forward"] + phases["backward"] + phases["optimizer"] > 0
        assert line["after"] > 0
        assert line["agree"] >= 0, step
    starts = [trace.steps[s]["started"] for s in range(7)]
    assert starts == sorted(starts)
    assert session.link_drops_read == []


def test_a_session_reports_to_its_job_and_follows_a_pin(one_rank_group, coordinator):
    url = coordinator.url
    job = submit(url, {**SMALLEST_SPEC, "name": "script", "model": "train:Net", "dataset": "external",
                       "external": True, "steps": 400})
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    session = start(model, device=torch.device("cpu"), wrap=DistributedDataParallel, compression="acpsgd",
                    rank=2, steps=400, coordinator=JobLink(url, job["id"], job["worker_token"]),
                    report_interval_s=0.05, sync_every=2)
    optimizer = torch.optim.SGD(session.ddp.parameters(), lr=0.1)
    train(session, session.ddp, 10, optimizer)
    wait_for(lambda: httpx.get(f"{url}/v1/jobs/{job['id']}").json()["step"] > 0, 10, "a report")
    pin = httpx.put(f"{url}/v1/jobs/{job['id']}/policy", json={"mode": "pinned", "compressor": "fp16"})
    assert pin.status_code == 200

    def switched():
        train(session, session.ddp, 2, optimizer)
        return session.compressor == "fp16"

    wait_for(switched, 20, "the pin to reach the session")
    assert session.switches[-1]["version"] == 1 and session.switches[-1]["to"] == "fp16"
    train(session, session.ddp, 400 - session.step_index, optimizer)
    done = wait_for(lambda: (j := httpx.get(f"{url}/v1/jobs/{job['id']}").json())["state"] == "succeeded" and j,
                    10, "the job to end with its last report")
    assert done["step"] == 400 and done["compressor"] == "fp16"
