"""specrt.export: PyTorch reference models (LlamaGen GPT, VQ-16, the demo family) and the
ONNX exporter that turns them into a bundle. Needs the `export` extra (torch, onnx)."""
