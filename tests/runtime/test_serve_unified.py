"""`specrt serve` on a unified-vocabulary bundle (the chameleon demo's): prompts in, the PNG and the
VQ grid out (row ends dropped), as one generate gives them; a class id is refused in one line.
`specrt serve` runs as a subprocess on 127.0.0.1; every wait is bounded."""
from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from serving_fixtures import served  # noqa: E402

from specrt.errors import SpecrtError  # noqa: E402
from specrt.runtime.family_registry import open_bundle  # noqa: E402


def test_specrt_serve_serves_prompts_of_a_unified_bundle(tmp_path):
    pytest.importorskip("pytriton.triton", reason="nvidia-pytriton is not installed (pip install 'specrt[serve]' in "
                                                  "a venv made with /usr/bin/python3.11; docs/guides/serve-triton.md)")
    pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install 'specrt[serve]')")
    from PIL import Image

    from specrt.export.bundle import ExportOptions
    from specrt.export.demo.registry import get_demo
    from specrt.export.unified.writer import write_unified_bundle
    from specrt.runtime.serving.client import Client

    bundle = tmp_path / "chameleon"
    # sjd is served: no one-call draft graphs (the slowest exports)
    options = ExportOptions(max_window=12, max_batch=2, draft_chain=0, draft_tree="", draft_growth="")
    write_unified_bundle(get_demo("chameleon").hook("model_set")(None), bundle, options)
    with served(bundle, tmp_path) as (_, grpc):
        reference = open_bundle(bundle)
        expected = reference.generate(prompts=["a thin two"], method="sjd", seed=1, window=6)
        with Client(f"127.0.0.1:{grpc}", protocol="grpc", timeout_s=60.0) as client:
            image = client.generate(prompt="a thin two", method="sjd", seed=1, window=6)
            assert image.tokens.shape == (64,) and np.array_equal(image.tokens, expected.tokens[0].ravel())
            pixels = np.asarray(Image.open(io.BytesIO(image.png)).convert("RGB"))
            assert pixels.shape == (32, 32, 3) and np.abs(pixels.astype(int) - expected.images[0]).max() <= 1
            assert image.stats["method"] == "sjd" and image.stats["target_passes"] < 72
            with pytest.raises(SpecrtError, match="give prompt, not class_id") as caught:
                client.generate(class_id=3)
            assert "\n" not in str(caught.value)
