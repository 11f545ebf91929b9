"""Model registry: exact parameter shapes of the reference networks, forward shapes, errors.

Large models are built on the ``meta`` device (``parameter_shapes``), so these tests take
well under a second each and allocate no weights.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from planning import sections
from workers.models import MODEL_NAMES, build_model, count_parameters, default_num_classes, parameter_shapes

#: torchvision's counts with ImageNet heads (num_classes=1000).
TORCHVISION_COUNTS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet152": 60_192_808,
    "vgg16": 138_357_544,
}
#: BertModel (embeddings + encoder + pooler) has 109,482,240 parameters (bert-base) and
#: 335,141,888 (bert-large); a 2-class head adds 768*2+2 = 1,538 and 1024*2+2 = 2,050.
BERT_BASE_2_CLASSES = 109_483_778
BERT_LARGE_2_CLASSES = 335_143_938

TINY_BERT = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "intermediate_size": 128}


def _numel(shapes: list[tuple[int, ...]]) -> int:
    return sum(math.prod(shape) for shape in shapes)


def test_model_names_match_the_job_config() -> None:
    assert MODEL_NAMES == sections.MODEL_NAMES


@pytest.mark.parametrize("name", sorted(TORCHVISION_COUNTS))
def test_vision_parameter_counts_match_torchvision(name: str) -> None:
    assert _numel(parameter_shapes(name, num_classes=1000)) == TORCHVISION_COUNTS[name]


def test_vision_models_default_to_imagenet_head() -> None:
    assert default_num_classes("resnet50") == 1000
    assert parameter_shapes("resnet50")[-2:] == [(1000, 2048), (1000,)]


def test_bert_base_parameter_count() -> None:
    total = _numel(parameter_shapes("bert-base", num_classes=2))
    assert abs(total - 110_000_000) <= 1_500_000
    assert total == BERT_BASE_2_CLASSES


def test_bert_large_parameter_count() -> None:
    assert _numel(parameter_shapes("bert-large", num_classes=2)) == BERT_LARGE_2_CLASSES


def test_bert_has_separate_query_key_value_matrices() -> None:
    with torch.device("meta"):
        model = build_model("bert-base", num_classes=2)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for part in ("query", "key", "value", "output"):
        assert shapes[f"layers.0.attention.{part}.weight"] == (768, 768)
    assert shapes["layers.11.intermediate.weight"] == (3072, 768)
    assert shapes["embeddings.word_embeddings.weight"] == (30522, 768)
    assert shapes["embeddings.position_embeddings.weight"] == (512, 768)
    assert shapes["embeddings.token_type_embeddings.weight"] == (2, 768)
    assert shapes["pooler.weight"] == (768, 768)
    assert shapes["classifier.weight"] == (2, 768)


def test_resnet_parameter_names_follow_torchvision() -> None:
    with torch.device("meta"):
        names = [name for name, _ in build_model("resnet50", num_classes=1000).named_parameters()]
    assert names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert "layer1.0.downsample.0.weight" in names
    assert "layer4.2.conv3.weight" in names
    assert names[-2:] == ["fc.weight", "fc.bias"]


def test_parameter_shapes_equal_built_model() -> None:
    model = build_model("resnet50", num_classes=1000)
    assert parameter_shapes("resnet50", num_classes=1000) == [tuple(p.shape) for p in model.parameters()]
    assert count_parameters(model) == TORCHVISION_COUNTS["resnet50"]


def test_vgg16_first_classifier_layer_keeps_torchvision_shape() -> None:
    shapes = parameter_shapes("vgg16")
    assert shapes[-6] == (4096, 25088)  # the first classifier layer, VGG's largest gradient


@pytest.mark.parametrize(
    ("name", "batch", "kwargs"),
    [
        ("mlp", torch.randn(4, 64), {"in_channels": 1, "image_size": 8}),
        ("mlp", torch.randn(4, 1, 8, 8), {"in_channels": 1, "image_size": 8}),
        ("cnn", torch.randn(4, 1, 8, 8), {"in_channels": 1, "image_size": 8}),
        ("cnn", torch.randn(4, 3, 32, 32), {}),
        ("resnet18", torch.randn(2, 3, 32, 32), {}),
        ("resnet18", torch.randn(2, 1, 48, 48), {"in_channels": 1, "image_size": 48}),
    ],
)
def test_image_forward_shapes_and_every_parameter_gets_a_gradient(name: str, batch: torch.Tensor, kwargs: dict) -> None:
    model = build_model(name, num_classes=10, **kwargs)
    logits = model(batch)
    assert logits.shape == (batch.shape[0], 10)
    # DDP requires every parameter to take part in the loss.
    F.cross_entropy(logits, torch.zeros(batch.shape[0], dtype=torch.long)).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_vgg16_forward_on_small_images() -> None:
    # 138M parameters are too slow to allocate here; check the shapes the classifier sees.
    with torch.device("meta"):
        model = build_model("vgg16", num_classes=10)
        logits = model(torch.empty(2, 3, 32, 32))
    assert logits.shape == (2, 10)


def test_small_bert_forward_and_backward() -> None:
    model = build_model("bert-base", num_classes=3, vocab_size=100, **TINY_BERT)
    assert len(model.layers) == 2
    tokens = torch.randint(100, (5, 16))
    logits = model(tokens)
    assert logits.shape == (5, 3)
    F.cross_entropy(logits, torch.zeros(5, dtype=torch.long)).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_bert_padding_mask_hides_padded_tokens() -> None:
    model = build_model("bert-base", num_classes=2, vocab_size=100, **TINY_BERT).eval()
    tokens = torch.randint(100, (1, 8))
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    other = tokens.clone()
    other[0, 5:] = (other[0, 5:] + 1) % 100  # change only the padded positions
    with torch.no_grad():
        assert torch.allclose(model(tokens, attention_mask=mask), model(other, attention_mask=mask), atol=1e-6)


def test_bert_layer_override_changes_depth_only() -> None:
    shapes = parameter_shapes("bert-base", num_layers=2)
    full = parameter_shapes("bert-base")
    per_layer = 16  # q, k, v, out, 2 norms, 2 FFN linears: 8 weights + 8 biases
    assert len(full) - len(shapes) == 10 * per_layer
    assert shapes[:5] == full[:5]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: build_model("resnet99", num_classes=10), "unknown model 'resnet99'"),
        (lambda: build_model("resnet50", num_classes=10, image_size=16), "image_size >= 32"),
        (lambda: build_model("vgg16", num_classes=10, image_size=8), "image_size >= 32"),
        (lambda: build_model("resnet18", num_classes=10, num_layers=2), "takes no options"),
        (lambda: build_model("bert-base", num_classes=2, depth=2), "unknown option(s) depth"),
        (lambda: build_model("bert-base", num_classes=2, seq_len=1024), "seq_len 1024 exceeds"),
        (lambda: build_model("mlp", num_classes=0), "num_classes must be >= 1"),
        (lambda: build_model("bert-base", num_classes=2, hidden_size=100, num_heads=12), "not divisible"),
    ],
)
def test_bad_arguments_raise_value_error(call, message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        with torch.device("meta"):
            call()
    assert message in str(excinfo.value)
