"""Training loops of the t2i demo: text encoder + target GPT together, then the draft, then the evaluator.

Why this order: LlamaGen trains its t2i GPTs on a frozen flan-t5-xl; no such encoder exists
here, so the small T5 learns with the target (the caption loss reaches it through the
target's caption projection) and is then frozen for the draft, which must read the same
features the bundle will hand it. Both GPTs start from the c2i demo's trained GPTs (same
tokenizer, same image-token trunk; only the caption projection is new), which is what lets
a 2-core CPU train the family in well under an hour. The loops are training.py's `optimise`.
"""
from __future__ import annotations

import numpy as np

from specrt.lazy import require

torch = require("torch", "t2i demo training")
F = torch.nn.functional

from specrt.export.demo.configs import Schedule  # noqa: E402
from specrt.export.demo.dataset import DigitsSplit  # noqa: E402
from specrt.export.demo.evaluator import EvaluatorConfig  # noqa: E402
from specrt.export.demo.t2i.captions import ATTRIBUTE_NAMES, Request, caption, training_caption  # noqa: E402
from specrt.export.demo.t2i.evaluator import PromptEvaluator, predict, prompt_following  # noqa: E402
from specrt.export.demo.training import _batch, optimise  # noqa: E402
from specrt.models.llamagen_gpt import GPT, GPTConfig  # noqa: E402
from specrt.runtime.conditions import left_align  # noqa: E402


class CaptionedImages:
    """The training images' digits and measured attributes, turned into caption batches."""

    def __init__(self, tokenizer, digits: np.ndarray, attributes: dict[str, np.ndarray], cond_len: int):
        self.tokenizer, self.digits, self.attributes, self.cond_len = tokenizer, np.asarray(digits), attributes, cond_len

    def attributes_of(self, image: int) -> dict[str, int]:
        return {name: int(self.attributes[name][image]) for name in ATTRIBUTE_NAMES}

    def random_texts(self, images: np.ndarray, rng: np.random.Generator) -> list[str]:
        return [training_caption(int(self.digits[i]), self.attributes_of(int(i)), rng) for i in images]

    def full_texts(self, images: np.ndarray) -> list[str]:
        """The canonical caption naming every attribute (held-out losses, evaluation)."""
        return [caption(int(self.digits[i]), self.attributes_of(int(i))) for i in images]

    def tokens(self, texts: list[str]) -> tuple["torch.Tensor", "torch.Tensor"]:
        """T5Embedder's tokenisation (runtime.text): ids and mask [B, cond_len], right-padded."""
        out = self.tokenizer([t.lower().strip() for t in texts], max_length=self.cond_len, padding="max_length",
                             truncation=True, return_tensors="pt")
        return out["input_ids"], out["attention_mask"]


def encode_captions(encoder, ids: "torch.Tensor", mask: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """Encoder features arranged as the prefill graph receives them (runtime.conditions): real
    tokens moved to the end (left padding), padded positions zeroed; returns (captions, bool mask)."""
    hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    length = mask.shape[1]
    # the runtime's own left_align, applied to positions, gives the gather index
    order, flipped = left_align(np.broadcast_to(np.arange(length), mask.shape)[..., None], mask.numpy().astype(bool))
    index = torch.from_numpy(np.ascontiguousarray(order[..., 0])).long()
    hidden = torch.gather(hidden, 1, index[..., None].expand_as(hidden))
    cond_mask = torch.from_numpy(flipped)
    return hidden * cond_mask[..., None].to(hidden.dtype), cond_mask


def warm_start(model: GPT, init: GPT) -> GPT:
    """Copy every weight of `init` that `model` has in the same shape: a c2i GPT gives its
    image-token trunk (its class embedding has no place here), a t2i GPT everything."""
    own = model.state_dict()
    state = {k: v for k, v in init.state_dict().items() if k in own and own[k].shape == v.shape}
    missing, _ = model.load_state_dict(state, strict=False)
    assert all(k.startswith("cls_embedding.") for k in missing), missing
    return model


class _EncoderAndGPT(torch.nn.Module):
    """The text encoder and the target GPT as one module, so one optimiser trains both."""

    def __init__(self, encoder, gpt: GPT):
        super().__init__()
        self.encoder, self.gpt = encoder, gpt


def gpt_loss(gpt: GPT, encoder, data: CaptionedImages, codes: np.ndarray, idx: np.ndarray, texts: list[str],
             drop: np.ndarray) -> "torch.Tensor":
    """Teacher-forced next-token cross-entropy of sequences `idx` under the captions `texts`;
    rows where `drop` is true take the unconditional caption (CFG training)."""
    ids, mask = data.tokens(texts)
    cond, cond_mask = encode_captions(encoder, ids, mask)
    cond = gpt.drop_conditions(cond, torch.from_numpy(drop))
    toks = torch.from_numpy(codes[idx])
    logits = gpt(cond, toks, cond_mask)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), toks.reshape(-1))


