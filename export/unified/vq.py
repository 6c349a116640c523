"""The image decoders of the unified-vocabulary generators, as bundles need them.

A bundle ships only the decode half of each model's VQ: codes int [B, rows, cols] -> image
[B, 3, H, W] in about [-1, 1] (docs/contracts.md, "Graphs of a bundle"). Every module here
exposes `decode_codes(codes)` and `config.downsample` / `config.codebook_size`, the interface
`specrt.export.onnx_export.export_vq_decode` and the PyTorch backend use.

- Janus / Janus-Pro: LlamaGen's VQ-16 (taming-derived; l2-normalised codebook), weights under
  the checkpoint's `...vqmodel.` keys. Ours (`TamingVQDecoder`), no transformers at export time.
- Lumina-mGPT (Chameleon): transformers' ChameleonVQVAE has no decoder; Lumina-mGPT decodes with
  Chameleon's original VQGAN (`vqgan.ckpt` + `vqgan.yaml`, taming-transformers VQModel layout).
  The same `TamingVQDecoder`, its keys taken as they are.
- Emu3: a MoVQ-style decoder with spatially conditioned norms and a temporal axis. We wrap
  transformers' own Emu3VQVAE decoder modules (the maintained reference; needs transformers at
  export time) and decode one image: a single latent frame, the first decoded frame kept, as
  Emu3VQVAE.decode does for a 3-d input.

Why our own taming decoder rather than transformers' JanusVQVAE: it takes any rows x cols
(transformers' decode insists on its square `num_patches`), it needs no transformers to export,
and tests can then compare it with transformers as an independent reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from specrt.errors import SpecrtError
from specrt.export.unified.config import read_json
from specrt.export.unified.weights import checkpoint_files
from specrt.models.llamagen_vq import AttnBlock, ResnetBlock, Upsample, VQConfig, swish
from specrt.lazy import require

ARCHITECTURES = ("janus", "emu3", "chameleon")
_ALIASES = {
    "janus": "janus", "janusforconditionalgeneration": "janus", "janus-pro": "janus",
    "emu3": "emu3", "emu3forconditionalgeneration": "emu3", "emu3forcausallm": "emu3",
    "chameleon": "chameleon", "chameleonforconditionalgeneration": "chameleon",
    "lumina-mgpt": "chameleon", "lumina_mgpt": "chameleon",
}
_CODEBOOK_KEY = "quantize.embedding.weight"
VQGAN_FILES = ("vqgan.ckpt", "vqgan.yaml")
# Where Lumina-mGPT keeps Chameleon's VQGAN relative to a checkpoint directory, besides the
# directory itself (its repository: ckpts/chameleon/tokenizer/; a user may copy it anywhere).
_VQGAN_SUBDIRS = (".", "tokenizer", "vqgan", "image_tokenizer", "chameleon/tokenizer", "ckpts/chameleon/tokenizer")


def normalize_architecture(architecture: str) -> str:
    """'JanusForConditionalGeneration', 'janus', 'Lumina-mGPT', ... -> janus | emu3 | chameleon."""
    name = _ALIASES.get(architecture.strip().lower())
    if name is None:
        raise SpecrtError(f"unsupported unified architecture {architecture!r}; supported: {', '.join(ARCHITECTURES)} "
                          "(Janus / Janus-Pro, Emu3, Chameleon / Lumina-mGPT)")
    return name


# ---- taming-layout decoder (Janus's VQ-16, Chameleon's VQGAN) ------------------------------------


@dataclass(frozen=True)
class TamingVQConfig:
    """A taming-transformers VQModel's decode side (ddconfig + embed_dim / n_embed).

    attn_levels: the decoder levels (0 = full resolution) whose blocks have attention; taming
    derives them from `attn_resolutions` and `resolution`, Janus has them at the lowest level only.
    l2_norm: the codebook is l2-normalised at lookup (LlamaGen / Janus), not (taming / Chameleon).
    output_mean / output_std: the checkpoint's image normalisation; decode returns
    2 * (x * std + mean) - 1 so the output is in [-1, 1] whatever the model was trained with
    (mean = std = 0.5, the usual case, is the identity).
    """

    ch: int
    ch_mult: tuple[int, ...]
    num_res_blocks: int
    z_channels: int
    embed_dim: int
    n_embed: int
    attn_levels: tuple[int, ...]
    out_ch: int = 3
    l2_norm: bool = False
    norm_groups: int = 32
    output_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    output_std: tuple[float, ...] = (0.5, 0.5, 0.5)

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def codebook_size(self) -> int:
        return self.n_embed

    def block_config(self) -> VQConfig:
        """The LlamaGen VQConfig our shared blocks read (norm groups, dropout): taming's blocks
        are LlamaGen's (GroupNorm eps 1e-6, swish, nearest x2 upsample + conv, 1-head attention)."""
        return VQConfig(ch=self.ch, ch_mult=self.ch_mult, norm_groups=self.norm_groups, dropout=0.0,
                        codebook_show_usage=False)


