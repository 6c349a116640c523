"""Plug-ins found by name: the registries of the runtime (model families, bundle backends) hold
dotted paths, "package.module:attribute", resolved here when first used.

Why by name: the runtime sits below the exporter, the engine builder and the CLI and imports none
of them, yet runs what they provide (TensorRT engines, onnxruntime's TensorRT provider options).
A registry line names the provider; importlib loads it on the call that needs it, so the runtime
imports with numpy alone, and a plug-in that cannot be loaded (its package missing, a name that
moved) is one line naming what was asked for instead of a traceback from deep inside an import.
"""
from __future__ import annotations

import importlib
from typing import Any

from specrt.errors import SpecrtError


def load(path: str, what: str) -> Any:
    """The object `path` names ("package.module:attribute", or a module alone), for `what` (how
    the error names the plug-in: "the trt backend"). A missing optional dependency the plug-in
    requires on import keeps its own message (specrt.lazy's MissingDependency: what to install)."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecrtError(f"{what} cannot be loaded: {module_name} does not import "
                          f"({(str(exc).splitlines() or ['no reason given'])[0]})") from exc
    if not attribute:
        return module
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise SpecrtError(f"{what} cannot be loaded: {module_name} has no {attribute}") from None
