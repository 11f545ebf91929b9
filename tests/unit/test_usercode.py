"""User factories named by import path: loaded where the job runs, with errors that name the
field, the path and the cause; the default checkpoint interval."""

import textwrap

import pytest
import torch

from planning.config import TrainConfig
from planning.sections import auto_checkpoint_every
from workers.usercode import UserCodeError, build_workload, check_importable, load


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A package ``userpkg_t`` in a temporary directory, importable for this test only."""
    package = tmp_path / "userpkg_t"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "parts.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset

        NOT_CALLABLE = 3

        def model():
            return nn.Linear(4, 2)

        def image_model():
            return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))

        def data(seed):
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(64, 4, generator=g)
            return TensorDataset(x, (x[:, 0] > 0).long()), TensorDataset(x[:8], (x[:8, 0] > 0).long())

        def not_a_model():
            return "a string"

        def broken():
            raise RuntimeError("no GPU here")

        def one_set(seed):
            return TensorDataset(torch.zeros(4, 4))

        class Losses:
            @staticmethod
            def l1():
                return nn.L1Loss()
    '''))
    (package / "bad_import.py").write_text("import not_installed_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "userpkg_t"
    import sys
    for name in [n for n in sys.modules if n.startswith("userpkg_t")]:
        del sys.modules[name]


def test_load_resolves_dotted_attributes(user_package):
    assert load(f"{user_package}.parts:Losses.l1", "loss")() .__class__.__name__ == "L1Loss"


@pytest.mark.parametrize(("path", "field", "message"), [
    ("nowhere_at_all.mod:f", "model",
     "model: cannot import 'nowhere_at_all.mod:f': ModuleNotFoundError: No module named 'nowhere_at_all'"),
    ("userpkg_t.bad_import:f", "dataset",
     "dataset: cannot import 'userpkg_t.bad_import:f': ModuleNotFoundError: No module named 'not_installed_anywhere'"),
    ("userpkg_t.parts:missing", "model",
     "model: cannot import 'userpkg_t.parts:missing': module 'userpkg_t.parts' has no attribute 'missing'"),
    ("userpkg_t.parts:NOT_CALLABLE", "loss", "loss: 'userpkg_t.parts:NOT_CALLABLE' is a int, not a callable factory"),
])
def test_load_errors_name_field_path_and_cause(user_package, path, field, message):
    with pytest.raises(UserCodeError) as error:
        load(path, field)
    assert str(error.value) == message


def config(**fields):
    return TrainConfig.model_validate({"name": "t", "steps": 10, "workers": 1, "batch_size": 8, **fields})


def test_a_user_model_data_and_loss_build_a_workload(user_package):
    workload = build_workload(config(model=f"{user_package}.parts:model", dataset=f"{user_package}.parts:data",
                                     loss=f"{user_package}.parts:Losses.l1"))
    assert isinstance(workload.model, torch.nn.Linear)
    assert (len(workload.train_set), len(workload.test_set)) == (64, 8)
    assert isinstance(workload.loss_fn, torch.nn.L1Loss)


def test_a_user_model_on_a_built_in_dataset_gets_images(user_package):
    workload = build_workload(config(model=f"{user_package}.parts:image_model", dataset="synthetic"))
    image, label = workload.train_set[0]
    assert image.shape == (3, 32, 32) and workload.model(image[None]).shape == (1, 10)


@pytest.mark.parametrize(("fields", "message"), [
    ({"model": "userpkg_t.parts:not_a_model"}, "model: 'userpkg_t.parts:not_a_model' returned a str, not a torch.nn.Module"),
    ({"model": "userpkg_t.parts:broken"}, "model: 'userpkg_t.parts:broken' raised RuntimeError: no GPU here"),
    ({"model": "userpkg_t.parts:model", "dataset": "userpkg_t.parts:one_set"},
     "dataset: 'userpkg_t.parts:one_set' returned a TensorDataset; expected a tuple (train, held_out) of torch Datasets"),
])
def test_wrong_factories_fail_with_the_path(user_package, fields, message):
    with pytest.raises(UserCodeError) as error:
        build_workload(config(**fields))
    assert str(error.value) == message


def test_check_importable_imports_without_calling(user_package):
    check_importable(config(model="userpkg_t.parts:broken"))  # importable; calling it would fail
    with pytest.raises(UserCodeError, match="loss: cannot import 'userpkg_t.parts:nope'"):
        check_importable(config(loss="userpkg_t.parts:nope"))


@pytest.mark.parametrize(("steps", "every"), [(1, 1), (9, 1), (40, 4), (100, 10), (101, 11), (5000, 500), (10**6, 500)])
def test_the_default_checkpoint_interval(steps, every):
    assert auto_checkpoint_every(steps) == every
    assert config(steps=steps).checkpoints.interval(steps) == every
    assert config(steps=steps, checkpoint_every=0).checkpoints.interval(steps) == 0
