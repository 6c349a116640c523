"""Read LlamaGen-layout checkpoints (.pt/.pth pickles or .safetensors) into our models.

Weights cannot be downloaded here and users bring files from many training setups, so the
loaders accept the usual wrappings (`model` / `module` / `state_dict` / `ema` sections,
DDP `module.` and torch.compile `_orig_mod.` prefixes) and, when a file does not fit the
requested architecture, say in one line what is missing, what is extra, and which
architecture the shapes actually point to.
"""
import argparse
import re
import warnings
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional, Union

import torch

from specrt.errors import SpecrtError
from specrt.models.llamagen_gpt import GPT, GPT_ARCHS, T2I_COND_LEN, GPTConfig
from specrt.models.llamagen_vq import VQ_ARCHS, VQConfig, VQDecoder, VQModel
from specrt.runtime.compatibility import (CAPTION_PROJECTION_KEY, CLASS_CONDITIONAL, CLASS_EMBEDDING_KEY,
                                          conditioning_from_keys)

StateDict = dict[str, torch.Tensor]
SECTIONS = ("model", "module", "state_dict", "ema")
PREFIXES = ("module.", "_orig_mod.")
# Runtime-only tensors LlamaGen sometimes leaves in a state_dict (caches set up before saving).
IGNORED_KEY = re.compile(r"(^|\.)(kv_cache\.[kv]_cache|causal_mask|freqs_cis)$")
MAX_MESSAGE = 600
MAX_LISTED = 3


def load_state_dict(path: Union[str, Path], section: Optional[str] = None, allow_pickle: bool = False) -> StateDict:
    """Tensors of a checkpoint file, unwrapped and with training prefixes stripped.

    `section` picks a top-level entry explicitly (e.g. "ema"); otherwise the first of
    model / module / state_dict / ema that exists is used, or the top level itself.
    `allow_pickle` permits full unpickling (arbitrary code!) for files that need it.
    """
    path = Path(path)
    if not path.is_file():
        raise SpecrtError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors" or _is_safetensors(path):  # safetensors first: it holds no code
        from safetensors.torch import load_file

        try:
            raw = load_file(str(path))
        except Exception as exc:  # safetensors raises its own error types
            raise SpecrtError(f"cannot read {path} as safetensors: {_short(exc)}") from exc
    else:
        raw = _torch_load(path, allow_pickle)
    return _normalise(_pick_section(raw, section, path))


def _is_safetensors(path: Path) -> bool:
    """A safetensors file whatever its name: 8-byte little-endian header length, then a JSON object."""
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") < path.stat().st_size


# The first bytes of the files a checkpoint is saved as, and of the files people hand over by mistake.
_CHECKPOINT_MAGIC = ((b"PK\x03\x04", "torch.save's zip"), (b"\x80", "a pickle"))
_OTHER_MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"RIFF", "a RIFF file (WebP, WAV)"),
                (b"GIF8", "a GIF image"), (b"%PDF", "a PDF"), (b"\x93NUMPY", "a numpy .npy array"),
                (b"\x08", "an ONNX graph (export it from its checkpoint instead)"))


def refuse_non_checkpoint(flag: str, path: Path) -> None:
    """SpecrtError unless `path` starts like a checkpoint (torch.save's zip, a pickle, or
    safetensors: an 8-byte header length, then JSON), read from its first bytes before anything
    loads: a PNG given as --target is named as a PNG, not met later as a missing image size."""
    path = Path(path)
    if not path.is_file():
        return  # a folder or a missing file: the caller's message says what to give
    with open(path, "rb") as handle:
        head = handle.read(9)
    if any(head.startswith(magic) for magic, _ in _CHECKPOINT_MAGIC) or (len(head) == 9 and head[8:9] == b"{"):
        return
    what = next((name for magic, name in _OTHER_MAGIC if head.startswith(magic)),
                "empty" if not head else "not a torch or safetensors file")
    raise SpecrtError(f"{flag} {path} is not a checkpoint ({what}): give a LlamaGen checkpoint file (.pt, .pth or "
                      ".safetensors)")


