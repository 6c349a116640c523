"""specrt.export: checkpoint loaders for the models of specrt.models, the demo families, and the
ONNX exporter that turns them into a bundle. Needs the `export` extra (torch, onnx)."""
