"""Several linear layers over the same input run as one product over one buffer.

Why: a decode step multiplies a few rows by each weight once, and a GPU runs a product of so few
rows as one tile of columns per streaming multiprocessor: a narrow product leaves multiprocessors
idle and costs a launch of its own. Layers that read the same input (a SwiGLU's gate and up, an
attention's q, k and v) can run as one product whose output is split afterwards. Their weights are
concatenated into one buffer once and each layer's parameters become views of their rows, so no
weight is kept twice, a checkpoint saves and loads under the layers' own names (a state dict
loaded later writes through the views), and the layers still run apart where a gradient is wanted.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn


def fuse_linears(linears: Sequence[nn.Linear]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One weight [sum of out_features, in_features] (and bias, where the layers have them) over
    `linears`, each layer's parameters re-pointed at its rows. Call it on the model's final device
    and dtype: moving the model later gives each parameter its own storage again (correct, but
    twice the memory)."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    biased = [linear.bias is not None for linear in linears]
    if any(biased) and not all(biased):
        raise ValueError("fused layers either all have biases or none")
    bias = torch.cat([linear.bias.detach() for linear in linears]) if all(biased) else None
    start = 0
    for linear in linears:
        rows = slice(start, start + linear.out_features)
        linear.weight.data = weight[rows]
        if bias is not None:
            linear.bias.data = bias[rows]
        start += linear.out_features
    return weight, bias


def runs_fused(fused: Optional[torch.Tensor], parameter: torch.Tensor) -> bool:
    """Whether a layer group with a fused buffer runs through it now: fused, and no gradient wanted
    for its parameters (the buffer would take the gradient the parameters need)."""
    return fused is not None and not (torch.is_grad_enabled() and parameter.requires_grad)
