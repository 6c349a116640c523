"""The embedded demos by name: what `--demo NAME` means for generate, export, bench and demo.

Each demo is a module with the same small set of hooks, imported only when the demo is used
(so `specrt --help` and the registry itself need no torch):

    packaged_weights_dir() -> Path          the committed weights (inside the package)
    packaged_sampling_defaults() -> dict    from its JSON, without torch (for --help)
    model_set(weights) -> ModelSet          what `specrt export --demo NAME` writes
    torch_pipeline(weights, **kw) -> Pipeline   `specrt generate --demo NAME` without a BUNDLE
    fidelity_judge(weights) -> judge        how `specrt bench --demo NAME` scores images
    bench_conditions(count) -> list         image i's condition, as `specrt bench` plans it by default
                                            (class i mod 10; the t2i default prompts, cycled)
    train(out_dir, seed, steps_scale, threads, evaluate) -> models   `specrt demo train --demo NAME`
    format_quality(quality) -> str          how `specrt demo train` prints the weights' "quality"

`weights` is None for the packaged weights or a `specrt demo train` output folder. A demo
that lacks a hook answers the command that needs it with a one-line SpecrtError (`hook`).
Adding a demo = one entry in DEMOS and one module.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from specrt.errors import SpecrtError


@dataclass(frozen=True)
class DemoEntry:
    """One demo: its name on the command line, one line for --help, and its hooks module."""

    name: str
    summary: str
    module: str

    def hooks(self) -> ModuleType:
        return importlib.import_module(self.module)

    def hook(self, name: str) -> Callable[..., Any]:
        """The demo's hook `name`, or a one-line error saying this demo does not do that."""
        fn = getattr(self.hooks(), name, None)
        if fn is None:
            raise SpecrtError(f"the {self.name} demo has no {name.replace('_', ' ')} (demos: {describe()})")
        return fn


DEMOS: dict[str, DemoEntry] = {
    "c2i": DemoEntry("c2i", "class-conditional digits (LlamaGen c2i GPTs + VQ)", "specrt.export.demo.c2i"),
    "mar": DemoEntry("mar", "class-conditional digits from continuous tokens (KL autoencoder, MAR-style target "
                            "and draft; methods ar, cspd)", "specrt.export.mar.hooks"),
    "t2i": DemoEntry("t2i", "captioned digits, e.g. \"a thick slanted seven\" (LlamaGen t2i GPTs, "
                            "a small T5 text encoder, VQ)", "specrt.export.demo.t2i"),
    "chameleon": DemoEntry("chameleon", "captioned digits from one text+image vocabulary, e.g. \"a thin two\" "
                                        "(Chameleon-architecture target and draft in Lumina-mGPT's format, row-end "
                                        "tokens, the t2i demo's VQ)", "specrt.export.demo.unified.hooks"),
}
DEFAULT_DEMO = "c2i"


def demo_names() -> tuple[str, ...]:
    return tuple(DEMOS)


def get_demo(name: str | None) -> DemoEntry:
    """The registered demo `name` (None: the default), or a one-line error listing the names."""
    name = name or DEFAULT_DEMO
    if name not in DEMOS:
        raise SpecrtError(f"unknown demo {name!r}; choose from {', '.join(DEMOS)}")
    return DEMOS[name]


def describe() -> str:
    """'c2i (class-conditional ...), t2i (...)' for help texts and errors."""
    return ", ".join(f"{d.name}" for d in DEMOS.values())


def help_text() -> str:
    """The --demo option's help: every demo with its one-line summary."""
    return "Embedded demo to use (no BUNDLE or checkpoints): " + "; ".join(
        f"{d.name}: {d.summary}" for d in DEMOS.values()) + f". Default {DEFAULT_DEMO}."
