"""A T5 text encoder as a bundle's own graph (`text_encode.onnx`) plus its `tokenizer.json`,
so a t2i bundle turns prompts into images with onnxruntime alone (Python or the C API).

The graph is T5EncoderModel's forward: input_ids, attention_mask int32 [batch, max_length]
-> embeddings float32 [batch, max_length, d_model] (the last hidden state, what LlamaGen's
T5Embedder hands the GPT). It is traced with torch's TorchScript exporter: the dynamo
exporter of torch 2.13 fails on transformers' T5 attention (a reshape of a transposed view).
The tokenizer is the model directory's fast tokenizer saved as one `tokenizers` JSON file;
the runtime applies padding and truncation to `max_length` itself (runtime.text).
"""
from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from specrt.errors import SpecrtError
from specrt.export.onnx_export import BATCH, _stamp_and_check, _quiet_torch_logs
from specrt.lazy import require
from specrt.manifest import GraphSpec, TensorSpec
from specrt.runtime.text import T5TextEncoder

GRAPH, TOKENIZER = "text_encode", "tokenizer.json"


class _EncoderGraph(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids.long(), attention_mask=attention_mask.long()).last_hidden_state


def text_encoder_spec(max_length: int, dim: int, batch_profile: dict[str, int], opset: int) -> GraphSpec:
    ids = (BATCH, max_length)
    return GraphSpec(name=GRAPH, file=f"{GRAPH}.onnx", role="text", kind="encode", opset=opset,
                     inputs=(TensorSpec("input_ids", "int32", ids), TensorSpec("attention_mask", "int32", ids)),
                     outputs=(TensorSpec("embeddings", "float32", (BATCH, max_length, dim)),),
                     profile={BATCH: batch_profile})


def text_encoder_entry(encoder: T5TextEncoder) -> dict:
    """The manifest's `text_encoder` entry: which graph and tokenizer, and how to tokenise."""
    pad_id = encoder.tokenizer.pad_token_id
    return {"graph": GRAPH, "tokenizer": TOKENIZER, "max_length": encoder.max_length, "dim": encoder.dim,
            "pad_id": int(pad_id if pad_id is not None else 0), "source": str(encoder.directory),
            "preprocessing": "lowercase, strip"}


def export_text_encoder(encoder: T5TextEncoder, batch_profile: dict[str, int], out_dir: Path, opset: int) -> GraphSpec:
    """Write text_encode.onnx and tokenizer.json to out_dir."""
    onnx = require("onnx", "ONNX export")
    backend = getattr(encoder.tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise SpecrtError(f"the tokenizer in {encoder.directory} has no fast (tokenizers) version to ship in a bundle")
    backend.save(str(out_dir / TOKENIZER))
    spec = text_encoder_spec(encoder.max_length, encoder.dim, batch_profile, opset)
    ids, mask = encoder.tokenize(["a prompt", "another, longer prompt for the example"])
    examples = (torch.from_numpy(ids).int(), torch.from_numpy(mask).int())
    path = out_dir / spec.file
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), _quiet_torch_logs():
        warnings.simplefilter("ignore")
        torch.onnx.export(_EncoderGraph(encoder.model.cpu()).eval(), examples, str(path), dynamo=False, opset_version=opset,
                          input_names=list(spec.input_names), output_names=list(spec.output_names),
                          dynamic_axes={t.name: {0: BATCH} for t in spec.inputs + spec.outputs})
    model = onnx.load(str(path))
    _stamp_and_check(model, spec)
    onnx.save_model(model, str(path))
    return spec
