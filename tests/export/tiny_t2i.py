"""A tiny text-to-image family in LlamaGen's layout, a bundle exported from it once per process,
and LlamaGen's own t2i generation (generate() + sample_t2i.py's caption handling) as reference.

The GPTs are random weights saved as LlamaGen checkpoints (`{"model": state_dict}`) and read
back through specrt's loader, so key layout, uncond_embedding and caption projection are on
the line, not only the module.
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from llamagen_reference import ReferenceLlamaGen, llamagen_gpt_shapes, random_state_dict
from specrt.export.bundle import ExportOptions, ModelSet
from specrt.export.checkpoints import load_gpt
from specrt.manifest import Manifest
from specrt.models.llamagen_gpt import GPTConfig
from specrt.models.llamagen_vq import VQModel
from tiny_export import GRID, VOCAB, temporary_bundle, tiny_vq_config

COND_LEN, CAPTION_DIM = 6, 12
SIZES = {"target": dict(dim=32, n_layer=2, n_head=4, n_kv_head=2), "draft": dict(dim=16, n_layer=1, n_head=2, n_kv_head=2)}
# no one-call tree graphs (the slowest exports): the t2i tests run chains, where the captions matter
OPTIONS = ExportOptions(max_window=20, max_batch=6, neighbours_k=6, draft_tree="", draft_growth="")


def llamagen_state(role: str, seed: int) -> dict[str, torch.Tensor]:
    size = SIZES[role]
    shapes = llamagen_gpt_shapes(size["dim"], size["n_layer"], size["n_head"], size["n_kv_head"], VOCAB,
                                 model_type="t2i", caption_dim=CAPTION_DIM, cond_len=COND_LEN)
    state = random_state_dict(shapes, seed=seed)
    state["cls_embedding.uncond_embedding"] /= CAPTION_DIM**0.5  # LlamaGen's init scale
    return state


@lru_cache(maxsize=None)
def t2i_checkpoints() -> dict[str, Path]:
    """target.pt / draft.pt in LlamaGen's checkpoint layout (weights under "model")."""
    root = Path(tempfile.mkdtemp(prefix="specrt-t2i-ckpt-"))
    atexit.register(shutil.rmtree, root, True)
    paths = {}
    for seed, role in enumerate(SIZES):
        paths[role] = root / f"t2i_{role}.pt"
        torch.save({"model": llamagen_state(role, seed)}, paths[role])
    return paths


def t2i_config(role: str) -> GPTConfig:
    """The sizes (head counts are not in the weights) of a role's checkpoint."""
    return GPTConfig(**SIZES[role], vocab_size=VOCAB, model_type="t2i", cond_len=COND_LEN, caption_dim=CAPTION_DIM,
                     grid_size=GRID)


WORDS = "a an the thick thin slanted upright small large zero one two three four five six seven eight nine".split()


def tiny_t5(directory: Path) -> Path:
    """A flan-t5-style directory built offline: a word-level fast tokenizer (T5's special
    tokens: pad 0, </s> 1 appended to every prompt, unk 2) and a random T5 encoder whose
    features are CAPTION_DIM wide."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(directory))
    torch.manual_seed(5)
    config = T5Config(vocab_size=len(vocab), d_model=CAPTION_DIM, d_kv=4, d_ff=24, num_layers=2, num_heads=2,
                      feed_forward_proj="gated-gelu", is_encoder_decoder=False)
    T5EncoderModel(config).eval().save_pretrained(str(directory))
    return directory


@lru_cache(maxsize=None)
def t5_directory() -> Path | None:
    """The tiny T5 directory, or None where transformers is not installed."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    root = Path(tempfile.mkdtemp(prefix="specrt-tiny-t5-"))
    atexit.register(shutil.rmtree, root, True)
    return tiny_t5(root / "t5")


def t2i_models() -> ModelSet:
    """The t2i family, with the tiny T5 as text encoder where transformers is installed."""
    from specrt.runtime.text import T5TextEncoder

    ckpt = t2i_checkpoints()
    t5 = t5_directory()
    torch.manual_seed(0)
    return ModelSet(target=load_gpt(ckpt["target"], t2i_config("target")), draft=load_gpt(ckpt["draft"], t2i_config("draft")),
                    vq=VQModel(tiny_vq_config()).eval(), sources={role: str(p) for role, p in ckpt.items()},
                    text_encoder=T5TextEncoder(t5, max_length=COND_LEN) if t5 else None)


@lru_cache(maxsize=None)
def t2i_bundle() -> tuple[Manifest, ModelSet]:
    """(manifest, models) of the t2i bundle, exported once per process; do not modify it."""
    models = t2i_models()
    return temporary_bundle(models, OPTIONS, "specrt-t2i-bundle-"), models


def t5_style_captions(lengths: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """What a T5 encoder returns for captions of these token counts: [N, COND_LEN, D] embeddings,
    real tokens first (the padded ones hold nonzero junk, as a real encoder's do) and the mask."""
    rng = np.random.default_rng(seed)
    embeddings = rng.standard_normal((len(lengths), COND_LEN, CAPTION_DIM)).astype(np.float32)
    mask = np.arange(COND_LEN)[None] < np.asarray(lengths)[:, None]
    return embeddings, mask


def llamagen_t2i_greedy(role: str, embeddings: np.ndarray, mask: np.ndarray, cfg_scale: float) -> np.ndarray:
    """LlamaGen's t2i sampling with argmax: sample_t2i.py's left padding and zeroing, then
    generate(): [cond; uncond_embedding] rows sharing emb_masks, the eye on the mask, prefill,
    one token at a time, logits u + (c − u)·s. Image tokens [N, grid²]."""
    state = llamagen_state(role, list(SIZES).index(role))
    size = SIZES[role]
    ref = ReferenceLlamaGen(state, size["n_head"], size["n_kv_head"], GRID, COND_LEN)
    caption_embs, emb_masks = torch.from_numpy(embeddings), torch.from_numpy(mask).long()
    new_emb_masks = torch.flip(emb_masks, dims=[-1])
    new_caption_embs = []
    for caption_emb, emb_mask in zip(caption_embs, emb_masks):
        valid_num = int(emb_mask.sum().item())
        new_caption_embs.append(torch.cat([caption_emb[valid_num:], caption_emb[:valid_num]]))
    c_indices = torch.stack(new_caption_embs) * new_emb_masks[:, :, None]
    cond_null = torch.zeros_like(c_indices) + state["cls_embedding.uncond_embedding"]
    cond = torch.cat([c_indices, cond_null])
    count, steps = len(mask), GRID * GRID
    ref.setup_caches(2 * count, COND_LEN + steps, torch.cat([new_emb_masks, new_emb_masks]))

    def guided(logits):
        c, u = logits[:count, -1], logits[count:, -1]
        return (u + (c - u) * cfg_scale).argmax(-1)

    with torch.no_grad():
        token = guided(ref.forward(cond=cond, input_pos=torch.arange(COND_LEN)))
        tokens = [token]
        for k in range(1, steps):
            pos = torch.tensor([COND_LEN + k - 1])
            token = guided(ref.forward(idx=torch.cat([token, token])[:, None], input_pos=pos))
            tokens.append(token)
    return torch.stack(tokens, 1).numpy()
