"""The PyTorch backend: runs specrt.models' GPT.prefill / GPT.step, the sampling head, and VQModel.decode_codes.

torch is imported here only (lazily, through specrt.lazy), so the runtime imports without it.
The KV buffer and the step inputs live on the model's device, allocated once per generate
call; on CPU the numpy step inputs are shared with torch without copies. The sampling head
(runtime/head.py, the module every exported graph ends in) runs on the device too: per step
the host receives the draws [I, W] and reads single probabilities or, at a rejection, one
row through DeviceRows, so O(W + V) numbers cross instead of W·V logits.

On CUDA each window size's step (model + head) is captured as a CUDA graph at its second use and
replayed from then on:
a decode step of a small model is dominated by launching its few hundred kernels, and the
speculative methods repeat the same few window sizes thousands of times per image. The graph
reads the step inputs from the same preallocated device buffers every call, so a replay needs
no new allocation; its outputs are copied into the two alternating output buffers the runner
contract promises (docs/contracts.md "Output validity").
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from specrt.lazy import require
from specrt.models.neighbours import DEFAULT_K, codebook_neighbours, codebook_of, neighbour_count
from specrt.models.step_kernels import DEFAULT_STEP_ATTENTION, step_matmuls_for
from specrt.runtime.backends.device_outputs import DeviceDraws, DeviceRows
from specrt.runtime.conditions import Conditions
from specrt.runtime.eagle import HeadRunner
from specrt.runtime.kv_rows import regroup_kv, uniform_run
from specrt.runtime.runner import GrownTrees, ModelRunner, ModelSpec, StepOutput
from specrt.runtime.vq_decoder import VQDecoder


def _torch():
    return require("torch", "the torch backend")


def prefill_inputs(torch: Any, rows: Conditions, device: Any, dtype: Any) -> tuple:
    """The condition rows as a model's prefill takes them, on its device: prompt ids and their mask
    (a unified model), caption embeddings, mask and CFG flags (t2i), or class ids (c2i)."""
    if rows.is_prompt:
        return (torch.from_numpy(rows.prompt_ids.astype(np.int64)).to(device), torch.from_numpy(rows.caption_mask).to(device))
    if rows.is_caption:
        return (torch.from_numpy(rows.captions).to(device, dtype), torch.from_numpy(rows.caption_mask).to(device),
                torch.from_numpy(rows.uncond).to(device))
    return (torch.from_numpy(rows.class_ids.astype(np.int64)).to(device),)


def model_spec(gpt: Any) -> ModelSpec:
    """The runtime's view of a specrt.models GPT (GPTConfig field names)."""
    cfg = gpt.config
    if hasattr(cfg, "grammar"):  # a unified-vocabulary model (specrt.export.unified.UnifiedLM)
        return ModelSpec(vocab_size=cfg.vocab_size, grid_size=cfg.grammar.rows, cond_len=cfg.cond_len,
                         model_type="prompt", stream_len=cfg.grammar.stream_len)
    if not hasattr(cfg, "num_classes"):  # an EAGLE head: TorchHeadRunner sets the target's spec
        return ModelSpec(vocab_size=cfg.vocab_size, grid_size=cfg.grid_size, cond_len=cfg.cond_len,
                         model_type=cfg.model_type)
    return ModelSpec(vocab_size=cfg.vocab_size, grid_size=cfg.grid_size, num_classes=cfg.num_classes,
                     cond_len=cfg.cond_len, model_type=cfg.model_type,
                     caption_dim=cfg.caption_dim if cfg.model_type == "t2i" else 0)


