"""Training loops of the continuous demo: the KL autoencoder, then the MAR-style target and draft.

The optimiser, schedule and seeding are the c2i demo's (export/demo/training.optimise); what
is new is the two losses. The autoencoder: pixel MSE + a small KL to N(0, I). The MAR model:
MAR's diffusion loss — teacher-forced causal transformer gives z per token, the head predicts
the noise of x_t = sqrt(ᾱ_t)·x_0 + sqrt(1 − ᾱ_t)·ε at a random step t of the very schedule the
runtime samples with (runtime/families/continuous/formulas.ddpm_schedule), `diffusion_batch_mul` draws per token.
"""
from __future__ import annotations

import numpy as np

from specrt.lazy import require

torch = require("torch", "demo training")
F = torch.nn.functional

from specrt.export.demo.configs import Schedule  # noqa: E402
from specrt.export.demo.dataset import DigitsSplit, shift  # noqa: E402
from specrt.export.demo.training import _batch, optimise  # noqa: E402
from specrt.models.mar.autoencoder import AEConfig, KLAutoencoder, to_tokens  # noqa: E402
from specrt.models.mar.model import MAR, MARConfig  # noqa: E402
from specrt.runtime.families.continuous.formulas import ddpm_schedule  # noqa: E402


def train_autoencoder(split: DigitsSplit, cfg: AEConfig, schedule: Schedule, kl_weight: float, max_shift: int,
                      seed: int, progress: bool = True) -> tuple[KLAutoencoder, dict[str, float]]:
    """Reconstruction + kl_weight·KL; sets cfg.scale_factor so the training tokens have unit std."""
    torch.manual_seed(seed)
    model = KLAutoencoder(cfg)

    def loss_fn(step: int, rng: np.random.Generator):
        idx = rng.integers(0, len(split.train_labels), schedule.batch_size)
        images = _batch(split.train_images, idx, max_shift, rng)
        recon, kl = model(images)
        rec = F.mse_loss(recon, images)
        return rec + kl_weight * kl, {"recon_mse": rec.item(), "kl": kl.item()}

    metrics = optimise(model, schedule, loss_fn, seed, "autoencoder", progress)
    with torch.no_grad():
        mean, _ = model.posterior(torch.from_numpy(split.train_images))
        cfg.scale_factor = float(1.0 / mean.std())
        held = torch.from_numpy(split.held_out_images)
        metrics["held_out_recon_mse"] = F.mse_loss(model.decode(model.posterior(held)[0]), held).item()
    metrics["scale_factor"] = cfg.scale_factor
    return model, metrics


@torch.no_grad()
def encode_shifted(ae: KLAutoencoder, images: np.ndarray, labels: np.ndarray, max_shift: int,
                   batch_size: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Posterior (mean, std) tokens, scaled, [N·shifts, seq_len, C] of every image under every
    shift in [-max_shift, max_shift]², and their labels: the MAR models' training set
    (a fresh posterior sample per batch, as MAR trains on sampled latents)."""
    ae.eval()
    offsets = [(dy, dx) for dy in range(-max_shift, max_shift + 1) for dx in range(-max_shift, max_shift + 1)]
    means, stds = [], []
    for dy, dx in offsets:
        moved = shift(images, dy, dx)
        for start in range(0, len(moved), batch_size):
            mean, std = ae.posterior(torch.from_numpy(np.ascontiguousarray(moved[start:start + batch_size])))
            means.append(to_tokens(mean * ae.cfg.scale_factor).numpy())
            stds.append(to_tokens(std * ae.cfg.scale_factor).numpy())
    return np.concatenate(means), np.concatenate(stds), np.tile(labels, len(offsets))


def diffusion_loss(model: MAR, tokens: "torch.Tensor", class_ids: "torch.Tensor", alpha_bars: "torch.Tensor",
                   batch_mul: int) -> "torch.Tensor":
    """MAR's loss on a batch of sequences tokens [B,S,C]: ε-prediction MSE at random steps."""
    cfg = model.cfg
    b, s, c = tokens.shape
    inputs = torch.cat([torch.zeros(b, 1, c), tokens[:, :-1]], dim=1)  # position 0 is the class
    past_k, past_v = model.transformer.empty_cache(b)
    z, _, _ = model.transformer.step(inputs, class_ids, torch.arange(s), past_k, past_v)
    z = z.reshape(b * s, cfg.dim).repeat(batch_mul, 1)
    x0 = tokens.reshape(b * s, c).repeat(batch_mul, 1)
    t = torch.randint(0, cfg.diffusion_steps, (len(x0),))
    eps = torch.randn_like(x0)
    a = alpha_bars[t][:, None]
    return F.mse_loss(model.head(a.sqrt() * x0 + (1 - a).sqrt() * eps, t, z), eps)


def train_mar(cfg: MARConfig, means: np.ndarray, stds: np.ndarray, labels: np.ndarray, schedule: Schedule,
              class_dropout: float, batch_mul: int, seed: int, desc: str,
              held_out: tuple[np.ndarray, np.ndarray] | None = None,
              progress: bool = True) -> tuple[MAR, dict[str, float]]:
    """One MAR-style model on posterior samples; `class_dropout` of the rows get the unconditional
    class (id num_classes, MAR's fake_latent), which classifier-free guidance needs."""
    torch.manual_seed(seed)
    model = MAR(cfg)
    alpha_bars = torch.tensor(ddpm_schedule(cfg.schedule, cfg.diffusion_steps, cfg.beta_start, cfg.beta_end).alpha_bars,
                              dtype=torch.float32)

    def loss_fn(step: int, rng: np.random.Generator):
        idx = rng.integers(0, len(labels), schedule.batch_size)
        tokens = torch.from_numpy(means[idx] + stds[idx] * rng.standard_normal(means[idx].shape).astype(np.float32))
        cond = np.where(rng.random(len(idx)) < class_dropout, cfg.num_classes, labels[idx])
        loss = diffusion_loss(model, tokens, torch.from_numpy(cond), alpha_bars, batch_mul)
        return loss, {"loss": loss.item()}

    metrics = optimise(model, schedule, loss_fn, seed, desc, progress)
    if held_out is not None:
        torch.manual_seed(seed)
        with torch.no_grad():
            tokens, held_labels = (torch.from_numpy(a) for a in held_out)
            metrics["held_out_loss"] = diffusion_loss(model, tokens, held_labels, alpha_bars, 4).item()
    return model, metrics
