"""Data-only package: the committed demo weights (demo.json + *.safetensors), shipped as package data."""
