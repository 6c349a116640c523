"""How well the t2i demo follows prompts: AR samples of the default prompts read by the evaluator,
beside the evaluator's own accuracy on real held-out digits against their measured captions.

The acceptance figures are in `ratio`: AR prompt following over the same on real images, per
property, for all named words together (`words`) and for every word of a prompt at once
(`all`); the issue asks for at least 0.8. Also: Fréchet distance of the
samples to real images beside the real-vs-real floor, and SD's mean accepted length.
"""
from __future__ import annotations

from typing import Optional


from specrt.runtime.pipeline import Pipeline, from_uint8, to_uint8
from specrt.runtime.sampling import SamplingParams

from specrt.export.demo.dataset import DigitsSplit
from specrt.export.demo.evaluator import embed, frechet_distance
from specrt.export.demo.t2i.captions import ATTRIBUTE_NAMES, default_prompts, parse_prompt
from specrt.export.demo.t2i.evaluator import predict, prompt_following
from specrt.export.demo.t2i.store import T2IDemoModels
from specrt.export.demo.t2i.training import real_prompt_following

SD_DRAFT_LEN = 4
SD_PROMPTS = 20
QUALITY_REPEATS = 4  # 320 AR samples: "all" is read to about ±0.03 (one sd), 80 left it at ±0.05
KEYS = ("digit",) + ATTRIBUTE_NAMES + ("words", "all")


def demo_pipeline(models: T2IDemoModels, **options) -> Pipeline:
    """The runtime's PyTorch pipeline over the t2i family, prompts through its text encoder."""
    return Pipeline.from_torch(models.target, models.draft, models.vq, text_encoder=models.text_encoder(), **options)


def quality_summary(models: T2IDemoModels, split: DigitsSplit, seed: int = 0, repeats: int = QUALITY_REPEATS,
                    params: Optional[SamplingParams] = None, draft_len: int = SD_DRAFT_LEN) -> dict:
    """Prompt following of AR samples (default prompts × repeats) and of real held-out images."""
    params = params or models.sampling_defaults
    sampling = {"cfg_scale": params.cfg_scale, "temperature": params.temperature, "top_k": params.top_k,
                "top_p": params.top_p}
    prompts = default_prompts() * repeats
    pipe = demo_pipeline(models)
    images = from_uint8(pipe.generate(prompts=prompts, method="ar", seed=seed, **sampling).images)
    ar = prompt_following(predict(models.evaluator, images), [parse_prompt(p) for p in prompts])
    as_pixels = lambda x: from_uint8(to_uint8(x))  # noqa: E731  real images, the same uint8 path
    held_attributes = models.bins.labels(split.held_out_images, split.held_out_labels)
    real = real_prompt_following(models.evaluator, split, held_attributes, as_pixels(split.held_out_images))
    half_a, half_b = split.held_out_halves()
    feats = embed(models.evaluator, images)[0]
    feats_a, feats_b = (embed(models.evaluator, as_pixels(h))[0] for h in (half_a, half_b))
    n = min(len(feats), len(feats_b))
    stats = pipe.generate(prompts=prompts[:SD_PROMPTS], method="sd", seed=seed + 1, draft_len=draft_len,
                          **sampling).stats
    return {
        "sampling": sampling,
        "prompts": len(prompts),
        "real_prompt_following": real,
        "ar_prompt_following": ar,
        "ratio": {k: ar[k] / real[k] for k in KEYS if ar.get(k) is not None and real.get(k)},
        "fd_ar_vs_real": frechet_distance(feats[:n], feats_a),
        "fd_real_vs_real": frechet_distance(feats_b[:n], feats_a),
        "fd_set_sizes": [n, len(feats_a)],
        "sd_draft_len": draft_len,
        "sd_prompts": SD_PROMPTS,
        "sd_mean_accepted_length": stats.mean_accepted_length,
    }


def format_summary(summary: dict) -> str:
    """The summary as `specrt demo train --demo t2i` prints it."""
    s = summary["sampling"]
    real, ar, ratio = summary["real_prompt_following"], summary["ar_prompt_following"], summary["ratio"]
    nan = float("nan")
    lines = [f"sampling: cfg_scale={s['cfg_scale']} temperature={s['temperature']} top_k={s['top_k']} top_p={s['top_p']}",
             f"prompt following   {'  '.join(f'{k:>9}' for k in KEYS)}",
             f"real held-out      {'  '.join(f'{real[k]:9.3f}' for k in KEYS)}",
             f"AR ({summary['prompts']} prompts)  {'  '.join(f'{ar[k]:9.3f}' for k in KEYS)}",
             f"AR / real          {'  '.join(f'{ratio.get(k, nan):9.2f}' for k in KEYS)}",
             f"Fréchet distance AR vs real {summary['fd_ar_vs_real']:.2f}, real vs real {summary['fd_real_vs_real']:.2f} "
             f"(sets {summary['fd_set_sizes'][0]} vs {summary['fd_set_sizes'][1]})",
             f"speculative decoding, draft_len={summary['sd_draft_len']}: mean accepted length "
             f"{summary['sd_mean_accepted_length']:.2f} ({summary['sd_prompts']} prompts)"]
    return "\n".join(lines)
