"""`specrt generate --method auto [--relaxed] [--remeasure]`: the flags, the cache key's parts,
and the one call to runtime.choosing.choose_method.

What names a choice (runtime/choosing/cache.py keys it): the models (a BUNDLE's manifest digest,
which holds every graph's sha256; the demo's weights digest; checkpoint files by path, size and
time), the device and how it runs (backend, torch device, threads, loop, compiled step, largest
window), the batch (--num-images × conditions: the images one call decodes together), the
sampling and the guarantee. --relaxed and --remeasure say something only about auto: given with
another method they are one line and exit 2, as is a --param that is not a sampling key (auto
chooses the method's parameters itself).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from specrt.errors import SpecrtError

AUTO = "auto"


@dataclass(frozen=True)
class AutoRequest:
    """--method auto's own flags, checked before a model loads."""

    relaxed: bool = False
    remeasure: bool = False

    @classmethod
    def checked(cls, method: str, relaxed: bool, remeasure: bool, params: dict[str, str],
                sampling_keys: tuple[str, ...]) -> Optional["AutoRequest"]:
        """The request when --method auto is given (None otherwise); SpecrtError for --relaxed or
        --remeasure without it, and for a method parameter with it."""
        if method != AUTO:
            for flag, given in (("--relaxed", relaxed), ("--remeasure", remeasure)):
                if given:
                    raise SpecrtError(f"{flag} applies to --method auto (a method named by --method is lossless or "
                                      f"relaxed by itself: docs/concepts/methods.md)")
            return None
        chosen = sorted(k for k in params if k not in sampling_keys)
        if chosen:
            raise SpecrtError(f"--param {chosen[0]}: --method auto chooses the method's parameters itself; name a "
                              f"method to set them (only sampling keys may go with auto)")
        return cls(relaxed, remeasure)


def model_identity(kind: str, manifest: Any, demo: Optional[str], files: tuple[Optional[Path], ...]) -> str:
    """What names the models a choice was measured on: a BUNDLE's manifest (its graphs' sha256 are
    in it), the embedded demo's weights, or checkpoint files by path, size and modification time."""
    if manifest is not None:
        digest = hashlib.sha256(json.dumps(manifest.raw, sort_keys=True, default=str).encode()).hexdigest()[:24]
        return f"bundle {digest}"
    if kind == "demo":
        from specrt.bench.models import demo_weights_dir, weights_digest

        return f"demo {demo or 'c2i'} {weights_digest(demo_weights_dir(None, demo))}"
    parts = []
    for path in (p for p in files if p is not None):
        entries = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        parts += [f"{p.resolve()} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in entries]
    return "checkpoints " + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def how_it_runs(run: Any, bundle: Optional[Path]) -> tuple[str, str]:
    """(device, backend) of the cache key: the machine (the GPU's name on CUDA) and every run flag
    that changes a step's cost."""
    from specrt.runtime.machine import device_name

    backend = run.backend or ("ort" if bundle is not None else "torch")
    torch_device = (run.device or "cpu").strip().lower()
    on_gpu = torch_device.startswith("cuda") or backend in ("ort-cuda", "ort-trt", "trt")
    device = device_name("torch-cuda" if torch_device.startswith("cuda") else backend) if on_gpu else device_name("cpu")
    return device, (f"{backend}, device {torch_device}, threads {run.threads}, loop {run.loop}, "
                    f"compile {run.compile_step}, max window {run.max_window}")


def choose(request: AutoRequest, pipe: Any, identity: str, run: Any, bundle: Optional[Path],
           conditions: dict[str, Any], sampling: dict[str, Any], takes_prompts: bool,
           say: Callable[[str], None]) -> Any:
    """runtime.choosing.choose_method for the call the flags describe: its images (`conditions`,
    generate's condition keyword) are the batch; a prompt model is measured on the call's own
    prompts, a class-conditional one on every class. Progress lines go to `say`."""
    from specrt.runtime.choosing import choose_method

    (rows,) = conditions.values()
    batch = len(rows[0]) if isinstance(rows, tuple) else len(rows)
    device, backend = how_it_runs(run, bundle)
    return choose_method(pipe, batch=min(batch, getattr(pipe, "max_images", None) or batch), relaxed=request.relaxed,
                         sampling=sampling, conditions=conditions if takes_prompts else None, identity=identity,
                         device=device, backend=backend, remeasure=request.remeasure, progress=say)


def closing_note(choice: Any) -> dict[str, Any]:
    """What the closing line and --stats say about the choice."""
    return {"chose": choice.label, "method": choice.method, "params": choice.params,
            "predicted_speedup": round(choice.predicted_speedup, 4), "guarantee": choice.guarantee,
            "measured_now": choice.measured, "cache": str(choice.cache_path) if choice.cache_path else None}
