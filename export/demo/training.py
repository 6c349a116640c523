"""Training loops for the demo family: VQ tokenizer, target and draft GPTs, evaluator.

Why our own loops: weights cannot be downloaded, so the demo is trained here, on CPU, in
minutes. Each loop is seeded (same seed ⇒ same weights on the same torch build), shows a
tqdm bar, and returns a small dict of metrics that ends up in the weights' JSON.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from specrt.lazy import require

torch = require("torch", "demo training")
F = torch.nn.functional

from specrt.export.demo.configs import Schedule  # noqa: E402
from specrt.export.demo.dataset import DigitsSplit, random_shifts, shift  # noqa: E402
from specrt.export.demo.evaluator import DigitClassifier, EvaluatorConfig, accuracy  # noqa: E402
from specrt.models.llamagen_gpt import GPT, GPTConfig  # noqa: E402
from specrt.models.llamagen_vq import VQConfig, VQModel  # noqa: E402

LossFn = Callable[[int, np.random.Generator], "tuple[torch.Tensor, dict[str, float]]"]


class StageTimer:
    """Runs training stages and keeps each one's wall-clock seconds (demo.json's training.seconds)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable, *args, **kwargs):
        import time

        t0 = time.time()
        result = fn(*args, **kwargs)
        self.seconds[name] = round(time.time() - t0, 1)
        return result


