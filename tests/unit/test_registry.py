"""Adding a compressor is its description, its kernel and one registry entry: a compressor
defined here, registered for the test, reaches ``compressors.build``, ``planning.wire``, the
cost model, the policy's candidates and decision, and ``JobSpec`` validation."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from compressors import GradientSync, build
from compressors.allreduce import CastAllReduce
from compressors.base import run_in_lockstep
from compressors.quality import estimate_errors
from coordinator.schemas import JobSpec
from planning import registry
from planning.codec import Codec, CompressorSpec, TensorLoad
from planning.costmodel import Link, StepProfile, candidates, codec_work, predict_step
from planning.policy import Measurements, PolicyConfig, PolicyState, Switch, decide, guard_failure
from planning.progress import error_of
from planning.shapes import Shape, numel
from planning.spec import make_spec
from planning.wire import is_compressed, wire_bytes

NAME = "halfmat"


class HalfMatrices(CastAllReduce):
    """The test kernel: the whole bucket in fp16 (an existing kernel reused: the point is the
    plumbing, not new maths)."""

    dtype = torch.float16


class HalfMatricesCodec(Codec):
    """Sends matrices in 2 bytes an element, charges 1-D tensors full price (as if fp32)."""

    name = NAME
    kernel = f"{__name__}:HalfMatrices"
    lossiness = 1  # between none (0) and fp16 (1): ties are broken by registry order
    known_error = 2.0 ** -11

    def compresses(self, spec: CompressorSpec, shape: Shape) -> bool:
        return len(shape) >= 2

    def compressed_bytes(self, spec: CompressorSpec, shape: Shape, element_bytes: int) -> float:
        return 2 * numel(shape)

    def compressed_load(self, spec: CompressorSpec, shape: Shape, world_size: int, wire: float) -> TensorLoad:
        return TensorLoad(wire, 0.0, 0.0, numel(shape), 0.0, numel(shape))


SHAPES = [(256, 128), (128,), (10, 256)]


@pytest.fixture
def halfmat():
    with registry.registered(HalfMatricesCodec()) as codec:
        yield codec
    assert NAME not in registry.names()


def test_unregistered_it_is_unknown_everywhere():
    with pytest.raises(ValueError, match="^name: unknown compressor 'halfmat'"):
        build(NAME)
    with pytest.raises(ValidationError, match="unknown compressor 'halfmat'"):
        JobSpec.model_validate({"compression": {"compressor": NAME}})


def test_build_resolves_its_kernel_and_the_kernel_runs(halfmat):
    compressor = build(NAME, warmup_steps=0)
    assert type(compressor) is HalfMatrices and compressor.label == NAME
    with pytest.raises(ValueError, match="^rank: not a parameter of 'halfmat'"):
        build(NAME, rank=4)
    buffers = [torch.full((6,), float(r + 1)) for r in range(2)]
    run_in_lockstep([compressor.process(b, [], 2) for b in buffers])
    assert torch.equal(buffers[0], torch.full((6,), 1.5))
    assert GradientSync(compressor).compressor is compressor


def test_wire_bytes_and_the_cost_model_use_its_formulas(halfmat):
    spec = make_spec(NAME)
    assert is_compressed(spec, (3, 4)) and not is_compressed(spec, (12,))
    expected = 2 * (256 * 128) + 4 * 128 + 2 * (10 * 256)
    assert wire_bytes(spec, SHAPES, world_size=2) == expected
    assert build(NAME).wire_bytes(SHAPES, 2) == expected
    assert codec_work(spec, SHAPES, 2) == 2 * (256 * 128 + 128 + 10 * 256)
    profile = StepProfile.build(SHAPES, forward_s=0.01, backward_s=0.02)
    slow = Link(alpha=1e-4, beta=1e-6)
    mine, plain = predict_step(spec, profile, 2, slow), predict_step(make_spec("none"), profile, 2, slow)
    assert mine.bytes_per_step == expected
    assert mine.comm_s < plain.comm_s


def test_the_policy_considers_and_chooses_it(halfmat):
    labels = [spec.label for spec in candidates(("fp16", NAME, "none"))]
    assert labels == ["none", "fp16", NAME]  # by lossiness, then registry order
    assert NAME in PolicyConfig().allowed  # the default is every registered compressor
    cfg = PolicyConfig(allowed=("none", NAME), min_dwell_s=0.0, critical_initial_steps=0)
    current = make_spec("none")
    assert guard_failure(make_spec(NAME), cfg, critical=True) is None
    assert error_of(NAME, NAME, None) == 2.0 ** -11  # its known error, no measurement needed
    profile = StepProfile.build([(2048, 2048)], forward_s=0.001, backward_s=0.002)
    m = Measurements(bandwidth_bytes_per_second=1e7, latency_s=1e-4, world_size=4, profile=profile,
                     current=current, step=1000)
    decision, _ = decide(PolicyState(), m, cfg, now=100.0)
    assert isinstance(decision, Switch) and decision.spec.name == NAME


def test_jobspec_accepts_it_fixed_and_adaptive(halfmat):
    job = JobSpec.model_validate({"compression": {"compressor": NAME, "rank": 8}})
    assert job.compression.compressor == NAME
    assert job.compression.compressor_params() == {"warmup_steps": 0}  # takes no rank
    adaptive = JobSpec.model_validate({"compression": {"mode": "adaptive", "allowed": ["none", NAME]}})
    assert adaptive.compression.allowed == ["none", NAME]


def test_the_quality_estimate_runs_its_kernel(halfmat):
    tensor = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    errors = estimate_errors([tensor], [make_spec(NAME), make_spec("fp16")])
    assert errors[NAME] == errors["fp16"] > 0  # the same cast, through the generic estimate


def test_a_registered_name_cannot_be_taken_twice(halfmat):
    with pytest.raises(ValueError, match="already registered"):
        registry.register(HalfMatricesCodec())
    with pytest.raises(ValueError, match="built in"):
        registry.unregister("none")
