"""EAGLE heads on disk: LANTERN's drafter layout in, the same layout out.

A LANTERN drafter directory holds `config.json` (HF Llama keys: hidden_size,
num_attention_heads, num_key_value_heads, intermediate_size, rms_norm_eps, vocab_size,
input_type, optional `bias` for fc) and `pytorch_model.bin` or `model.safetensors` with the
keys of EagleHead.state_dict(). `specrt train-draft` writes the same directory (plus a
`specrt` section in config.json: training state and the target it was trained for), so the
exporter and `Pipeline.from_torch` read LANTERN's drafters and ours through one loader.
A single weight file works too (its config from `X.json` beside `X.safetensors`, or
config.json); without a config the head count comes from the target.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

import torch

from specrt.errors import SpecrtError
from specrt.export.checkpoints import _load_into, load_state_dict
from specrt.models.eagle_head import EagleConfig, EagleHead
from specrt.models.llamagen_gpt import GPT

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _weights_and_config(path: Path) -> tuple[Path, dict]:
    if path.is_dir():
        weights = next((path / n for n in WEIGHT_FILES if (path / n).is_file()), None)
        if weights is None:
            raise SpecrtError(f"EAGLE head directory {path} has no {' or '.join(WEIGHT_FILES)}")
        config_path = path / CONFIG_FILE
    elif path.is_file():  # its own X.json beside X.safetensors (the packaged demo head), else config.json
        weights, config_path = path, path.with_suffix(".json")
        if not config_path.is_file():
            config_path = path.parent / CONFIG_FILE
    else:
        raise SpecrtError(f"EAGLE head not found: {path}")
    config: dict = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise SpecrtError(f"cannot read {config_path}: {exc}") from None
    return weights, config


def head_config(config: dict, state: dict, target: GPT) -> EagleConfig:
    """The head's sizes: LANTERN's config.json where present, else the weights and the target."""
    t = target.config
    fc = state.get("fc.weight")
    gate = state.get("layers.0.mlp.gate_proj.weight")
    dim = int(config.get("hidden_size", fc.shape[0] if fc is not None else t.dim))
    if dim != t.dim or int(config.get("vocab_size", t.vocab_size)) != t.vocab_size:
        raise SpecrtError(f"EAGLE head (hidden {dim}, vocab {config.get('vocab_size', t.vocab_size)}) does not fit "
                          f"the target (dim {t.dim}, vocab {t.vocab_size})")
    kind = config.get("input_type", t.model_type)
    if kind.startswith("t2i") != (t.model_type == "t2i"):
        raise SpecrtError(f"EAGLE head is for {kind} models, the target is {t.model_type}")
    n_head = int(config.get("num_attention_heads", t.n_head))
    try:
        return EagleConfig(
            dim=dim, n_head=n_head, n_kv_head=int(config.get("num_key_value_heads", n_head)),
            ffn_hidden=int(config.get("intermediate_size", gate.shape[0] if gate is not None else t.ffn_hidden)),
            vocab_size=t.vocab_size, grid_size=t.grid_size, cond_len=t.cond_len,
            norm_eps=float(config.get("rms_norm_eps", 1e-6)), rope_base=t.rope_base,
            fc_bias=bool(config.get("bias", True)), model_type=t.model_type)
    except ValueError as exc:
        raise SpecrtError(str(exc)) from None


def load_eagle_head(source: Union[str, Path], target: GPT) -> EagleHead:
    """An EAGLE head (LANTERN layout, directory or weight file) tied to `target`'s lm_head, in eval mode.

    The head's own `embed_tokens` is used when the file has it (LANTERN saves it), else the
    target's. A file whose keys or shapes do not fit is one SpecrtError naming them.
    """
    weights, config = _weights_and_config(Path(source))
    state = load_state_dict(weights)
    head = EagleHead(head_config(config, state, target)).tie_to(target)
    if "embed_tokens.weight" not in state:
        state = {**state, "embed_tokens.weight": head.embed_tokens.weight.detach().clone()}
    _load_into(head, state, "an EAGLE head (LANTERN's cnets_llamagen layout)",
               lambda: "expected embed_tokens, fc.weight/bias, layers.0.self_attn.{q,k,v,o}_proj, "
                       "layers.0.mlp.{gate,up,down}_proj, layers.0.post_attention_layernorm")
    return head.to(target.output.weight.dtype).eval()


def packaged_demo_head() -> Path:
    """The EAGLE head trained here for the c2i demo target (`specrt train-draft`), shipped as
    export/demo/weights/eagle.safetensors + eagle.json."""
    from specrt.export.demo import packaged_weights_dir

    return Path(packaged_weights_dir()) / "eagle.safetensors"


def resolve_head(source: Union[str, Path]) -> Path:
    """A head argument as the CLI takes it: a path, or `demo` for the packaged demo head."""
    return packaged_demo_head() if str(source) == "demo" else Path(source)


def lantern_config(config: EagleConfig) -> dict[str, Any]:
    """config.json in LANTERN's (HF Llama) keys."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": config.dim, "intermediate_size": config.ffn_hidden,
            "num_attention_heads": config.n_head, "num_key_value_heads": config.n_kv_head,
            "num_hidden_layers": 1, "rms_norm_eps": config.norm_eps, "vocab_size": config.vocab_size,
            "bias": config.fc_bias, "input_type": config.model_type, "rope_scaling": None, "pretraining_tp": 1}


def save_eagle_head(head: EagleHead, out: Union[str, Path], extra: Optional[dict] = None,
                    dtype: torch.dtype = torch.float32) -> Path:
    """Write `out/` = config.json (LANTERN keys + `specrt`: extra) + model.safetensors, atomically per file."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in head.state_dict().items()}
    tmp = out / "model.safetensors.tmp"
    save_file(state, str(tmp))
    tmp.replace(out / "model.safetensors")
    config = {**lantern_config(head.config), "specrt": extra or {}}
    tmp = out / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(config, indent=2))
    tmp.replace(out / CONFIG_FILE)
    return out
