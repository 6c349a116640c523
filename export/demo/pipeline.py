"""`specrt demo train`: VQ tokenizer → tokenised dataset → target GPT → draft GPT → evaluator.

One seeded function so the committed weights can be reproduced with one command; the
per-model loops live in training.py, the file format in store.py.
"""
from __future__ import annotations

import platform
import time
from pathlib import Path

from specrt.lazy import require

torch = require("torch", "demo training")

from specrt import __version__  # noqa: E402
from specrt.export.demo import configs, training  # noqa: E402
from specrt.export.demo.dataset import HELD_OUT_FRACTION, SPLIT_SEED, DigitsSplit, load_split  # noqa: E402
from specrt.export.demo.store import DemoModels, config_dicts, round_to_storage, save_demo  # noqa: E402
from specrt.models.llamagen_gpt import GPTConfig, num_parameters  # noqa: E402
from specrt.models.llamagen_vq import VQConfig  # noqa: E402

DEFAULT_THREADS = 2  # the workplace CPU; on a shared, busy machine 1 avoids OpenMP threads waiting on each other


def subset_split(split: DigitsSplit, n_train: int, n_held_out: int) -> DigitsSplit:
    """The first images of each part (for smoke tests that must run in seconds)."""
    return DigitsSplit(split.train_images[:n_train], split.train_labels[:n_train],
                       split.held_out_images[:n_held_out], split.held_out_labels[:n_held_out])


def train_demo(out_dir: str | Path | None, seed: int = 0, steps_scale: float = 1.0, progress: bool = True,
               split: DigitsSplit | None = None, vq_config: VQConfig | None = None,
               target_config: GPTConfig | None = None, draft_config: GPTConfig | None = None,
               evaluate: bool = True, threads: int = DEFAULT_THREADS) -> DemoModels:
    """Train the whole family and (when out_dir is given) save it; returns the models.

    steps_scale multiplies every model's step count (0.01 for a smoke run). The config
    overrides exist for tests; the command line always uses configs.py's sizes.
    """
    torch.set_num_threads(threads)
    started = time.time()
    split = split if split is not None else load_split()
    schedule = configs.DemoTrainingConfig().scaled(steps_scale)
    vq_cfg = vq_config or configs.vq_config()
    target_cfg = target_config or configs.target_config()
    draft_cfg = draft_config or configs.draft_config()
    evaluator_cfg = configs.DEFAULT_EVALUATOR
    metrics: dict[str, dict] = {}
    timed = training.StageTimer()
    seconds = timed.seconds

    vq, metrics["vq"] = timed("vq", training.train_vq, split, vq_cfg, schedule.vq, schedule.max_shift,
                              seed * 100 + 1, progress)
    codes, labels = timed("tokenize", training.tokenize_shifted, vq, split.train_images, split.train_labels,
                          schedule.max_shift, progress)
    held_out = (training.tokenize(vq, split.held_out_images), split.held_out_labels)
    target, metrics["target"] = timed("target", training.train_gpt, target_cfg, codes, labels, schedule.target,
                                      schedule.class_dropout, seed * 100 + 2, "target gpt", held_out, progress)
    draft, metrics["draft"] = timed("draft", training.train_gpt, draft_cfg, codes, labels, schedule.draft,
                                    schedule.class_dropout, seed * 100 + 3, "draft gpt", held_out, progress)
    evaluator, metrics["evaluator"] = timed("evaluator", training.train_evaluator, split, evaluator_cfg,
                                            schedule.evaluator, schedule.max_shift, seed * 100 + 4, progress)
    for role, model in (("vq", vq), ("target", target), ("draft", draft), ("evaluator", evaluator)):
        metrics[role]["parameters"] = num_parameters(model)

    config = config_dicts(vq_cfg, target_cfg, draft_cfg, evaluator_cfg)
    config.update(
        sampling_defaults=dict(configs.SAMPLING_DEFAULTS),
        dataset={"name": "sklearn.datasets.load_digits", "image_size": 32, "split_seed": SPLIT_SEED,
                 "held_out_fraction": HELD_OUT_FRACTION, "train_images": len(split.train_labels),
                 "held_out_images": len(split.held_out_labels), "tokenized_sequences": len(codes)},
        training=dict(schedule.to_dict(), seed=seed, steps_scale=steps_scale),
        metrics=metrics,
        provenance={"created_by": f"specrt {__version__}", "torch": torch.__version__,
                    "python": platform.python_version(), "threads": threads},
    )
    models = DemoModels(*(round_to_storage(m) for m in (target, draft, vq, evaluator)), config)
    if out_dir is not None:  # save before the (slow) quality summary, then again with it
        save_demo(models, out_dir)
    if evaluate:
        from specrt.export.demo.report import quality_summary
        config["quality"] = timed("quality", quality_summary, models, split, per_class=10, seed=seed,
                                  progress=progress)
    seconds["total"] = round(time.time() - started, 1)
    config["training"]["seconds"] = seconds
    if out_dir is not None:
        save_demo(models, out_dir)
    return models