def _torch_load(path: Path, allow_pickle: bool) -> object:
    """torch.load with weights_only=True: a pickle may name any Python callable, and unpickling
    would call it (a checkpoint is code unless proven otherwise). torch's weights-only unpickler
    admits tensors, containers and plain values only; `allow_pickle` is the explicit opt-out."""
    if allow_pickle:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        # LlamaGen's training checkpoints carry the argparse Namespace of the run.
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "pickle protocol 4": our message says what matters
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        refusal = "refusing to unpickle anything but tensors"
        unsupported = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
        if unsupported:  # a callable outside torch's weights-only allowlist: refused, never called
            raise SpecrtError(
                f"{path} holds Python objects beyond tensors ({unsupported.group(1)}); {refusal}: re-save only "
                f"the state_dict (or as .safetensors), or allow full unpickling if you trust the file") from None
        operand = re.search(r"Unsupported operand \d+", str(exc))
        detail = f"{type(exc).__name__}: {operand.group(0).lower()}" if operand else type(exc).__name__
        raise SpecrtError(f"cannot read {path} as a torch checkpoint ({detail}); {refusal}") from None


def _pick_section(raw: object, section: Optional[str], path: Path) -> dict:
    if not isinstance(raw, dict):
        raise SpecrtError(f"{path} holds a {type(raw).__name__}, not a state_dict")
    if section is not None:
        if section not in raw:
            raise SpecrtError(f"{path} has no section {section!r}; top-level keys: {_listing(list(raw))}")
        return raw[section]
    if _is_tensor_dict(raw):
        return raw
    for name in SECTIONS:
        if isinstance(raw.get(name), dict):
            return raw[name]
    raise SpecrtError(f"{path} has no model weights (looked for {', '.join(SECTIONS)}); top-level keys: {_listing(list(raw))}")


def _is_tensor_dict(d: dict) -> bool:
    return bool(d) and all(isinstance(v, torch.Tensor) for v in d.values())


def _normalise(state: dict) -> StateDict:
    out: StateDict = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        for prefix in PREFIXES:
            while key.startswith(prefix):
                key = key[len(prefix):]
        if not IGNORED_KEY.search(key):
            out[key] = value
    if not out:
        raise SpecrtError("checkpoint section holds no tensors")
    return out


# ---- GPT ------------------------------------------------------------------------------


def image_grid(image_size: int, downsample: int) -> int:
    """Tokens per side for `image_size` pixels through a VQ that downsamples by `downsample`.

    The one place the grid is derived (generate, export, random weights): the VQ's own
    factor, read from its decoder, never an assumed 16.
    """
    if image_size < downsample or image_size % downsample:
        raise SpecrtError(f"--image-size must be a positive multiple of the VQ's downsampling {downsample}, got {image_size}")
    return image_size // downsample


