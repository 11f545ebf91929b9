"""The one decision type: a versioned choice of compressor, from the controller to every rank.

Torch-free (pydantic and ``planning.spec`` only). The same :class:`Decision` is what
``planning.controller.AdaptiveController`` produces, what ``POST /telemetry`` and
``GET /decision`` answer, what rank 0 broadcasts to the other ranks, what the coordinator's
store keeps (one row per version) and what the REST history lists. ``source`` and ``at``
say where and when it was made; a worker's own decisions (its starting choice, a scripted
schedule, a checkpoint) may leave them unset.

The policy (``planning.policy.decide``) returns a *verdict* (``Keep`` or ``Switch``, with
its predicted step times); the controller turns a ``Switch`` into the next :class:`Decision`
with :func:`switch_params`, the one place where a chosen spec becomes a decision's
parameters (docs/decisions.md, "One decision type").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planning.spec import CompressorSpec, make_spec, spec_to_dict

#: Who made a decision: the job spec (version 0), the adaptive policy, or an operator's pin.
#: ``released`` is accepted for decisions stored by earlier versions.
DecisionSource = Literal["config", "policy", "pinned", "released"]

#: Parameters a switch does not carry: the warm-up belongs to the start of training, and a
#: mid-run switch must not run plain all-reduce steps again (a fresh compressor's step
#: counter starts at 0, so a carried ``warmup_steps`` would repeat it).
_NOT_CARRIED = frozenset({"warmup_steps"})


class Decision(BaseModel):
    """The compressor every rank should use; ``version`` grows with each change."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(default=0, ge=0)
    compressor: str
    params: dict[str, Any] = {}
    reason: str = ""
    predicted_gain: float | None = None
    source: DecisionSource | None = None
    #: When it was made, on the clock of whoever made it (the coordinator: Unix time).
    at: float | None = None

    @model_validator(mode="after")
    def _valid_compressor(self) -> "Decision":
        make_spec(self.compressor, **self.params)
        return self

    @property
    def spec(self) -> CompressorSpec:
        return make_spec(self.compressor, **self.params)


def switch_params(spec: CompressorSpec) -> dict[str, Any]:
    """A switch's or pin's parameters: what selects the compressor (``rank`` / ``ratio``) and
    any common setting that differs from its default, never the warm-up."""
    default = make_spec(spec.name)
    return {k: v for k, v in spec.params().items()
            if k not in _NOT_CARRIED and (k in ("rank", "ratio") or getattr(default, k) != v)}


def decision_for(spec: CompressorSpec, version: int, reason: str, gain: float | None = None) -> Decision:
    """A decision that holds all of ``spec`` (a worker's starting choice: warm-up included)."""
    data = spec_to_dict(spec)
    name = data.pop("name")
    return Decision(version=version, compressor=name, params=data, reason=reason, predicted_gain=gain)
