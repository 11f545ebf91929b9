"""A BERT encoder (Devlin et al. 2019) with a sequence-classification head.

Parameter shapes match Hugging Face's ``BertForSequenceClassification`` for the published
BERT-Base and BERT-Large configurations (:data:`BERT_CONFIGS`), written in plain ``torch.nn``
so no model library is needed; smaller configurations (a 2-layer BERT) serve fast tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: Architecture hyper-parameters of the published checkpoints.
BERT_CONFIGS: dict[str, dict[str, int]] = {
    "bert-base": {"num_layers": 12, "hidden_size": 768, "num_heads": 12, "intermediate_size": 3072},
    "bert-large": {"num_layers": 24, "hidden_size": 1024, "num_heads": 16, "intermediate_size": 4096},
}
BERT_MAX_POSITIONS = 512
BERT_TYPE_VOCAB = 2
#: Default classes for sequence classification (e.g. sentiment: negative/positive).
BERT_NUM_CLASSES = 2


class BertEmbeddings(nn.Module):
    """Sum of token, position and segment embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, hidden: int, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(BERT_TYPE_VOCAB, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.norm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with separate query/key/value projections.

    Separate projections (rather than one fused in_proj as ``nn.MultiheadAttention`` has)
    keep BERT's gradient shapes: three hidden x hidden matrices per layer.
    """

    def __init__(self, hidden: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        if hidden % num_heads:
            raise ValueError(f"hidden_size {hidden} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.dropout = dropout
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        return x.view(batch, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = (self._split_heads(proj(x)) for proj in (self.query, self.key, self.value))
        dropout = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
        context = context.transpose(1, 2).reshape(x.shape)
        return self.output(context)


class BertLayer(nn.Module):
    """Post-LayerNorm transformer layer: attention, add & norm, GELU feed-forward, add & norm."""

    def __init__(self, hidden: int, num_heads: int, intermediate: int, dropout: float) -> None:
        super().__init__()
        self.attention = BertSelfAttention(hidden, num_heads, dropout)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, attn_mask)))
        feed_forward = self.output(F.gelu(self.intermediate(x)))
        return self.output_norm(x + self.dropout(feed_forward))


class BertClassifier(nn.Module):
    """BERT encoder + pooler (tanh dense on [CLS]) + linear classification head.

    Matches the parameter shapes of ``BertForSequenceClassification``: BERT-Base has
    109,482,240 parameters before the head.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        vocab_size: int = 30522,
        num_layers: int = 12,
        hidden_size: int = 768,
        num_heads: int = 12,
        intermediate_size: int = 3072,
        max_positions: int = BERT_MAX_POSITIONS,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.embeddings = BertEmbeddings(vocab_size, hidden_size, max_positions, dropout)
        self.layers = nn.ModuleList(
            BertLayer(hidden_size, num_heads, intermediate_size, dropout) for _ in range(num_layers)
        )
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``attention_mask``: optional (batch, seq_len), 1 for real tokens, 0 for padding."""
        if input_ids.shape[1] > self.max_positions:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds {self.max_positions} positions")
        mask = None
        if attention_mask is not None:
            mask = attention_mask[:, None, None, :].to(torch.bool)  # broadcast over heads and queries
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(self.dropout(pooled))
