"""The user's own model, data and loss over REST, on a real local Ray cluster.

The package is written to a temporary directory that is on no process's ``sys.path``: the
coordinator cannot import it, and the workers get it only through the job's ``runtime_env``
(``working_dir``), which the coordinator hands to Ray on the job's runner actor.
"""

import re
import textwrap
import uuid

import httpx
import pytest
from support.api import TERMINAL, history_of, job_of, post, wait_state

pytestmark = pytest.mark.slow

REAL = "workers.runner:run_job"
PHASES = ("data", "forward", "backward", "exposed_comm", "optimizer", "compress", "communicate", "decompress")


@pytest.fixture
def user_code(tmp_path):
    """(working_dir, package name): a package of a model, a dataset and a loss factory."""
    root = tmp_path / "user-code"
    name = f"gwtest_{uuid.uuid4().hex[:8]}"
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "factories.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset

        def model():
            return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))

        def data(seed):
            g = torch.Generator().manual_seed(seed)
            teacher = torch.randn(8, 4, generator=g)
            x = torch.randn(2048, 8, generator=g)
            y = (x @ teacher).argmax(1)
            return TensorDataset(x[:1536], y[:1536]), TensorDataset(x[1536:], y[1536:])

        def loss():
            return nn.CrossEntropyLoss(label_smoothing=0.1)

        def not_a_model():
            return {"layers": 3}
    '''))
    return root, name


def spec(name, package, working_dir, **extra):
    return {"name": name, "model": f"{package}.factories:model", "dataset": f"{package}.factories:data",
            "loss": f"{package}.factories:loss", "steps": 60, "batch_size": 32, "workers": 2,
            "report_interval_s": 0.3, "runtime_env": {"working_dir": str(working_dir)},
            "compression": {"mode": "adaptive", "compressor": "acpsgd", "rank": 4}, **extra}


@pytest.mark.timeout(300)
def test_a_job_of_user_code_shipped_by_runtime_env_succeeds_like_a_built_in_one(serve, user_code):
    working_dir, package = user_code
    coordinator = serve(runner=REAL)
    url = coordinator.url
    job = post(url, spec("mine", package, working_dir))
    done = wait_state(url, job["id"], TERMINAL, timeout_s=240)
    assert done["state"] == "succeeded", (done, coordinator.log())
    assert done["step"] == 60
    summary = done["summary"]
    assert summary["model"] == f"{package}.factories:model"
    assert summary["final_loss"] < 1.3  # 4 classes: log 4 = 1.39 at chance
    assert 0.0 <= summary["eval_accuracy"] <= 1.0 and summary["eval_loss"] > 0  # the held-out set was used
    for phase in ("forward", "backward", "communicate"):
        assert done["phase_seconds"][phase] > 0, phase

    history = history_of(url, job["id"])
    assert [t["to_state"] for t in history["transitions"]] == ["queued", "running", "succeeded"]
    assert history["telemetry"] and history["telemetry"][-1]["step"] == 60
    assert set(history["telemetry"][-1]["phase_seconds"]) == set(PHASES)
    decisions = history["decisions"]
    assert decisions[0]["source"] == "config" and decisions[0]["compressor"] == "acpsgd"
    assert [g["restart"] for g in history["worker_groups"]] == [False]

    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    for phase in ("forward", "backward", "optimizer"):
        pattern = rf'gradwire_step_phase_seconds_count\{{[^}}]*job="{job["id"]}"[^}}]*phase="{phase}"[^}}]*\}} ([0-9.e+]+)'
        counts = re.findall(pattern, metrics) or re.findall(
            rf'gradwire_step_phase_seconds_count\{{[^}}]*phase="{phase}"[^}}]*job="{job["id"]}"[^}}]*\}} ([0-9.e+]+)', metrics)
        assert counts and float(counts[0]) > 0, phase
    assert re.search(rf'gradwire_compressor_info\{{[^}}]*job="{job["id"]}"', metrics)


@pytest.mark.timeout(240)
def test_user_code_that_does_not_import_or_has_the_wrong_type_fails_the_job_naming_the_path(serve, user_code):
    working_dir, package = user_code
    coordinator = serve(runner=REAL)
    url = coordinator.url
    no_runtime_env = post(url, {**spec("no-env", package, working_dir), "runtime_env": None})
    missing = post(url, spec("missing", package, working_dir, model=f"{package}.factories:transformer"))
    wrong_type = post(url, spec("wrong-type", package, working_dir, model=f"{package}.factories:not_a_model"))

    failed = wait_state(url, no_runtime_env["id"], TERMINAL, timeout_s=120)
    assert failed["state"] == "failed"
    assert failed["reason"] == (f"UserCodeError: model: cannot import '{package}.factories:model': "
                                f"ModuleNotFoundError: No module named '{package}'")
    failed = wait_state(url, missing["id"], TERMINAL, timeout_s=120)
    assert (failed["state"], failed["reason"]) == ("failed", (
        f"UserCodeError: model: cannot import '{package}.factories:transformer': module "
        f"'{package}.factories' has no attribute 'transformer'"))
    failed = wait_state(url, wrong_type["id"], TERMINAL, timeout_s=120)
    assert (failed["state"], failed["reason"]) == ("failed", (
        f"UserCodeError: model: '{package}.factories:not_a_model' returned a dict, not a torch.nn.Module"))
    for job in (no_runtime_env, missing, wrong_type):
        assert job_of(url, job["id"])["step"] == 0  # no worker group ever trained
