"""The all-MiniLM-L6-v2 BERT encoder as a PyTorch module whose padding mask is additive scores
computed inside `forward`: no data-dependent mask logic from transformers, so the same module
traces to ONNX (`conveyor models prepare`) and captures into a CUDA graph (the torch engine)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Added to attention scores of padding; finite so that FP16 (TensorRT, torch) cannot overflow.
MASKED_SCORE = -10000.0


def load_encoder(source: Path, attention: str = "eager") -> PreTrainedModel:
    """PyTorch weights from `source` only (never a hub: offline mode is set before transformers
    loads, and files must be local). `eager` attention gives plain MatMul/Softmax ops (export);
    `sdpa` fused attention kernels (serving)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    model: PreTrainedModel = AutoModel.from_pretrained(
        str(source), local_files_only=True, attn_implementation=attention
    )
    return model.eval()


class MaskedEncoder(torch.nn.Module):
    """Last hidden states (batch, sequence, hidden) of the encoder, padding masked additively."""

    def __init__(self, encoder: PreTrainedModel) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        dtype = next(self.encoder.parameters()).dtype
        scores_bias = (1.0 - attention_mask[:, None, None, :].to(dtype)) * MASKED_SCORE
        outputs = self.encoder(
            input_ids=input_ids, attention_mask=scores_bias, token_type_ids=token_type_ids
        )
        hidden: torch.Tensor = outputs.last_hidden_state
        return hidden


class PooledEncoder(MaskedEncoder):
    """Sentence embeddings on the device: sentence-transformers' mean pooling over real tokens,
    then L2 normalisation, in fp32 whatever the encoder's dtype, so only (batch, 384) floats
    come back to the host. A padding row (no real token) pools to zeros, never NaN."""

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        hidden = super().forward(input_ids, attention_mask, token_type_ids).float()
        pooled = mean_pool(hidden, attention_mask)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1, eps=1e-12)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The mean of the real tokens' states. Padding is left out of the sum, not multiplied by
    zero: a NaN or infinity computed at a padding position (fp16) made the row's mean NaN, so a
    text failed beside a longer one and not alone."""
    real = attention_mask[:, :, None].bool()
    summed = torch.where(real, hidden, 0.0).sum(dim=1)
    pooled: torch.Tensor = summed / real.sum(dim=1).float().clamp(min=1e-9)
    return pooled
