"""The Python side of the C API (runtime/embedding.py) on a continuous bundle, without building
the library: the handle's family answers (dtype, decoder, image size), float tokens out of a
bundle without a decoder, pixels refused there with one line, null sampling keys as defaults.
The C library itself is tested end to end in test_capi.py."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from specrt.errors import SpecrtError
from specrt.runtime import embedding

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from serving_fixtures import tiny_continuous_bundle  # noqa: E402
from specrt.runtime.family_registry import read_bundle  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402

@pytest.fixture(scope="module")
def decoderless_bundle(tmp_path_factory):
    return tiny_continuous_bundle(tmp_path_factory.mktemp("embedding") / "bundle")


def test_a_continuous_bundle_without_decoder_gives_float_tokens(decoderless_bundle):
    handle = embedding.open_handle(str(decoderless_bundle), None)
    assert handle.info == ("continuous", embedding.DTYPES["float32"], False, 0, 0)
    dtype, shape, tokens, pixels, height, width, stats = embedding.generate_output(
        handle, [0, 2], "cspd", '{"draft_len": 2}', 3, True)
    expected = Pipeline.from_bundle(decoderless_bundle).generate([0, 2], method="cspd", seed=3, decode=False,
                                                                 draft_len=2).tokens
    assert (dtype, shape, pixels, height, width) == (2, (2, 4, 3), None, 0, 0)
    assert tokens == np.ascontiguousarray(expected, dtype=np.float32).tobytes()
    assert set(stats) == set(embedding.STATS_FIELDS)
    assert stats["tokens"] == 8 and stats["target_forwards"] > 0 and stats["seconds_total"] > 0
    assert stats["seconds_target"] == 0.0  # not measured by this family: 0, as specrt.h says

    with pytest.raises(SpecrtError, match="has no decoder.*specrt_generate_output") as caught:
        embedding.generate_rgb8(handle, [0], "ar", None, 0)
    assert embedding.status_of(caught.value)[0] == embedding.INVALID_ARGUMENT
    with pytest.raises(SpecrtError, match="class-conditional"):
        embedding.generate_output_prompts(handle, [b"a cat"], "ar", None, 0, False)


def test_a_null_sampling_key_takes_the_bundles_default(decoderless_bundle):
    handle = embedding.open_handle(str(decoderless_bundle), None)
    plain = embedding.generate_output(handle, [1], "ar", None, 4, False)
    nulls = embedding.generate_output(handle, [1], "ar", json.dumps({"temperature": None, "cfg_scale": None}), 4,
                                      False)
    assert plain[2] == nulls[2]


def test_the_decoders_image_size_comes_from_the_manifest(decoderless_bundle, tmp_path):
    plugin, manifest = read_bundle(decoderless_bundle)
    pipe = Pipeline.from_bundle(decoderless_bundle)
    assert plugin.image_size(pipe, manifest) is None
    pipe.decoder = lambda tokens: tokens  # as if the bundle had one
    with pytest.raises(SpecrtError, match="decoder needs a positive integer 'image_size'"):
        plugin.image_size(pipe, replace(manifest, raw={**manifest.raw, "decoder": {"graph": "decoder.onnx"}}))
    assert plugin.image_size(pipe, replace(manifest, raw={**manifest.raw, "decoder": {"image_size": 32}})) == (32, 32)


def test_a_missing_bundle_is_not_found(tmp_path):
    with pytest.raises(embedding.BundleNotFound) as caught:
        embedding.open_handle(str(tmp_path / "nowhere"), None)
    assert embedding.status_of(caught.value)[0] == embedding.NOT_FOUND
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text('{"family": "continuous", ')
    with pytest.raises(SpecrtError, match="not valid JSON"):
        embedding.open_handle(str(broken), None)
