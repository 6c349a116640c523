"""`specrt train-draft`: train an EAGLE head for a target, EAGLE/LANTERN's recipe.

Per step, a batch of token sequences (the target's own samples, or images tokenised with the
VQ) goes through the frozen target under teacher forcing, giving its features f_k (final-norm
hidden states; f_k predicts image token k) and its distributions p_{k}. The head reads the
pairs (f_k + noise, x_k) at the positions of x_k and is trained to predict the next feature
and token:

    loss = SmoothL1(g_k, f_{k+1}) + ce_weight · CE(p_{k+1}, softmax(lm_head(g_k)))

with uniform noise U(−noise/2, noise/2) on the input features (EAGLE's AddUniformNoise) and
`uncond_fraction` of the rows conditioned on the null class / uncond caption, so the head's
unconditional rows make sense under classifier-free guidance (LANTERN: 10%).
Resumable: every `checkpoint_every` steps the head, the optimiser and the data stream's state
go to OUT/train_state.pt; `resume=True` continues from there and ends with the same weights
as an uninterrupted run (same seed, same torch build).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from specrt.errors import SpecrtError
from specrt.export.demo.configs import Schedule
from specrt.export.demo.training import descend, learning_rate, log_metrics
from specrt.export.eagle.checkpoint import save_eagle_head
from specrt.models.eagle_head import EagleConfig, EagleHead
from specrt.lazy import require
from specrt.models.llamagen_gpt import GPT

STATE_FILE = "train_state.pt"


@dataclass
class Recipe:
    """EAGLE/LANTERN training settings (LANTERN: lr 1e-4 on real drafters; the demo uses more)."""

    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 100
    ce_weight: float = 0.1
    noise: float = 0.2
    uncond_fraction: float = 0.1
    checkpoint_every: int = 200
    seed: int = 0

    def schedule(self) -> Schedule:
        return Schedule(self.steps, self.batch_size, self.lr, min(self.warmup, self.steps // 5), 0.0, 0.1)


@dataclass
class TrainingData:
    """Image token sequences [M, grid²] int64 and their conditions (class ids [M] for c2i)."""

    tokens: np.ndarray
    conditions: np.ndarray
    source: str


@torch.no_grad()
def target_samples(target: GPT, vq, count: int, seed: int, threads: Optional[int] = None,
                   progress: bool = True) -> TrainingData:
    """`count` images sampled from the target itself (AR at its sampling defaults, random classes),
    as Cool-SD trains its Lumina-mGPT drafters: the head learns the distribution it will draft for."""
    from specrt.runtime.pipeline import Pipeline

    if target.config.model_type != "c2i":
        raise SpecrtError("train-draft samples class-conditional targets; for t2i pass tokenised images")
    tqdm = require("tqdm", "train-draft").tqdm
    pipe = Pipeline.from_torch(target, None, vq, threads=threads)
    rng = np.random.default_rng(seed)
    classes = rng.integers(0, target.config.num_classes, count)
    per_call = max(1, min(64, pipe.max_images or 64))
    tokens = []
    for start in tqdm(range(0, count, per_call), desc="target samples", disable=not progress):
        chunk = classes[start:start + per_call]
        result = pipe.generate([int(c) for c in chunk], method="ar", seed=seed + start, decode=False)
        tokens.append(result.tokens.reshape(len(chunk), -1))
    return TrainingData(np.concatenate(tokens).astype(np.int64), classes.astype(np.int64), f"target samples ({count})")


def _features(target: GPT, cond: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target's (features f [B,N,H], probabilities p [B,N,V]) under teacher forcing."""
    with torch.no_grad():
        logits, hidden = target.forward_with_hidden(cond, tokens)
        return hidden.float(), torch.softmax(logits.float(), dim=-1)


