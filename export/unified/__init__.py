"""Unified-vocabulary image generators (Janus / Janus-Pro, Emu3, Lumina-mGPT / Chameleon) from
Hugging Face checkpoint directories: config (config.py), language model (model.py), weights
(weights.py). The contract is docs/contracts.md, "Unified-vocabulary models"."""
from specrt.export.unified.config import SUPPORTED, UnifiedConfig, read_config
from specrt.export.unified.model import UnifiedLM
from specrt.export.unified.weights import load_unified

__all__ = ["SUPPORTED", "UnifiedConfig", "UnifiedLM", "load_unified", "read_config"]
