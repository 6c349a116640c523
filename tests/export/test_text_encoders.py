"""Text encoders behind runtime.text's one interface: a T5 directory through transformers, the
bundle's own ONNX graph + tokenizer.json (no torch), and precomputed embeddings from files."""
from __future__ import annotations

import numpy as np
import pytest

from specrt.errors import SpecrtError
from specrt.runtime.conditions import Conditions
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.text import load_caption_file
from tiny_t2i import CAPTION_DIM, COND_LEN, WORDS, t2i_bundle, t5_directory

pytest.importorskip("transformers")
PROMPTS = ["A thick seven", "  the small slanted two  ", "one two three four five six seven eight"]


@pytest.fixture(scope="module")
def t5():
    from specrt.runtime.text import T5TextEncoder

    return T5TextEncoder(t5_directory(), max_length=COND_LEN)


@pytest.fixture(scope="module")
def bundle():
    return t2i_bundle()


def test_t5_tokenises_like_llamagen_t5_embedder(t5):
    """Lower-cased, EOS appended, right-padded with 0 to max_length, truncated keeping the EOS."""
    ids, mask = t5.tokenize(PROMPTS)
    word = {w: i + 3 for i, w in enumerate(WORDS)}
    np.testing.assert_array_equal(ids[0], [word["a"], word["thick"], word["seven"], 1, 0, 0])
    np.testing.assert_array_equal(mask.sum(1), [4, 5, COND_LEN])
    assert ids[2, -1] == 1 and ids[2, 0] == word["one"]
    embeddings, real = t5.encode(PROMPTS)
    assert embeddings.shape == (3, COND_LEN, CAPTION_DIM) and real.dtype == bool


def test_bundle_text_encoder_matches_transformers(bundle, t5):
    manifest, _ = bundle
    entry = manifest.raw["text_encoder"]
    assert (entry["max_length"], entry["dim"], entry["pad_id"]) == (COND_LEN, CAPTION_DIM, 0)
    assert manifest.graph("text_encode").role == "text" and "tokenizer.json" in manifest.files
    onnx_encoder = Pipeline.from_bundle(manifest.root).text_encoder
    for got, want in zip(onnx_encoder.tokenize(PROMPTS), t5.tokenize(PROMPTS)):
        np.testing.assert_array_equal(got, want)
    got, want = onnx_encoder.encode(PROMPTS), t5.encode(PROMPTS)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])


def test_prompts_through_bundle_and_torch_give_the_same_image(bundle, t5):
    manifest, models = bundle
    from_bundle = Pipeline.from_bundle(manifest.root).generate(prompts=PROMPTS[:2], method="sd", seed=4)
    torch_pipe = Pipeline.from_torch(models.target, models.draft, models.vq, max_window=20, text_encoder=t5)
    from_torch = torch_pipe.generate(prompts=PROMPTS[:2], method="sd", seed=4)
    np.testing.assert_array_equal(from_bundle.tokens, from_torch.tokens)
    # a prompt is its embeddings: the same through `captions`
    via_captions = torch_pipe.generate(captions=t5.encode(PROMPTS[:2]), method="sd", seed=4)
    np.testing.assert_array_equal(via_captions.tokens, from_torch.tokens)


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".safetensors"])
def test_caption_files(tmp_path, suffix):
    rng = np.random.default_rng(0)
    embeddings = rng.standard_normal((2, 4, CAPTION_DIM)).astype(np.float32)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=bool)
    path = tmp_path / f"captions{suffix}"
    if suffix == ".npy":
        np.save(path, embeddings)
    elif suffix == ".npz":
        np.savez(path, embeddings=embeddings, mask=mask)
    else:
        from safetensors.numpy import save_file
        save_file({"embeddings": embeddings, "mask": mask.astype(np.uint8)}, str(path))
    loaded, loaded_mask = load_caption_file(path)
    np.testing.assert_array_equal(loaded, embeddings)
    rows = Conditions.of_captions(loaded, loaded_mask, cond_len=COND_LEN)
    expected_real = [4, 4] if suffix == ".npy" else [2, 4]
    np.testing.assert_array_equal(rows.caption_mask.sum(1), expected_real)
    assert rows.caption_mask[:, -1].all()  # left-padded: the last position is always a real token
    np.testing.assert_array_equal(rows.captions[0, -expected_real[0]:], embeddings[0, :expected_real[0]])


def test_caption_file_errors(tmp_path):
    with pytest.raises(SpecrtError, match="not found"):
        load_caption_file(tmp_path / "missing.npy")
    np.savez(tmp_path / "other.npz", features=np.zeros((1, 2, 3)))
    with pytest.raises(SpecrtError, match="no 'embeddings'"):
        load_caption_file(tmp_path / "other.npz")
    with pytest.raises(SpecrtError, match="first tokens"):
        Conditions.of_captions(np.zeros((1, 3, 2)), np.array([[0, 1, 1]]))
