"""The unified demo's shipped checkpoints: transformers loads them as Chameleon, the one vocabulary
holds the caption words, Lumina-mGPT's structural tokens and Chameleon-named image tokens that
transformers' own mapping reads back, and the target has learnt the digits (teacher-forced
held-out NLL far below a uniform guess). Nothing is trained here."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from specrt.export.demo.unified import store  # noqa: E402
from specrt.export.demo.unified import vocabulary as voc  # noqa: E402

STRUCTURAL_NAMES = ("<s>", "<pad>", "</s>", "<unk>", "<racm3:break>", "<eoss>", "<reserved08799>",
                    "<reserved08804>", "<reserved08706>")
# the target's held-out image-token NLL is about 1.8 nats after training (demo.json); a model that
# had learnt nothing would sit near log 512 = 6.24
HELD_OUT_NLL_BOUND = 2.5


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return store.load_model(store.target_dir())


@pytest.fixture(scope="module")
def draft():
    return store.load_model(store.draft_dir())


@pytest.fixture(scope="module")
def tokenizer():
    return store.load_tokenizer(store.target_dir())


def test_the_checkpoints_are_chameleon_directories_transformers_loads(target, draft):
    for directory, model, size in ((store.target_dir(), target, 2_000_000), (store.draft_dir(), draft, 130_000)):
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in directory.iterdir()}
        loaded = transformers.ChameleonForConditionalGeneration.from_pretrained(str(directory))
        assert next(loaded.parameters()).dtype == torch.float32  # config.json says float32 (fp16 on disk)
        assert loaded.config.architectures == ["ChameleonForConditionalGeneration"]
        assert loaded.config.vocab_size == voc.VOCAB_SIZE and loaded.config.vocabulary_map == voc.VOCAB
        lm = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.vqmodel."))
        assert 0.8 * size < lm < 1.2 * size
    assert (store.target_dir() / "tokenizer.json").read_text() == (store.draft_dir() / "tokenizer.json").read_text()
    weights = sum((d / "model.safetensors").stat().st_size for d in (store.target_dir(), store.draft_dir()))
    assert weights < 6e6  # a few MB (fp16)


def test_the_tokenizer_reads_prompts_as_known_words(tokenizer):
    encoded = tokenizer.encode("a thin two")
    assert encoded.tokens == ["<s>", "a", "thin", "two"]
    assert voc.VOCAB[voc.UNK] not in encoded.ids
    prompt = tokenizer.encode(voc.prompt_text("A thick, slanted 7")).tokens
    assert prompt[:12] == ["<s>", "generate", "an", "image", "of", "32x32", "according", "to", "the", "following",
                           "prompt", ":"]
    assert prompt[12:] == ["a", "thick", ",", "slanted", "7", "<reserved08706>"]
    # the shipped file is what vocabulary.build_tokenizer builds
    assert json.loads(tokenizer.to_str()) == json.loads(voc.build_tokenizer().to_str())


def test_the_vocabulary_map_round_trips_every_code_through_transformers(target):
    from transformers.models.chameleon.modeling_chameleon import ChameleonImageVocabularyMapping

    mapping = ChameleonImageVocabularyMapping(target.config.vocabulary_map)
    codes = torch.arange(voc.CODEBOOK_SIZE)
    ids = mapping.convert_img2bpe(codes)
    assert ids.tolist() == [voc.code_to_id(c) for c in range(voc.CODEBOOK_SIZE)]
    assert [mapping.bpe2img[int(i)] for i in ids] == codes.tolist()
    assert mapping.image_tokens == list(range(voc.FIRST_IMAGE_ID, voc.FIRST_IMAGE_ID + voc.CODEBOOK_SIZE))
    assert target.model.vocabulary_mapping.img2bpe == mapping.img2bpe


def test_structural_tokens_exist_by_name(target, tokenizer):
    vocab = target.config.vocabulary_map
    for name in STRUCTURAL_NAMES:
        assert name in vocab and tokenizer.token_to_id(name) == vocab[name], name
        assert tokenizer.encode(name, add_special_tokens=False).ids == [vocab[name]], name  # matched verbatim
    assert voc.SIZE == voc.size_token(voc.GRID // 2) == "<reserved08804>"
    assert (target.config.bos_token_id, target.config.pad_token_id, target.config.eos_token_id) == (
        vocab["<s>"], vocab["<pad>"], vocab["</s>"])
    # a training row in Lumina-mGPT's layout: prompt, image prefix, rows ending in the row end, <eoss>, end of turn
    row, first = voc.training_sequence(voc.encode_prompts(tokenizer, ["a thin two"])[0], np.arange(64))
    names = [tokenizer.id_to_token(i) for i in row]
    start = names.index("<racm3:break>")
    assert names[start - 1] == "<reserved08706>" and first == start
    assert names[start + 1:start + 3] == ["<reserved08804>", "<reserved08804>"]
    stream = names[start + 3:-2]
    assert len(stream) == voc.GRID * (voc.GRID + 1) and stream[voc.GRID::voc.GRID + 1] == ["<reserved08799>"] * voc.GRID
    assert stream[:2] == ["IMGIMGAZ", "IMGIMGBZ"] and names[-2:] == ["<eoss>", "<reserved08706>"]


def test_demo_json_describes_the_shipped_demo():
    config = store.demo_config()
    assert config["grid"] == {"rows": 8, "cols": 8, "row_end": True, "image_vocab": 512, "image_size": 32,
                              "stream_len": 72}
    assert set(store.sampling_defaults()) == {"cfg_scale", "temperature", "top_k", "top_p"}
    assert config["prompt"]["template"] == voc.TEMPLATE
    assert store.vq_path().is_file() and config["files"]["vq"]["demo"] == "t2i"
    assert config["tokens"]["structural"]["row_end"] == ["<reserved08799>", voc.VOCAB[voc.ROW_END]]


def test_the_target_has_learnt_the_held_out_digits(target, draft, tokenizer):
    from specrt.export.demo.dataset import load_split
    from specrt.export.demo.t2i.captions import ATTRIBUTE_NAMES, AttributeBins, caption
    from specrt.export.demo.training import tokenize
    from specrt.export.demo.unified.sampling import image_nll

    split = load_split()
    images, digits = split.held_out_images[:48], split.held_out_labels[:48]
    attributes = AttributeBins.from_dict(store.t2i_config()["attributes"]).labels(images, digits)
    captions = [caption(int(d), {n: int(attributes[n][i]) for n in ATTRIBUTE_NAMES}) for i, d in enumerate(digits)]
    codes = tokenize(store.load_vq(), images)
    conditional = image_nll(target, tokenizer, captions, codes)["codes"]
    unconditional = image_nll(target, tokenizer, [None] * len(codes), codes)["codes"]
    assert conditional < HELD_OUT_NLL_BOUND < math.log(voc.CODEBOOK_SIZE)
    assert conditional < unconditional - 0.05  # the caption helps: the model reads the prompt
    assert image_nll(draft, tokenizer, captions, codes)["codes"] < math.log(voc.CODEBOOK_SIZE) - 2
