"""The continuous-token model family: a MAR-style transformer with a diffusion MLP head.

model.py        the torch modules (transformer step with a caller-owned KV cache, diffusion head)
autoencoder.py  the KL autoencoder whose decoder turns continuous tokens into pixels
"""
