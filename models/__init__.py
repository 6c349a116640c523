"""specrt.models: the PyTorch model definitions the exporter and the PyTorch backend share.

LlamaGen's GPT (with its caller-owned KV cache and RoPE tables), its VQ tokenizer, LANTERN's
codebook-neighbour table, the EAGLE draft head, and the MAR-style continuous family. They sit below both the
runtime and the exporter, so the runtime's PyTorch backend runs the very modules export
traces without importing the exporter. Needs torch (the `export` extra) where a model is built.
"""