def eagle_loss(head: EagleHead, target: GPT, cond: torch.Tensor, tokens: torch.Tensor, recipe: Recipe,
               generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """The recipe's loss on one batch (conditions already dropped to null where wanted)."""
    features, probs = _features(target, cond, tokens)
    n = tokens.shape[1] - 1  # pairs (f_k, x_k), k < N-1, each predicting f_{k+1}
    noisy = features[:, :n] + (torch.rand(features[:, :n].shape, generator=generator) - 0.5) * recipe.noise
    positions = (target.config.cond_len + torch.arange(n))[None].expand(tokens.shape[0], n)
    logits, out = head(tokens[:, :n], noisy, positions)
    regression = F.smooth_l1_loss(out, features[:, 1:])
    cross_entropy = -(probs[:, 1:] * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    with torch.no_grad():
        agree = (logits.argmax(-1) == probs[:, 1:].argmax(-1)).float().mean().item()
    loss = regression + recipe.ce_weight * cross_entropy
    return loss, {"loss": loss.item(), "smooth_l1": regression.item(), "ce": cross_entropy.item(), "top1": agree}


def _optimizer(head: EagleHead, recipe: Recipe) -> torch.optim.Optimizer:
    params = [p for p in head.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)


def train_eagle_head(target: GPT, data: TrainingData, out: str | Path, recipe: Recipe = Recipe(),
                     head_config: Optional[EagleConfig] = None, resume: bool = False, progress: bool = True,
                     target_source: str = "") -> tuple[EagleHead, dict]:
    """Train (or resume training) a head for the frozen `target`; write OUT/ (LANTERN layout) and return it.

    The returned metrics average the last 10% of steps (loss terms and top-1 agreement with the
    target). OUT/train_state.pt holds what `resume` needs; it is removed once training ends.
    """
    tqdm = require("tqdm", "train-draft").tqdm
    out = Path(out)
    target.eval().requires_grad_(False)
    config = head_config or EagleConfig.for_target(target)
    torch.manual_seed(recipe.seed)
    head = EagleHead(config).tie_to(target)
    optimizer = _optimizer(head, recipe)
    generator = torch.Generator().manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    history: dict[str, list[float]] = {}
    start = 0
    state_path = out / STATE_FILE
    if resume:
        if not state_path.is_file():
            raise SpecrtError(f"--resume: {state_path} not found (train-draft writes it every checkpoint_every steps)")
        saved = torch.load(state_path, map_location="cpu", weights_only=False)  # our own file
        if saved["recipe"] != asdict(recipe) or saved["config"] != config.to_dict():
            raise SpecrtError(f"--resume: {state_path} was written with other settings; use the same flags "
                              f"(or start afresh without --resume)")
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        generator.set_state(saved["generator"])
        rng.bit_generator.state = saved["rng"]
        history, start = saved["history"], saved["step"]
    schedule = recipe.schedule()
    tokens_all, conds_all = torch.from_numpy(data.tokens), torch.from_numpy(data.conditions)
    head.train()
    bar = tqdm(range(start, recipe.steps), desc="train-draft", initial=start, total=recipe.steps,
               disable=not progress, dynamic_ncols=True)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(schedule, step)
        idx = torch.from_numpy(rng.integers(0, len(tokens_all), recipe.batch_size))
        drop = torch.from_numpy(rng.random(recipe.batch_size) < recipe.uncond_fraction)
        cond = target.drop_conditions(conds_all[idx], drop)
        loss, metrics = eagle_loss(head, target, cond, tokens_all[idx], recipe, generator)
        descend(optimizer, head.parameters(), loss, 0.5)  # EAGLE clips at 0.5
        log_metrics(history, metrics)
        if step % 20 == 0 or step == recipe.steps - 1:
            bar.set_postfix({k: f"{v[-1]:.3f}" for k, v in history.items()})
        if (step + 1) % recipe.checkpoint_every == 0 and step + 1 < recipe.steps:
            out.mkdir(parents=True, exist_ok=True)
            tmp = state_path.with_suffix(".tmp")
            torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                        "rng": rng.bit_generator.state, "history": history, "step": step + 1,
                        "recipe": asdict(recipe), "config": config.to_dict()}, tmp)
            tmp.replace(state_path)
    head.eval()
    tail = max(1, recipe.steps // 10)
    metrics = {f"final_{k}": float(np.mean(v[-tail:])) for k, v in history.items()}
    save_eagle_head(head, out, {"target": target_source, "data": data.source, "recipe": asdict(recipe),
                                "metrics": metrics})
    state_path.unlink(missing_ok=True)
    return head, metrics


def metrics_line(metrics: dict) -> str:
    return json.dumps({k: round(v, 4) for k, v in metrics.items()})
