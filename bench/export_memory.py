"""Peak memory of `specrt export` on a random-weight unified model of ~1.1B parameters.

    python bench/export_memory.py [--work /tmp/specrt-1b] [--dtype float16] [--keep]

Builds an Emu3-layout checkpoint with transformers' own classes (TinyLlama's dims: hidden 2048,
22 layers, 32 heads / 4 KV heads, SwiGLU 5632; a 40960-token vocabulary holding 8192 visual
tokens; random weights, saved with save_pretrained in bfloat16), then runs
`specrt export --target CKPT --dtype DTYPE` in a child process whose peak RSS the kernel keeps
(getrusage of the children, ru_maxrss: the high-water mark, so nothing between samples is missed).
Prints weights bytes (the language model's parameters in the export dtype), peak RSS, their
ratio, the export's wall time and the bundle's size on disk; docs/large-models.md has the
figures of one run. Needs ~2.3 GB of disk for the checkpoint plus the bundle (~4.6 GB at
float16, ~9.1 GB at float32: prefill and step each carry the weights); both are deleted
afterwards unless --keep.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

# TinyLlama-1.1B's trunk; the vocabulary is a Chameleon/Emu3-like text + visual one
DIMS = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
            num_key_value_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-5)
TEXT_TOKENS, VISUAL_TOKENS = 32768, 8192
GRID = "16x16"


def build_checkpoint(path: Path) -> Path:
    """An Emu3-Gen-layout Hugging Face directory with random weights (bf16 safetensors, tokenizer.json)."""
    import torch
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    names = ["<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<|image start|>", "<|image end|>",
             "<|image token|>", "<|extra_200|>", "<|extra_201|>", "<image>", "<unk>", "*"]
    vocab = {name: i for i, name in enumerate(names)}
    for n in range(10):
        vocab[str(n)] = len(vocab)
    while len(vocab) < TEXT_TOKENS:
        vocab[f"w{len(vocab)}"] = len(vocab)
    for code in range(VISUAL_TOKENS):
        vocab[f"<|visual token {code:06d}|>"] = len(vocab)
    text = dict(DIMS, vocab_size=len(vocab), pad_token_id=vocab["<|endoftext|>"],
                bos_token_id=vocab["<|extra_203|>"], eos_token_id=vocab["<|extra_204|>"],
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, attention_dropout=0.0)
    vq = dict(codebook_size=VISUAL_TOKENS, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 2],
              num_res_blocks=1, attn_resolutions=[], hidden_size=64, num_attention_heads=1,
              temporal_downsample_factor=4)
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=dict(vocab))
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # build in bf16: half the builder's memory, same checkpoint
    try:
        model = Emu3ForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(previous)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    del model
    special = [n for n in names if n != "*"] + [n for n in vocab if n.startswith("<|visual")]
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    tok.save(str(path / "tokenizer.json"))
    return path


def language_model_parameters(path: Path) -> int:
    """Parameters of the checkpoint's language model (the VQ's are exported too, but are small)."""
    from safetensors import safe_open

    total = 0
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if "vqmodel" not in key:
                    total += _numel(handle.get_slice(key).get_shape())
    return total


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores {cpu}, {memory:.0f} GiB RAM"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/specrt-export-memory"))
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and the bundle")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    ns = parser.parse_args()

    ckpt, bundle = ns.work / "checkpoint", ns.work / f"bundle-{ns.dtype}"
    if not (ckpt / "config.json").is_file():
        started = time.monotonic()
        print(f"building a random ~1.1B-parameter Emu3-layout checkpoint in {ckpt} ...", flush=True)
        build_checkpoint(ckpt)
        print(f"  built in {time.monotonic() - started:.0f} s", flush=True)
    params = language_model_parameters(ckpt)
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[ns.dtype]
    weights = params * itemsize
    shutil.rmtree(bundle, ignore_errors=True)
    cmd = [sys.executable, "-m", "specrt.cli", "export", "--target", str(ckpt), "--out", str(bundle),
           "--dtype", ns.dtype, "--grid", GRID, "--max-prompt-tokens", "64", "--threads", str(ns.threads)]
    print(f"exporting ({ns.dtype}) in a child process ...", flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.monotonic() - started
    print(proc.stdout, end="")
    if proc.returncode != 0:
        raise SystemExit(f"export failed (exit {proc.returncode})")
    # the high-water mark of the children waited for: the export is this process's only child
    peak = [resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024]
    disk = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    figures = {"machine": _machine(), "parameters": params, "dtype": ns.dtype, "weights_bytes": weights,
               "peak_rss_bytes": peak[-1], "ratio": round(peak[-1] / weights, 3), "export_seconds": round(seconds, 1),
               "bundle_bytes": disk, "files": {f.name: f.stat().st_size for f in sorted(bundle.iterdir())}}
    print(f"\nmachine      {figures['machine']}")
    print(f"parameters   {params / 1e9:.3f} B (language model)")
    print(f"weights      {weights / 2**30:.2f} GiB ({ns.dtype})")
    print(f"peak RSS     {peak[-1] / 2**30:.2f} GiB")
    print(f"ratio        {figures['ratio']:.2f}x the weights")
    print(f"export time  {seconds:.0f} s")
    print(f"bundle       {disk / 2**30:.2f} GiB on disk")
    if ns.json:
        ns.json.write_text(json.dumps(figures, indent=2) + "\n")
    if not ns.keep:
        shutil.rmtree(bundle, ignore_errors=True)
        shutil.rmtree(ckpt, ignore_errors=True)


if __name__ == "__main__":
    main()
