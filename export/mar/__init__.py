"""Exporting the continuous-token model family (the torch modules are specrt.models.mar).

export.py    the two ONNX graphs and the bundle that holds them (family "continuous")
"""
