"""The EAGLE head as bundle graphs: `draft_step` (and `draft_chain`) of a draft of kind `eagle` (docs/contracts.md).

One graph, no prefill (the head has no condition tokens of its own: its first pair is the
target prefill's feature with image token 0). Inputs: the step graph's, plus `hidden`
[batch, window, dim], the feature before each token (the target's `hidden` rows, or the head's
own features for a drafted parent); outputs: logits, the head's own `features` (EAGLE drafts
further from them; ONNX forbids an output named like an input), present_kv of its one layer,
then the sampling head's probs and draws, exactly like every other step graph.

`draft_chain` (runtime/chain.py HeadChain) runs a round's drafts in one graph: the step graph's
inputs (`hidden` after input_ids) plus `last`, as an independent draft's chain; each draft is fed
with the head's own feature of the slot before it; outputs present_kv, probs and draws only.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn

from specrt.models.eagle_head import EagleHead
from specrt.export.onnx_export import (BATCH, CACHE_LEN, DEFAULT_CHAIN_STEPS, DEFAULT_OPSET, TOTAL_LEN, WINDOW,
                                       GraphLimits, _example_inputs, _export, chain_spec, growth_spec, head_inputs,
                                       head_outputs, tree_spec)
from specrt.manifest import GraphSpec, TensorSpec
from specrt.runtime.chain import HeadChain, HeadGrowth, HeadTree
from specrt.runtime.tree import StaticShape
from specrt.runtime.tree_call import TreeLayout
from specrt.runtime.head import SamplingHead

GRAPH = "draft_step"
CHAIN_GRAPH = "draft_chain"
TREE_GRAPH = "draft_tree"
GROWTH_GRAPH = "draft_growth"


class _HeadStepGraph(nn.Module):
    def __init__(self, head: EagleHead):
        super().__init__()
        self.eagle, self.sampling = head, SamplingHead()

    def forward(self, input_ids, hidden, positions, attention_mask, past_kv, mix, uniforms):
        logits, features, present = self.eagle.step(input_ids.long(), hidden, positions.long(), attention_mask, past_kv)
        probs, draws = self.sampling(logits, mix, uniforms)
        return logits, features, present, probs, draws


def kv_shape(config, length) -> tuple:
    return (1, 2, BATCH, config.n_kv_head, length, config.head_dim)


def head_step_spec(config, limits: GraphLimits, opset: int) -> GraphSpec:
    inputs = (TensorSpec("input_ids", "int32", (BATCH, WINDOW)),
              TensorSpec("hidden", "float32", (BATCH, WINDOW, config.dim)),
              TensorSpec("positions", "int32", (BATCH, WINDOW)),
              TensorSpec("attention_mask", "bool", (BATCH, WINDOW, TOTAL_LEN)),
              TensorSpec("past_kv", "float32", kv_shape(config, CACHE_LEN)),
              *head_inputs(WINDOW))
    outputs = (TensorSpec("logits", "float32", (BATCH, WINDOW, config.vocab_size)),
               TensorSpec("features", "float32", (BATCH, WINDOW, config.dim)),
               TensorSpec("present_kv", "float32", kv_shape(config, WINDOW)),
               *head_outputs(config, WINDOW))
    return GraphSpec(name=GRAPH, file=f"{GRAPH}.onnx", role="draft", kind="step", opset=opset,
                     inputs=inputs, outputs=outputs, profile=limits.step_profile())


def with_hidden(spec: GraphSpec, config) -> GraphSpec:
    """An independent draft's drafting graph spec (a chain's, tree's or growth's: its one layer's
    KV) with the head's `hidden` input [batch, window, dim] after input_ids, as the head's step
    graph takes it."""
    hidden = TensorSpec("hidden", "float32", (BATCH, WINDOW, config.dim))
    return replace(spec, inputs=(spec.inputs[0], hidden, *spec.inputs[1:]))


def head_chain_spec(config, limits: GraphLimits, opset: int, steps: int) -> GraphSpec:
    return with_hidden(chain_spec(CHAIN_GRAPH, "draft", config, limits, opset, steps), config)


def _examples(spec: GraphSpec, head: EagleHead) -> tuple[torch.Tensor, ...]:
    """The step graph's examples with a random `hidden` slotted in after input_ids."""
    plain = GraphSpec(**{**spec.__dict__, "inputs": tuple(t for t in spec.inputs if t.name != "hidden")})
    examples = list(_example_inputs(plain, head.config))
    batch, window = examples[0].shape
    hidden = torch.randn(batch, window, head.config.dim, generator=torch.Generator().manual_seed(1))
    return (examples[0], hidden, *examples[1:])


def export_head_step(head: EagleHead, limits: GraphLimits, out_dir: Path, opset: int = DEFAULT_OPSET) -> GraphSpec:
    """Export the head's `draft_step` graph (dynamic batch, window and cache length)."""
    spec = head_step_spec(head.config, limits, opset)
    return _export(_HeadStepGraph(head), spec, _examples(spec, head), out_dir)


def export_head_chain(head: EagleHead, limits: GraphLimits, out_dir: Path, opset: int = DEFAULT_OPSET,
                      steps: int = DEFAULT_CHAIN_STEPS) -> GraphSpec:
    """Export the head's `draft_chain` graph: a catch-up window of pairs, then `steps` drafts
    drawn inside the graph (dynamic batch, window and cache length; steps static)."""
    spec = head_chain_spec(head.config, limits, opset, steps)
    return _export(HeadChain(head, steps), spec, _examples(spec, head), out_dir)  # its own signature


def export_head_tree(head: EagleHead, limits: GraphLimits, out_dir: Path, paths, opset: int = DEFAULT_OPSET) -> GraphSpec:
    """Export the head's `draft_tree` graph: a catch-up window of pairs, then the static tree
    `paths` drafted inside the graph, each node fed with its parent's head feature (HeadTree)."""
    spec = with_hidden(tree_spec(TREE_GRAPH, "draft", head.config, limits, opset, paths), head.config)
    return _export(HeadTree(head, TreeLayout(StaticShape(paths))), spec, _examples(spec, head), out_dir)


def export_head_growth(head: EagleHead, limits: GraphLimits, out_dir: Path, depth: int, top_k: int,
                       opset: int = DEFAULT_OPSET) -> GraphSpec:
    """Export the head's `draft_growth` graph: a catch-up window of pairs, then a dynamic tree
    grown inside the graph, each frontier node fed with its parent's head feature (HeadGrowth)."""
    spec = with_hidden(growth_spec(GROWTH_GRAPH, "draft", head.config, limits, opset, depth, top_k), head.config)
    return _export(HeadGrowth(head, depth, top_k), spec, _examples(spec, head), out_dir)
