"""A batch of Triton requests -> Pipeline.generate calls -> one response per request.

Triton's dynamic batcher hands the model every request that queued while it was busy. Rows
that ask for the same method, parameters and decoding run in one Pipeline.generate call (one
batched pass once the methods decode batches); rows that differ run in separate calls. Each
row's image depends only on its own condition, method, parameters and seed — every random
number a counter uniform of the image's seed and the draw's coordinates — so batching never
changes what a client gets. Mistakes in a row
become that row's `error`; an unexpected exception in one call becomes the `error` of that
call's rows and is logged, and the server keeps serving.

Nothing here knows a model family: the pipeline's Family (runtime/families) says what a row is
conditioned on, checks it, whether the model decodes images, and its tokens' dtype and shape,
so LlamaGen's VQ codes and a continuous model's latents are served by the same code.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.family_registry import pipeline_family
from specrt.runtime.family import Family
from specrt.runtime.serving.protocol import (ImageRequest, ImageResult, TensorSpec, decode_request, encode_response,
                                             outputs, png_bytes)

LOG = logging.getLogger("specrt.serve")


class RequestHandler:
    """Callable over a list of requests (input name -> array [rows, 1]); returns their outputs."""

    def __init__(self, pipeline: Any, family: Optional[Family] = None):
        self.pipeline = pipeline
        self.family = family or pipeline_family(pipeline)
        self.token_shape = tuple(self.family.token_shape(pipeline))
        self.decodes = self.family.has_decoder(pipeline)  # else every row is served tokens only

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The output tensors this model declares (tokens of its family's dtype and shape)."""
        return outputs(self.family.token_dtype, self.token_shape)

    def __call__(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        start = time.perf_counter()
        rows = [decode_request({name: request[name] for name in request.keys()}) for request in requests]
        results: dict[tuple[int, int], ImageResult] = {}
        groups: dict[tuple, list[tuple[tuple[int, int], ImageRequest]]] = defaultdict(list)
        for r, request_rows in enumerate(rows):
            for i, row in enumerate(request_rows):
                problem = row if isinstance(row, SpecrtError) else self.check(row)
                if problem is not None:
                    results[r, i] = ImageResult(error=str(problem))
                else:
                    groups[row.group].append(((r, i), row))
        for members in groups.values():
            for (key, _), result in zip(members, self.run_group([row for _, row in members], start)):
                results[key] = result
        return [encode_response([results[r, i] for i in range(len(request_rows))], self.token_shape,
                                self.family.token_dtype)
                for r, request_rows in enumerate(rows)]

    def check(self, row: ImageRequest) -> Union[SpecrtError, None]:
        """What rules a row out before it can spoil its group's call: its condition against the
        model, its method and parameters (the checks Pipeline.generate makes, row by row)."""
        try:
            self.family.check_submitted(self.pipeline, row.method, dict(row.params), class_id=row.class_id,
                                        prompt=row.prompt, prompt_options=row.prompt_options)
        except SpecrtError as exc:
            return exc
        return None

    def run_group(self, rows: list[ImageRequest], start: float) -> list[ImageResult]:
        """One generate call for rows of one group, each image with its own seed (Pipeline.generate
        draws every image's numbers from its own seed, so the batch does not change any image)."""
        first = rows[0]
        condition: dict[str, Any] = ({"class_ids": [r.class_id for r in rows]} if first.class_id is not None
                                     else {"prompts": [r.prompt for r in rows]})
        called = time.perf_counter()
        try:
            result = self.pipeline.generate(**condition, method=first.method, seed=[r.seed for r in rows],
                                            decode=self.decodes and not first.tokens_only, **first.prompt_options,
                                            **dict(first.params))
        except SpecrtError as exc:
            return [ImageResult(error=str(exc)) for _ in rows]
        except Exception as exc:  # a bug, not the client's mistake: log it, answer, keep serving
            LOG.exception("generate failed for %d rows (method %s)", len(rows), first.method)
            line = (str(exc).splitlines() or [""])[0]
            return [ImageResult(error=f"internal error: {type(exc).__name__}: {line}") for _ in rows]
        numbers = self.family.serving_stats(result)
        shared = {"method": first.method, **numbers, "target_forwards": numbers["target_forwards"] / len(rows),
                  "images_in_call": len(rows),
                  "generate_seconds": numbers.get("generate_seconds", round(time.perf_counter() - called, 6)),
                  "server_seconds": round(time.perf_counter() - start, 6)}
        return [ImageResult(tokens=result.tokens[i].reshape(self.token_shape),
                            png=b"" if result.images is None else png_bytes(result.images[i]), stats=dict(shared))
                for i in range(len(rows))]
