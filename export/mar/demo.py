"""The continuous demo ("mar"): a KL autoencoder, a MAR-style target and a smaller draft, trained
here on the bundled digits (export/demo/dataset.py) and shipped in export/mar/weights/.

    specrt demo train --demo mar --out DIR      # autoencoder -> latents -> target -> draft
    load_mar_demo()                               # .autoencoder, .target, .draft, .config

Sizes are chosen for a 2-core CPU (the whole training ≤ 60 min with 1 thread): 8×8 tokens of
4 channels (a ×4 autoencoder over 32×32 digits), an 8-step cosine DDPM head, a 3-layer target
and a 1-layer draft with a narrower head. The digit evaluator is the c2i demo's (it judges
images, whichever model made them). Weights are stored as fp16 like the c2i demo's.
"""
from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specrt.lazy import require

torch = require("torch", "the continuous demo")
safetensors_torch = require("safetensors.torch", "the continuous demo")

from specrt import __version__  # noqa: E402
from specrt.export.demo.configs import Schedule  # noqa: E402
from specrt.export.demo.dataset import NUM_CLASSES, DigitsSplit, load_split  # noqa: E402
from specrt.export.demo.store import _load_into, read_config, round_to_storage  # noqa: E402  (the c2i demo's fp16 store)
from specrt.export.mar.packaged import CONFIG_FILE, packaged_weights_dir  # noqa: E402
from specrt.models.mar.autoencoder import AEConfig, KLAutoencoder  # noqa: E402
from specrt.models.mar.model import MAR, MARConfig  # noqa: E402

FORMAT = "specrt-mar-demo"
VERSION = 1
WEIGHT_FILES = {"autoencoder": "autoencoder.safetensors", "target": "target.safetensors",
                "draft": "draft.safetensors"}
TOKENS = 4          # channels per token
DIFFUSION_STEPS = 8


def autoencoder_config() -> AEConfig:
    return AEConfig(latent_channels=TOKENS, ch=16, ch_mult=(1, 2, 2), z_channels=32, num_res_blocks=1, norm_groups=8)


def target_config() -> MARConfig:
    return MARConfig(token_dim=TOKENS, seq_len=64, dim=96, n_layer=3, n_head=4, num_classes=NUM_CLASSES,
                     head_width=96, head_depth=3, diffusion_steps=DIFFUSION_STEPS)


def draft_config() -> MARConfig:
    return MARConfig(token_dim=TOKENS, seq_len=64, dim=48, n_layer=1, n_head=2, num_classes=NUM_CLASSES,
                     head_width=64, head_depth=2, diffusion_steps=DIFFUSION_STEPS)


@dataclass
class MARTrainingConfig:
    """Everything `specrt demo train --demo mar` needs besides the seed; stored in mar.json."""

    autoencoder: Schedule = field(default_factory=lambda: Schedule(steps=150, batch_size=32, lr=2e-3, warmup=15))
    target: Schedule = field(default_factory=lambda: Schedule(steps=1500, batch_size=32, lr=1.5e-3, weight_decay=0.02))
    draft: Schedule = field(default_factory=lambda: Schedule(steps=1000, batch_size=32, lr=2e-3, weight_decay=0.01))
    kl_weight: float = 1e-3      # the autoencoder's KL term (pixel MSE is ~1e-3 at convergence)
    max_shift: int = 1           # augmentation: translations of up to this many pixels
    class_dropout: float = 0.1   # rows trained unconditionally (CFG)
    batch_mul: int = 2           # MAR's diffusion_batch_mul: noise draws per token per step

    def scaled(self, steps_scale: float) -> "MARTrainingConfig":
        return MARTrainingConfig(self.autoencoder.scaled(steps_scale), self.target.scaled(steps_scale),
                                 self.draft.scaled(steps_scale), self.kl_weight, self.max_shift,
                                 self.class_dropout, self.batch_mul)


# The temperature scales the chain's noise (MAR's --temperature); CFG as MAR's, on ε̂.
SAMPLING_DEFAULTS = {"cfg_scale": 2.0, "temperature": 1.0, "cfg_schedule": "constant"}


@dataclass
class MARDemo:
    """The trained continuous family, float32, eval mode."""

    autoencoder: KLAutoencoder
    target: MAR
    draft: MAR
    config: dict

    @property
    def sampling_defaults(self) -> dict:
        return dict(self.config.get("sampling_defaults", SAMPLING_DEFAULTS))