def attention_heads(dim: int, n_layer: int, qkv_rows: int, n_head: Optional[int] = None,
                    n_kv_head: Optional[int] = None, flag_prefix: str = "") -> tuple[int, int]:
    """(n_head, n_kv_head) of a GPT whose attention.wqkv has `qkv_rows` rows.

    The weights fix only (n_head + 2·n_kv_head)·head_dim = qkv_rows with head_dim = dim / n_head,
    so one of the two counts must come from outside: `n_head` or `n_kv_head` (checked against
    the rows), else LlamaGen's table when (dim, n_layer) is a named size. Otherwise a one-line
    error asks for --{flag_prefix}n-head: guessing a head_dim gives wrong logits silently.
    """
    flag = f"--{flag_prefix}n-head"
    kv_rows = qkv_rows - dim  # = 2 · n_kv_head · head_dim
    if n_head is None and n_kv_head is not None:
        n_head = 2 * n_kv_head * dim // kv_rows if kv_rows > 0 else 0
        if n_kv_head < 1 or n_head < 1 or dim % n_head or (n_head + 2 * n_kv_head) * (dim // n_head) != qkv_rows \
                or n_head % n_kv_head:
            raise SpecrtError(f"--{flag_prefix}n-kv-head {n_kv_head} does not fit the weights (dim {dim}, "
                              f"attention.wqkv {qkv_rows} rows)")
    if n_head is None:
        named = [h for d, n, h in GPT_ARCHS.values() if (d, n) == (dim, n_layer)]
        if not named:
            raise SpecrtError(f"the head count is not in the weights and dim {dim} with {n_layer} layers is no named "
                              f"LlamaGen size: give {flag} (or --{flag_prefix}arch)")
        n_head = named[0]
    if n_head < 1 or dim % n_head or kv_rows <= 0 or kv_rows % (2 * (dim // n_head)):
        raise SpecrtError(f"{flag} {n_head} does not fit the weights: dim {dim} and attention.wqkv's {qkv_rows} rows "
                          f"do not split into {n_head} query heads plus keys and values")
    derived_kv = kv_rows // (2 * (dim // n_head))
    if n_kv_head is not None and n_kv_head != derived_kv:
        raise SpecrtError(f"--{flag_prefix}n-kv-head {n_kv_head} disagrees with the weights: {n_head} heads of "
                          f"{dim // n_head} and attention.wqkv's {qkv_rows} rows mean {derived_kv} kv heads")
    if n_head % derived_kv:
        raise SpecrtError(f"{flag} {n_head} does not fit the weights: it would mean {derived_kv} kv heads, "
                          f"which do not divide {n_head} query heads")
    return n_head, derived_kv


def _gpt_shapes(state: StateDict) -> dict:
    """Everything a GPT state_dict says about itself: sizes and conditioning (not heads, not grid)."""
    if "tok_embeddings.weight" not in state:
        raise SpecrtError("not a LlamaGen GPT checkpoint: no tok_embeddings.weight")
    vocab_size, dim = state["tok_embeddings.weight"].shape
    layer_ids = {int(m.group(1)) for k in state if (m := re.match(r"layers\.(\d+)\.", k))}
    if "layers.0.attention.wqkv.weight" not in state:
        raise SpecrtError("not a LlamaGen GPT checkpoint: no layers.0.attention.wqkv.weight")
    fields = dict(vocab_size=vocab_size, dim=dim, n_layer=max(layer_ids) + 1,
                  qkv_rows=state["layers.0.attention.wqkv.weight"].shape[0],
                  model_type=conditioning_from_keys(state))
    if fields["model_type"] == CLASS_CONDITIONAL:
        fields["num_classes"] = state[CLASS_EMBEDDING_KEY].shape[0] - 1
    else:
        fields["caption_dim"] = state[CAPTION_PROJECTION_KEY].shape[1]
        uncond = state.get("cls_embedding.uncond_embedding")
        fields["cond_len"] = uncond.shape[0] if uncond is not None else T2I_COND_LEN
    return fields


def infer_gpt_config(state: StateDict, grid_size: int, n_head: Optional[int] = None, n_kv_head: Optional[int] = None,
                     flag_prefix: str = "") -> GPTConfig:
    """The GPTConfig the tensor shapes describe, with what they cannot say given.

    Read from the weights: vocab, dim, layers, kv heads (once the head count is known),
    conditioning (class embedding vs caption projection) and its sizes. Not in the weights:
    the grid (image size ÷ the VQ's downsampling) and the head count (see attention_heads).
    """
    fields = _gpt_shapes(state)
    qkv_rows = fields.pop("qkv_rows")
    fields["n_head"], fields["n_kv_head"] = attention_heads(fields["dim"], fields["n_layer"], qkv_rows, n_head,
                                                            n_kv_head, flag_prefix)
    try:
        return GPTConfig(**fields, grid_size=grid_size)
    except ValueError as exc:
        raise SpecrtError(f"checkpoint shapes do not form a LlamaGen GPT: {exc}") from exc


def describe_gpt(config: GPTConfig) -> str:
    """'GPT-B c2i (dim 768, 12 layers, 12 heads, vocab 16384, 1000 classes)' or a custom size."""
    name = next((n for n, arch in GPT_ARCHS.items() if arch == (config.dim, config.n_layer, config.n_head)), "custom GPT")
    kv = f", {config.n_kv_head} kv heads" if config.n_kv_head != config.n_head else ""
    return _describe(name, config.model_type, config.dim, config.n_layer, f", {config.n_head} heads{kv}",
                     config.vocab_size, config.num_classes, config.cond_len, config.caption_dim)


def _describe(name: str, model_type: str, dim: int, n_layer: int, heads: str, vocab_size: int, num_classes: int = 0,
              cond_len: int = 0, caption_dim: int = 0, **_unused) -> str:
    extra = f"{num_classes} classes" if model_type == CLASS_CONDITIONAL else f"{cond_len}x{caption_dim} captions"
    return f"{name} {model_type} (dim {dim}, {n_layer} layers{heads}, vocab {vocab_size}, {extra})"


def image_size_from_name(path: Union[str, Path]) -> Optional[int]:
    """LlamaGen names files by resolution (c2i_XL_384.pt, t2i_XL_stage2_512.pt); the
    weights themselves do not know their grid, so the name is the only other witness."""
    found = re.findall(r"(?<![0-9])(256|384|448|512|768|1024)(?![0-9])", Path(path).stem)
    return int(found[-1]) if found else None


def load_gpt(source: Union[str, Path, StateDict], config: Union[GPTConfig, str, None] = None,
             grid_size: Optional[int] = None, n_head: Optional[int] = None, n_kv_head: Optional[int] = None,
             flag_prefix: str = "", **load_kwargs) -> GPT:
    """A GPT in eval mode with the checkpoint's weights (float32).

    `config` is a GPTConfig (used as is), an arch name ("GPT-B": LlamaGen's named size fixes
    dim, layers and heads; everything else comes from the weights), or None to read the
    config from the weights with `n_head` / `n_kv_head` where the size is not a named one
    (attention_heads). Without a GPTConfig, `grid_size` (image size ÷ the VQ's downsampling,
    see image_grid) is required: the weights do not know it. `flag_prefix` names the CLI
    flags in messages ("draft-" for --draft-n-head).
    """
    state = source if isinstance(source, dict) else load_state_dict(source, **load_kwargs)
    if not isinstance(config, GPTConfig):
        if grid_size is None:
            raise SpecrtError("the image grid is not in a GPT's weights: give --image-size (grid = image size ÷ the VQ's "
                              "downsampling)")
        config = _config_for(state, config, grid_size, n_head, n_kv_head, flag_prefix)
    model = GPT(config)
    _load_into(model, state, what=describe_gpt(config), hint=lambda: f"the weights look like {_weights_look_like(state)}")
    return model.eval()


def _config_for(state: StateDict, arch: Optional[str], grid_size: int, n_head: Optional[int], n_kv_head: Optional[int],
                flag_prefix: str) -> GPTConfig:
    if arch is None:
        return infer_gpt_config(state, grid_size, n_head, n_kv_head, flag_prefix)
    if arch not in GPT_ARCHS:
        raise SpecrtError(f"unknown GPT arch {arch!r}; known: {', '.join(GPT_ARCHS)}")
    dim, n_layer, arch_heads = GPT_ARCHS[arch]
    if n_head is not None and n_head != arch_heads:
        raise SpecrtError(f"--{flag_prefix}n-head {n_head} disagrees with --{flag_prefix}arch {arch} ({arch_heads} heads)")
    fields = _gpt_shapes(state)
    qkv_rows = fields.pop("qkv_rows")
    if (fields["dim"], fields["n_layer"]) == (dim, n_layer):  # else the strict load says what differs
        fields["n_head"], fields["n_kv_head"] = attention_heads(dim, n_layer, qkv_rows, arch_heads, n_kv_head,
                                                                flag_prefix)
    fields.update(dim=dim, n_layer=n_layer, n_head=arch_heads, grid_size=grid_size)
    try:
        return GPTConfig(**fields)
    except ValueError as exc:
        raise SpecrtError(str(exc)) from exc


def _weights_look_like(state: StateDict) -> str:
    """A description of the weights for mismatch messages (heads only where they are certain)."""
    try:
        fields = _gpt_shapes(state)
    except SpecrtError as exc:
        return f"no LlamaGen GPT ({exc})"
    try:
        heads = attention_heads(fields["dim"], fields["n_layer"], fields["qkv_rows"])
    except SpecrtError:
        return _describe("custom GPT", heads="", **fields)
    name = next((n for n, arch in GPT_ARCHS.items() if arch[:2] == (fields["dim"], fields["n_layer"])), "custom GPT")
    kv = f", {heads[1]} kv heads" if heads[1] != heads[0] else ""
    return _describe(name, heads=f", {heads[0]} heads{kv}", **fields)


# ---- VQ -------------------------------------------------------------------------------


def infer_vq_config(state: StateDict, norm_groups: int = 32) -> VQConfig:
    """The VQConfig the tensor shapes describe (norm_groups is not in the weights)."""
    try:
        codebook_size, embed_dim = state["quantize.embedding.weight"].shape
        z_channels = state["post_quant_conv.weight"].shape[0]
        ch = state["decoder.conv_out.weight"].shape[1]
        levels = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"decoder\.conv_blocks\.(\d+)\.", k)))
        # decoder.conv_blocks.{i} runs from the lowest resolution (level levels-1) upwards.
        ch_mult = tuple(state[f"decoder.conv_blocks.{levels - 1 - level}.res.0.conv1.weight"].shape[0] // ch
                        for level in range(levels))
        dec_res = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"decoder\.conv_blocks\.0\.res\.(\d+)\.", k)))
    except KeyError as exc:
        raise SpecrtError(f"not a LlamaGen VQ checkpoint: no {exc.args[0]}") from exc
    except ValueError as exc:  # max() of nothing: no decoder blocks at all
        raise SpecrtError("not a LlamaGen VQ checkpoint: no decoder.conv_blocks") from exc
    try:
        return VQConfig(codebook_size=codebook_size, codebook_embed_dim=embed_dim, ch=ch, ch_mult=ch_mult,
                        z_channels=z_channels, num_res_blocks=dec_res - 1, norm_groups=norm_groups,
                        codebook_show_usage="quantize.codebook_used" in state)
    except ValueError as exc:
        raise SpecrtError(f"VQ checkpoint shapes do not form a valid config: {exc}") from exc