def learning_rate(schedule: Schedule, step: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to lr·min_lr_ratio at the last step."""
    if step < schedule.warmup:
        return schedule.lr * (step + 1) / schedule.warmup
    progress = (step - schedule.warmup) / max(1, schedule.steps - schedule.warmup)
    floor = schedule.lr * schedule.min_lr_ratio
    return floor + (schedule.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def descend(optimizer: "torch.optim.Optimizer", parameters, loss: "torch.Tensor", max_grad_norm: float) -> None:
    """One optimiser step on `loss`, gradients clipped to `max_grad_norm`."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    optimizer.step()


def log_metrics(history: dict[str, list[float]], metrics: dict[str, float]) -> None:
    for key, value in metrics.items():
        history.setdefault(key, []).append(value)


def optimise(model: "torch.nn.Module", schedule: Schedule, loss_fn: LossFn, seed: int, desc: str,
             progress: bool = True) -> dict[str, float]:
    """AdamW over `schedule`; returns each logged metric averaged over the last 10% of steps."""
    tqdm = require("tqdm", "demo training").tqdm
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": schedule.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=schedule.lr, betas=(0.9, 0.95))
    history: dict[str, list[float]] = {}
    model.train()
    bar = tqdm(range(schedule.steps), desc=desc, disable=not progress, leave=True, dynamic_ncols=True)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(schedule, step)
        loss, metrics = loss_fn(step, rng)
        descend(optimizer, model.parameters(), loss, 1.0)
        log_metrics(history, metrics)
        if step % 20 == 0 or step == schedule.steps - 1:
            bar.set_postfix({k: f"{v[-1]:.4f}" for k, v in history.items()})
    model.eval()
    tail = max(1, schedule.steps // 10)
    return {f"final_{k}": float(np.mean(v[-tail:])) for k, v in history.items()}


def _batch(images: np.ndarray, indices: np.ndarray, max_shift: int, rng: np.random.Generator) -> "torch.Tensor":
    return torch.from_numpy(random_shifts(images[indices], max_shift, rng))


# ---- evaluator --------------------------------------------------------------------------

def train_evaluator(split: DigitsSplit, config: EvaluatorConfig, schedule: Schedule, max_shift: int, seed: int,
                    progress: bool = True) -> tuple[DigitClassifier, dict[str, float]]:
    """Classifier on real training digits (shift-augmented); metrics include held-out accuracy."""
    torch.manual_seed(seed)
    model = DigitClassifier(config)

    def loss_fn(step: int, rng: np.random.Generator):
        idx = rng.integers(0, len(split.train_labels), schedule.batch_size)
        logits = model(_batch(split.train_images, idx, max_shift, rng))
        loss = F.cross_entropy(logits, torch.from_numpy(split.train_labels[idx]))
        return loss, {"loss": loss.item()}

    metrics = optimise(model, schedule, loss_fn, seed, "evaluator", progress)
    metrics["held_out_accuracy"] = accuracy(model, split.held_out_images, split.held_out_labels)
    return model, metrics


# ---- VQ tokenizer -----------------------------------------------------------------------

def train_vq(split: DigitsSplit, config: VQConfig, schedule: Schedule, max_shift: int, seed: int,
             progress: bool = True) -> tuple[VQModel, dict[str, float]]:
    """Reconstruction (MSE) + codebook + commitment losses; LlamaGen's perceptual/GAN terms are
    left out (no pretrained VGG here, and digits need neither)."""
    torch.manual_seed(seed)
    model = VQModel(config)

    def loss_fn(step: int, rng: np.random.Generator):
        idx = rng.integers(0, len(split.train_labels), schedule.batch_size)
        images = _batch(split.train_images, idx, max_shift, rng)
        recon, losses = model(images)
        rec = F.mse_loss(recon, images)
        loss = rec + losses["vq_loss"] + losses["commit_loss"] + losses["entropy_loss"]
        return loss, {"recon_mse": rec.item(), "codebook_usage": float(losses.get("codebook_usage", 0.0))}

    metrics = optimise(model, schedule, loss_fn, seed, "vq tokenizer", progress)
    with torch.no_grad():
        held = torch.from_numpy(split.held_out_images)
        quantized, codes, _ = model.encode(held)
        metrics["held_out_recon_mse"] = F.mse_loss(model.decode(quantized), held).item()
        train_codes = tokenize(model, split.train_images)
    metrics["codes_used_on_train"] = int(np.unique(train_codes).size)
    return model, metrics


@torch.no_grad()
def tokenize(vq: VQModel, images: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Images [N,3,32,32] -> raster-order codes int64 [N, grid*grid]."""
    vq.eval()
    out = []
    for start in range(0, len(images), batch_size):
        _, codes, _ = vq.encode(torch.from_numpy(np.ascontiguousarray(images[start:start + batch_size])))
        out.append(codes.reshape(codes.shape[0], -1).numpy())
    return np.concatenate(out).astype(np.int64)


def tokenize_shifted(vq: VQModel, images: np.ndarray, labels: np.ndarray, max_shift: int,
                     progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Codes of every image under every shift in [-max_shift, max_shift]²: the GPTs' training set."""
    tqdm = require("tqdm", "demo training").tqdm
    offsets = [(dy, dx) for dy in range(-max_shift, max_shift + 1) for dx in range(-max_shift, max_shift + 1)]
    codes = [tokenize(vq, shift(images, dy, dx)) for dy, dx in tqdm(offsets, desc="tokenize", disable=not progress)]
    return np.concatenate(codes), np.tile(labels, len(offsets))


# ---- GPTs -------------------------------------------------------------------------------

def token_nll(model: GPT, codes: np.ndarray, labels: np.ndarray, batch_size: int = 256) -> float:
    """Mean next-token negative log-likelihood (nats) of conditional sequences (eval mode)."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(codes), batch_size):
            toks = torch.from_numpy(codes[start:start + batch_size])
            logits = model(torch.from_numpy(labels[start:start + batch_size]), toks)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), toks.reshape(-1), reduction="sum").item()
            count += toks.numel()
    return total / count


def train_gpt(config: GPTConfig, codes: np.ndarray, labels: np.ndarray, schedule: Schedule, class_dropout: float,
              seed: int, desc: str, held_out: tuple[np.ndarray, np.ndarray] | None = None,
              progress: bool = True) -> tuple[GPT, dict[str, float]]:
    """Teacher-forced next-token cross-entropy; `class_dropout` of the rows get the null class,
    which is what makes classifier-free guidance possible at sampling time."""
    torch.manual_seed(seed)
    model = GPT(config)

    def loss_fn(step: int, rng: np.random.Generator):
        idx = rng.integers(0, len(codes), schedule.batch_size)
        toks = torch.from_numpy(codes[idx])
        cond = torch.from_numpy(labels[idx])
        cond = model.drop_conditions(cond, torch.from_numpy(rng.random(len(idx)) < class_dropout))
        logits = model(cond, toks)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), toks.reshape(-1))
        return loss, {"loss": loss.item()}

    metrics = optimise(model, schedule, loss_fn, seed, desc, progress)
    if held_out is not None:
        metrics["held_out_nll"] = token_nll(model, *held_out)
    return model, metrics
