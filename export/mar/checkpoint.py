"""LTH14/mar checkpoints (models/mar.py, models/diffloss.py) read into specrt's MAR-style model.

What maps, and how (facts from LTH14/mar's module definitions; no code of theirs is used):
- the diffusion head `diffloss.net.*` (SimpleMLPAdaLN) maps key for key onto ours, with two
  stated differences: MAR's head predicts [ε, learned variance] (out_channels = 2C); specrt
  keeps the ε rows of `final_layer.linear` and samples with the fixed σ_t² = β_t (why:
  runtime/families/continuous/formulas.py needs each step's density). Its timestep features are 256 wide
  (`head_freq_dim` 256) and its timesteps are those of MAR's 1000-step cosine training chain:
  specrt runs that chain unrespaced (`diffusion_steps` 1000); MAR's respaced sampling
  (num_sampling_steps 100) is not supported.
- `class_emb`, `fake_latent` (CFG's unconditional row) and `z_proj` map directly.
- The transformer maps only when it is the causal raster-order variant in MAR's names: one stack
  `encoder_blocks.N` (timm Block: norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2),
  `encoder_norm`, `z_proj_ln` (optional), `encoder_pos_embed_learned` [1, seq_len + 1, D] (class
  at position 0, i.e. buffer_size 1), and no decoder. MAR's released models are its masked
  bidirectional encoder–decoder (`decoder_blocks`, `mask_token`, `decoder_embed`, buffer_size 64,
  random order, several tokens per step): they have no causal counterpart, and loading them is
  refused in one line (their diffusion head alone loads with `load_mar_head`).
Checkpoint files: MAR saves {'model': ..., 'model_ema': ...}; the EMA weights (what MAR
evaluates with) are used when present.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from specrt.errors import SpecrtError
from specrt.models.mar.model import MAR, MARConfig, SimpleMLPAdaLN

MAR_TRAIN_STEPS = 1000
MAR_FREQ_DIM = 256
DECODER_KEYS = ("decoder_blocks.0.norm1.weight", "mask_token", "decoder_embed.weight")
# timm Block names -> ours (the rest of a block's names are the same)
_BLOCK = {"mlp.fc1": "mlp.0", "mlp.fc2": "mlp.2"}


def read_mar_state(source: str | Path | dict) -> dict[str, torch.Tensor]:
    """The state dict of a MAR checkpoint file (model_ema preferred) or of a dict already loaded."""
    if isinstance(source, dict):
        state = source
    else:
        try:
            state = torch.load(str(source), map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, ValueError) as err:
            raise SpecrtError(f"cannot read MAR checkpoint {source}: {str(err).splitlines()[0]}") from None
    for key in ("model_ema", "model"):
        if isinstance(state.get(key), dict):
            state = state[key]
            break
    if "diffloss.net.input_proj.weight" not in state:
        raise SpecrtError(f"{source if not isinstance(source, dict) else 'state dict'} is not an LTH14/mar checkpoint "
                          "(no diffloss.net.input_proj.weight)")
    return state


def _count(state: dict, prefix: str) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    return max(found) + 1 if found else 0


def head_config(state: dict) -> dict[str, Any]:
    """The MARConfig fields of a MAR diffusion head, read from its shapes."""
    width, channels = state["diffloss.net.input_proj.weight"].shape
    out = state["diffloss.net.final_layer.linear.weight"].shape[0]
    if out not in (channels, 2 * channels):
        raise SpecrtError(f"MAR head outputs {out} channels for {channels}-channel tokens (expected {channels} or {2 * channels})")
    return {"token_dim": int(channels), "head_width": int(width), "head_depth": _count(state, "diffloss.net.res_blocks."),
            "head_freq_dim": int(state["diffloss.net.time_embed.mlp.0.weight"].shape[1]),
            "diffusion_steps": MAR_TRAIN_STEPS, "schedule": "cosine"}


def head_state(state: dict) -> dict[str, torch.Tensor]:
    """`diffloss.net.*` as our head's keys; the learned-variance rows of the final layer dropped."""
    channels = state["diffloss.net.input_proj.weight"].shape[1]
    out = {}
    for key, value in state.items():
        if key.startswith("diffloss.net."):
            if key.startswith("diffloss.net.final_layer.linear."):
                value = value[:channels]
            out[key[len("diffloss.net."):]] = value.float()
    return out


