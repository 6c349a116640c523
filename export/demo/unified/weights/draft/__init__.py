"""Data-only package: the unified demo's draft, a Hugging Face Chameleon checkpoint directory (config, weights, tokenizer)."""
