"""FP8 training of the blocks' linear layers with torchao's Float8Linear (``parallel.float8``).

The matmuls of attention (wq, wk, wv, wo) and of the feed-forward (w1, w2, w3) run in FP8 with
dynamic scales: ``tensorwise`` (one scale per tensor, e4m3 forward, e5m2 gradients; torchao's
fastest) or ``rowwise`` (one scale per row, e4m3 throughout, power-of-two scales; more accurate).
Everything else stays in the compute dtype: embeddings, norms, attention's scores and softmax, the
output layer and the loss. Weights, gradients, optimizer state and checkpoints are unchanged
(Float8Linear keeps its weight in high precision and casts it each forward), so a checkpoint loads
with or without FP8 and exports to Hugging Face the same way.

torchao's FP8 all-gathers are not used, under FSDP nor in its tensor-parallel plans: gloo cannot
carry FP8 tensors, so they could not be tested here. FSDP gathers the bf16 weights and sequence
parallel the bf16 activations; each matmul casts what it was given.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

# torch._scaled_mm needs both dimensions of each weight in multiples of 16
FP8_ALIGNMENT = 16


def float8_shape_problems(widths: dict[str, int], tp: int) -> list[str]:
    """The linear-layer widths (per tensor-parallel rank) that FP8 matmuls cannot take."""
    return [f"{name} / parallel.tp = {size // tp} is not a multiple of {FP8_ALIGNMENT}"
            for name, size in widths.items() if (size // tp) % FP8_ALIGNMENT]


def apply_float8(model: nn.Module, recipe: str) -> int:
    """Swap the blocks' ``nn.Linear`` layers for Float8Linear in place (on meta, before any
    parallelism); returns how many were swapped."""
    if not torch.cuda.is_available():  # torchao warns on import that its CUDA kernels cannot load; not needed here
        logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    def in_a_block(module: nn.Module, name: str) -> bool:
        return isinstance(module, nn.Linear) and name.startswith("layers.")

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=in_a_block)
    swapped = sum(isinstance(m, Float8Linear) for m in model.modules())
    log.info("float8 (%s): %d linear layers in the blocks run their matmuls in FP8", recipe, swapped)
    return swapped
