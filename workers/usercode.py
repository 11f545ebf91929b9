"""The user's own model, data and loss, named in a job by import path (``package.module:factory``).

The coordinator only checks the form of a path (:func:`planning.sections.is_import_path`);
the code is imported here, inside the job's Ray processes, where the job's ``runtime_env``
(``working_dir``, ``py_modules``, ``pip``) has put it on ``sys.path``. Every failure is a
:class:`UserCodeError` whose message names the job field, the path and the error, so a job
that cannot start fails with a reason the user can act on.

Contracts (also in the README):

* ``model``: ``factory()`` returns a ``torch.nn.Module``;
* ``dataset``: ``factory(seed)`` returns ``(train, held_out)``: ``torch.utils.data.Dataset``
  objects of ``(input, target)`` items (``held_out`` may be None);
* ``loss``: ``factory()`` returns a callable ``loss(outputs, targets)`` giving a scalar tensor
  (a class such as ``torch.nn:MSELoss`` is such a factory).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import Dataset

from planning.config import TrainConfig
from planning.sections import is_import_path


class UserCodeError(ValueError):
    """A user factory could not be imported, failed, or returned the wrong type."""


def load(path: str, field: str) -> Callable[..., Any]:
    """The callable at ``package.module:attr.attr``; raises :class:`UserCodeError` naming ``field``."""
    if not is_import_path(path):
        raise UserCodeError(f"{field}: import path {path!r} is malformed (write 'package.module:factory')")
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - any import-time failure of user code
        raise UserCodeError(f"{field}: cannot import {path!r}: {type(exc).__name__}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UserCodeError(f"{field}: cannot import {path!r}: module {module_name!r} has no "
                                f"attribute {attribute!r}") from None
    if not callable(target):
        raise UserCodeError(f"{field}: {path!r} is a {type(target).__name__}, not a callable factory")
    return target


def _call(factory: Callable[..., Any], path: str, field: str, *args: Any) -> Any:
    try:
        return factory(*args)
    except BaseException as exc:  # noqa: BLE001 - report the user's error with the path
        raise UserCodeError(f"{field}: {path!r} raised {type(exc).__name__}: {exc}") from exc


def build_user_model(path: str) -> nn.Module:
    model = _call(load(path, "model"), path, "model")
    if not isinstance(model, nn.Module):
        raise UserCodeError(f"model: {path!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def build_user_datasets(path: str, seed: int) -> tuple[Dataset, Dataset | None]:
    result = _call(load(path, "dataset"), path, "dataset", seed)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise UserCodeError(f"dataset: {path!r} returned a {type(result).__name__}; "
                            "expected a tuple (train, held_out) of torch Datasets")
    train, held_out = result
    for name, value in (("train", train), ("held_out", held_out)):
        if value is None and name == "held_out":
            continue
        if not isinstance(value, Dataset) or not hasattr(value, "__len__"):
            raise UserCodeError(f"dataset: {path!r} returned a {type(value).__name__} as its {name} set; "
                                "expected a torch.utils.data.Dataset with a length")
    if len(train) == 0:
        raise UserCodeError(f"dataset: {path!r} returned an empty training set")
    return train, held_out


def build_user_loss(path: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    loss = _call(load(path, "loss"), path, "loss")
    if not callable(loss):
        raise UserCodeError(f"loss: {path!r} returned a {type(loss).__name__}, not a callable loss(outputs, targets)")
    return loss


@dataclass
class Workload:
    """What one job trains: a model, its training and held-out data, and the loss."""

    model: nn.Module
    train_set: Dataset
    test_set: Dataset | None
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(outputs, targets)


def build_workload(cfg: TrainConfig) -> Workload:
    """Model, data and loss of ``cfg``: built-in names from the registries, import paths from
    the user's code. A user model on a built-in dataset gets it as images (shaped as for the
    built-in ``cnn``: 3x32x32 synthetic images or 1x8x8 digits, 10 classes)."""
    from workers.data import build_dataset, input_spec
    from workers.models import build_model

    loss_fn = build_user_loss(cfg.model.loss) if cfg.model.loss else cross_entropy
    if cfg.data.user_code:
        train_set, test_set = build_user_datasets(cfg.data.dataset, cfg.seed)
        return Workload(build_user_model(cfg.model.name), train_set, test_set, loss_fn)
    shape_as = "cnn" if cfg.model.user_code else cfg.model.name
    options = dict(seq_len=cfg.data.seq_len, image_size=cfg.data.image_size)
    if cfg.model.user_code:
        model = build_user_model(cfg.model.name)
    else:
        model = build_model(cfg.model.name, **input_spec(cfg.model.name, cfg.data.dataset, **options))
    train_set = build_dataset(cfg.data.dataset, model=shape_as, split="train", seed=cfg.seed, **options)
    test_set = build_dataset(cfg.data.dataset, model=shape_as, split="test", seed=cfg.seed, **options)
    return Workload(model, train_set, test_set, loss_fn)


def check_importable(cfg: TrainConfig) -> None:
    """Import every user factory of ``cfg`` (without calling it): the job's runner calls this
    before starting workers, so a path that does not import fails the job at once."""
    for field, path in (("model", cfg.model.name), ("dataset", cfg.data.dataset), ("loss", cfg.model.loss)):
        if path and is_import_path(path):
            load(path, field)
