"""Class ids -> images for a continuous (MAR-style) model pair: the continuous family's Pipeline.

    pipe = ContinuousPipeline.from_bundle("mar-bundle")          # onnxruntime, from the manifest alone
    result = pipe.generate([3, 7], method="cspd", seed=0, draft_len=4)
    result.images   # uint8 [N, H, W, 3] (None without a tokenizer decoder), result.tokens [N, seq_len, C]

The continuous family's own pipeline beside runtime/pipeline.py's (discrete tokens, sampling heads
inside the graphs), with the same generate call (runtime/family.py): its runners, methods
and formulas are this folder's (runner.py, methods.py, formulas.py). Sampling defaults come from the bundle's manifest (the demo's
from its mar.json); each keyword given overrides that key. The images of a call are decoded
together in one pass (in passes of `max_images` when there are more); image i draws all its
randomness from counters keyed by its seed, seed + i (or seed[i]), so it is the same image alone
or in any batch, as in the discrete Pipeline, and the same whichever loop decodes it (`loop`).
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
from specrt.manifest import DEFAULT_MAX_IMAGES
from specrt.runtime.families.continuous.bundle import (ContinuousManifest, continuous_manifest, open_decoder,
                                                      open_runner)
from specrt.runtime.families.continuous.runner import ContinuousRunner
from specrt.runtime.families.continuous.methods import (ContinuousDecoding, ContinuousMethod, ContinuousStats,
                                                       make_continuous_method)
from specrt.runtime.families.continuous.round_loop import decode_rounds, plan_round, round_key, wants_round
from specrt.runtime.rounds import KEPT_ROUNDS, kept_round
from specrt.runtime.siblings import twin_pipeline

SAMPLING_KEYS = ("cfg_scale", "temperature", "cfg_schedule")
FALLBACK_SAMPLING = {"cfg_scale": 1.0, "temperature": 1.0, "cfg_schedule": "constant"}


@dataclass
class ContinuousResult:
    tokens: np.ndarray                 # [N, seq_len, C] float32
    images: Optional[np.ndarray]       # uint8 [N, H, W, 3], None when not decoded
    stats: ContinuousStats
    seconds: list[float]               # per image: the generation of its pass (without the decode)
    sampling: dict[str, Any]


def to_pixels(images: np.ndarray) -> np.ndarray:
    """Decoder output [N,3,H,W] in about [-1, 1] -> uint8 [N,H,W,3] (the c2i pipeline's mapping)."""
    from specrt.runtime.pipeline import to_uint8

    return to_uint8(images)


class ContinuousPipeline:
    """A continuous target, an optional draft and an optional tokenizer decoder; calls take turns.

    `max_images`: images decoded together in one pass (the discrete Pipeline's limit, 32 by
    default); a call with more runs in several passes, the same images either way."""

    def __init__(self, target: ContinuousRunner, draft: Optional[ContinuousRunner],
                 decoder: Optional[Callable[[np.ndarray], np.ndarray]], sampling_defaults: dict[str, Any],
                 source: str = "", max_images: Optional[int] = None):
        self.target, self.draft, self.decoder = target, draft, decoder
        self.sampling_defaults = {**FALLBACK_SAMPLING, **sampling_defaults}
        self.source = source
        self.max_images = validation.count("max_images", max_images) if max_images is not None else DEFAULT_MAX_IMAGES
        self._lock = threading.Lock()
        # which loop decodes (runtime.rounds.LOOPS, round_loop.wants_round): "auto" the device round
        # on an accelerator, "round" wherever the models are PyTorch modules, "host" the host loop
        self.loop = "auto"
        # rounds of recent calls, with their buffers and captured graphs; the most recent keep_rounds stay
        self._rounds: dict[tuple, Any] = {}
        self.keep_rounds = KEPT_ROUNDS

    @classmethod
    def from_bundle(cls, bundle: str | Path | ContinuousManifest, backend: str = "onnxruntime",
                    max_images: Optional[int] = None) -> "ContinuousPipeline":
        """Everything from the bundle's manifest (`bundle`: its checked manifest, or its folder,
        read once): models, decoder, sampling defaults."""
        manifest = continuous_manifest(bundle)
        return cls(open_runner(manifest, "target", backend), open_runner(manifest, "draft", backend),
                   open_decoder(manifest, backend), manifest.raw.get("sampling_defaults", {}),
                   str(manifest.raw.get("source", manifest.root)), max_images)

    @property
    def num_classes(self) -> int:
        return self.target.spec.num_classes

    def generate(self, class_ids: Sequence[int] | int, method: str = "ar", seed: int | Sequence[int] = 0,
                 decode: bool = True, **kwargs: Any) -> ContinuousResult:
        """Images for `class_ids` with `method` (ar, cspd); keyword arguments are sampling keys
        (cfg_scale, temperature, cfg_schedule) or the method's parameters.

        All images are decoded together, in one pass (passes of `max_images` when there are
        more). Image i draws its randomness from counters keyed by its seed, `seed + i` (or
        `seed[i]` when a seed per image is given), so generate([a, b], seed=s)'s second image is
        generate([b], seed=s + 1)'s only one."""
        from specrt.runtime.pipeline import image_seeds

        strategy, sampling = self.prepared(method, kwargs)
        if isinstance(class_ids, (int, np.integer)):
            class_ids = [class_ids]
        ids = np.asarray([validation.integer("class id", c, low=0, high=self.num_classes - 1) for c in class_ids],
                         dtype=np.int64)
        seeds = image_seeds(seed, len(ids))
        if not len(ids):
            raise SpecrtError("generate needs at least one class id")
        self.check_runs(strategy, decode)
        with self._lock:
            stats, tokens, seconds = ContinuousStats(), [], []
            rounds = wants_round(self.loop, self.target, method)
            for first in range(0, len(ids), self.max_images):
                part = slice(first, first + self.max_images)
                start = time.perf_counter()
                if rounds:
                    tokens.append(self._decode_rounds(strategy, ids[part], seeds[part], sampling, stats))
                else:
                    ctx = ContinuousDecoding(self.target, self.draft if strategy.needs_draft else None,
                                             seeds[part], stats=stats, **sampling)
                    tokens.append(strategy.generate(ctx, ids[part]))
                seconds += [time.perf_counter() - start] * len(ids[part])
            tokens = np.concatenate(tokens)
            images = to_pixels(self.decoder(tokens)) if decode else None
        return ContinuousResult(tokens, images, stats, seconds, sampling)

    def prepared(self, method: str, params: dict[str, Any]) -> tuple[ContinuousMethod, dict[str, Any]]:
        """A call's strategy object and sampling, parsed once: `params` mixes the method's parameters
        and sampling keys, as generate's keywords do (SpecrtError on mistakes)."""
        sampling = {**self.sampling_defaults, **{k: v for k, v in params.items() if k in SAMPLING_KEYS}}
        strategy = make_continuous_method(method, **{k: v for k, v in params.items() if k not in SAMPLING_KEYS})
        return strategy, sampling

    def check_runs(self, strategy: ContinuousMethod, decode: bool) -> None:
        """SpecrtError where this pipeline lacks what the call needs: the method's draft, the decoder."""
        model = self.source or "this model"
        if strategy.needs_draft and self.draft is None:
            raise SpecrtError(f"method {strategy.name!r} needs a draft model and {model} has none")
        if decode and self.decoder is None:
            raise SpecrtError(f"{model} has no tokenizer decoder: generate tokens only (decode=False)")

    def hold(self) -> None:
        """Take the runners for a caller that decodes round by round on them (in-flight batching,
        runtime/scheduling/continuous_slots.py), blocking until a running generate call is done;
        generate calls then wait until `let_go`. The runners' caches hold that caller's images."""
        self._lock.acquire()

    def let_go(self) -> None:
        """Give the runners back after `hold` (the next generate call may run)."""
        self._lock.release()

    def sibling(self) -> Optional["ContinuousPipeline"]:
        """The same models on runners of their own (ContinuousRunner.sibling: weights shared, caches
        not), with its own lock and device rounds: an in-flight scheduler decodes another group's
        batch on it (runtime/siblings.py); None where a runner cannot share its model."""
        return twin_pipeline(self, "_lock")

    def device_round(self, strategy: ContinuousMethod, sampling: dict[str, Any], images: int) -> Any:
        """The device round (round_loop.py) a call of `images` images decodes with, kept for later
        calls of its shape, or None where the call runs the host loop (by `loop`, wants_round).
        In-flight slots (runtime/scheduling/continuous_round_slots.py) take the same round a call of
        as many images runs, its buffers and captured graph included."""
        if not wants_round(self.loop, self.target, strategy.name):
            return None
        return self._round(strategy, sampling, images)

    def _round(self, strategy: ContinuousMethod, sampling: dict[str, Any], images: int) -> Any:
        draft = self.draft if strategy.needs_draft else None
        blank = np.zeros(images, dtype=np.int64)  # class ids only size the round; each call starts its own
        return kept_round(self._rounds, round_key(strategy, images, sampling),
                          lambda: plan_round(strategy, self.target, draft, sampling, blank), self.keep_rounds)

    def _decode_rounds(self, strategy: Any, ids: np.ndarray, seeds: list[int], sampling: dict[str, Any],
                       stats: ContinuousStats) -> np.ndarray:
        """One pass of device rounds (round_loop.py), the round kept for later calls of its shape."""
        round_ = self._round(strategy, sampling, len(ids))
        return decode_rounds(round_, ids, seeds, stats, graphs=self.target.cuda_graphs)
