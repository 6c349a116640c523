"""Data-only package: the t2i demo's T5 text encoder as a transformers directory (config, weights, tokenizer)."""
