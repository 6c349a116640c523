"""The continuous demo's hooks ("mar"): how each command reaches the MAR-style digits demo.

The same hook names as the c2i demo's (packaged weights and sampling defaults, a PyTorch
pipeline, a bundle export, the fidelity judge, bench conditions, training), so a demo
registry can list it beside the others. Imports without torch (the --help texts read the
sampling defaults); everything heavy is imported on use.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from specrt.export.demo.dataset import NUM_CLASSES
from specrt.export.mar.packaged import packaged_sampling_defaults, packaged_weights_dir

__all__ = ["packaged_weights_dir", "packaged_sampling_defaults", "torch_pipeline", "export_bundle", "fidelity_judge",
           "bench_conditions", "train", "format_quality"]

FAMILY = "continuous"
SUMMARY = "class-conditional digits from continuous tokens (KL autoencoder, MAR-style target and draft; ar, cspd)"


def torch_pipeline(weights: Optional[Path] = None, threads: Optional[int] = 1, device: Optional[str] = None,
                   **_options: Any) -> Any:
    """A ContinuousPipeline over the demo's PyTorch modules (runners and decoder on torch), on the
    CPU or on the torch `device` (cuda: where its pipeline's "auto" loop runs the device round, a
    CUDA graph), with `threads` intra-op threads (1 by default: the modules are tiny, and on a busy
    CPU torch's default threading made one cspd image 10× slower). The other options of the
    demos' hook (compile, max_window) do not apply to it: runtime.families.continuous's
    torch_options."""
    from specrt.export.mar.demo import load_mar_demo
    from specrt.lazy import require
    from specrt.runtime.families.continuous.torch_runner import torch_runners
    from specrt.runtime.families.continuous.pipeline import ContinuousPipeline
    from specrt.runtime.threads import set_torch_threads

    torch = require("torch", "the continuous demo")
    set_torch_threads(threads)
    demo = load_mar_demo(weights)
    decoder_module = demo.autoencoder.decoder_only().eval()
    if device is not None:
        decoder_module = decoder_module.to(device)
    on = next(decoder_module.parameters()).device

    def decode(tokens):
        with torch.inference_mode():
            return decoder_module(torch.from_numpy(tokens).to(on)).cpu().numpy()
    target, draft = torch_runners(demo.target, demo.draft, device)
    return ContinuousPipeline(target, draft, decode, demo.sampling_defaults,
                              "the mar demo" if weights is None else f"mar demo weights {weights}")


def export_bundle(out_dir: Path, weights: Optional[Path] = None) -> Path:
    """The demo as a continuous bundle: target and draft step/head graphs, the tokenizer decoder,
    the sampling defaults (written atomically, export.mar.export)."""
    from specrt.export.mar.demo import load_mar_demo
    from specrt.export.mar.export import export_bundle as write

    demo = load_mar_demo(weights)
    source = "demo:mar" if weights is None else f"{weights}:mar"
    return write(demo.target, demo.draft, out_dir, decoder=demo.autoencoder.decoder_only(),
                 sampling_defaults=demo.sampling_defaults, source=source)


def fidelity_judge(weights: Optional[Path] = None) -> Any:
    """The c2i demo's judge (evaluator accuracy, Fréchet distance vs held-out real digits): it
    judges images, whichever model made them."""
    from specrt.export.demo.fidelity import FidelityJudge

    return FidelityJudge.from_demo(None)


def bench_conditions(count: int) -> list[int]:
    """Image i asks for class i mod 10."""
    return [i % NUM_CLASSES for i in range(count)]


def train(out_dir: Optional[Path], seed: int = 0, steps_scale: float = 1.0, threads: int = 1,
          evaluate: bool = True) -> Any:
    """`specrt demo train --demo mar`: autoencoder, target and draft from scratch (≤ 60 min, 1 thread)."""
    from specrt.export.mar.demo import train_mar_demo

    return train_mar_demo(out_dir, seed=seed, steps_scale=steps_scale, evaluate=evaluate, threads=threads)


def format_quality(quality: dict) -> str:
    return (f"evaluator accuracy: AR samples {quality['ar_sample_accuracy']:.3f} "
            f"({quality['samples_per_class']}/class), autoencoder reconstructions "
            f"{quality['reconstruction_accuracy']:.3f}, real held-out {quality['held_out_real_accuracy']:.3f}")
