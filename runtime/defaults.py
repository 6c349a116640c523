"""Sampling defaults per model family: the one table every path takes them from.

Why one table: the same checkpoint, seed and flags must give the same image on every path —
checkpoints on PyTorch (`specrt generate --target`, `Pipeline.from_torch`), the bundle that
`specrt export` writes (its manifest carries the defaults, so onnxruntime, TensorRT, the C
API and bench read them back), and `specrt bench`. Two paths starting from different
defaults sample different distributions without anyone noticing.

LlamaGen's defaults are those its own sampling scripts set (FoundationVision/LlamaGen,
autoregressive/sample/sample_c2i.py and sample_t2i.py). A model tuned elsewhere (the
embedded demo: demo.json) carries its own defaults as a `sampling_defaults` attribute,
which its loader sets; `defaults_of` prefers that. Explicit flags or keyword arguments
override single keys of whichever defaults apply (`Pipeline.generate`).
"""
from __future__ import annotations

from typing import Any

from specrt.errors import SpecrtError
from specrt.runtime.sampling import SamplingParams

# family -> (defaults, where they come from)
FAMILIES: dict[str, tuple[SamplingParams, str]] = {
    "llamagen-c2i": (SamplingParams(cfg_scale=4.0, temperature=1.0, top_k=2000, top_p=1.0),
                     "LlamaGen sample_c2i.py"),
    "llamagen-t2i": (SamplingParams(cfg_scale=7.5, temperature=1.0, top_k=1000, top_p=1.0),
                     "LlamaGen sample_t2i.py"),
}


def family_defaults(family: str) -> SamplingParams:
    """The sampling defaults of a model family ('llamagen-c2i', 'llamagen-t2i')."""
    try:
        return FAMILIES[family][0]
    except KeyError:
        raise SpecrtError(f"no sampling defaults for model family {family!r}; known: {', '.join(FAMILIES)}") from None


def family_of(model: Any) -> str:
    """The family key of a specrt GPT module (LlamaGen layout, c2i or t2i)."""
    return f"llamagen-{model.config.model_type}"


def defaults_of(model: Any) -> SamplingParams:
    """A GPT module's sampling defaults: its own (set by its loader, e.g. the demo's demo.json),
    else its family's."""
    own = getattr(model, "sampling_defaults", None)
    return own if own is not None else family_defaults(family_of(model))


def as_dict(params: SamplingParams) -> dict[str, float]:
    """The four keys as a manifest, a Pipeline and bench JSON store them."""
    return {"cfg_scale": params.cfg_scale, "temperature": params.temperature, "top_k": params.top_k,
            "top_p": params.top_p}


def describe(params: SamplingParams | dict) -> str:
    """'cfg 4.0, temperature 1.0, top-k 2000, top-p 1.0' for help texts and output lines; the keys
    a model family has (a continuous model has no top-k/top-p but a cfg_schedule), in that order."""
    p = as_dict(params) if isinstance(params, SamplingParams) else params
    parts = [f"cfg {p['cfg_scale']:g}", f"temperature {p['temperature']:g}"]
    if "top_k" in p:
        parts.append(f"top-k {int(p['top_k'])}")
    if "top_p" in p:
        parts.append(f"top-p {p['top_p']:g}")
    if "cfg_schedule" in p:
        parts.append(f"cfg schedule {p['cfg_schedule']}")
    return ", ".join(parts)


def families_help() -> list[str]:
    """One line per family for `--help`: 'llamagen-c2i: cfg 4, ... (LlamaGen sample_c2i.py)'."""
    return [f"{family}: {describe(params)} ({source})" for family, (params, source) in FAMILIES.items()]
