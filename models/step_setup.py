"""How a model's decode step runs its blocks (models/step_kernels.py names the choices): its
products over one input fused or apart, their products through the skinny-row Triton kernel or
F.linear, its attention through scaled_dot_product_attention or the split-cache kernel.

Why a module of its own: the choices are set on a model once, by whoever runs its steps (the PyTorch
runner, the step profile), after the model reached its device and dtype; the blocks only read the
flags and buffers these functions set (LlamaGen's FeedForward and Attention, the unified-vocabulary
LM's attention and MLP)."""
from __future__ import annotations

import torch.nn as nn

from specrt.lazy import require
from specrt.models.step_kernels import STEP_ATTENTION, STEP_MATMULS


def set_step_matmuls(model: nn.Module, matmuls: str) -> None:
    """How `model`'s blocks run their products: "separate" (each layer its own), "fused" (products
    over one input as one: fuse_projections) or "skinny" (fused, and every block product of a
    step's few rows through the Triton kernel of models.skinny_matmul)."""
    if matmuls not in STEP_MATMULS:
        raise ValueError(f"step matmuls {matmuls!r}: choose from {', '.join(STEP_MATMULS)}")
    if matmuls == "skinny":
        _require_triton_on_gpu(model, "the skinny step matmuls")
    fuse_projections(model, matmuls != "separate")
    use_skinny_matmuls(model, matmuls == "skinny")


def set_step_attention(model: nn.Module, attention: str) -> int:
    """How `model`'s blocks attend over a static KV cache: "sdpa" (scaled_dot_product_attention)
    or "triton" (a step's few query rows through models.window_attention): how many attention
    modules (those with a `triton_attention` flag: LlamaGen's and the unified-vocabulary LM's)."""
    if attention not in STEP_ATTENTION:
        raise ValueError(f"step attention {attention!r}: choose from {', '.join(STEP_ATTENTION)}")
    modules = [module for module in model.modules() if hasattr(module, "triton_attention")]
    if attention == "triton":
        _require_triton_on_gpu(model, "the Triton step attention")
    for module in modules:
        module.triton_attention = attention == "triton"
    return len(modules)


def use_skinny_matmuls(model: nn.Module, on: bool = True) -> int:
    """Every block projection of `model` through the skinny-row kernel where a step's rows fit it
    (`on`), or back to F.linear: how many modules (those with a `skinny_matmuls` flag: LlamaGen's
    attention and feed-forward, the unified-vocabulary LM's attention and MLP, biases included)."""
    modules = [module for module in model.modules() if hasattr(module, "skinny_matmuls")]
    for module in modules:
        module.skinny_matmuls = on
    return len(modules)


def fuse_projections(model: nn.Module, on: bool = True) -> int:
    """Every module of `model` that can run its products over one input as one (a `fuse_projections(on)`
    method: LlamaGen's feed-forward, the unified-vocabulary LM's attention and MLP) fused, or apart
    again: how many. For inference on the model's final device and dtype (models.fused_linears)."""
    modules = [module for module in model.modules() if hasattr(module, "fuse_projections")]
    for module in modules:
        module.fuse_projections(on)
    return len(modules)


def _require_triton_on_gpu(model: nn.Module, what: str) -> None:
    """Triton, where `model` runs on CUDA and `what` needs it: one line when it is missing, not an
    ImportError inside a compiled step (a CPU runs the kernels' torch references and needs none)."""
    if any(parameter.is_cuda for parameter in model.parameters()):
        require("triton", what)
