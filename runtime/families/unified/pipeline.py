"""The unified-vocabulary family's pipeline: the discrete Pipeline with token prompts and a grammar.

Why a subclass and not a new stack: the speculative loop does not change at all. The target's and
draft's logits already carry the image grammar (forced row ends are point masses, runtime/grammar.py),
so every method, runner, verification formula and backend of the discrete family runs these models
as they are. What differs is only at the edges: a prompt becomes token ids through the model's own
recipe (prompts.PromptEncoder), and the decoded stream becomes a grid by dropping the structural
tokens (ImageGrammar.grid).

    pipe = Pipeline.from_bundle("janus-bundle/")                       # -> UnifiedPipeline
    result = pipe.generate(prompts=["a red apple"], method="sjd-pac", seed=0)
    result.tokens  # int64 [N, rows, cols] VQ codes;  result.stream: [N, stream_len] with row ends
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from specrt import validation
from specrt.errors import SpecrtError
from specrt.manifest import Manifest, as_manifest
from specrt.models.step_kernels import DEFAULT_STEP_ATTENTION
from specrt.runtime.backends.bundle_backends import bundle_parts
from specrt.runtime.conditions import Conditions
from specrt.runtime.families.unified.bundle import grammar_of, prompt_recipe_of
from specrt.runtime.families.unified.prompts import PromptEncoder
from specrt.runtime.grammar import ImageGrammar, head_neighbours
from specrt.runtime.methods import DEFAULT_MAX_WINDOW, Method, checked_max_window
from specrt.runtime.pipeline import GenerationResult, Pipeline, image_seeds
from specrt.runtime.token_embeddings import embedding_table_of

BACKENDS = ("ort", "ort-cpu", "ort-cuda", "ort-trt")  # TensorRT engines ('trt') are not wired for these bundles


class UnifiedPipeline(Pipeline):
    """Target (+ draft) of a unified-vocabulary model, its VQ decoder, prompt recipe and grammar."""

    def __init__(self, target: Any, vq: Any, grammar: ImageGrammar, prompts: PromptEncoder,
                 draft: Any = None, neighbours: Optional[np.ndarray] = None,
                 sampling_defaults: Optional[dict] = None, max_images: Optional[int] = None,
                 token_embeddings: Optional[np.ndarray] = None, **_: Any):
        super().__init__(target, vq, draft, neighbours=neighbours, sampling_defaults=sampling_defaults,
                         max_images=max_images, token_embeddings=token_embeddings)
        self.grammar, self.prompts = grammar, prompts
        if target.spec.num_image_tokens != grammar.stream_len:
            raise SpecrtError(f"the target decodes {target.spec.num_image_tokens} tokens per image but the grammar's "
                              f"stream is {grammar.stream_len}")

    # ---- constructors ------------------------------------------------------------------------

    @classmethod
    def open_bundle(cls, bundle: str | Path | Manifest, backend: str = "ort",
                    providers: Optional[Sequence[Any]] = None, threads: Optional[int] = None,
                    precision: Optional[str] = None) -> "UnifiedPipeline":
        """A unified bundle (its checked manifest, or its directory) on onnxruntime ('ort', or
        'ort-cpu' / 'ort-cuda' / 'ort-trt' with the bundle's provider options); its manifest is
        checked first (runtime/bundle_check.py), one line if not."""
        manifest = as_manifest(bundle)
        parts = bundle_parts(manifest, backend, providers, threads, precision, backends=BACKENDS)
        parts.pop("text_encoder", None)
        grammar = grammar_of(manifest.models["target"])
        target = manifest.models["target"]
        encoder = PromptEncoder.from_files(prompt_recipe_of(manifest.raw), int(target["cond_len"]), manifest.root,
                                           target.get("text_vocab_size"))
        return cls(grammar=grammar, prompts=encoder, **parts)

    @classmethod
    def from_torch(cls, target: Any, draft: Any = None, vq: Any = None, prompts: Optional[PromptEncoder] = None,
                   neighbours: Optional[np.ndarray] = None, max_window: int = DEFAULT_MAX_WINDOW,
                   device: Optional[str] = None, sampling_defaults: Optional[dict] = None,
                   cuda_graphs: Optional[bool] = None, max_images: int = 32, compile: Optional[bool] = None,
                   compile_mode: str = "default", step_matmuls: Optional[str] = None,
                   step_attention: str = DEFAULT_STEP_ATTENTION, **_: Any) -> "UnifiedPipeline":
        """specrt.export.unified.UnifiedLM modules (target, optional draft of the same vocabulary and
        grammar) and a VQ decoder module (decode_codes); the PyTorch backend runs them as the graphs."""
        from specrt.runtime.backends.torch_backend import TorchRunner, TorchVQ

        grammar = target.config.grammar
        if draft is not None and (draft.config.grammar != grammar or draft.config.cond_len != target.config.cond_len):
            raise SpecrtError("the draft's image grammar or prompt length differs from the target's")
        max_window = checked_max_window(validation.count("max_window", max_window), grammar.stream_len, "max_window")
        step = (cuda_graphs, compile, compile_mode, step_matmuls, step_attention)
        runner = TorchRunner(target, max_window, device, *step)
        draft_runner = TorchRunner(draft, max_window, device, *step) if draft is not None else None
        if neighbours is None and vq is not None:
            codes = TorchVQ.neighbours_of(vq)
            neighbours = None if codes is None else head_neighbours(codes, grammar)
        if prompts is not None and prompts.vocab_size is None:
            prompts.vocab_size = getattr(target.config, "text_vocab_size", None)
        if prompts is None:  # token ids only; Janus's unconditional rule needs nothing but its pad id
            config = target.config
            rule = {"kind": "pad", "keep_first": 1, "keep_last": 1} if config.architecture == "janus" else \
                {"kind": "ids", "ids": []}
            prompts = PromptEncoder({"uncond": rule, "pad_id": getattr(config, "pad_id", None) or 0}, config.cond_len,
                                    vocab_size=getattr(config, "text_vocab_size", None))
        return cls(runner, TorchVQ(vq, device) if vq is not None else None, grammar, prompts, draft=draft_runner,
                   neighbours=neighbours, sampling_defaults=sampling_defaults or {}, max_images=max_images,
                   token_embeddings=embedding_table_of(target))

    # ---- generation ----------------------------------------------------------------------------

    @property
    def image_size(self) -> tuple[int, int]:
        down = self.vq.downsample
        return self.grammar.rows * down, self.grammar.cols * down

    def conditions(self, class_ids: Any = None, prompts: Sequence[str] | str | None = None, captions: Any = None,
                   prompt_ids: Any = None, negative_prompt: Optional[str] = None,
                   prompt_suffix: bool = True) -> Conditions:
        """Token prompts: text through the model's recipe, or ready ids of its vocabulary (the recipe's
        unconditional rule still applies to them), or ready Conditions. `negative_prompt` and
        `prompt_suffix` as in generate."""
        if class_ids is not None or captions is not None:
            raise SpecrtError("this model is conditioned on text prompts: give prompts (or prompt_ids), not "
                              + ("class ids" if class_ids is not None else "caption embeddings"))
        if isinstance(prompts, Conditions):
            if negative_prompt is not None or not validation.flag("prompt_suffix", prompt_suffix):
                raise SpecrtError("negative_prompt and prompt_suffix shape prompts from text; ready Conditions are "
                                  "used as given")
            return prompts
        return self.prompts.encode(prompts, prompt_ids, negative_prompt=negative_prompt, prompt_suffix=prompt_suffix)

    def generate(self, class_ids: Any = None, method: str | Method = "ar", seed: int | Sequence[int] = 0,
                 decode: bool = True, *, prompts: Sequence[str] | str | None = None, captions: Any = None,
                 prompt_ids: Any = None, negative_prompt: Optional[str] = None, prompt_suffix: bool = True,
                 **params: Any) -> GenerationResult:
        """Images for `prompts` (or `prompt_ids`) with a decoding method; as Pipeline.generate. The
        result's `tokens` are the VQ grids, `stream` the decoded tokens with the row ends in place.

        Classifier-free guidance pushes each image away from its unconditional row, which the
        model's recipe builds (Emu3: its negative prompt; Janus: the prompt padded out;
        Lumina-mGPT: the image-start tokens alone). `negative_prompt` replaces that row by a text
        of the caller's (through the model's template; "" is the row without words), so guidance
        also steers away from what it says. `prompt_suffix=False` drops the fixed words the
        recipe appends to every prompt (Emu3's " masterpiece, film grained, best quality."); a
        recipe without them refuses it."""
        decode = validation.flag("decode", decode)
        if decode and self.vq is None:
            raise SpecrtError("this bundle has no image decoder (exported without the model's VQ): generate tokens only "
                              "(--tokens-only, decode=False), or re-export with --vq DIR")
        with self._generate_lock:
            conditions = self.conditions(class_ids, prompts, captions, prompt_ids, negative_prompt, prompt_suffix)
            return self._generate(conditions, method, image_seeds(seed, len(conditions)), decode, **params)

