"""Calibration feeds recorded from the runtime on a bundle's own generations.

Activation ranges (INT8, FP8) are only as good as the inputs they were measured on, and a
step graph's inputs are far from random: token ids the model itself sampled, positions and
window masks of real decoding steps, and a KV cache filled by real prefixes. So the feeds
are recorded here while the bundle generates images on onnxruntime with the methods it will
run (AR steps of one token, SD's target windows of draft_len + 1 and its draft steps), and a
fixed number per graph is kept by reservoir sampling: spread over whole generations, with
memory bounded by the calibration-set size (a GPT-B step feed carries a ~47 MB KV cache).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from specrt.manifest import Manifest
from specrt.runtime.kv_inputs import past_feeds, stacked_feed
from specrt.runtime.backends.ort_backend import OrtRunner, bundle_companions
from specrt.runtime.conditions import Conditions
from specrt.runtime.runner import StepOutput

Feeds = dict[str, np.ndarray]
Progress = Callable[[str], None]


class Reservoir:
    """A uniform sample of at most `size` items from a stream; an item is built only when kept."""

    def __init__(self, size: int, seed: int):
        self.size, self.seen, self.items = size, 0, []
        self._rng = np.random.default_rng(seed)

    def offer(self, make: Callable[[], Feeds]) -> None:
        self.seen += 1
        if len(self.items) < self.size:
            self.items.append(make())
            return
        slot = int(self._rng.integers(self.seen))
        if slot < self.size:
            self.items[slot] = make()


class RecordingRunner(OrtRunner):
    """An OrtRunner that offers a copy of every prefill and step feed to its graphs' reservoirs."""

    def __init__(self, manifest: Manifest, role: str, reservoirs: dict[str, Reservoir], threads: Optional[int]):
        super().__init__(manifest, role, None, threads)
        self.reservoirs = reservoirs

    def _prefill(self, rows: Conditions, uniforms: np.ndarray) -> StepOutput:
        self.reservoirs[self.prefill_spec.name].offer(lambda: {
            name: np.array(value) for name, value in self.prefill_feeds(rows, uniforms).items()})
        return super()._prefill(rows, uniforms)

    def _step(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, uniforms: np.ndarray):
        self.reservoirs[self.step_spec.name].offer(lambda: {
            "input_ids": ids.copy(), "positions": positions.copy(), "attention_mask": mask.copy(),
            **past_feeds(self.step_spec, self._kv.copy()), "mix": self.mix.copy(), "uniforms": uniforms.copy()})
        return super()._step(ids, positions, mask, uniforms)

    def can_chain(self, steps: int) -> bool:
        return False  # every draft step runs (and is recorded) on its own: chain feeds are made from them

    def can_draft_tree(self, layout: Any) -> bool:
        return False  # likewise every tree level: tree feeds are made from them

    def can_grow_tree(self, layout: Any) -> bool:
        return False  # and every dynamic tree pass: growth feeds are made from them


def chain_feeds(step_feeds: list[Feeds], steps: Optional[int],
                inputs: Optional[Sequence[str]] = None) -> list[Feeds]:
    """Feeds for a draft chain (or tree: `steps` its drafts; a growth graph: None, it draws
    nothing) graph from its draft's recorded step feeds: the same window, cache and guidance,
    drafting after each image's last window slot (the later passes see the activations of the
    drafts the graph makes itself).

    `inputs` (the graph's input names) drops every recorded entry the graph does not take:
    onnxruntime refuses a feed with a name the graph lacks, and a growth graph has no
    `uniforms` although the step feeds it is made from do."""
    feeds = []
    for feed in step_feeds:
        images, window = feed["mix"].shape[0], feed["input_ids"].shape[1]
        made = {**feed, "past_kv": stacked_feed(feed), "last": np.full(images, window - 1, dtype=np.int32)}
        if steps is not None:
            made["uniforms"] = np.full((images, steps), 0.5, dtype=np.float32)
        else:
            made.pop("uniforms", None)
        if inputs is not None:
            made = {name: value for name, value in made.items() if name in inputs}
        feeds.append(made)
    return feeds


def record_feeds(manifest: Manifest, size: int, images: int, seed: int = 0, threads: Optional[int] = None,
                 progress: Optional[Progress] = None) -> dict[str, list[Feeds]]:
    """Up to `size` feeds per prefill/step graph of the bundle's target and draft, from `images`
    generations: odd images decode with AR (one-token target steps), even ones with SD when
    the bundle has a draft (target windows of 5, draft steps of 1), with the bundle's sampling
    defaults and the classes taken in turn; a draft chain graph's from its draft's step feeds."""
    from specrt.runtime.pipeline import Pipeline
    from specrt.runtime.vq_decoder import VQDecoder

    class NoImages(VQDecoder):  # calibration needs the tokens' feeds, not pictures
        def decode(self, codes: np.ndarray) -> np.ndarray:
            return np.zeros((len(codes), 3, 1, 1), dtype=np.float32)

    roles = [role for role in ("target", "draft") if f"{role}_step" in manifest.graphs]
    reservoirs = {f"{role}_{kind}": Reservoir(size, seed + i)
                  for i, (role, kind) in enumerate((r, k) for r in roles for k in ("prefill", "step"))}
    runners = {role: RecordingRunner(manifest, role, reservoirs, threads) for role in roles}
    companions = bundle_companions(manifest)
    pipe = Pipeline(runners["target"], NoImages(), runners.get("draft"), neighbours=companions["neighbours"],
                    sampling_defaults=companions["sampling_defaults"])
    classes = int(manifest.models["target"]["num_classes"])
    for i in range(images):
        method = "sd" if i % 2 == 0 and pipe.draft is not None else "ar"
        pipe.generate([i % classes], method=method, seed=seed + i)
        if progress:
            progress(f"calibration: image {i + 1}/{images} ({method})")
    feeds = {name: reservoir.items for name, reservoir in reservoirs.items()}
    for role in roles:
        for kind in ("chain", "tree", "growth"):  # a chain's or tree's: one uniform per draft; a growth's: none
            graph = manifest.graphs.get(f"{role}_{kind}")
            if graph is not None:
                drafts = int(graph.input("uniforms").shape[1]) if "uniforms" in graph.input_names else None
                feeds[graph.name] = chain_feeds(feeds[f"{role}_step"], drafts, graph.input_names)
    return feeds