class _MidBlock(nn.Module):
    def __init__(self, channels: int, blocks: VQConfig):
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, blocks)
        self.attn_1 = AttnBlock(channels, blocks)
        self.block_2 = ResnetBlock(channels, channels, blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class TamingDecoder(nn.Module):
    """taming's Decoder, its key names: conv_in, mid.{block_1,attn_1,block_2},
    up[level].{block,attn,upsample} with up[0] the full resolution, norm_out, conv_out."""

    def __init__(self, config: TamingVQConfig):
        super().__init__()
        blocks = config.block_config()
        levels = len(config.ch_mult)
        block_in = config.ch * config.ch_mult[-1]
        self.conv_in = nn.Conv2d(config.z_channels, block_in, 3, padding=1)
        self.mid = _MidBlock(block_in, blocks)
        ups: list[nn.Module] = []
        for level in reversed(range(levels)):
            up = nn.Module()
            up.block, up.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(config.num_res_blocks + 1):
                up.block.append(ResnetBlock(block_in, config.ch * config.ch_mult[level], blocks))
                block_in = config.ch * config.ch_mult[level]
                if level in config.attn_levels:
                    up.attn.append(AttnBlock(block_in, blocks))
            if level != 0:
                up.upsample = Upsample(block_in)
            ups.insert(0, up)
        self.up = nn.ModuleList(ups)
        self.norm_out = nn.GroupNorm(config.norm_groups, block_in, eps=1e-6)
        self.conv_out = nn.Conv2d(block_in, config.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(range(len(self.up))):
            up = self.up[level]
            for i, block in enumerate(up.block):
                h = block(h)
                if len(up.attn):
                    h = up.attn[i](h)
            if level != 0:
                h = up.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


def _output_affine(module: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    """Buffers mapping a decoder's output, normalised with the image processor's mean/std, to the
    [-1, 1] the runtime expects (x·2σ + 2μ − 1); `_affine` is False when that is the identity."""
    scale = [2.0 * s for s in std]
    shift = [2.0 * m - 1.0 for m in mean]
    module._affine = scale != [1.0] * len(scale) or shift != [0.0] * len(shift)
    module.register_buffer("out_scale", torch.tensor(scale).view(1, -1, 1, 1), persistent=False)
    module.register_buffer("out_shift", torch.tensor(shift).view(1, -1, 1, 1), persistent=False)


class _Codebook(nn.Module):
    """Holds `embedding` so a VQModel's `quantize.embedding.weight` loads as it is."""

    def __init__(self, n_embed: int, embed_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(n_embed, embed_dim)


class TamingVQDecoder(nn.Module):
    """codes int [B, rows, cols] -> image [B, 3, rows*ds, cols*ds] in about [-1, 1]; the keys of
    a taming VQModel's `quantize.embedding`, `post_quant_conv.*` and `decoder.*` load directly."""

    def __init__(self, config: TamingVQConfig):
        super().__init__()
        self.config = config
        self.quantize = _Codebook(config.n_embed, config.embed_dim)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, 1)
        self.decoder = TamingDecoder(config)
        _output_affine(self, config.output_mean, config.output_std)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, h, w] -> latents [B, embed_dim, h, w] (l2-normalised rows for Janus)."""
        latents = F.embedding(codes.long(), self.quantize.embedding.weight)
        if self.config.l2_norm:
            latents = F.normalize(latents, p=2, dim=-1)
        return latents.permute(0, 3, 1, 2)

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        image = self.decoder(self.post_quant_conv(self.lookup(codes)))
        return image * self.out_scale + self.out_shift if self._affine else image

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decode_codes(codes)


# ---- Emu3 (transformers' decoder modules) ---------------------------------------------------------


@dataclass(frozen=True)
class Emu3VQInfo:
    """What the exporter and runtime read off a VQ module."""

    codebook_size: int
    embed_dim: int
    downsample: int
    temporal_downsample_factor: int
    output_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    output_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    hf_config: Any = field(default=None, compare=False, repr=False)


class Emu3VQDecoder(nn.Module):
    """Emu3VQVAE's decode of one image, on transformers' own `quantize`, `post_quant_conv` and
    `decoder` modules (the encoder is never built). An image is one latent frame; the decoder's
    temporal upsampling turns it into `temporal_downsample_factor` frames, of which Emu3 keeps
    the first (Emu3VQVAE.decode: `video[:, 0]` for a [B, h, w] input). The forward is ours (the
    same modules in the same order), so the exported graph keeps a dynamic batch."""

    def __init__(self, info: Emu3VQInfo, quantize: nn.Module, post_quant_conv: nn.Module, decoder: nn.Module):
        super().__init__()
        self.config = info
        self.quantize, self.post_quant_conv, self.decoder = quantize, post_quant_conv, decoder
        _output_affine(self, info.output_mean, info.output_std)

    def _first_frame(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, C, 1, h, w] -> frame 0 of the temporal stack's output [B, C, h, w].

        Emu3VQVAEDecoder runs the latents and the quantized states through its temporal stack as
        one batch (cat / chunk along batch); per sample that is the same thing (eval BatchNorm,
        convolutions), and done separately the graph keeps a dynamic batch (the cat / chunk /
        reshape(-1, ...) of transformers' forward bake the traced batch into ONNX Reshapes).
        After the stack every module is 2-d, frame by frame: decoding frame 0 alone is exact and
        spares the frames Emu3 discards."""
        for layer in self.decoder.time_res_stack:
            latents = layer(latents)
        for layer in self.decoder.time_conv:
            latents = layer(latents)
            latents = latents * torch.sigmoid(latents)
        return latents[:, :, 0]

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        quant = self.quantize.embedding(codes.long())  # [B, h, w, C]
        quant = quant.permute(0, 3, 1, 2).unsqueeze(2)  # [B, C, T=1, h, w]
        hidden = self._first_frame(self.post_quant_conv(quant))
        quant = self._first_frame(quant)
        decoder = self.decoder
        hidden = decoder.middle_block(decoder.conv_in(hidden), quant)
        hidden = decoder.norm_out(decoder.up_block(hidden, quant), quant)
        image = decoder.conv_out(hidden * torch.sigmoid(hidden))
        return image * self.out_scale + self.out_shift if self._affine else image

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decode_codes(codes)


# ---- loading from a checkpoint directory ----------------------------------------------------------


def _vq_prefix(keys: Iterable[str], checkpoint_dir: Path) -> str:
    """The key prefix of the VQ model (`model.vqmodel.` as loaded, `vqmodel.` as Emu3 files store it)."""
    found = sorted(k[: -len(_CODEBOOK_KEY)] for k in keys if k.endswith(_CODEBOOK_KEY) and "vq" in k[: -len(_CODEBOOK_KEY)])
    if len(found) != 1:
        raise SpecrtError(f"{checkpoint_dir}: expected one VQ codebook key '*vqmodel.{_CODEBOOK_KEY}' in the weights, found {found or 'none'}")
    return found[0]


def read_vq_state(checkpoint_dir: Path, parts: tuple[str, ...] = ("quantize.", "post_quant_conv.", "decoder.")) -> dict[str, torch.Tensor]:
    """The VQ model's decode-side tensors, prefix stripped, read with safe_open (nothing else is
    loaded: a 7B checkpoint's language model stays on disk)."""
    from safetensors import safe_open  # a core dependency of specrt

    files = checkpoint_files(checkpoint_dir)
    where: dict[str, Path] = {}
    for path in files:
        if not path.exists():
            raise SpecrtError(f"{checkpoint_dir}: the weight index names {path.name}, which is missing")
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                where[key] = path
    prefix = _vq_prefix(where, checkpoint_dir)
    state: dict[str, torch.Tensor] = {}
    for path in files:
        wanted = [k for k, p in where.items() if p == path and k.startswith(prefix) and k[len(prefix):].startswith(parts)]
        if not wanted:
            continue
        with safe_open(str(path), framework="pt") as handle:
            for key in wanted:
                state[key[len(prefix):]] = handle.get_tensor(key).float()
    return state


def _image_normalisation(checkpoint_dir: Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of preprocessor_config.json, else (0.5, 0.5): what Janus's and Emu3's own code
    use (decoded x -> (x + 1) / 2)."""
    path = checkpoint_dir / "preprocessor_config.json"
    if not path.exists():
        return (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    config = read_json(path)
    if config.get("do_normalize") is False:
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    mean, std = config.get("image_mean", 0.5), config.get("image_std", 0.5)
    mean = tuple(float(v) for v in (mean if isinstance(mean, list) else [mean] * 3))
    std = tuple(float(v) for v in (std if isinstance(std, list) else [std] * 3))
    return mean, std


def _load_strict(module: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SpecrtError(f"{source}: VQ weights do not fit the configured decoder "
                          f"(missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]})")


def load_janus_vq(checkpoint_dir: Path, config: dict) -> TamingVQDecoder:
    """Janus / Janus-Pro: config.json's vq_config (defaults: JanusVQVAEConfig's, i.e. VQ-16)."""
    vq = config.get("vq_config") or {}
    ch_mult = tuple(vq.get("channel_multiplier", (1, 1, 2, 2, 4)))
    mean, std = _image_normalisation(checkpoint_dir)
    cfg = TamingVQConfig(ch=vq.get("base_channels", 128), ch_mult=ch_mult, num_res_blocks=vq.get("num_res_blocks", 2),
                         z_channels=vq.get("latent_channels", 256), embed_dim=vq.get("embed_dim", 8),
                         n_embed=vq.get("num_embeddings", 16384), attn_levels=(len(ch_mult) - 1,),
                         out_ch=vq.get("out_channels", 3), l2_norm=True, output_mean=mean, output_std=std)
    state = read_vq_state(checkpoint_dir)
    # Janus (like LlamaGen) stores up[0] = the lowest resolution; taming's up[0] is the highest.
    levels = len(ch_mult)
    state = {_janus_to_taming(k, levels): v for k, v in state.items()}
    module = TamingVQDecoder(cfg)
    _load_strict(module, state, str(checkpoint_dir))
    return module.eval()


def _janus_to_taming(key: str, levels: int) -> str:
    parts = key.split(".")
    if parts[:2] == ["decoder", "up"]:
        parts[2] = str(levels - 1 - int(parts[2]))
    return ".".join(parts)


def load_emu3_vq(checkpoint_dir: Path, config: dict) -> Emu3VQDecoder:
    """Emu3: transformers' Emu3VQVAE built on the meta device (no encoder memory), its decode
    modules moved to CPU and filled from the checkpoint."""
    require("transformers", "Emu3's VQ decoder")
    from transformers import Emu3VQVAEConfig
    from transformers.models.emu3.modeling_emu3 import Emu3VQVAE

    hf_config = Emu3VQVAEConfig.from_dict(dict(config.get("vq_config") or {}))
    hf_config._attn_implementation = "eager"  # plain matmuls: exports to ONNX on every opset
    with torch.device("meta"):
        full = Emu3VQVAE(hf_config)
    modules = [full.quantize, full.post_quant_conv, full.decoder]
    for module in modules:
        module.to_empty(device="cpu")
    mean, std = _image_normalisation(checkpoint_dir)
    info = Emu3VQInfo(codebook_size=hf_config.codebook_size, embed_dim=hf_config.embed_dim,
                      downsample=2 ** (len(hf_config.channel_multiplier) - 1),
                      temporal_downsample_factor=hf_config.temporal_downsample_factor,
                      output_mean=mean, output_std=std, hf_config=hf_config)
    module = Emu3VQDecoder(info, *modules)
    _load_strict(module, read_vq_state(checkpoint_dir), str(checkpoint_dir))
    return module.eval()


def _parse_yaml(path: Path) -> dict:
    """PyYAML when installed (not a specrt dependency), else `_tiny_yaml` (enough for vqgan.yaml)."""
    try:
        import yaml
    except ImportError:
        data = _tiny_yaml(path.read_text(), path)
    else:
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise SpecrtError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpecrtError(f"{path}: expected a mapping (taming VQModel config), got {type(data).__name__}")
    return data


def _scalar(text: str) -> Any:
    """A YAML scalar or flow list, as vqgan.yaml writes them: 1, 0.0, true, null, [1, 1, 2], name."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(t) for t in text[1:-1].split(",") if t.strip()]
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "~", ""):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("'\"")


def _tiny_yaml(text: str, path: Path) -> dict:
    """Block mappings by indentation, `- item` lists, flow lists and scalars; comments dropped.
    Only what taming's model configs use; anything else is refused with the line."""
    root: dict = {}
    stack: list[tuple[int, Any]] = [(-1, root)]  # (indent, container)
    pending: Optional[tuple[dict, str, int]] = None  # a `key:` whose value is the next, deeper block
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        body = line.strip()
        if pending is not None:
            parent, key, key_indent = pending
            pending = None
            if indent > key_indent or (body.startswith("- ") and indent >= key_indent):
                parent[key] = [] if body.startswith("- ") else {}
                stack.append((indent, parent[key]))
        while len(stack) > 1:
            top_indent, top = stack[-1]
            if not (indent < top_indent or (indent == top_indent and isinstance(top, list) and not body.startswith("- "))):
                break
            stack.pop()
        container = stack[-1][1]
        if body.startswith("- ") and isinstance(container, list):
            container.append(_scalar(body[2:]))
        elif ":" in body and isinstance(container, dict):
            key, _, value = body.partition(":")
            if value.strip():
                container[key.strip()] = _scalar(value)
            else:
                container[key.strip()] = None
                pending = (container, key.strip(), indent)
        else:
            raise SpecrtError(f"{path}:{number}: cannot read this line without PyYAML (pip install pyyaml): {body}")
    return root


def chameleon_vq_config(yaml_path: Path) -> TamingVQConfig:
    """vqgan.yaml (taming: model.params.{embed_dim, n_embed, ddconfig}) -> TamingVQConfig."""
    data = _parse_yaml(yaml_path)
    model = data.get("model", data)  # taming nests everything under model.params
    params = model.get("params", model) if isinstance(model, dict) else {}
    dd = params.get("ddconfig")
    if not isinstance(dd, dict):
        raise SpecrtError(f"{yaml_path}: no model.params.ddconfig (taming VQModel layout expected)")
    if params.get("remap") or dd.get("give_pre_end") or dd.get("tanh_out") or dd.get("attn_type", "vanilla") != "vanilla":
        raise SpecrtError(f"{yaml_path}: remap / give_pre_end / tanh_out / non-vanilla attention are not supported")
    try:
        ch_mult = tuple(int(m) for m in dd["ch_mult"])
        resolution = int(dd["resolution"])
        attn_res = {int(r) for r in dd.get("attn_resolutions") or ()}
        return TamingVQConfig(ch=int(dd["ch"]), ch_mult=ch_mult, num_res_blocks=int(dd["num_res_blocks"]),
                              z_channels=int(dd["z_channels"]), embed_dim=int(params["embed_dim"]),
                              n_embed=int(params["n_embed"]),
                              attn_levels=tuple(lv for lv in range(len(ch_mult)) if resolution // 2**lv in attn_res),
                              out_ch=int(dd.get("out_ch", 3)), l2_norm=False)
    except KeyError as exc:
        raise SpecrtError(f"{yaml_path}: ddconfig/params lacks {exc.args[0]!r}") from None


def load_chameleon_vqgan(ckpt_path: str | Path, yaml_path: str | Path) -> TamingVQDecoder:
    """Chameleon's VQGAN as Lumina-mGPT decodes with it (get_codebook_entry: a plain lookup, no
    normalisation; post_quant_conv; taming decoder). Lumina clamps the output to [-1, 1] before
    turning it into pixels; like every vq_decode we return it unclamped (about [-1, 1])."""
    ckpt_path, yaml_path = Path(ckpt_path), Path(yaml_path)
    for path in (ckpt_path, yaml_path):
        if not path.exists():
            raise SpecrtError(f"Chameleon's VQGAN decoder needs {path.name}: {path} not found")
    config = chameleon_vq_config(yaml_path)
    try:  # weights_only: a checkpoint cannot run code while it loads
        checkpoint = torch.load(str(ckpt_path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is the user's file
        raise SpecrtError(f"{ckpt_path}: cannot load as a tensors-only torch checkpoint ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise SpecrtError(f"{ckpt_path}: expected a state_dict (or a dict with 'state_dict')")
    wanted = ("quantize.embedding.", "post_quant_conv.", "decoder.")
    state = {k: v.float() for k, v in state.items() if k.startswith(wanted)}
    module = TamingVQDecoder(config)
    _load_strict(module, state, str(ckpt_path))
    return module.eval()


def find_vqgan(checkpoint_dir: Path, ckpt: Optional[Path] = None, yaml: Optional[Path] = None) -> tuple[Path, Path]:
    """The VQGAN's two files: those given, else the first directory among the checkpoint
    directory and its usual subfolders that holds both."""
    if ckpt is not None or yaml is not None:
        ckpt = ckpt or (yaml.parent / VQGAN_FILES[0])
        yaml = yaml or (ckpt.parent / VQGAN_FILES[1])
        return ckpt, yaml
    for sub in _VQGAN_SUBDIRS:
        folder = checkpoint_dir / sub
        if all((folder / name).exists() for name in VQGAN_FILES):
            return folder / VQGAN_FILES[0], folder / VQGAN_FILES[1]
    raise SpecrtError(f"{checkpoint_dir}: Chameleon / Lumina-mGPT images decode with Chameleon's VQGAN: put vqgan.ckpt and "
                      "vqgan.yaml (Lumina-mGPT's ckpts/chameleon/tokenizer/) in the checkpoint directory or pass their paths")


def load_unified_vq(checkpoint_dir: str | Path, architecture: str, vqgan_ckpt: Optional[str | Path] = None,
                    vqgan_yaml: Optional[str | Path] = None) -> nn.Module:
    """The image decoder of a unified-vocabulary checkpoint directory, ready for export_vq_decode.

    architecture: janus | emu3 | chameleon (or the config's class name). Chameleon's decoder is
    not in the Hugging Face weights: vqgan.ckpt + vqgan.yaml (found beside the checkpoint, or given).
    """
    checkpoint_dir = Path(checkpoint_dir)
    name = normalize_architecture(architecture)
    if name == "chameleon":
        ckpt, yaml = find_vqgan(checkpoint_dir, Path(vqgan_ckpt) if vqgan_ckpt else None,
                                Path(vqgan_yaml) if vqgan_yaml else None)
        return load_chameleon_vqgan(ckpt, yaml)
    config = read_json(checkpoint_dir / "config.json")
    return load_janus_vq(checkpoint_dir, config) if name == "janus" else load_emu3_vq(checkpoint_dir, config)
