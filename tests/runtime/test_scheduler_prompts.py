"""In-flight batching of prompt-conditioned models on the toy backend: a text-to-image pipeline
(caption rows with padding masks, CFG's uncond rows) and a unified-vocabulary one (token prompts,
per-row unconditional prompts, a grammar's forced row ends). Each image equals its request alone,
so admitting a prompt into a slot sets that slot's rows and caption mask only."""
from __future__ import annotations

import numpy as np
import pytest

from _toy_exact import one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.families.unified.pipeline import UnifiedPipeline
from specrt.runtime.families.unified.prompts import PromptEncoder
from specrt.runtime.grammar import ImageGrammar
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.scheduling import Request, Scheduler

GUIDED = {"cfg_scale": 2.0, "temperature": 0.9, "top_k": 2, "top_p": 1.0}
PROMPTS = ["5", "5 6", "4 6 5", "6", "4 4"]  # different lengths: different padding per row
METHODS = [("ar", {}), ("sd", {"draft_len": 3}), ("sjd", {"window": 3})]


class WordIds:
    """A text encoder for the toy: each word is a token id, read as a 1-channel caption embedding."""

    def encode(self, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = [[float(w) for w in p.split()] for p in prompts]
        length = max(map(len, ids))
        embeddings = np.zeros((len(ids), length, 1), dtype=np.float32)
        mask = np.zeros((len(ids), length), dtype=bool)
        for row, words in enumerate(ids):
            embeddings[row, :len(words), 0], mask[row, :len(words)] = words, True
        return embeddings, mask


def t2i_pipeline() -> Pipeline:
    target, draft, vq = toy_models(vocab_size=4, grid_size=3, seed=5, caption_len=4)
    return Pipeline(target, vq, draft, sampling_defaults=GUIDED, text_encoder=WordIds())


def unified_pipeline() -> UnifiedPipeline:
    target, draft, vq = toy_models(vocab_size=3, grid_size=3, seed=7, row_end=True, prompt_len=4)
    pipe = UnifiedPipeline(target, vq, ImageGrammar(3, 3, 3, row_end=True),
                           PromptEncoder({"uncond": {"kind": "ids", "ids": [7]}, "pad_id": 0}, 4),
                           draft=draft, sampling_defaults=GUIDED)
    # the toy's prompts are token ids: a text's words are its ids (no tokenizer)
    def conditions(class_ids=None, prompts=None, *_, **__):
        return UnifiedPipeline.conditions(pipe, prompt_ids=[[int(w) for w in p.split()] for p in prompts])
    pipe.conditions = conditions
    return pipe


@pytest.mark.parametrize("make", [t2i_pipeline, unified_pipeline], ids=["t2i", "unified"])
def test_prompt_images_in_flight_equal_alone(make, monkeypatch):
    pipe = make()
    if isinstance(pipe, UnifiedPipeline):  # the served check reads text through the recipe's tokenizer
        from specrt.runtime.families.unified import UnifiedFamily
        monkeypatch.setattr(UnifiedFamily, "check_request", lambda *a, **k: None)
    requests = [Request(prompt=p, seed=20 + i, method=m, params=params, decode=i % 2 == 0)
                for m, params in METHODS for i, p in enumerate(PROMPTS)]
    with Scheduler(pipe, slots=2, max_queue=len(requests)) as scheduler:
        tickets = [scheduler.submit(r) for r in requests]
        results = [t.result(timeout=60) for t in tickets]
        assert scheduler.stats().rounds > len(requests)  # in flight, not one call per group
    for request, result in zip(requests, results):
        alone = pipe.generate(prompts=[request.prompt], method=request.method, seed=request.seed,
                              decode=request.decode, **request.params)
        np.testing.assert_array_equal(result.tokens, alone.tokens)
        if alone.stream is not None:
            np.testing.assert_array_equal(result.stream, alone.stream)
        assert (result.images is None) == (not request.decode)
        if request.decode:
            np.testing.assert_array_equal(result.images, alone.images)
