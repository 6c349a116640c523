"""The interface every model family implements (runtime/family_registry.py registers them).

A family is what a bundle's manifest names: how its manifest is checked (`parse`, once per
bundle: every other method takes what it returns), how its graphs are opened into a pipeline on
a backend, which methods it offers, what a generate call is conditioned on and gives back (VQ
codes or continuous latents), and how `specrt inspect` describes it. The pipelines share one
calling convention — `generate(class_ids, method=..., seed=..., decode=..., **sampling_and_params)`
returning a result with `tokens`, `images` (None when not decoded) and `stats` — so serving, the
C API and the CLI need nothing family-specific beyond what this interface says.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Iterable, Optional

from specrt.errors import SpecrtError


TORCH_OPTIONS = ("device", "loop", "compile", "max_window")


class Family(ABC):
    """One model family's plug-in."""

    name: ClassVar[str]                  # the manifest's "family"
    methods: ClassVar[tuple[str, ...]]   # what generate(method=...) accepts
    # methods of other families this one cannot run, with the one line that says why
    refused_methods: ClassVar[dict[str, str]] = {}
    token_dtype: ClassVar[str]           # "int64" (VQ codes) or "float32" (continuous latents)
    backends: ClassVar[tuple[str, ...]]  # what open(backend=...) accepts
    description: ClassVar[str]           # how messages name the family's models ("a ... model")
    sampling_keys: ClassVar[tuple[str, ...]]  # the sampling keys generate takes (CLI flags beyond them are refused)
    # "module:function" running `specrt bench` for this family (its own settings and fidelity
    # judge), called with the command's options as keywords; None: the LlamaGen bench
    bench_runner: ClassVar[Optional[str]] = None
    takes_prompts: ClassVar[bool] = False  # generate is conditioned on text prompts (else class ids)
    # its CFG row is a prompt too: generate takes negative_prompt / prompt_suffix (--negative-prompt,
    # --no-prompt-suffix); elsewhere the unconditional row is a learned embedding and they are refused
    negative_prompts: ClassVar[bool] = False
    # what its PyTorch pipeline (an embedded demo's, checkpoints') takes from `specrt generate`, of
    # TORCH_OPTIONS: the torch device (--device), the loop choice (--loop: the device round where a
    # method has one), a compiled step (--compile/--no-compile) and the largest window (--max-window);
    # the CLI refuses the flags of the others in one line, and all of them for a BUNDLE as LlamaGen's
    torch_options: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def parse(self, raw: dict[str, Any], root: Path) -> Any:
        """The bundle's manifest (its parsed JSON `raw`, the bundle folder `root`) checked as this
        family reads it, one line if it is not: what open, describe and the questions below take.
        It carries `raw` and `root` (runtime/family_registry.read_bundle finds the family again from it)."""

    @abstractmethod
    def open(self, manifest: Any, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
        """The family's pipeline over the bundle whose checked manifest (parse) is `manifest`."""

    @abstractmethod
    def describe(self, manifest: Any) -> str:
        """The manifest as a human reads it, after the family's own checks of the bundle (inspect)."""

    def method_classes(self) -> dict[str, Any]:
        """The strategy class of each of `methods`, by name: what `--method auto` reads to know
        which settings to measure (runtime/choosing: each class's lossless and auto_settings)."""
        from specrt.runtime.methods import METHODS

        return {name: METHODS[name] for name in self.methods if name in METHODS}

    def takes_modules(self, target: Any) -> bool:
        """True when PyTorch modules with this target are this family's to run through its own
        pipeline (from_torch), not the LlamaGen layout's Pipeline.from_torch."""
        return False

    def from_torch(self, target: Any, draft: Any, vq: Any, **options: Any) -> Any:
        """The family's pipeline over PyTorch modules it takes (takes_modules); `options` as
        Pipeline.from_torch's."""
        raise NotImplementedError(f"family {self.name!r} has no pipeline over PyTorch modules")

    def conditions(self, pipeline: Any) -> str:
        """What generate is conditioned on: "class ids" or "prompts" (serving and the C API ask)."""
        return "class ids"

    def has_decoder(self, pipeline: Any) -> bool:
        """True when generate(decode=True) gives images (else tokens only)."""
        return True

    def summary(self, result: Any) -> dict[str, Any]:
        """A generate result's numbers as `specrt generate --stats` writes them (JSON-ready; at
        least tokens and method-specific counters)."""
        return result.stats.summary()

    def image_size(self, pipeline: Any, manifest: Any) -> Optional[tuple[int, int]]:
        """(height, width) in pixels of one decoded image, None when the pipeline has no decoder
        (tokens only). `manifest` is the bundle's checked manifest (parse); the C API asks this
        once, when it opens a bundle, so a caller can size its pixel buffer."""
        return tuple(pipeline.image_size) if self.has_decoder(pipeline) else None

    def call_stats(self, result: Any) -> dict[str, float]:
        """A generate result's numbers under the names every family shares (runtime/stats.py's
        Stats.as_dict: tokens, target_forwards, draft_forwards, mean_accepted_length, seconds_total,
        seconds_target, seconds_draft, seconds_verify, seconds_cache, seconds_decode). A number the
        family does not measure is left out: the C API reports it as 0 (seconds_total as the call's
        wall time)."""
        return result.stats.as_dict()

    # ---- what serving asks (runtime/serving: `specrt serve`, `specrt triton-repo`) ----------------

    pipeline_class: ClassVar[str]        # "module:Class" of open()'s pipeline: family_registry.pipeline_family finds
    #                                      the family of a pipeline built elsewhere (an embedded demo) by it

    def token_shape(self, pipeline: Any) -> tuple[int, ...]:
        """One image's tokens as served: positions in raster order, then a continuous token's
        channels ((grid*grid,) VQ codes; (seq_len, C) latents). Triton declares (-1, *channels)."""
        raise NotImplementedError(f"family {self.name!r} does not say its served token shape")

    def manifest_token_shape(self, manifest: Any) -> tuple[int, ...]:
        """token_shape from the bundle's checked manifest alone (triton-repo writes config.pbtxt
        without opening a graph); SpecrtError in one line when the manifest does not say it."""
        raise NotImplementedError(f"family {self.name!r} does not say its served token shape")

    def check_request(self, pipeline: Any, method: str, params: dict[str, Any], class_id: Optional[int] = None,
                      prompt: Optional[str] = None) -> None:
        """SpecrtError for what generate would refuse in one served row (its class id or prompt,
        method, method parameters and sampling keys in `params`), found without generating, so
        a bad row fails alone and never the call of the rows batched with it. The row carries
        the condition conditions(pipeline) names (the handler refuses the other kind first)."""
        raise NotImplementedError(f"family {self.name!r} cannot check a served request")

    def check_submitted(self, pipeline: Any, method: str, params: dict[str, Any], class_id: Optional[int] = None,
                        prompt: Optional[str] = None, prompt_options: Iterable[str] = ()) -> None:
        """SpecrtError for a request served or submitted to the scheduler, before it can share a
        batch: its condition is the kind conditions(pipeline) names, prompt options (negative_prompt,
        prompt_suffix: `prompt_options` names those given) only where the unconditional row is a
        prompt, then check_request. Serving's handler and the scheduler both ask this, so a request
        is refused with the same line either way."""
        if self.conditions(pipeline) == "class ids":
            if class_id is None:
                raise SpecrtError("this model is class-conditional: give class_id, not prompt")
        elif prompt is None:
            raise SpecrtError("this model is conditioned on prompts: give prompt, not class_id")
        options = list(prompt_options)
        if options and not self.negative_prompts:
            raise SpecrtError(f"{' and '.join(options)} apply to models whose unconditional row is a prompt "
                              f"(Janus, Emu3, Lumina-mGPT), not to a {self.description} model")
        self.check_request(pipeline, method, params, class_id=class_id, prompt=prompt)

    def serving_stats(self, result: Any) -> dict[str, Any]:
        """A generate result's numbers for a served row's `stats`: accepted_length (tokens per
        target forward), target_forwards (summed over the call's images), target_passes (target
        graph runs), generate_seconds when measured, and what else the family counts."""
        raise NotImplementedError(f"family {self.name!r} does not report serving stats")