@torch.no_grad()
def held_out_nll(gpt: GPT, encoder, data: CaptionedImages, codes: np.ndarray, batch_size: int = 256) -> float:
    """Mean next-token NLL (nats) of held-out sequences under their full canonical captions."""
    gpt.eval()
    encoder.eval()
    total, count = 0.0, 0
    for start in range(0, len(codes), batch_size):
        idx = np.arange(start, min(start + batch_size, len(codes)))
        loss = gpt_loss(gpt, encoder, data, codes, idx, data.full_texts(idx), np.zeros(len(idx), bool))
        total += loss.item() * len(idx) * codes.shape[1]
        count += len(idx) * codes.shape[1]
    return total / count


def train_gpt(config: GPTConfig, init: GPT, encoder, data: CaptionedImages, codes: np.ndarray, sequence_images: np.ndarray,
              schedule: Schedule, caption_dropout: float, seed: int, desc: str, train_encoder: bool,
              held_out: tuple[CaptionedImages, np.ndarray] | None = None, progress: bool = True) -> tuple[GPT, dict]:
    """A t2i GPT warm-started from `init`; with train_encoder the encoder learns alongside."""
    torch.manual_seed(seed)
    gpt = warm_start(GPT(config), init)
    encoder.requires_grad_(train_encoder)
    module = _EncoderAndGPT(encoder, gpt) if train_encoder else gpt
    if not train_encoder:
        encoder.eval()

    def loss_fn(step: int, rng: np.random.Generator):
        idx = rng.integers(0, len(codes), schedule.batch_size)
        texts = data.random_texts(sequence_images[idx], rng)
        loss = gpt_loss(gpt, encoder, data, codes, idx, texts, rng.random(len(idx)) < caption_dropout)
        return loss, {"loss": loss.item()}

    metrics = optimise(module, schedule, loss_fn, seed, desc, progress)
    encoder.requires_grad_(False)
    encoder.eval()
    if held_out is not None:
        metrics["held_out_nll"] = held_out_nll(gpt, encoder, *held_out)
    return gpt.eval(), metrics


def train_evaluator(split: DigitsSplit, train_attributes: dict[str, np.ndarray],
                    held_out_attributes: dict[str, np.ndarray], config: EvaluatorConfig, schedule: Schedule,
                    max_shift: int, seed: int, progress: bool = True) -> tuple[PromptEvaluator, dict]:
    """Digit + attribute classifier on real training images (shift-augmented: the attributes
    do not move with the digit); metrics include its prompt following on held-out real images."""
    torch.manual_seed(seed)
    model = PromptEvaluator(config)
    targets = torch.from_numpy(np.stack([train_attributes[n] for n in ATTRIBUTE_NAMES], 1))

    def loss_fn(step: int, rng: np.random.Generator):
        idx = rng.integers(0, len(split.train_labels), schedule.batch_size)
        features = model.features(_batch(split.train_images, idx, max_shift, rng))
        digit = F.cross_entropy(model.head(features), torch.from_numpy(split.train_labels[idx]))
        attributes = F.cross_entropy(model.attribute_logits(features).reshape(-1, 2), targets[idx].reshape(-1))
        loss = digit + attributes
        return loss, {"loss": loss.item()}

    metrics = optimise(model, schedule, loss_fn, seed, "evaluator", progress)
    metrics["held_out"] = real_prompt_following(model, split, held_out_attributes)
    return model, metrics


def real_requests(digits: np.ndarray, attributes: dict[str, np.ndarray]) -> list[Request]:
    """What real images' captions ask for: their digit and every measured attribute."""
    return [Request(int(d), {n: int(attributes[n][i]) for n in ATTRIBUTE_NAMES}) for i, d in enumerate(digits)]


def real_prompt_following(model: PromptEvaluator, split: DigitsSplit, held_out_attributes: dict[str, np.ndarray],
                          images: np.ndarray | None = None) -> dict:
    """The evaluator's accuracy on held-out real images against their own captions: the ceiling."""
    images = split.held_out_images if images is None else images
    return prompt_following(predict(model, images), real_requests(split.held_out_labels, held_out_attributes))