def load_mar_head(source: str | Path | dict) -> tuple[SimpleMLPAdaLN, MARConfig]:
    """The diffusion head of any LTH14/mar checkpoint as specrt's head (ε only) and its config."""
    state = read_mar_state(source)
    z_dim = int(state["diffloss.net.cond_embed.weight"].shape[1])
    cfg = MARConfig(dim=z_dim, n_head=1, **head_config(state))
    head = SimpleMLPAdaLN(cfg)
    head.load_state_dict(head_state(state), strict=True)
    return head.eval(), cfg


def load_mar_checkpoint(source: str | Path | dict, n_head: int) -> MAR:
    """A causal MAR-layout checkpoint as specrt's MAR (`n_head`: the checkpoint cannot say it).
    MAR's masked encoder–decoder models are refused in one line (see the module docstring)."""
    state = read_mar_state(source)
    where = source if not isinstance(source, dict) else "this checkpoint"
    if any(k in state for k in DECODER_KEYS):
        buffer = state["encoder_pos_embed_learned"].shape[1] - state["diffusion_pos_embed_learned"].shape[1] \
            if "diffusion_pos_embed_learned" in state and "encoder_pos_embed_learned" in state else "?"
        raise SpecrtError(f"{where} is MAR's masked bidirectional encoder-decoder ({_count(state, 'encoder_blocks.')} "
                          f"encoder + {_count(state, 'decoder_blocks.')} decoder blocks, mask_token, buffer_size {buffer}): "
                          "specrt runs only the causal raster-order variant (one encoder stack, buffer_size 1); "
                          "load_mar_head reads its diffusion head")
    missing = [k for k in ("class_emb.weight", "fake_latent", "z_proj.weight", "encoder_pos_embed_learned",
                           "encoder_norm.weight") if k not in state]
    if missing:
        raise SpecrtError(f"{where} lacks {', '.join(missing)}: not a causal MAR-layout checkpoint")
    num_classes, dim = state["class_emb.weight"].shape
    positions = state["encoder_pos_embed_learned"].shape[1]
    cfg = MARConfig(seq_len=positions - 1, dim=int(dim), n_layer=_count(state, "encoder_blocks."), n_head=n_head,
                    mlp_ratio=state["encoder_blocks.0.mlp.fc1.weight"].shape[0] / dim, num_classes=int(num_classes),
                    input_norm="z_proj_ln.weight" in state, **head_config(state))
    ours = {f"diffloss.net.{k}": v for k, v in head_state(state).items()}
    renames = {"class_emb.": "transformer.class_emb.", "z_proj.": "transformer.z_proj.",
               "z_proj_ln.": "transformer.z_proj_ln.", "encoder_norm.": "transformer.norm."}
    unmapped = []
    for key, value in state.items():
        if key.startswith("diffloss.net."):
            continue
        if key == "fake_latent":
            ours["transformer.fake_latent"] = value.float()
        elif key == "encoder_pos_embed_learned":
            ours["transformer.pos_embed"] = value.float()
        elif key.startswith("encoder_blocks."):
            name = key.replace("encoder_blocks.", "transformer.blocks.", 1)
            for theirs, mine in _BLOCK.items():
                name = name.replace(f".{theirs}.", f".{mine}.")
            ours[name] = value.float()
        elif prefix := next((p for p in renames if key.startswith(p)), None):
            ours[renames[prefix] + key[len(prefix):]] = value.float()
        else:
            unmapped.append(key)
    if unmapped:
        raise SpecrtError(f"{where}: no counterpart in specrt's causal model for {', '.join(sorted(unmapped)[:4])}"
                          + (f" and {len(unmapped) - 4} more" if len(unmapped) > 4 else ""))
    model = MAR(cfg)
    try:
        model.load_state_dict(ours, strict=True)
    except RuntimeError as err:
        raise SpecrtError(f"{where}: shapes do not fit a causal MAR of dim {dim}, {cfg.n_layer} layers, "
                          f"{n_head} heads: {str(err).splitlines()[-1].strip()}") from None
    return model.eval()
