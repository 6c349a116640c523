"""`specrt demo train --demo t2i`: measured captions → text encoder + target → draft → evaluator.

One seeded function, like the c2i demo's (export.demo.pipeline). It starts from the packaged
c2i demo: its VQ tokenizer is reused as is (the t2i family shares it, as LlamaGen's t2i and
c2i models share VQ-16) and its GPTs seed the t2i GPTs' trunks.
"""
from __future__ import annotations

import atexit
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from specrt.lazy import require

torch = require("torch", "t2i demo training")

from specrt import __version__  # noqa: E402
from specrt.export.demo import load_demo  # noqa: E402
from specrt.export.demo.dataset import HELD_OUT_FRACTION, SPLIT_SEED, DigitsSplit, load_split  # noqa: E402
from specrt.export.demo.store import config_dicts, round_to_storage  # noqa: E402
from specrt.export.demo.t2i import configs, training  # noqa: E402
from specrt.export.demo.t2i.captions import ATTRIBUTES, TEMPLATES, AttributeBins, MENTION_PROBABILITY  # noqa: E402
from specrt.export.demo.t2i.store import TEXT_ENCODER_DIR, T2IDemoModels, save_t2i_demo  # noqa: E402
from specrt.export.demo.t2i.text_model import build_encoder, build_tokenizer, save_text_encoder  # noqa: E402
from specrt.export.demo.training import StageTimer, tokenize, tokenize_shifted  # noqa: E402
from specrt.models.llamagen_gpt import num_parameters  # noqa: E402


def train_t2i_demo(out_dir: str | Path | None, seed: int = 0, steps_scale: float = 1.0, progress: bool = True,
                   evaluate: bool = True, threads: int = 1, split: DigitsSplit | None = None,
                   c2i_weights: str | Path | None = None) -> T2IDemoModels:
    """Train the t2i family on top of the c2i demo (`c2i_weights`, default the packaged one) and
    (when out_dir is given) save it; returns the models. steps_scale as for the c2i demo."""
    torch.set_num_threads(threads)
    started = time.time()
    split = split if split is not None else load_split()
    schedule = configs.T2ITrainingConfig().scaled(steps_scale)
    c2i = load_demo(c2i_weights)
    metrics: dict[str, dict] = {}
    timed = StageTimer()
    seconds = timed.seconds

    bins = AttributeBins.fit(split.train_images, split.train_labels)
    train_attributes = bins.labels(split.train_images, split.train_labels)
    held_attributes = bins.labels(split.held_out_images, split.held_out_labels)
    tokenizer = build_tokenizer()
    torch.manual_seed(seed * 100 + 5)
    encoder = build_encoder(configs.TEXT_ENCODER, vocab_size=len(tokenizer))
    codes, sequence_images = timed("tokenize", tokenize_shifted, c2i.vq, split.train_images,
                                   np.arange(len(split.train_labels)), schedule.max_shift, progress)
    data = training.CaptionedImages(tokenizer, split.train_labels, train_attributes, configs.COND_LEN)
    held = (training.CaptionedImages(tokenizer, split.held_out_labels, held_attributes, configs.COND_LEN),
            tokenize(c2i.vq, split.held_out_images))
    target_cfg, draft_cfg = configs.target_config(), configs.draft_config()
    target, metrics["target"] = timed("target", training.train_gpt, target_cfg, c2i.target, encoder, data, codes,
                                      sequence_images, schedule.target, schedule.caption_dropout, seed * 100 + 2,
                                      "target gpt + text encoder", True, held, progress)
    draft, metrics["draft"] = timed("draft", training.train_gpt, draft_cfg, c2i.draft, encoder, data, codes,
                                    sequence_images, schedule.draft, schedule.caption_dropout, seed * 100 + 3,
                                    "draft gpt", False, held, progress)
    evaluator, metrics["evaluator"] = timed("evaluator", training.train_evaluator, split, train_attributes,
                                            held_attributes, configs.DEFAULT_EVALUATOR, schedule.evaluator,
                                            schedule.max_shift, seed * 100 + 4, progress)
    for role, model in (("target", target), ("draft", draft), ("evaluator", evaluator), ("text_encoder", encoder)):
        metrics.setdefault(role, {})["parameters"] = num_parameters(model)

    config = config_dicts(c2i.vq.config, target_cfg, draft_cfg, configs.DEFAULT_EVALUATOR)
    config.update(
        text_encoder=dict(configs.TEXT_ENCODER.to_dict(), vocab_size=len(tokenizer), max_length=configs.COND_LEN),
        attributes=bins.to_dict(),
        captions={"words": {name: list(map(list, pair)) for name, pair in ATTRIBUTES.items()},
                  "templates": list(TEMPLATES), "mention_probability": MENTION_PROBABILITY},
        sampling_defaults=dict(configs.SAMPLING_DEFAULTS),
        dataset={"name": "sklearn.datasets.load_digits", "image_size": 32, "split_seed": SPLIT_SEED,
                 "held_out_fraction": HELD_OUT_FRACTION, "train_images": len(split.train_labels),
                 "held_out_images": len(split.held_out_labels), "tokenized_sequences": len(codes)},
        training=dict(schedule.to_dict(), seed=seed, steps_scale=steps_scale,
                      warm_start="the packaged c2i demo's target and draft (trunks) and VQ tokenizer"),
        metrics=metrics,
        provenance={"created_by": f"specrt {__version__}", "torch": torch.__version__,
                    "python": platform.python_version(), "threads": threads},
    )
    if out_dir is None:  # the text encoder still needs a directory (runtime.text reads one)
        root = Path(tempfile.mkdtemp(prefix="specrt-t2i-demo-"))
        atexit.register(shutil.rmtree, root, True)
    else:
        root = Path(out_dir)
    encoder_dir = save_text_encoder(encoder, tokenizer, root / TEXT_ENCODER_DIR)
    models = T2IDemoModels(*(round_to_storage(m) for m in (target, draft, c2i.vq, evaluator)), config, encoder_dir)
    if out_dir is not None:  # save before the (slow) quality summary, then again with it
        save_t2i_demo(models, out_dir)
    if evaluate:
        from specrt.export.demo.t2i.report import quality_summary

        config["quality"] = timed("quality", quality_summary, models, split, seed=seed)
    seconds["total"] = round(time.time() - started, 1)
    config["training"]["seconds"] = seconds
    if out_dir is not None:
        save_t2i_demo(models, out_dir)
    return models
