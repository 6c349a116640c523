"""Data-only package: the committed t2i demo weights (demo.json, *.safetensors, text_encoder/), shipped as package data."""
