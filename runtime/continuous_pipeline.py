"""Class ids -> images for a continuous (MAR-style) model pair: the continuous family's Pipeline.

    pipe = ContinuousPipeline.from_bundle("mar-bundle")          # onnxruntime, from the manifest alone
    result = pipe.generate([3, 7], method="cspd", seed=0, draft_len=4)
    result.images   # uint8 [N, H, W, 3] (None without a tokenizer decoder), result.tokens [N, seq_len, C]

Beside runtime/pipeline.py's Pipeline (discrete tokens, sampling heads inside the graphs), not
a subclass: the runners, methods and formulas are the continuous ones (continuous_runner,
methods/continuous, continuous). Sampling defaults come from the bundle's manifest (the demo's
from its mar.json); each keyword given overrides that key. Image i of a call uses seed + i, so
an image does not depend on what else is in the batch.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from specrt import validation
from specrt.errors import SpecrtError
from specrt.runtime.continuous_runner import ContinuousRunner
from specrt.runtime.methods.continuous import ContinuousDecoding, ContinuousStats, make_continuous_method

SAMPLING_KEYS = ("cfg_scale", "temperature", "cfg_schedule")
FALLBACK_SAMPLING = {"cfg_scale": 1.0, "temperature": 1.0, "cfg_schedule": "constant"}


@dataclass
class ContinuousResult:
    tokens: np.ndarray                 # [N, seq_len, C] float32
    images: Optional[np.ndarray]       # uint8 [N, H, W, 3], None when not decoded
    stats: ContinuousStats
    seconds: list[float]               # per image: generation (without the decode)
    sampling: dict[str, Any]


def to_pixels(images: np.ndarray) -> np.ndarray:
    """Decoder output [N,3,H,W] in about [-1, 1] -> uint8 [N,H,W,3] (the c2i pipeline's mapping)."""
    from specrt.runtime.pipeline import to_uint8

    return to_uint8(images)


class ContinuousPipeline:
    """A continuous target, an optional draft and an optional tokenizer decoder; calls take turns."""

    def __init__(self, target: ContinuousRunner, draft: Optional[ContinuousRunner],
                 decoder: Optional[Callable[[np.ndarray], np.ndarray]], sampling_defaults: dict[str, Any],
                 source: str = ""):
        self.target, self.draft, self.decoder = target, draft, decoder
        self.sampling_defaults = {**FALLBACK_SAMPLING, **sampling_defaults}
        self.source = source
        self._lock = threading.Lock()

    @classmethod
    def from_bundle(cls, bundle_dir: str | Path, backend: str = "onnxruntime") -> "ContinuousPipeline":
        """Everything from the bundle's manifest: models, decoder, sampling defaults."""
        from specrt.runtime.continuous_bundle import open_decoder, open_runner, read_continuous_manifest

        manifest = read_continuous_manifest(bundle_dir)
        return cls(open_runner(bundle_dir, "target", backend), open_runner(bundle_dir, "draft", backend),
                   open_decoder(bundle_dir, backend), manifest.get("sampling_defaults", {}),
                   str(manifest.get("source", bundle_dir)))

    @property
    def num_classes(self) -> int:
        return self.target.spec.num_classes

    def generate(self, class_ids: Sequence[int], method: str = "ar", seed: int = 0, decode: bool = True,
                 **kwargs: Any) -> ContinuousResult:
        """Images for `class_ids` with `method` (ar, cspd); keyword arguments are sampling keys
        (cfg_scale, temperature, cfg_schedule) or the method's parameters."""
        sampling = {**self.sampling_defaults, **{k: kwargs.pop(k) for k in list(kwargs) if k in SAMPLING_KEYS}}
        strategy = make_continuous_method(method, **kwargs)
        validation.seed(seed, "seed")
        ids = np.asarray([validation.integer("class id", c, low=0, high=self.num_classes - 1) for c in class_ids],
                         dtype=np.int64)
        if not len(ids):
            raise SpecrtError("generate needs at least one class id")
        if strategy.needs_draft and self.draft is None:
            raise SpecrtError(f"method {method!r} needs a draft model and {self.source or 'this model'} has none")
        if decode and self.decoder is None:
            raise SpecrtError(f"{self.source or 'this model'} has no tokenizer decoder: generate tokens only (decode=False)")
        with self._lock:
            stats, tokens, seconds = ContinuousStats(), [], []
            for i, class_id in enumerate(ids):
                ctx = ContinuousDecoding(self.target, self.draft if strategy.needs_draft else None,
                                         np.random.default_rng(seed + i), stats=stats, **sampling)
                start = time.perf_counter()
                tokens.append(strategy.generate(ctx, ids[i : i + 1])[0])
                seconds.append(time.perf_counter() - start)
            tokens = np.stack(tokens)
            images = to_pixels(self.decoder(tokens)) if decode else None
        return ContinuousResult(tokens, images, stats, seconds, sampling)
