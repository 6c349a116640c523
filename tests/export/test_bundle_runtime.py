"""The runtime's onnxruntime path over an exported bundle reproduces its PyTorch path exactly.

Same seed, same models: the tokens must be identical (the graphs differ from torch by ~1e-7,
far below what changes a sampled token here), and LANTERN reads the bundle's neighbour
table where the torch path computes its own from the VQ codebook.
"""
from __future__ import annotations

import numpy as np
import pytest

from specrt.runtime.pipeline import Pipeline
from tiny_export import tiny_bundle


@pytest.mark.parametrize("method", ["ar", "sd", "lantern"])
def test_bundle_and_torch_pipelines_generate_the_same_tokens(method):
    manifest, models = tiny_bundle()
    from_bundle = Pipeline.from_bundle(manifest.root).generate([1, 4], method=method, seed=3)
    from_torch = Pipeline.from_torch(models.target, models.draft, models.vq).generate([1, 4], method=method, seed=3)
    np.testing.assert_array_equal(from_bundle.tokens, from_torch.tokens)
    assert np.abs(from_bundle.images.astype(int) - from_torch.images.astype(int)).max() <= 1
