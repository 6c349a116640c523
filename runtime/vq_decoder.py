"""The VQ decoder's role in a pipeline: image tokens to pixels, whatever runs it (onnxruntime,
PyTorch, TensorRT, the toy); beside the runners, which produce the tokens."""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class VQDecoder(ABC):
    """codes [N, grid, grid] -> images float [N, 3, H, W] in about [−1, 1]; H = grid · downsample."""

    downsample: int = 16

    @abstractmethod
    def decode(self, codes: np.ndarray) -> np.ndarray:
        ...
