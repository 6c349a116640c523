"""The continuous-token model family: a MAR-style transformer with a diffusion MLP head.

model.py     the torch modules (transformer step with a caller-owned KV cache, diffusion head)
export.py    the two ONNX graphs and the bundle that holds them (family "continuous")
"""