def describe_vq(config: VQConfig) -> str:
    return (f"VQ (codebook {config.codebook_size}x{config.codebook_embed_dim}, ch {config.ch}, "
            f"ch_mult {list(config.ch_mult)}, z {config.z_channels}, downsample {config.downsample})")


def load_vq(source: Union[str, Path, StateDict], config: Union[VQConfig, str, None] = None,
            decoder_only: bool = False, norm_groups: int = 32, **load_kwargs) -> Union[VQModel, VQDecoder]:
    """A VQModel (or only its VQDecoder) in eval mode; config None infers it from the shapes
    (with `norm_groups` GroupNorm groups, which the weights cannot tell). A named arch
    ("VQ-16", "VQ-8") fixes the layout; the codebook's size and dim still come from the
    weights, as LlamaGen's VQ_models take them as arguments.

    With decoder_only, encoder / quant_conv weights in the file are ignored (and may be absent).
    """
    state = source if isinstance(source, dict) else load_state_dict(source, **load_kwargs)
    if isinstance(config, str):
        if config not in VQ_ARCHS:
            raise SpecrtError(f"unknown VQ arch {config!r}; known: {', '.join(VQ_ARCHS)}")
        config = VQ_ARCHS[config]
        codebook = state.get("quantize.embedding.weight")
        if codebook is not None and codebook.dim() == 2:  # LlamaGen passes the codebook's size as arguments
            config = replace(config, codebook_size=codebook.shape[0], codebook_embed_dim=codebook.shape[1])

    def hint() -> str:
        try:
            return f"the weights look like {describe_vq(infer_vq_config(state, norm_groups=1))}"  # groups do not show
        except (SpecrtError, KeyError, ValueError):
            return "the weights do not look like a LlamaGen VQ"

    if config is None:
        config = infer_vq_config(state, norm_groups)
    if "quantize.codebook_used" not in state and config.codebook_show_usage:
        config = replace(config, codebook_show_usage=False)  # the usage monitor is optional
    model: Union[VQModel, VQDecoder] = VQDecoder(config) if decoder_only else VQModel(config)
    if decoder_only:
        state = {k: v for k, v in state.items() if not k.startswith(("encoder.", "quant_conv."))}
    _load_into(model, state, what=describe_vq(config), hint=hint)
    return model.eval()