class TorchRunner(ModelRunner):
    """A ModelRunner over a GPT module (eval mode, inference_mode, its own device and dtype).

    `cuda_graphs` (default: on for CUDA devices) replays one captured graph per window size;
    `compile` (default: on for CUDA devices) runs the step's transformer blocks compiled by
    torch.compile (compiled_step.CompiledStep, `compile_mode` one of its COMPILE_MODES).
    `step_matmuls` (models.step_kernels.STEP_MATMULS) says how the blocks run their products:
    "fused" (the products that read one input as one: models.fused_linears; the default on CUDA),
    "separate" (the default elsewhere), or "skinny" (fused, and a step's few rows through the
    Triton kernel of models.skinny_matmul: for CUDA, with Triton); `step_attention` (STEP_ATTENTION) how they
    attend over the static cache: "sdpa" (default) or "triton" (models.window_attention, for CUDA).

    The KV buffer holds `max_window` scratch columns after the capacity: a step writes its
    window's keys/values there in place (models.kv_cache.StaticCache) and attends over the
    buffer as it lies, so no layer copies its cache; `present` is a view of those columns until
    the next step, and commits copy the accepted ones down as before.
    """

    meters_host_reads = True
    device_rounds = True
    chain_kind = "DraftChain"  # the runtime.chain module `chain` runs

    def __init__(self, gpt: Any, max_window: int = 64, device: Optional[str] = None,
                 cuda_graphs: Optional[bool] = None, compile: Optional[bool] = None, compile_mode: str = "default",
                 step_matmuls: Optional[str] = None, step_attention: str = DEFAULT_STEP_ATTENTION):
        super().__init__(model_spec(gpt), max_window)
        torch = _torch()
        self.torch = torch
        from specrt.models.step_setup import set_step_attention, set_step_matmuls  # need torch, as this runner does
        from specrt.runtime.head import apply_head
        self.gpt = gpt.eval()
        if device is not None:
            self.gpt.to(device)
        self.device = next(self.gpt.parameters()).device
        self.dtype = next(self.gpt.parameters()).dtype
        self.step_matmuls = step_matmuls_for(self.device.type, step_matmuls)
        set_step_matmuls(self.gpt, self.step_matmuls)  # on its device and dtype now, as fusing needs
        set_step_attention(self.gpt, step_attention)
        self.step_attention = step_attention
        cfg = gpt.config
        self._kv_shape = (cfg.n_layer, 2, 0, cfg.n_kv_head, 0, cfg.head_dim)
        self.on_accelerator = self.device.type != "cpu"
        self.keep_rows_on_device = self.on_accelerator  # tests force True to check DeviceRows on CPU
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        if self.cuda_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs needs a CUDA device")
        self.compiled = None  # compiled_step.CompiledStep where the step is compiled
        if self.device.type == "cuda" if compile is None else compile:
            from specrt.runtime.backends.compiled_step import CompiledStep

            self.compiled = CompiledStep(compile_mode)
        self._run_layer = self.compiled.run_layer if self.compiled else None
        self._apply_head = apply_head

    def _unallocated(self) -> None:
        super()._unallocated()
        self._kv = self._present = self._mix = None
        self._graphs: dict[Any, Any] = {}  # window size (or a chain's key) -> CapturedStep
        self._seen_windows: set[Any] = set()  # sizes (keys) stepped once since the buffers were made
        self._chains: dict[Any, Any] = {}  # steps (a tree: its layout key) -> runtime.chain's module over this model
        self._outputs: list[Any] = []  # two probs buffers [I, max_window, V], alternating between steps
        self._parity = 0
        self._staging: dict[str, tuple] = {}  # per use: _staged's page-locked buffer and its last copy's event

    def _allocate_kv(self, batch: int, capacity: int) -> None:
        torch = self.torch
        layers, two, _, heads, _, head_dim = self._kv_shape
        shape = (layers, two, batch, heads, capacity + self.max_window, head_dim)  # + the step's scratch columns
        self._kv_flat = torch.zeros(int(np.prod(shape)), dtype=self.dtype, device=self.device)
        self._kv = self._kv_flat.view(shape)
        self._mix = torch.zeros(self.mix.shape, dtype=torch.float32, device=self.device)  # filled by allocate()
        self._uniforms_dev = torch.zeros(self._uniforms.shape, dtype=torch.float32, device=self.device)
        if self.device.type != "cpu":  # device-side twins of the host step inputs
            self._ids_dev = torch.zeros(self._ids.shape, dtype=torch.int32, device=self.device)
            self._pos_dev = torch.zeros(self._positions.shape, dtype=torch.int32, device=self.device)
            self._mask_dev = torch.zeros(self._mask.shape, dtype=torch.bool, device=self.device)
            self._last_dev = torch.zeros(self._last.shape, dtype=torch.int32, device=self.device)
        self._graphs.clear()  # captured against the buffers just replaced
        self._seen_windows.clear()
        if self.cuda_graphs:
            shape = (self.mix.shape[0], self.max_window, self.spec.vocab_size)
            self._outputs = [torch.zeros(shape, dtype=torch.float32, device=self.device) for _ in range(2)]

    def allocate(self, mix: np.ndarray, capacity: Optional[int] = None) -> None:
        """The base allocation, then the guidance matrix to the device once per generate call
        (it is constant for the call: copying it every step cost a host-to-device copy per step)."""
        super().allocate(mix, capacity)
        self._mix.copy_(self.torch.from_numpy(self.mix))

    @property
    def kv_buffer(self) -> Any:
        return self._kv_flat

    @property
    def retain_share(self) -> float:  # type: ignore[override]
        """Replayed CUDA graphs are re-captured after a shrink: finished images wait for a quarter of the batch."""
        return 0.25 if self.cuda_graphs else 0.0

    def _retain(self, rows: np.ndarray) -> None:
        """The kept rows move to the front of the same buffer; graphs captured for the old batch go."""
        with self.torch.inference_mode():
            self._kv = regroup_kv(self._kv_flat, self._kv, self.torch.from_numpy(rows).to(self.device),
                                  self.columns_in_use())
        self._mix = self.torch.from_numpy(self.mix).to(self.device)  # a normal tensor: allocate() copies into it
        self._graphs.clear()
        self._seen_windows.clear()

    def _host_buffer(self, count: int, dtype: Any) -> np.ndarray:
        """Step inputs in page-locked memory on CUDA, so their copies to the device are
        asynchronous (a pageable copy stages the data and waits, once per input per step)."""
        if self.device.type != "cuda":
            return super()._host_buffer(count, dtype)
        torch_dtype = self.torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
        return self.torch.zeros(count, dtype=torch_dtype, pin_memory=True).numpy()  # the array keeps the tensor

    def send_to_device(self, host: np.ndarray, use: str = "verification") -> Any:
        """What verification sends for a round (DeviceRows.send: tokens and uniforms, host rows to
        stack with device ones) on the device without waiting (_staged)."""
        return self._staged(host, use)

    def _staged(self, host: np.ndarray, use: str) -> Any:
        """A small host array (indices, uniforms) on the device, flat, without waiting: on CUDA
        copied into a page-locked buffer kept for `use` and queued on the stream, which the kernels
        that read it follow; a pageable copy would stage the data and wait. Before the buffer is
        rewritten, its last copy's event is waited for: by then a read back has almost always
        waited for the stream already (every round reads draws or outcomes between two commits
        or two verifications), and back-to-back copies (a batch-1 adopt's runs) stay correct. On
        the CPU the array itself."""
        flat = np.ascontiguousarray(host).reshape(-1)
        if self.device.type == "cpu":
            return self.torch.from_numpy(flat)
        buffer, copied = self._staging.get(use, (None, None))
        if copied is not None:
            copied.synchronize()
        if buffer is None or buffer.dtype != flat.dtype or buffer.size < flat.size:
            buffer = self._host_buffer(max(flat.size, 4096), flat.dtype)
        staged = buffer[: flat.size]
        staged[...] = flat
        sent = self.torch.from_numpy(staged).to(self.device, non_blocking=True)
        copied = self.torch.cuda.Event()
        copied.record(self.torch.cuda.current_stream(self.device))
        self._staging[use] = buffer, copied
        return sent

    def _to_device(self, host: np.ndarray, flat_dev: Any) -> Any:
        """A device tensor with host's shape, backed by the preallocated flat device buffer.

        From page-locked step inputs (_host_buffer) the copy is queued without waiting: the
        step's kernels follow it on the same stream, and the host writes the next step's inputs
        only after this step's draws are read back, which waits for the stream."""
        tensor = self.torch.from_numpy(host)
        if self.device.type == "cpu":
            return tensor
        view = flat_dev[: host.size].view(host.shape)
        view.copy_(tensor, non_blocking=tensor.is_pinned())
        return view

    def _head(self, logits: Any, uniforms: np.ndarray) -> StepOutput:
        probs, draws = self._apply_head(logits, self._mix, self._to_device(uniforms, self._uniforms_dev))
        return self._handoff(probs, draws)

    def _handoff(self, probs: Any, draws: Any) -> StepOutput:
        """The head's outputs to the caller: the draws (W numbers) to the host, the rows kept on
        the device (DeviceRows) or copied whole where the device is the host. A tree drafter
        that reads every row it asked for (`rows_to_host`) gets rows and draws in one read back,
        where reading its rows afterwards would wait for the device a second time."""
        if self.keep_rows_on_device and self.rows_to_host and probs.shape[-1] < 2 ** 24:
            # token ids below 2^24 are exact in float32: one flat transfer, split on the host
            flat = self.torch.cat([probs.reshape(-1).float(), draws.reshape(-1).float()]).cpu().numpy()
            self.host_numbers += flat.size
            self.host_syncs += 1
            rows = flat[: probs.numel()].reshape(tuple(probs.shape))
            return StepOutput(rows, flat[probs.numel():].astype(np.int64).reshape(tuple(draws.shape)))
        if self.keep_rows_on_device and not self.draws_to_host:  # draws a restriction redraws: read if ever used
            return StepOutput(DeviceRows(probs, self), DeviceDraws(draws.clone(), self))
        host_draws = draws.cpu().numpy()  # on CUDA this copy waits for the step
        self.host_numbers += host_draws.size
        self.host_syncs += 1
        return StepOutput(DeviceRows(probs, self) if self.keep_rows_on_device else probs.cpu().numpy(), host_draws)

    def _prefill(self, rows: Conditions, uniforms: np.ndarray) -> StepOutput:
        torch = self.torch
        with torch.inference_mode():
            logits, hidden, present = self.gpt.prefill(*prefill_inputs(torch, rows, self.device, self.dtype))
            self._hidden = hidden
            self._kv[:, :, :, :, : present.shape[4]] = present.to(self.dtype)
            return self._head(logits, uniforms)

    def _prefill_rows(self, model_rows: np.ndarray, rows: Conditions, mix: np.ndarray,
                      uniforms: np.ndarray) -> StepOutput:
        """The admitted images' prefill written into their rows of the cache in place (captured step
        graphs read the same buffer, so nothing is re-captured)."""
        torch = self.torch
        with torch.inference_mode():
            logits, _, present = self.gpt.prefill(*prefill_inputs(torch, rows, self.device, self.dtype))
            index = torch.as_tensor(model_rows, device=self.device)
            self._kv[:, :, index, :, : present.shape[4]] = present.to(self.dtype)
            probs, draws = self._apply_head(logits, torch.as_tensor(mix, device=self.device),
                                            torch.as_tensor(uniforms, device=self.device))
            return self._handoff(probs, draws)

    def _step(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        torch = self.torch
        with torch.inference_mode():
            ids_t = self._to_device(ids, getattr(self, "_ids_dev", None))
            pos_t = self._to_device(positions, getattr(self, "_pos_dev", None))
            mask_t = self._to_device(mask, getattr(self, "_mask_dev", None))
            uniforms_t = self._to_device(uniforms, self._uniforms_dev)
            if self.cuda_graphs:
                return self._replay(ids_t, pos_t, mask_t, uniforms_t)
            self._present, probs, draws, self._hidden = self._eager_step(ids_t, pos_t, mask_t, uniforms_t)
            return self._handoff(probs, draws)

    def _replay(self, ids_t: Any, pos_t: Any, mask_t: Any, uniforms_t: Any) -> StepOutput:
        """The step as a CUDA graph of this window size (captured at its second use, then replayed)."""
        window = int(ids_t.shape[1])
        present, probs, draws, hidden = self._captured(window, lambda: self._eager_step(ids_t, pos_t, mask_t, uniforms_t))
        self._present, self._hidden = present, hidden
        return self._kept(probs, draws)

    def _captured(self, key: Any, run: Any) -> Any:
        """run()'s outputs, from the CUDA graph captured for `key` at its second use. A key's
        first call runs eagerly: the last rounds of an image use one-off sizes, whose capture
        (two warm-up runs and the capture) would cost more than it saves."""
        captured = self._graphs.get(key)
        if captured is None and key in self._seen_windows:
            captured = self._graphs[key] = CapturedStep(self.torch, run)
        self._seen_windows.add(key)
        return captured.replay() if captured is not None else run()

    def _kept(self, probs: Any, draws: Any) -> StepOutput:
        """A replayed graph's rows copied to one of the two alternating output buffers (the next
        replay overwrites the graph's own), then handed off."""
        kept = self._outputs[self._parity][: self.images, : probs.shape[1]]
        self._parity ^= 1
        kept.copy_(probs)
        return self._handoff(kept, draws)

    def can_chain(self, steps: int) -> bool:
        return True  # the chain module runs any number of steps

    def _chain(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
               uniforms: np.ndarray) -> StepOutput:
        """runtime/chain.py's DraftChain, the module the draft_chain graph is exported from, on the
        runner's buffers: the drafts stay on the device between steps (one read of the draws at the end)."""
        steps = uniforms.shape[1]
        return self._run_drafting(self._chain_module(steps), ("chain", int(ids.shape[1]), steps),
                                  ids, positions, mask, last, uniforms)

    def can_draft_tree(self, layout: Any) -> bool:
        return True  # the tree module runs any static shape

    def _draft_tree(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray, layout: Any,
                    uniforms: np.ndarray, features: Optional[np.ndarray] = None) -> StepOutput:
        """runtime/chain.py's DraftTree (an EAGLE head's HeadTree, fed `features`), the module the
        draft_tree graph is exported from, made once per shape: the levels' draws stay on the
        device (one read back at the end)."""
        return self._run_drafting(self._module("Tree", layout.key, layout), ("tree", int(ids.shape[1]), layout.key),
                                  ids, positions, mask, last, uniforms, features)

    def can_grow_tree(self, layout: Any) -> bool:
        return True  # the growth module runs any depth and top_k

    def _grow_tree(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
                   layout: Any, features: Optional[np.ndarray] = None) -> GrownTrees:
        """runtime/chain.py's DraftGrowth (HeadGrowth for a head), the module the draft_growth graph
        is exported from, made once per (depth, top_k): the passes stay on the device, and the
        candidates come back in one read (tokens and indices are exact in float64)."""
        torch = self.torch
        growth = self._module("Growth", layout.key, layout.depth, layout.top_k)
        with torch.inference_mode():
            args = self._drafting_args(ids, positions, mask, last, features)
            run = lambda: growth(*args)  # noqa: E731
            key = ("growth", int(ids.shape[1]), layout.key)
            self._present, tokens, scores, fronts = self._captured(key, run) if self.cuda_graphs else run()
            flat = torch.cat([tokens.reshape(-1).double(), scores.reshape(-1), fronts.reshape(-1).double()]).cpu().numpy()
        self.host_numbers += 2 * flat.size  # (counted in 4-byte numbers)
        self.host_syncs += 1
        count = tokens.numel()
        return GrownTrees(flat[:count].astype(np.int64).reshape(tuple(tokens.shape)),
                          flat[count: 2 * count].reshape(tuple(scores.shape)),
                          flat[2 * count:].astype(np.int64).reshape(tuple(fronts.shape)))

    def _drafting_args(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
                       features: Optional[np.ndarray]) -> list[Any]:
        """A drafting module's inputs on the device, up to the mix: ids, an EAGLE head's
        `features` (the feature before each window token), positions, mask, the KV buffer, last, mix."""
        ids_t = self._to_device(ids, getattr(self, "_ids_dev", None))
        hidden = [] if features is None else [self.torch.from_numpy(features).to(self.device, self.dtype)]
        pos_t = self._to_device(positions, getattr(self, "_pos_dev", None))
        mask_t = self._to_device(mask, getattr(self, "_mask_dev", None))
        last_t = self._to_device(last, getattr(self, "_last_dev", None))
        return [ids_t, *hidden, pos_t, mask_t, self._committed_kv(), last_t, self._mix]

    def _run_drafting(self, module: Any, key: Any, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                      last: np.ndarray, uniforms: np.ndarray, features: Optional[np.ndarray] = None) -> StepOutput:
        """A drafting module (a chain's or a tree's) on the runner's buffers: a CUDA graph per `key`
        where the runner captures them; the present rows kept for commit and stage."""
        with self.torch.inference_mode():
            args = [*self._drafting_args(ids, positions, mask, last, features),
                    self._to_device(uniforms, self._uniforms_dev)]
            run = lambda: module(*args)  # noqa: E731
            if self.cuda_graphs:
                self._present, probs, draws = self._captured(key, run)
                return self._kept(probs, draws)
            self._present, probs, draws = run()
            return self._handoff(probs, draws)

    def _chain_module(self, steps: int) -> Any:
        """The chain module (`chain_kind`: runtime.chain's DraftChain, an EAGLE head's HeadChain) of
        `steps` drafts over this model, made once per count."""
        return self._module("Chain", steps, steps)

    def _module(self, what: str, key: Any, *args: Any) -> Any:
        """runtime.chain's drafting module `what` (Chain, Tree, Growth) of this runner's kind
        (`chain_kind`: Draft… for a model, Head… for an EAGLE head) over this model, made once per key."""
        module = self._chains.get(key)
        if module is None:
            from specrt.runtime import chain as chains  # needs torch, as this runner does
            kind = getattr(chains, self.chain_kind.replace("Chain", what))
            module = self._chains[key] = kind(self.gpt, *args).to(self.device)
        return module

    def _eager_step(self, ids_t: Any, pos_t: Any, mask_t: Any, uniforms_t: Any) -> tuple[Any, Any, Any, Any]:
        """Model step and sampling head on the fixed input buffers: (present KV, probs, draws, hidden).
        The window's keys/values are written into the buffer's scratch columns (present views them)."""
        logits, hidden, present = self.gpt.step(ids_t, pos_t, mask_t, self._static_kv(), self._run_layer)
        probs, draws = self._apply_head(logits, self._mix, uniforms_t)
        return present, probs, draws, hidden

    def _static_kv(self) -> Any:
        """The KV buffer as a step writes it: scratch columns from the capacity on."""
        from specrt.models.kv_cache import StaticCache

        return StaticCache(self._kv, self.capacity)

    def _committed_kv(self) -> Any:
        """The buffer's committed columns [L, 2, B, Hkv, capacity, D] (a view): what the drafting
        modules, which keep their own window rows, read as past_kv."""
        return self._kv[:, :, :, :, : self.capacity]

    def _hidden_rows(self, slots: Sequence[int]) -> np.ndarray:
        rows = self._hidden[:, list(slots)].float().cpu().numpy()
        self.host_numbers += rows.size
        self.host_syncs += 1
        return rows

    def _write_kv(self, rows: np.ndarray, columns: np.ndarray, slots: np.ndarray) -> None:
        with self.torch.inference_mode():
            index = self._staged(np.stack([rows, columns, slots]), "kv index").view(3, -1)  # one copy, no wait
            self._kv[:, :, index[0], :, index[1]] = self._present[:, :, index[0], :, index[2]].to(self.dtype)

    stages_trees = True

    def _move_kv(self, rows: np.ndarray, columns: np.ndarray, sources: np.ndarray) -> None:
        with self.torch.inference_mode():
            index = self._staged(np.stack([rows, columns, sources]), "kv index").view(3, -1)
            self._kv[:, :, index[0], :, index[1]] = self._kv[:, :, index[0], :, index[2]]  # the gather copies first

    def _write_block(self, column: int, start: int, count: int) -> None:
        """One strided copy on the device, its bounds as Python ints: a batch-1 commit or tree level
        builds no index arrays on the host and sends no index tensor."""
        with self.torch.inference_mode():
            self._kv[:, :, :, :, column:column + count].copy_(self._present[:, :, :, :, start:start + count])

    def _move_block(self, column: int, source: int, count: int) -> None:
        with self.torch.inference_mode():
            moved = self._kv[:, :, :, :, source:source + count]
            if source < column + count:  # overlapping runs: a parallel (CUDA) copy could read what it wrote
                moved = moved.clone()
            self._kv[:, :, :, :, column:column + count].copy_(moved)

    def _write_runs(self, columns: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> None:
        """Block copies on the device (no index tensor to send): one for the whole batch when
        every image copies the same run to the same column, else one per image."""
        block = uniform_run(columns, starts, counts)
        if block is not None:
            self._write_block(*block)
            return
        with self.torch.inference_mode():
            images = self.images
            for i in np.flatnonzero(counts).tolist():
                column, start, count = int(columns[i]), int(starts[i]), int(counts[i])
                self._kv[:, :, i::images, :, column:column + count].copy_(
                    self._present[:, :, i::images, :, start:start + count])


class TorchHeadRunner(HeadRunner, TorchRunner):
    """An EAGLE head (specrt.export.eagle.EagleHead) on PyTorch: eager steps, chains and trees
    (runtime/chain.py HeadChain, HeadTree, HeadGrowth: any count, shape, depth and top-k; no CUDA
    graphs: the feature input changes its host buffer per window size; not compiled: its one
    layer runs once a step, so a compiled block would save a few kernels and cost a compile)."""

    chain_kind = "HeadChain"
    device_rounds = True  # runtime/rounds/drafts.py HeadDraft: chains, static and dynamic trees

    def __init__(self, head: Any, target_spec: ModelSpec, max_window: int = 64, device: Optional[str] = None):
        TorchRunner.__init__(self, head, max_window, device, cuda_graphs=False, compile=False)
        self.spec = target_spec  # the head speaks the target's token language and conditions
        self.dim = head.config.dim

    def _head_step(self, ids, features, positions, mask, uniforms) -> StepOutput:
        torch = self.torch
        with torch.inference_mode():
            dev = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
            logits, out, self._present = self.gpt.step(dev(ids).long(), dev(features).to(self.dtype),
                                                       dev(positions).long(), dev(mask), self._static_kv())
            self.features_out[...] = out.float().cpu().numpy()
            probs, draws = self._apply_head(logits, self._mix, self._to_device(uniforms, self._uniforms_dev))
            return self._handoff(probs, draws)

    def _head_chain(self, ids, features, positions, mask, last, uniforms) -> StepOutput:
        """The head's chain module (the draft_chain graph's) on the runner's KV buffer: the drafts
        and the head's features stay on the device between drafts (one read of the draws at the end)."""
        steps = uniforms.shape[1]
        return self._run_drafting(self._chain_module(steps), ("chain", int(ids.shape[1]), steps),
                                  ids, positions, mask, last, uniforms, features)

    def _head_tree(self, ids, features, positions, mask, last, layout, uniforms) -> StepOutput:
        return TorchRunner._draft_tree(self, ids, positions, mask, last, layout, uniforms, features)

    def _head_grow(self, ids, features, positions, mask, last, layout) -> GrownTrees:
        return TorchRunner._grow_tree(self, ids, positions, mask, last, layout, features)


class CapturedStep:
    """One CUDA graph of a step function whose inputs live at fixed device addresses.

    Warm-up runs on a side stream first (cuBLAS handles and autotuning must not happen during
    capture, as PyTorch's CUDA-graph notes require); each graph has its own memory pool, so
    replaying one window size never overwrites another's outputs."""

    def __init__(self, torch: Any, run: Any):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = run()

    def replay(self) -> Any:
        self.graph.replay()
        return self.outputs


class TorchVQ(VQDecoder):
    """VQModel.decode_codes on the model's device."""

    def __init__(self, vq: Any, device: Optional[str] = None):
        self.torch = _torch()
        self.vq = vq.eval()
        if device is not None:
            self.vq.to(device)
        self.device = next(self.vq.parameters()).device
        self.downsample = int(vq.config.downsample)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            images = self.vq.decode_codes(self.torch.from_numpy(np.asarray(codes, dtype=np.int64)).to(self.device))
        return images.float().cpu().numpy()

    @staticmethod
    def neighbours_of(vq: Any, k: int = DEFAULT_K) -> Optional[np.ndarray]:
        """LANTERN's neighbour table from the codebook as used at lookup (None if it has none);
        k is clamped to the codebook as export clamps it (specrt.models.neighbours.neighbour_count)."""
        with _torch().no_grad():
            codebook = codebook_of(vq)
        return None if codebook is None else codebook_neighbours(codebook, neighbour_count(k, codebook.shape[0])[0])