def save_mar_demo(models: MARDemo, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for role, filename in WEIGHT_FILES.items():
        state = {k: v.detach().to(torch.float16).contiguous() for k, v in getattr(models, role).state_dict().items()}
        safetensors_torch.save_file(state, str(out / filename))
    config = dict(models.config, format=FORMAT, version=VERSION, files=WEIGHT_FILES)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out


def load_mar_demo(path: str | Path | None = None) -> MARDemo:
    """The continuous demo from `path` (a `specrt demo train --demo mar` output) or the package."""
    root = Path(path) if path is not None else packaged_weights_dir()
    config = read_config(root, FORMAT, VERSION, config_file=CONFIG_FILE, kind="continuous demo")
    ae = _load_into(KLAutoencoder(AEConfig.from_dict(config["autoencoder"])), root / WEIGHT_FILES["autoencoder"])
    target = _load_into(MAR(MARConfig(**config["target"])), root / WEIGHT_FILES["target"])
    draft = _load_into(MAR(MARConfig(**config["draft"])), root / WEIGHT_FILES["draft"])
    return MARDemo(ae, target, draft, config)


def train_mar_demo(out_dir: str | Path | None, seed: int = 0, steps_scale: float = 1.0, progress: bool = True,
                   split: DigitsSplit | None = None, evaluate: bool = True, threads: int = 1,
                   configs: tuple[AEConfig, MARConfig, MARConfig] | None = None) -> MARDemo:
    """Train the continuous demo (and save it when out_dir is given); returns the models.
    `configs` (autoencoder, target, draft) exist for tests; the command line uses this module's."""
    from specrt.export.mar import training

    torch.set_num_threads(threads)
    started = time.time()
    split = split if split is not None else load_split()
    schedule = MARTrainingConfig().scaled(steps_scale)
    ae_cfg, target_cfg, draft_cfg = configs or (autoencoder_config(), target_config(), draft_config())
    metrics: dict[str, dict] = {}
    seconds: dict[str, float] = {}

    def timed(name: str, fn, *args, **kwargs):
        t0 = time.time()
        result = fn(*args, **kwargs)
        seconds[name] = round(time.time() - t0, 1)
        return result

    ae, metrics["autoencoder"] = timed("autoencoder", training.train_autoencoder, split, ae_cfg, schedule.autoencoder,
                                       schedule.kl_weight, schedule.max_shift, seed * 100 + 11, progress)
    round_to_storage(ae)
    means, stds, labels = timed("encode", training.encode_shifted, ae, split.train_images, split.train_labels,
                                schedule.max_shift)
    held_means, _, held_labels = training.encode_shifted(ae, split.held_out_images, split.held_out_labels, 0)
    held_out = (held_means, held_labels)
    models = {}
    for role, cfg, sched, offset in (("target", target_cfg, schedule.target, 12), ("draft", draft_cfg, schedule.draft, 13)):
        models[role], metrics[role] = timed(role, training.train_mar, cfg, means, stds, labels, sched,
                                            schedule.class_dropout, schedule.batch_mul, seed * 100 + offset,
                                            f"{role} mar", held_out, progress)
        round_to_storage(models[role])
    for role, model in (("autoencoder", ae), *models.items()):
        metrics[role]["parameters"] = sum(p.numel() for p in model.parameters())
    config = {
        "autoencoder": ae_cfg.to_dict(), "target": target_cfg.to_dict(), "draft": draft_cfg.to_dict(),
        "sampling_defaults": dict(SAMPLING_DEFAULTS),
        "dataset": {"name": "sklearn.datasets.load_digits", "train_images": len(split.train_labels),
                    "encoded_sequences": len(labels)},
        "training": dict(asdict(schedule), seed=seed, steps_scale=steps_scale),
        "metrics": metrics,
        "provenance": {"created_by": f"specrt {__version__}", "torch": torch.__version__,
                       "python": platform.python_version(), "threads": threads},
    }
    demo = MARDemo(ae, models["target"], models["draft"], config)
    if out_dir is not None:
        save_mar_demo(demo, out_dir)
    if evaluate:
        config["quality"] = timed("quality", quality_summary, demo, split, per_class=3, seed=seed)
    seconds["total"] = round(time.time() - started, 1)
    config["training"]["seconds"] = seconds
    if out_dir is not None:
        save_mar_demo(demo, out_dir)
    return demo


def sample_tokens(models: MARDemo, class_ids: np.ndarray, method: str = "ar", seed: int = 0,
                  **params) -> tuple[np.ndarray, object]:
    """Continuous tokens [N, seq_len, C] from the runtime's own methods on the PyTorch backend,
    decoded together (image i with seed + i, as the pipeline does)."""
    from specrt.runtime.families.continuous.torch_runner import torch_runners
    from specrt.runtime.families.continuous.methods import ContinuousDecoding, make_continuous_method

    sampling = dict(models.sampling_defaults)
    sampling.update({k: params.pop(k) for k in list(params) if k in ("cfg_scale", "temperature")})
    target, draft = torch_runners(models.target, models.draft if method != "ar" else None)
    ctx = ContinuousDecoding(target, draft, [seed + i for i in range(len(class_ids))], **sampling)
    tokens = make_continuous_method(method, **params).generate(ctx, np.asarray(class_ids))
    return tokens, ctx.stats


@torch.no_grad()
def decode_tokens(models: MARDemo, tokens: np.ndarray) -> np.ndarray:
    """Tokens [N, seq_len, C] -> images [N,3,32,32] in [-1, 1] through the shipped decoder."""
    return models.autoencoder.decoder_only()(torch.from_numpy(np.asarray(tokens, np.float32))).clamp(-1, 1).numpy()


def quality_summary(models: MARDemo, split: DigitsSplit, per_class: int, seed: int = 0) -> dict:
    """Class accuracy of AR samples and of autoencoder reconstructions, judged by the c2i demo's
    evaluator (the same judge as the discrete demo's numbers)."""
    from specrt.export.demo import load_demo
    from specrt.export.demo.evaluator import accuracy

    evaluator = load_demo().evaluator
    labels = np.repeat(np.arange(NUM_CLASSES), per_class)
    tokens, stats = sample_tokens(models, labels, "ar", seed)
    with torch.no_grad():
        held = torch.from_numpy(split.held_out_images)
        recon = models.autoencoder.decode(models.autoencoder.posterior(held)[0]).clamp(-1, 1).numpy()
    return {"sampling": models.sampling_defaults, "samples_per_class": per_class,
            "ar_sample_accuracy": accuracy(evaluator, decode_tokens(models, tokens), labels),
            "reconstruction_accuracy": accuracy(evaluator, recon, split.held_out_labels),
            "held_out_real_accuracy": accuracy(evaluator, split.held_out_images, split.held_out_labels)}