# ---- shared -----------------------------------------------------------------------------


def _load_into(model: torch.nn.Module, state: StateDict, what: str, hint) -> None:
    """Strict load with a one-line, bounded SpecrtError on any mismatch."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    if not (missing or unexpected or wrong):
        model.load_state_dict(state, strict=True)
        return
    parts = []
    if wrong:
        shown = ", ".join(f"{k}: file {list(state[k].shape)} vs model {list(expected[k].shape)}" for k in wrong[:2])
        parts.append(f"{len(wrong)} shape mismatches ({shown}{', ...' if len(wrong) > 2 else ''})")
    if missing:
        parts.append(f"{len(missing)} missing keys ({_listing(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected keys ({_listing(unexpected)})")
    head, tail = f"checkpoint does not fit {what}: ", f"; {hint()}"
    body = "; ".join(parts)
    room = max(MAX_MESSAGE - len(head) - len(tail), 40)
    if len(body) > room:  # shorten the details, never the hint
        body = body[: room - 3] + "..."
    raise SpecrtError((head + body + tail)[:MAX_MESSAGE])


def _listing(keys: list) -> str:
    shown = ", ".join(str(k) for k in keys[:MAX_LISTED])
    return shown + (f", +{len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else "")


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def config_dict(config: Union[GPTConfig, VQConfig]) -> dict:
    """Plain-JSON view of a config (for manifests and logs)."""
    d = asdict(config)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
