"""Lazy imports of heavy optional dependencies.

The runtime must import on a Jetson with numpy + onnxruntime alone, so torch, onnx and
tensorrt are imported only when a feature needs them, with a message naming the extra to
install when they are missing.
"""
import importlib
from types import ModuleType

from specrt.errors import MissingDependency

_EXTRA_FOR = {
    "torch": "pip install 'specrt[export]' (GPU users: install a CUDA build of torch first)",
    "onnx": "pip install 'specrt[export]'",
    "onnxscript": "pip install 'specrt[export]'",
    "sklearn": "pip install 'specrt[export]'",
    "matplotlib": "pip install 'specrt[export]'",
    "tensorrt": "pip install 'specrt[trt]' (on Jetson, TensorRT comes with JetPack)",
    "polygraphy": "pip install 'specrt[trt]'",
    "onnxruntime": "pip install onnxruntime (or 'specrt[gpu]' for onnxruntime-gpu)",
}


def require(module_name: str, feature: str) -> ModuleType:
    """Import `module_name` or raise MissingDependency (a SpecrtError) saying which feature needs it and how to install it."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        top = module_name.split(".")[0]
        hint = _EXTRA_FOR.get(top, f"pip install {top}")
        raise MissingDependency(f"{feature} needs {top}, which is not installed: {hint}") from exc


def available(module_name: str) -> bool:
    """True when `module_name` can be imported (without raising for the caller)."""
    try:
        importlib.import_module(module_name)
    except ImportError:
        return False
    return True
