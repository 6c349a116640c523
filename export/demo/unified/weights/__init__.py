"""Data-only package: the committed unified demo (demo.json; target/ and draft/ Hugging Face Chameleon checkpoint directories), shipped as package data."""
