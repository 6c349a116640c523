"""Data-only package: the unified demo's target, a Hugging Face Chameleon checkpoint directory (config, weights, tokenizer)."""
