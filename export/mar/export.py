"""ONNX graphs of the continuous family and the bundle that holds them.

Per model role (target, draft) two graphs, both with dynamic rows:
  <role>_step.onnx  tokens [B,W,C] f32, class_ids [B] i64, positions [B,W] i64,
                    attention_mask [B,W,P+W] bool, past_k, past_v [L,B,H,P,hd] f32
                    ->  z [B,W,D], present_k, present_v [L,B,H,W,hd]
                    (B rows: the images of a batch, then under CFG their unconditional twins;
                    each row its own positions and mask, so images of one pass may have
                    different committed lengths; W >= 1 and P >= 0 dynamic; the KV cache is
                    the runtime's, runtime/families/continuous/runner.py)
  <role>_head.onnx  x [R,C] f32, t [R] i64, z [R,D] f32  ->  eps [R,C]   (R dynamic)
and, when the bundle has a tokenizer decoder (the continuous demo's KL autoencoder):
  decoder.onnx      tokens [N, seq_len, C] f32  ->  images [N, 3, H, W] f32 in about [-1, 1]   (N dynamic)
The bundle's manifest.json says `"family": "continuous"` and carries each model's config
(runtime/families/continuous/bundle.py reads it); the weights also ship as <role>.safetensors so the
torch backend runs the same bundle. Written to a temporary directory and renamed into place.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from specrt.models.mar.autoencoder import TokenDecoder
from specrt.models.mar.model import MAR

FAMILY = "continuous"
FORMAT_VERSION = 2  # 2: per-row positions and an attention mask (batches of images); 1: one image
OPSET = 17
STEP_INPUTS = ("tokens", "class_ids", "positions", "attention_mask", "past_k", "past_v")
STEP_OUTPUTS = ("z", "present_k", "present_v")
HEAD_INPUTS = ("x", "t", "z")
HEAD_OUTPUTS = ("eps",)
DECODER_INPUTS = ("tokens",)
DECODER_OUTPUTS = ("images",)


class _Step(torch.nn.Module):
    def __init__(self, model: MAR):
        super().__init__()
        self.transformer = model.transformer

    def forward(self, tokens, class_ids, positions, attention_mask, past_k, past_v):
        return self.transformer.step(tokens, class_ids, positions, past_k, past_v, attention_mask)


class _Head(torch.nn.Module):
    def __init__(self, model: MAR):
        super().__init__()
        self.net = model.diffloss.net

    def forward(self, x, t, z):
        return self.net(x, t, z)


def export_step(model: MAR, path: Path) -> None:
    """The transformer step graph (legacy exporter: its dynamic axes keep P = 0 valid)."""
    cfg = model.cfg
    past = torch.zeros(cfg.n_layer, 2, cfg.n_head, 1, cfg.head_dim)
    window = min(2, cfg.seq_len)  # example positions 1..window stay inside the position table
    mask = torch.ones(window, 1 + window, dtype=torch.bool).tril(diagonal=1)
    examples = (torch.zeros(2, window, cfg.token_dim), torch.tensor([0, cfg.num_classes]),
                torch.arange(1, window + 1).repeat(2, 1), mask.repeat(2, 1, 1), past, past.clone())
    kv_axes = {1: "batch", 3: "past_len"}
    rows = {0: "batch", 1: "window"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Step(model).eval(), examples, str(path), dynamo=False, opset_version=OPSET,
                          input_names=list(STEP_INPUTS), output_names=list(STEP_OUTPUTS),
                          dynamic_axes={"tokens": rows, "class_ids": {0: "batch"}, "positions": rows,
                                        "attention_mask": {0: "batch", 1: "window", 2: "total_len"},
                                        "past_k": kv_axes, "past_v": kv_axes, "z": rows,
                                        "present_k": {1: "batch", 3: "window"}, "present_v": {1: "batch", 3: "window"}})


def export_head(model: MAR, path: Path) -> None:
    """The diffusion head graph, rows dynamic."""
    cfg = model.cfg
    examples = (torch.zeros(3, cfg.token_dim), torch.zeros(3, dtype=torch.long), torch.zeros(3, cfg.dim))
    rows = {0: "rows"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Head(model).eval(), examples, str(path), dynamo=False, opset_version=OPSET,
                          input_names=list(HEAD_INPUTS), output_names=list(HEAD_OUTPUTS),
                          dynamic_axes={"x": rows, "t": rows, "z": rows, "eps": rows})


def export_decoder(decoder: TokenDecoder, seq_len: int, path: Path) -> None:
    """The tokenizer decoder graph: continuous tokens -> images, rows dynamic."""
    examples = (torch.zeros(2, seq_len, decoder.cfg.latent_channels),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(decoder.eval(), examples, str(path), dynamo=False, opset_version=OPSET,
                          input_names=list(DECODER_INPUTS), output_names=list(DECODER_OUTPUTS),
                          dynamic_axes={"tokens": {0: "images"}, "images": {0: "images"}})


def export_bundle(target: MAR, draft: MAR | None, out_dir: str | Path, decoder: TokenDecoder | None = None,
                  sampling_defaults: dict | None = None, source: str | None = None) -> Path:
    """Write a continuous bundle (graphs, weights, manifest) to `out_dir` atomically: the models,
    optionally the tokenizer decoder (then the bundle makes images), the sampling defaults the
    runtime starts from and a note of where the weights came from."""
    from safetensors.torch import save_file

    from specrt.bundle_dir import move_into_place, partial_dir, refuse_existing

    out_dir = Path(out_dir).absolute()
    refuse_existing(out_dir, force=True)  # a bundle there is replaced; any other folder is refused before work
    with partial_dir(out_dir) as tmp:  # removed on failure; a killed run's is removed by the next write
        models = {}
        for role, model in (("target", target), ("draft", draft)):
            if model is None:
                continue
            export_step(model, tmp / f"{role}_step.onnx")
            export_head(model, tmp / f"{role}_head.onnx")
            save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp / f"{role}.safetensors"))
            models[role] = {"family": FAMILY, "config": model.cfg.to_dict(), "step": f"{role}_step.onnx",
                            "head": f"{role}_head.onnx", "weights": f"{role}.safetensors"}
        manifest = {"family": FAMILY, "format_version": FORMAT_VERSION, "opset": OPSET, "models": models,
                    "step_io": [list(STEP_INPUTS), list(STEP_OUTPUTS)],
                    "head_io": [list(HEAD_INPUTS), list(HEAD_OUTPUTS)]}
        if decoder is not None:
            if decoder.cfg.latent_channels != target.cfg.token_dim:
                raise ValueError(f"decoder takes {decoder.cfg.latent_channels}-channel tokens, the target makes "
                                 f"{target.cfg.token_dim}")
            export_decoder(decoder, target.cfg.seq_len, tmp / "decoder.onnx")
            save_file({k: v.detach().contiguous() for k, v in decoder.state_dict().items()},
                      str(tmp / "decoder.safetensors"))
            manifest["decoder"] = {"graph": "decoder.onnx", "weights": "decoder.safetensors",
                                   "config": decoder.cfg.to_dict(), "image_size": decoder.cfg.image_size,
                                   "io": [list(DECODER_INPUTS), list(DECODER_OUTPUTS)]}
        if sampling_defaults is not None:
            manifest["sampling_defaults"] = dict(sampling_defaults)
        if source is not None:
            manifest["source"] = source
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        move_into_place(tmp, out_dir, force=True)
    return out_dir


def verify_bundle(bundle_dir: str | Path, atol: float = 1e-4) -> list[str]:
    """Run every graph of a continuous bundle on onnxruntime and its weights on PyTorch over
    windows 1 and 3 after caches of 0 and 2 positions, for one row and for CFG's two (class,
    unconditional), over a ragged batch (rows at different committed lengths, a padded window),
    and head batches of 1 and 5 rows;
    one line per check. Raises SpecrtError on the first disagreement beyond `atol`."""
    import numpy as np

    from specrt.errors import SpecrtError
    from specrt.runtime.families.continuous.bundle import open_decoder, open_runner, read_continuous_manifest
    from specrt.runtime.families.continuous.runner import step_inputs

    lines = []
    rng = np.random.default_rng(0)
    for role in read_continuous_manifest(bundle_dir)["models"]:
        ort_runner, torch_runner = open_runner(bundle_dir, role), open_runner(bundle_dir, role, "torch")
        spec = ort_runner.spec
        cases = [(f"rows {b} past {p} window {w}", [p] * b, [w] * b, [0, spec.num_classes][:b])
                 for b in (1, 2) for p in (0, 2) for w in (1, 3) if p + w <= spec.seq_len + 1]
        if spec.seq_len >= 2:  # three rows at lengths 0, 2, 1 with windows 2, 1, 0 (pads)
            cases.append(("ragged rows 3 past 0/2/1 window 2/1/0", [0, 2, 1], [2, 1, 0], [0, spec.num_classes, 1]))
        for name, lengths, sizes, class_ids in cases:
            lengths, sizes = np.array(lengths, np.int64), np.array(sizes, np.int64)
            past, width = int(lengths.max()), max(int(sizes.max()), 1)
            positions, mask = step_inputs(lengths, sizes, width, past, spec.seq_len)
            past_kv = rng.standard_normal((2, spec.n_layer, len(lengths), spec.n_head, past, spec.head_dim)
                                          ).astype(np.float32)
            args = (rng.standard_normal((len(lengths), width, spec.token_dim)).astype(np.float32),
                    np.array(class_ids, np.int64), positions, mask, past_kv[0], past_kv[1])
            for got, want in zip(ort_runner._transformer(*args), torch_runner._transformer(*args)):
                worst = float(np.abs(np.asarray(got) - np.asarray(want)).max())
                if worst > atol:
                    raise SpecrtError(f"{role} step ({name}): onnxruntime and torch differ by {worst:.2e}")
            lines.append(f"{role} step {name}: ok")
        for rows in (1, 5):
            args = (rng.standard_normal((rows, spec.token_dim)).astype(np.float32),
                    rng.integers(0, spec.diffusion_steps, rows).astype(np.int64),
                    rng.standard_normal((rows, spec.hidden)).astype(np.float32))
            worst = float(np.abs(ort_runner._head(*args) - torch_runner._head(*args)).max())
            if worst > atol:
                raise SpecrtError(f"{role} head ({rows} rows): onnxruntime and torch differ by {worst:.2e}")
            lines.append(f"{role} head rows {rows}: ok (max diff {worst:.1e})")
    if "decoder" in read_continuous_manifest(bundle_dir):
        ort_decoder, torch_decoder = open_decoder(bundle_dir), open_decoder(bundle_dir, "torch")
        spec = open_runner(bundle_dir, "target").spec
        for rows in (1, 3):
            tokens = rng.standard_normal((rows, spec.seq_len, spec.token_dim)).astype(np.float32)
            worst = float(np.abs(ort_decoder(tokens) - torch_decoder(tokens)).max())
            if worst > atol * 10:  # a conv stack over 32x32 pixels: float error grows with depth
                raise SpecrtError(f"decoder ({rows} images): onnxruntime and torch differ by {worst:.2e}")
            lines.append(f"decoder images {rows}: ok (max diff {worst:.1e})")
    return lines
