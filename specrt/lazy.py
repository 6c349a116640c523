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
    "scipy": "pip install 'specrt[export]'",
    "onnxruntime": "pip install onnxruntime (or 'specrt[gpu]' for onnxruntime-gpu)",
    "transformers": "pip install 'specrt[t2i]' (or 'specrt[unified]')",
    "tokenizers": "pip install 'specrt[t2i]' or 'specrt[unified]' (a bundle's own text encoder or prompts need only "
                  "tokenizers)",
    "modelopt": "pip install 'specrt[quant]'",
    "onnx_graphsurgeon": "pip install 'specrt[quant]'",
    "pytriton": "pip install 'specrt[serve]' in a venv made with the system python3.11 (docs/guides/serve-triton.md)",
    "tritonclient": "pip install 'specrt[serve]'",
    "cuda": "pip install 'specrt[trt]'",
}


def require(module_name: str, feature: str) -> ModuleType:
    """Import `module_name` or raise MissingDependency (a SpecrtError), one line saying what is missing,
    what needs it and how to install it: `transformers is not installed (needed for T5 text
    encoders): pip install 'specrt[t2i]'`."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        top = module_name.split(".")[0]
        hint = _EXTRA_FOR.get(top, f"pip install {top}")
        raise MissingDependency(f"{top} is not installed (needed for {feature}): {hint}") from exc


def available(module_name: str) -> bool:
    """True when `module_name` can be imported (without raising for the caller)."""
    try:
        importlib.import_module(module_name)
    except ImportError:
        return False
    return True
