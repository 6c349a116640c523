"""The user-facing API: a Pipeline holds the runners and VQ decoder; generate() runs one method.

    pipe = Pipeline.from_bundle("bundle/")                 # onnxruntime over the bundle's graphs
    pipe = Pipeline.from_torch(target_gpt, draft_gpt, vq)  # PyTorch modules (CPU or CUDA)
    result = pipe.generate([207, 360], method="cool-sd", seed=0, relaxation_budget=2.0)
    result.images  # uint8 [N, H, W, 3]; result.tokens [N, grid, grid]; result.stats.summary()
    pipe.generate(prompts=["a thick seven"])               # t2i: through the pipeline's text encoder
    pipe.generate(captions=(embeddings, mask))             # t2i: precomputed caption embeddings
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from specrt import validation
from specrt.errors import SpecrtError
from specrt.manifest import DEFAULT_MAX_IMAGES
from specrt.runtime.compatibility import check_compatible
from specrt.runtime.defaults import as_dict, defaults_of
from specrt.runtime.conditions import Conditions
from specrt.runtime.family_registry import modules_family, open_bundle
from specrt.runtime.decoding import Decoding
from specrt.runtime.methods import DEFAULT_MAX_WINDOW, Method, checked_max_window, make_method
from specrt.runtime.methods.grouped import GroupedDecoding
from specrt.runtime.methods.speculative import Lantern
from specrt.models.step_kernels import DEFAULT_STEP_ATTENTION
from specrt.runtime.rounds import KEPT_ROUNDS, LOOPS
from specrt.runtime.runner import ModelRunner
from specrt.runtime.sampling import SamplingParams, guidance_mix
from specrt.runtime.siblings import twin_pipeline
from specrt.runtime.stats import Stats
from specrt.runtime.threads import set_torch_threads
from specrt.runtime.token_embeddings import TokenEmbeddings, embedding_table_of
from specrt.runtime.vq_decoder import VQDecoder

SAMPLING_KEYS = ("cfg_scale", "temperature", "top_k", "top_p")


@dataclass
class GenerationResult:
    tokens: np.ndarray  # int64 [N, grid, grid]
    images: Optional[np.ndarray]  # uint8 [N, H, W, 3]; None with generate(..., decode=False)
    stats: Stats
    sampling: Optional[SamplingParams] = None  # the distribution sampled: defaults + explicit keys
    stream: Optional[np.ndarray] = None  # unified-vocabulary models: int64 [N, stream_len], row ends included


def to_uint8(images: np.ndarray) -> np.ndarray:
    """[N, 3, H, W] in about [−1, 1] -> uint8 [N, H, W, 3] with x·127.5 + 128, clamped (LlamaGen)."""
    return np.clip(np.asarray(images, dtype=np.float32) * 127.5 + 128.0, 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)


def from_uint8(pixels: np.ndarray) -> np.ndarray:
    """uint8 [N, H, W, 3] -> float32 [N, 3, H, W] in about [−1, 1]: to_uint8's inverse (up to
    rounding), so evaluators judge exactly the pixels a user gets."""
    return ((np.asarray(pixels, dtype=np.float32) - 128.0) / 127.5).transpose(0, 3, 1, 2)


class Pipeline:
    """Target (+ optional draft) runners, a VQ decoder and the sampling defaults of a model family."""

    grammar: Any = None  # a unified model's image grammar (runtime/grammar.py): streams are read back through it

    def __init__(self, target: ModelRunner, vq: VQDecoder, draft: Optional[ModelRunner] = None,
                 neighbours: Optional[np.ndarray] = None, sampling_defaults: Optional[dict] = None,
                 max_images: Optional[int] = None, text_encoder: Any = None,
                 token_embeddings: Optional[np.ndarray] = None):
        self.target, self.draft, self.vq = target, draft, vq
        self.text_encoder = text_encoder  # t2i: a runtime.text.TextEncoder for `prompts`
        self.neighbours = neighbours
        # GSD's clusters: the target's token embeddings [V, D] (None: a bundle exported before them)
        self.token_embeddings = None if token_embeddings is None else TokenEmbeddings(np.asarray(token_embeddings))
        self.sampling_defaults = dict(sampling_defaults or {})
        # images decoded together in one pass (a bundle's `export --max-batch`); more run in several passes
        self.max_images = max_images or DEFAULT_MAX_IMAGES
        # generate() runs on the runners' preallocated buffers (KV cache, step I/O), so two calls
        # at once would overwrite each other's state: calls from several threads take turns, and
        # each caller gets exactly the result it would get alone. Run several Pipelines (or
        # processes) for parallel generation.
        self._generate_lock = threading.Lock()  # hold() / let_go() for callers decoding round by round
        # which loop decodes (runtime/rounds.LOOPS): "auto" runs the device round on a GPU PyTorch
        # backend where the method has one, "round" wherever it has one, "host" the host loop
        self.loop = "auto"
        # device rounds of recent calls, with their buffers and captured graphs, by what shapes them;
        # the most recent keep_rounds stay (runtime/rounds kept_round: a bench of more settings raises it)
        self._rounds: dict[tuple, Any] = {}
        self.keep_rounds = KEPT_ROUNDS

    # ---- constructors ------------------------------------------------------------------------

    @classmethod
    def from_bundle(cls, bundle: Any, backend: str = "ort", providers: Optional[Sequence[Any]] = None,
                    threads: Optional[int] = None, precision: Optional[str] = None) -> Any:
        """Any bundle: its folder, or its manifest read before (runtime/family_registry.read_bundle). The
        manifest is read once and checked, and the family it names (runtime/families: LlamaGen-layout
        VQ models, unified-vocabulary LLMs, continuous MAR-style models) opens it on `backend`: one
        of runtime/backends/bundle_backends.BUNDLE_BACKENDS for a discrete family. A LlamaGen bundle
        gives this class; another family gives its own pipeline, with the same
        generate(class_ids, method=..., seed=...) call.

        `threads`: intra-op threads per onnxruntime session (specrt.runtime.threads; None:
        onnxruntime's default, one per core); `precision` picks the engines ('trt') or TensorRT EP
        precision ('ort-trt'); `providers` replaces the backend's onnxruntime providers."""
        options = {"providers": providers, "precision": precision}
        return open_bundle(bundle, backend=backend, threads=threads, **options)

    @classmethod
    def from_torch(cls, target_gpt: Any, draft_gpt: Any, vq: Any, neighbours: Optional[np.ndarray] = None,
                   max_window: int = DEFAULT_MAX_WINDOW, device: Optional[str] = None,
                   sampling_defaults: Optional[SamplingParams] = None, cuda_graphs: Optional[bool] = None,
                   threads: Optional[int] = None, text_encoder: Any = None,
                   max_images: int = DEFAULT_MAX_IMAGES, compile: Optional[bool] = None,
                   compile_mode: str = "default", step_matmuls: Optional[str] = None,
                   step_attention: str = DEFAULT_STEP_ATTENTION) -> "Pipeline":
        """PyTorch GPT modules (specrt.models.llamagen_gpt.GPT) and a VQModel or VQDecoder;
        draft may be None, a GPT (an independent draft) or an EAGLE head (specrt.export.eagle,
        e.g. from load_eagle_head or train-draft), which drafts from the target's hidden states. The three must fit together (runtime.compatibility): one line if not.

        Sampling defaults: `sampling_defaults`, else the target's (specrt.runtime.defaults: what
        its loader recorded, else its family's), which `specrt export` writes into a bundle too,
        so this pipeline and the bundle exported from the same modules sample alike.
        `cuda_graphs` (default: on for CUDA) replays each window size's step as a CUDA graph.
        `compile` (default: on for CUDA) runs each step's transformer blocks compiled by
        torch.compile (`compile_mode`: "default" or "max-autotune-no-cudagraphs"); the first
        steps compile, a second shape once more (runtime/backends/compiled_step.py); False keeps
        the eager step, the reference the compiled one is tested against.
        `step_matmuls`: how LlamaGen's blocks run their products (TorchRunner: "fused", the default
        on CUDA, "separate", the default elsewhere, or "skinny" for CUDA with Triton; a
        unified-vocabulary model takes the same choices through UnifiedPipeline.from_torch).
        `step_attention`: "sdpa" (default) or "triton" (TorchRunner).
        `threads`: torch's intra-op threads, as from_bundle's for onnxruntime (torch's setting
        is process-wide; None leaves it as it is, by default one per core).
        `text_encoder` (t2i) turns prompts into caption embeddings (runtime.text).
        `max_images`: images decoded together in one pass (a bundle's `export --max-batch`).
        Modules another family runs (runtime/families.modules_family: a unified-vocabulary model,
        specrt.export.unified.UnifiedLM) give that family's pipeline (UnifiedPipeline: prompts as
        token ids unless a recipe is attached, UnifiedPipeline.from_torch).
        """
        family = modules_family(target_gpt)
        if family is not None:
            if threads is not None:
                set_torch_threads(validation.count("threads", threads))
            return family.from_torch(target_gpt, draft_gpt, vq, neighbours=neighbours, max_window=max_window,
                                     device=device, sampling_defaults=sampling_defaults, cuda_graphs=cuda_graphs,
                                     max_images=max_images, compile=compile, compile_mode=compile_mode)
        from specrt.runtime.eagle import EAGLE_KIND
        from specrt.runtime.backends.torch_backend import TorchHeadRunner, TorchRunner, TorchVQ
        max_window = checked_max_window(validation.count("max_window", max_window),
                                        target_gpt.config.num_image_tokens, "max_window")
        if threads is not None:
            set_torch_threads(validation.count("threads", threads))
        eagle = getattr(draft_gpt, "draft_kind", None) == EAGLE_KIND  # an EAGLE head (specrt.export.eagle)
        check_compatible(target_gpt.config, draft_gpt.config if draft_gpt is not None and not eagle else None,
                         vq.config, "Pipeline.from_torch")
        target = TorchRunner(target_gpt, max_window, device, cuda_graphs, compile, compile_mode, step_matmuls,
                             step_attention)
        draft = None
        if eagle:
            draft = TorchHeadRunner(draft_gpt, target.spec, max_window, device)
            target.keep_hidden = True
        elif draft_gpt is not None:
            draft = TorchRunner(draft_gpt, max_window, device, cuda_graphs, compile, compile_mode, step_matmuls,
                                step_attention)
        if neighbours is None:
            neighbours = TorchVQ.neighbours_of(vq)
        defaults = sampling_defaults or defaults_of(target_gpt)
        return cls(target, TorchVQ(vq, device), draft, neighbours=neighbours, sampling_defaults=as_dict(defaults),
                   text_encoder=text_encoder, max_images=validation.count("max_images", max_images),
                   token_embeddings=embedding_table_of(target_gpt))

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) in pixels of one generated image."""
        side = self.target.spec.grid_size * self.vq.downsample
        return side, side

    # ---- generation ----------------------------------------------------------------------------

    def conditions(self, class_ids: Sequence[int] | int | None = None, prompts: Sequence[str] | str | None = None,
                   captions: Any = None) -> Conditions:
        """What to condition on, checked against the model: class ids (c2i); prompts, through the
        text encoder, or caption embeddings (t2i) — [N, L, D], (embeddings, mask) as a T5
        encoder returns them, or ready Conditions."""
        spec = self.target.spec
        given = [name for name, value in (("class ids", class_ids), ("prompts", prompts), ("captions", captions))
                 if value is not None]
        if len(given) != 1:
            want = "class ids" if spec.model_type == "c2i" else "prompts or caption embeddings"
            raise SpecrtError(f"give {want}" + (f", not {' and '.join(given)}" if given else ""))
        if spec.model_type == "c2i":
            if class_ids is None:
                raise SpecrtError(f"this model is class-conditional: give class ids, not {given[0]}")
            return Conditions.of_classes(validation.class_ids(class_ids, spec.num_classes))
        if class_ids is not None:
            raise SpecrtError("this model is text-to-image: give prompts or caption embeddings, not class ids")
        if prompts is not None:
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            if not prompts:
                raise SpecrtError("no prompts given")
            if self.text_encoder is None:
                raise SpecrtError("this pipeline has no text encoder: pass caption embeddings, or a bundle "
                                  "exported with --text-encoder")
            captions = self.text_encoder.encode(prompts)
        if isinstance(captions, Conditions):
            rows = captions
        else:
            embeddings, mask = captions if isinstance(captions, tuple) else (captions, None)
            rows = Conditions.of_captions(embeddings, mask, cond_len=spec.cond_len)
        if rows.captions.shape[1:] != (spec.cond_len, spec.caption_dim):
            raise SpecrtError(f"caption embeddings are {rows.captions.shape[2]}-dimensional; this model takes "
                              f"{spec.caption_dim}-dimensional ones")
        return rows

    def generate(self, class_ids: Sequence[int] | int | None = None, method: str | Method = "ar",
                 seed: int | Sequence[int] = 0, decode: bool = True, *, prompts: Sequence[str] | str | None = None,
                 captions: Any = None, **params: Any) -> GenerationResult:
        """Images for `class_ids` (c2i) or `prompts` / `captions` (t2i, see `conditions`) with a
        decoding method; `params` mix sampling keys (cfg_scale, temperature, top_k, top_p) and
        the method's own parameters. A Method instance may be passed instead of a name (tests
        inject deliberately broken variants).

        All images are decoded together, in one pass (in passes of the bundle's `max_images`
        when there are more). Image i's random numbers are counter uniforms of its seed, `seed + i`
        (or `seed[i]` when a seed per image is given), and of each draw's own coordinates
        (runtime.counter_random), and of nothing else, so it is the same image whether decoded
        alone or in any batch, by the host loop on any backend or by the device round:
        generate([a, b], seed=s)'s second image is generate([b], seed=s + 1)'s only one.
        decode=False skips the VQ decoder (result.images is None): for users with their own
        decoder, or timing token generation alone; the tokens are the same either way.
        Thread-safe: concurrent calls on one Pipeline are serialised (see __init__)."""
        decode = validation.flag("decode", decode)
        with self._generate_lock:
            conditions = self.conditions(class_ids, prompts, captions)
            height, width = self.image_size
            validation.within_memory("images", len(conditions), 8 * self.target.spec.num_image_tokens
                                     + (height * width * 3 if decode else 0), "the images and tokens of one call")
            return self._generate(conditions, method, image_seeds(seed, len(conditions)), decode, **params)

    def prepared(self, method: str | Method, params: dict[str, Any]) -> tuple[Method, SamplingParams]:
        """The strategy object and sampling distribution a generate call with these `params`
        (sampling keys and the method's parameters) decodes with, checked against these models
        (one line if they do not fit). In-flight batching (runtime/scheduling) prepares a
        batch's method once with it, as generate does per call."""
        spec = self.target.spec
        params = dict(params)
        # explicit keys override the defaults one by one; None means "the default" on every path
        explicit = {k: v for k in SAMPLING_KEYS if k in params and (v := params.pop(k)) is not None}
        if "top_k" in explicit:  # a family default may exceed a small vocabulary (for_vocab); a user's value may not
            explicit["top_k"] = validation.integer(f"top_k (0 disables it; this model has {spec.vocab_size} tokens)",
                                                   explicit["top_k"], low=0, high=spec.vocab_size)
        sampling = SamplingParams(**{**self.sampling_defaults, **explicit}).for_vocab(spec.vocab_size)
        if isinstance(method, Method) and params:
            raise SpecrtError(f"parameters {', '.join(params)} go to make_method, not to a Method instance")
        decoder = method if isinstance(method, Method) else make_method(method, **params)
        method = decoder.name
        if decoder.needs_draft and self.draft is None:
            raise SpecrtError(f"method {method!r} needs a draft model and these models have none: re-export the bundle "
                              "with `specrt export --draft DRAFT.pt ...` or quantize the target into one with "
                              "`specrt quantize BUNDLE --out OUT --self-draft int4` (checkpoints: add --draft DRAFT.pt); "
                              "ar, sjd and sjd-pac need no draft")
        if isinstance(decoder, Lantern):
            decoder.neighbours = self.neighbours
        if isinstance(decoder, GroupedDecoding):
            decoder.embeddings = self.token_embeddings
        if decoder.max_window > self.target.max_window:
            raise SpecrtError(f"method {method!r} feeds the target {decoder.max_window} tokens per step "
                              f"(sjd/sjd-pac: window + the pending token; draft methods: draft_len + 1, "
                              f"or a tree's drafts + 1); "
                              f"this model allows at most {self.target.max_window}")
        return decoder, sampling

    def _generate(self, conditions: Conditions, method: str | Method, seeds: list[int], decode: bool,
                  **params: Any) -> GenerationResult:
        spec = self.target.spec
        decoder, sampling = self.prepared(method, params)

        stats = Stats()
        start = time.perf_counter()
        per_pass = self.max_images
        tokens = np.concatenate([self._decode_pass(decoder, sampling, conditions.part(first, first + per_pass),
                                                   seeds[first:first + per_pass], stats)
                                 for first in range(0, len(conditions), per_pass)])
        stream = tokens.reshape(len(conditions), spec.num_image_tokens)
        tokens = self.grids(stream)
        images = None
        if decode:
            with stats.timing("vq_decode"):
                images = to_uint8(self.vq.decode(tokens))
        stats.tokens = int(stream.size)  # decoded tokens (a grammar's row ends included): what passes are counted against
        stats.seconds["total"] = time.perf_counter() - start
        return GenerationResult(tokens, images, stats, sampling, stream if self.grammar is not None else None)

    @property
    def kept_rounds(self) -> list[Any]:
        """The device rounds this pipeline keeps for later calls, the most recent last (each with the
        `state` of its last call): what a profiler runs to count a round's kernels."""
        return list(self._rounds.values())

    def hold(self) -> None:
        """Take the runners for a caller that decodes round by round on them (in-flight batching,
        runtime/scheduling), blocking until a running generate call is done; generate calls then wait
        until `let_go`. The runners' buffers hold that caller's images between its rounds."""
        self._generate_lock.acquire()

    def let_go(self) -> None:
        """Give the runners back after `hold` (the next generate call may run)."""
        self._generate_lock.release()

    def sibling(self) -> Optional["Pipeline"]:
        """The same model on runners of their own (ModelRunner.sibling: sessions and weights shared,
        buffers not), with its own lock and device rounds; None where a runner cannot share its model.
        An in-flight scheduler decodes another group's batch on it while this pipeline's runners hold
        the first group's images (runtime/scheduling). Text encoder, VQ decoder and grammar are shared:
        they keep nothing between calls."""
        return twin_pipeline(self, "_generate_lock")

    def device_round(self, decoder: Method, sampling: SamplingParams, mix: np.ndarray) -> Any:
        """The device round (runtime/rounds) this call decodes with, or None for the host loop: by
        `loop` — "host" never, "auto" on a GPU PyTorch backend, "round" wherever the method has one."""
        loop = validation.choice("loop", self.loop, LOOPS)
        if loop == "host" or not self.target.device_rounds or (loop == "auto" and not self.target.on_accelerator):
            if loop == "round":
                raise SpecrtError("loop 'round' runs on the PyTorch backend only (checkpoints or the demo, "
                                  "--backend torch); bundles on onnxruntime or TensorRT run the host loop")
            return None
        from specrt.runtime.rounds import kept_round, method_key, plan_round

        key = (method_key(decoder), mix.shape, sampling)
        round_ = kept_round(self._rounds, key, lambda: plan_round(decoder, self.target, self.draft if decoder.needs_draft
                                                                 else None, sampling, mix, self.grammar),
                            self.keep_rounds)
        if round_ is None and loop == "round":
            raise SpecrtError(f"method {decoder.name!r} with these parameters has no device round (it has: ar; sd, "
                              "cool-sd, lantern drafting chains or trees with a draft model or an EAGLE head; sjd; "
                              "sjd-pac with spine or full trees that fit the window): use loop 'host' or 'auto'")
        return round_

    def grids(self, stream: np.ndarray) -> np.ndarray:
        """Decoded streams [N, tokens] -> the VQ grids [N, rows, cols] the decoder takes (a grammar's
        structural tokens dropped)."""
        if self.grammar is not None:
            return self.grammar.grid(stream)
        grid = self.target.spec.grid_size
        return stream.reshape(len(stream), grid, grid)

    def _decode_pass(self, decoder: Method, sampling: SamplingParams, conditions: Conditions, seeds: list[int],
                     stats: Stats) -> np.ndarray:
        """One pass of the method over at most max_images images; its counters into `stats`."""
        runners = [r for r in (self.target, self.draft if decoder.needs_draft else None) if r is not None]
        mix = guidance_mix(len(conditions), sampling)
        round_ = self.device_round(decoder, sampling, mix)
        for runner in runners:
            if round_ is None:  # the round's models keep their own buffers (runtime/backends/device_model.py)
                runner.allocate(mix)
            runner.reset_counters()
        ctx = Decoding(self.target, self.draft if decoder.needs_draft else None, sampling, seeds, stats, self.grammar)
        if round_ is not None:
            from specrt.runtime.rounds import decode_rounds

            return decode_rounds(round_, ctx.condition_rows(conditions), seeds, self.target.spec.num_image_tokens, stats,
                                 graphs=self.target.cuda_graphs)
        tokens = decoder.generate(ctx, conditions)
        stats.target_forwards += self.target.image_forwards
        stats.target_calls += self.target.forwards
        stats.seconds["target_forward"] += self.target.forward_seconds
        stats.seconds["cache"] += sum(r.cache_seconds for r in runners)
        if decoder.needs_draft:
            stats.draft_forwards += self.draft.image_forwards
            stats.draft_calls += self.draft.forwards
            stats.seconds["draft_forward"] += self.draft.forward_seconds
        if any(r.meters_host_reads for r in runners):
            stats.host_numbers = (stats.host_numbers or 0) + sum(r.host_numbers for r in runners)
            stats.host_syncs = (stats.host_syncs or 0) + sum(r.host_syncs for r in runners)
        return tokens


def image_seeds(seed: int | Sequence[int], count: int) -> list[int]:
    """Each image's seed: seed + i (mod 2^64, the C API's uint64_t), or one given per image."""
    if isinstance(seed, (str, bytes)) or not hasattr(seed, "__iter__"):
        first = validation.seed(seed)
        return [(first + i) % (validation.SEED_MAX + 1) for i in range(count)]
    seeds = [validation.seed(value, f"seed {i}") for i, value in enumerate(seed)]
    if len(seeds) != count:
        raise SpecrtError(f"{len(seeds)} seeds for {count} images: give one seed, or one per image")
    return seeds
