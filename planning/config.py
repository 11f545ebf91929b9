"""A training job's configuration: the run-wide fields and one section per concern.

``JobFields`` is what a user says about a job (the coordinator's REST ``JobSpec`` is this
model); ``TrainConfig`` adds what the launcher sets and is what every worker receives. The
sections (``planning.sections``) hold each concern's fields and rules, so each is validated
once, whether the spec came over REST, from a YAML file for ``gradwire train``/``submit``, or
from a worker's ``train_loop_config``.

Flat specs, the form every job had before the sections, keep working: :func:`fold_flat`
moves each known flat key into its section (``batch_size`` -> ``data.batch_size``,
``probe_interval_s`` -> ``probing.interval_s``; ``model: mlp`` -> ``model.name``) before
validation, so an error names the field by its section path (``data.batch_size: ...``).

Torch-free (pydantic only): the coordinator imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, StrictBool, field_validator, model_validator

from planning.sections import (
    EXTERNAL_DATASET,
    JOB_NAME_PATTERN,
    SEQUENCE_MODELS,
    CheckpointConfig,
    CompressionConfig,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    ProbingConfig,
    _Section,
)

#: Bounds of ``workers`` (and of a reported world size).
MAX_WORKERS = 1024

#: Where each flat key of the pre-section form lives now: ``flat -> (section, field)``.
FLAT_KEYS: dict[str, tuple[str, str]] = {
    "loss": ("model", "loss"),
    "dataset": ("data", "dataset"),
    "batch_size": ("data", "batch_size"),
    "seq_len": ("data", "seq_len"),
    "image_size": ("data", "image_size"),
    "shuffle_seed": ("data", "shuffle_seed"),
    "lr": ("optimizer", "lr"),
    "momentum": ("optimizer", "momentum"),
    "weight_decay": ("optimizer", "weight_decay"),
    "lr_schedule": ("optimizer", "lr_schedule"),
    "bucket_cap_mb": ("compression", "bucket_cap_mb"),
    "pipelining": ("compression", "pipelining"),
    "sync_every": ("compression", "sync_every"),
    "schedule": ("compression", "schedule"),
    "probe_interval_s": ("probing", "interval_s"),
    "probe_budget": ("probing", "budget"),
    "report_interval_s": ("probing", "report_interval_s"),
    "checkpoint_every": ("checkpoints", "every"),
    "max_failures": ("checkpoints", "max_failures"),
}
#: Sections that a plain string names (``model: mlp`` is ``model: {name: mlp}``).
NAMED_SECTIONS: dict[str, str] = {"model": "name", "optimizer": "name"}




def _as_dict(section: Any, name: str) -> dict[str, Any]:
    if section is None:
        return {}
    if isinstance(section, BaseModel):
        return section.model_dump(exclude_unset=True)
    if isinstance(section, Mapping):
        return dict(section)
    raise ValueError(f"{name}: must be a mapping of fields")


def fold_flat(data: Any) -> Any:
    """``data`` with every flat key of :data:`FLAT_KEYS` moved into its section (and a string
    ``model``/``optimizer`` made the section's ``name``). A field given both flat and in its
    section is an error naming both; anything else is left for validation to judge."""
    if not isinstance(data, Mapping):
        return data
    out = dict(data)
    for section, leaf in NAMED_SECTIONS.items():
        if isinstance(out.get(section), str):
            out[section] = {leaf: out[section]}
    for flat, (section, leaf) in FLAT_KEYS.items():
        if flat not in out:
            continue
        value = out.pop(flat)
        target = _as_dict(out.get(section), section)
        if leaf in target:
            raise ValueError(f"{flat}: given twice, flat and as {section}.{leaf}; give it once")
        out[section] = {**target, leaf: value}
    return out



class RuntimeEnvConfig(_Section):
    """How the user's code reaches the workers: the subset of Ray's ``runtime_env`` a job may
    set, with Ray's own field names (https://docs.ray.io/en/latest/ray-core/handling-dependencies.html).

    ``working_dir`` and ``py_modules`` entries are local paths on the coordinator's host
    (Ray zips and uploads them to the cluster when the job starts) or remote URIs of zip
    files (``https://``, ``s3://``, ``gs://``); ``pip`` lists requirement strings installed
    into a virtualenv of the job's own; ``env_vars`` are set in every process of the job.
    """

    working_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    py_modules: list[str] | None = Field(default=None, min_length=1, max_length=64)
    pip: list[str] | None = Field(default=None, min_length=1, max_length=256)
    env_vars: dict[str, str] | None = None

    @field_validator("py_modules", "pip")
    @classmethod
    def _no_empty_entries(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not entry.strip() for entry in value):
            raise ValueError("entries must be non-empty strings")
        return value

    @field_validator("env_vars")
    @classmethod
    def _env_names(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name in value or {}:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"environment variable name {name!r} is not valid")
        return value

    def to_ray(self) -> dict[str, Any]:
        """The dict ``ray.remote(...).options(runtime_env=...)`` takes."""
        return self.model_dump(exclude_none=True)


class JobFields(_Section):
    """What a user says about a training job: run-wide fields and one section per concern.
    Every field has a default; unknown fields are refused; flat keys are folded into their
    sections first (:func:`fold_flat`)."""

    name: str = Field(default="job", min_length=1, max_length=128, pattern=JOB_NAME_PATTERN,
                      description="letters, digits, '.', '_' and '-' (it names the run's directory)")
    #: True: the training runs elsewhere (a Ray Train or torchrun script using
    #: ``gradwire.ray.prepare`` / ``gradwire.torch.prepare``); the coordinator records it,
    #: decides for it and shows it, but launches nothing.
    external: StrictBool = False
    #: Ray runtime environment of the job's processes: how a user factory's code gets there.
    runtime_env: RuntimeEnvConfig | None = None
    steps: int | None = Field(default=None, ge=1, le=10_000_000)
    epochs: int | None = Field(default=None, ge=1, le=100_000)
    #: Worker processes: ``2``, or ``[min, max]`` (``"1..4"``) for Ray Train elastic scaling.
    workers: int | tuple[int, int] = 2
    use_gpu: StrictBool = False
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    compression: CompressionConfig = CompressionConfig()
    probing: ProbingConfig = ProbingConfig()
    checkpoints: CheckpointConfig = CheckpointConfig()

    @model_validator(mode="before")
    @classmethod
    def _fold(cls, data: Any) -> Any:
        return fold_flat(data)

    @field_validator("workers", mode="before")
    @classmethod
    def _parse_workers(cls, value: Any) -> Any:
        """Accept ``2``, ``"2"``, ``"1..4"`` or ``[1, 4]``."""
        if isinstance(value, bool):
            raise ValueError("must be a number or 'min..max', got a boolean")
        if isinstance(value, str):
            text = value.strip()
            if ".." in text:
                low, _, high = text.partition("..")
                try:
                    return (int(low), int(high))
                except ValueError:
                    raise ValueError(f"must be a number or 'min..max', got {value!r}") from None
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"must be a number or 'min..max', got {value!r}") from None
        return value

    @field_validator("workers")
    @classmethod
    def _valid_workers(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        low, high = (value, value) if isinstance(value, int) else value
        if low < 1 or high > MAX_WORKERS or low > high:
            raise ValueError(f"must be between 1 and {MAX_WORKERS} with min <= max, got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "JobFields":
        if self.steps is None and self.epochs is None:
            object.__setattr__(self, "steps", 100)
        if self.steps is not None and self.epochs is not None:
            raise ValueError("give steps or epochs, not both")
        model, dataset = self.model.name, self.data.dataset
        if model in SEQUENCE_MODELS and dataset == "digits":
            raise ValueError(f"model.name {model!r} takes token sequences; data.dataset 'digits' holds images")
        if (dataset == EXTERNAL_DATASET) != self.external:
            raise ValueError(f"data.dataset {EXTERNAL_DATASET!r} is for external jobs (external: true) only, "
                             "and an external job's dataset is 'external'")
        if not self.external and self.data.user_code and not self.model.user_code:
            raise ValueError(f"data.dataset {dataset!r} is your own: give your own model too (built-in "
                             "models are shaped for the built-in datasets)")
        return self

    @property
    def min_workers(self) -> int:
        return self.workers if isinstance(self.workers, int) else self.workers[0]

    @property
    def max_workers(self) -> int:
        return self.workers if isinstance(self.workers, int) else self.workers[1]

    @property
    def shuffle_seed(self) -> int:
        """The seed of the training samples' order: ``data.shuffle_seed``, else the job's ``seed``."""
        return self.seed if self.data.shuffle_seed is None else self.data.shuffle_seed


class TrainConfig(JobFields):
    """Everything one training job needs; what every worker receives."""

    #: Where ``--no-ray`` runs keep checkpoints (Ray Train uses its own storage).
    checkpoint_dir: str | None = None
    #: Set by the coordinator: where rank 0 posts telemetry and reads decisions.
    coordinator_url: str | None = None
    job_id: str | None = None
    job_token: str | None = None
