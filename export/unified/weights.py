"""Load a unified-vocabulary checkpoint's language-model weights into a UnifiedLM, tensor by tensor.

Real checkpoints are 7B+ parameters, so the module is built on the meta device (no random
init, no memory) and every tensor goes from safetensors straight into its parameter, cast
once: the peak is the loaded model plus one tensor, never a second copy of the checkpoint.
Keys are mapped by prefix from the names transformers writes (and, for Emu3, the names on
the Hub, `text_model.model.…`, which transformers renames on load); the vision tower and the
VQ model are not the language model's and are skipped (export/unified/vq.py reads those).
A key we cannot place, or a parameter no key fills, is one SpecrtError line naming it.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
import torch.nn as nn

from specrt.errors import SpecrtError
from specrt.export.unified.config import UnifiedConfig, read_config
from specrt.export.unified.model import UnifiedLM

# (checkpoint prefix, parameter prefix), first match wins
_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "janus": (("model.language_model.", ""), ("model.generation_embeddings.", "generation_embeddings."),
              ("model.generation_aligner.", "generation_aligner."), ("model.generation_head.", "generation_head."),
              ("lm_head.", "lm_head.")),
    "emu3": (("text_model.model.", ""), ("model.text_model.", ""), ("text_model.lm_head.", "lm_head."),
             ("lm_head.", "lm_head.")),
    "chameleon": (("model.", ""), ("lm_head.", "lm_head.")),
}
_SKIPPED: dict[str, tuple[str, ...]] = {
    "janus": ("model.vision_model.", "model.aligner.", "model.vqmodel."),
    "emu3": ("vqmodel.", "model.vqmodel."),
    "chameleon": ("model.vqmodel.",),
}


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards its index names, or model.safetensors."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / name for name in shards]
    elif (directory / "model.safetensors").is_file():
        files = [directory / "model.safetensors"]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise SpecrtError(f"{directory} has no safetensors weights (model.safetensors or an index with shards)")
    for path in files:
        if not path.is_file():
            raise SpecrtError(f"{path} is named in the checkpoint's index but missing")
    return files


def parameter_name(architecture: str, key: str) -> Optional[str]:
    """The UnifiedLM parameter a checkpoint key fills; None for keys of other parts (vision, VQ)."""
    if key.startswith(_SKIPPED[architecture]) or key.endswith("rotary_emb.inv_freq"):
        return None
    for prefix, target in _RENAMES[architecture]:
        if key.startswith(prefix):
            return target + key[len(prefix):]
    return "?" + key  # no rename applies: reported as unexpected


_CAST_CHUNK_BYTES = 16 << 20
# safetensors dtype names -> torch (the header's spelling)
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


def iter_tensors(directory: str | Path) -> Iterator[tuple[str, Callable[..., torch.Tensor]]]:
    """(key, loader) of every tensor in the checkpoint; a tensor is read only when its loader runs
    (while the iteration is at that key), cast by it when given a dtype (`loader(torch.float16)`).

    Read with plain file reads into a tensor allocated for it, not through safetensors' memory
    map: the pages a map touches stay in the process's resident set until it is closed, so a
    mapped shard would count a second copy of the weights against the export's peak memory.
    """
    scratch = torch.empty(_CAST_CHUNK_BYTES, dtype=torch.uint8)  # one cast buffer for the whole load
    for path in checkpoint_files(directory):
        with open(path, "rb") as handle:
            size = struct.unpack("<Q", handle.read(8))[0]
            header = json.loads(handle.read(size))
            base = 8 + size
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                if info["dtype"] not in _SAFETENSORS_DTYPES:
                    raise SpecrtError(f"weight {key!r} in {path} has dtype {info['dtype']}, which specrt does not read "
                                      f"(known: {', '.join(_SAFETENSORS_DTYPES)})")
                yield key, (lambda dtype=None, info=info: _read_tensor(handle, base, info, path, dtype, scratch))



def _read_tensor(handle, base: int, info: dict, path: Path, dtype: Optional[torch.dtype],
                 scratch: torch.Tensor) -> torch.Tensor:
    """One tensor of an open safetensors file, in `dtype` (None: as stored). A cast goes through
    `scratch` (one 16 MB buffer for the whole load), so the stored copy of a tensor never exists
    beside the cast one, and no per-tensor temporary is freed: freed large blocks raise glibc's
    mmap threshold, and later tensors then fragment the heap (~0.4x the weights kept, measured)."""
    start, end = info["data_offsets"]
    stored = _SAFETENSORS_DTYPES[info["dtype"]]
    tensor = torch.empty(info["shape"], dtype=dtype or stored)
    numel = tensor.numel()
    if numel * stored.itemsize != end - start:
        raise SpecrtError(f"{path}: a tensor's byte range ({end - start} bytes) does not match its shape and dtype")
    handle.seek(base + start)

    def fill(part: torch.Tensor) -> None:
        view = part.view(torch.uint8).numpy()
        if handle.readinto(memoryview(view)) != view.nbytes:
            raise SpecrtError(f"{path} is truncated")

    flat = tensor.reshape(-1)
    if tensor.dtype == stored:
        fill(flat)
        return tensor
    step = scratch.numel() // stored.itemsize
    for first in range(0, numel, step):
        part = scratch[: min(step, numel - first) * stored.itemsize].view(stored)
        fill(part)
        flat[first:first + part.numel()].copy_(part)
    return tensor


def _set_parameter(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    module._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)


def load_weights(model: UnifiedLM, directory: str | Path, dtype: Optional[torch.dtype] = torch.float32,
                 device: str | torch.device = "cpu", progress: bool = False) -> UnifiedLM:
    """Fill `model` (usually built on the meta device) from the checkpoint in `directory`.

    dtype: cast every tensor to it (None keeps the checkpoint's). progress: a bar on stderr over the
    parameters read (a 7B checkpoint takes minutes). Raises SpecrtError naming the first unexpected
    key, a shape mismatch, or the parameters no key filled.
    """
    from tqdm import tqdm

    config = model.config
    expected = dict(model.named_parameters(remove_duplicate=False))
    tied = config.tie_embeddings
    if tied:
        expected.pop("lm_head.weight", None)
    loaded: set[str] = set()
    bar = tqdm(total=sum(p.numel() for p in expected.values()), unit="param", unit_scale=True, desc="weights",
               disable=not progress, leave=False, dynamic_ncols=True)
    for key, read in iter_tensors(directory):
        name = parameter_name(config.architecture, key)
        if name is None or (tied and name == "lm_head.weight"):
            continue
        if name not in expected:
            raise SpecrtError(f"unexpected weight {key!r} in the {config.architecture} checkpoint {directory}")
        tensor = read(dtype)
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise SpecrtError(f"weight {key!r} has shape {tuple(tensor.shape)}, the config implies "
                              f"{tuple(expected[name].shape)}")
        _set_parameter(model, name, tensor.to(device=device))
        loaded.add(name)
        bar.update(tensor.numel())
    bar.close()
    missing = [name for name in expected if name not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise SpecrtError(f"missing weight {missing[0]!r}{more} in the {config.architecture} checkpoint {directory}")
    if tied:
        model.tie_weights()
    model._make_buffers()  # index / rope tables on the weights' device
    model.restrict_head()  # the graphs' own V_head-row tables (UnifiedLM.restrict_head)
    return model.eval()


def load_unified(directory: str | Path, grid: Optional[tuple[int, int]] = None, cond_len: Optional[int] = None,
                 dtype: Optional[torch.dtype] = torch.float32, device: str | torch.device = "cpu",
                 progress: bool = False) -> UnifiedLM:
    """A UnifiedLM from a Hugging Face checkpoint directory (config.json + safetensors).

    grid: (rows, cols) for Emu3 / Chameleon (default: the model's usual size; Janus's comes from
    its config); cond_len: longest prompt in tokens (default 128); dtype: the weights' dtype
    (None: as stored). The graphs compute in that dtype and return float32 logits.
    """
    config: UnifiedConfig = read_config(directory, grid=grid, cond_len=cond_len)
    with torch.device("meta"):
        model = UnifiedLM(config)
    return load_weights(model, directory, dtype=dtype, device=device, progress=progress)
