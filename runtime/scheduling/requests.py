"""What a caller hands the scheduler (Request) and gets back (Ticket), and the errors a request can end with.

A Request is one image: its condition (a class id, or a prompt with an optional negative prompt),
its method with the method's parameters and sampling keys, its seed and an optional deadline.
Its `group` says which requests may decode in one batch (runtime/scheduling/scheduler.py: the
grouping rule). A Ticket carries the request's concurrent.futures.Future: it resolves to the result
a pipeline's generate gives for this one image, or to one of the SpecrtError subclasses below;
`await ticket` works in asyncio code, and cancelling the awaiting task cancels the request.
"""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Optional

from specrt import validation
from specrt.errors import SpecrtError


class QueueFull(SpecrtError):
    """The scheduler already holds `max_queue` waiting requests: this one is refused at once
    (a server answers HTTP 503 / gRPC UNAVAILABLE; the client may retry later)."""


class DeadlineExceeded(SpecrtError):
    """The request's deadline passed before its image was finished; it left its slot (or the
    queue) at the next round."""


class RequestCancelled(SpecrtError):
    """The request was cancelled while it ran or waited (close(cancel_running=True) ends what runs
    with this error; Ticket.cancel() cancels the future itself, which then raises CancelledError)."""


class SchedulerClosed(SpecrtError):
    """The scheduler was closed: it admits no new request, and requests still waiting when it
    stopped end with this error."""


@dataclass(frozen=True)
class Request:
    """One image to generate. Exactly one of `class_id` (class-conditional models) or `prompt`
    (text-to-image and unified-vocabulary models); `negative_prompt` / `prompt_suffix` shape a
    unified model's unconditional row as generate's keywords of those names do.

    `params` mixes the method's parameters and the sampling keys (cfg_scale, temperature, top_k,
    top_p; a continuous model's cfg_schedule), as generate's keywords do. The image depends on
    (condition, method, params, seed) alone: it is generate(condition, method=..., seed=seed,
    **params)'s, whatever else the scheduler decodes beside it. `decode=False` gives tokens only.
    `deadline`: a time.monotonic() instant; past it the request ends with DeadlineExceeded at the
    scheduler's next round (None: no deadline)."""

    class_id: Optional[int] = None
    prompt: Optional[str] = None
    method: str = "ar"
    params: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    decode: bool = True
    negative_prompt: Optional[str] = None
    prompt_suffix: Optional[bool] = None
    deadline: Optional[float] = None

    def __post_init__(self) -> None:
        if (self.class_id is None) == (self.prompt is None):
            raise SpecrtError("a request takes a class id (class-conditional models) or a prompt, exactly one")
        if self.class_id is not None:
            object.__setattr__(self, "class_id", validation.integer("class id", self.class_id, low=0))
        if not isinstance(self.method, str):
            raise SpecrtError(f"method must be a name, got {type(self.method).__name__}")
        object.__setattr__(self, "seed", validation.seed(self.seed))
        object.__setattr__(self, "decode", validation.flag("decode", self.decode))
        object.__setattr__(self, "params", dict(self.params or {}))
        if self.deadline is not None:
            object.__setattr__(self, "deadline", validation.number("deadline", self.deadline))
        # the scheduler compares groups for every waiting request at every round: written once here
        object.__setattr__(self, "_group", (self.method, json.dumps(self.params, sort_keys=True, default=str),
                                            self.decode, self.negative_prompt, self.prompt_suffix))

    @property
    def group(self) -> tuple:
        """Requests with equal groups may share a batch: the same method, parameters and sampling
        keys, decoding, and unconditional-row options (the condition and the seed may differ)."""
        return self._group  # type: ignore[attr-defined]

    @property
    def prompt_options(self) -> dict[str, Any]:
        """The generate keywords that shape a prompt model's rows, where the request gives them."""
        return {name: value for name, value in (("negative_prompt", self.negative_prompt),
                                                ("prompt_suffix", self.prompt_suffix)) if value is not None}


class Ticket:
    """A submitted request's handle: `future` resolves to the image's result (the type a
    pipeline's generate returns, for this one image) or raises DeadlineExceeded,
    RequestCancelled, SchedulerClosed or the SpecrtError that generate raised for it.

    `cancel()` cancels the future at once (it then raises CancelledError) and the scheduler frees
    the request's slot at its next round. `await ticket` (or asyncio.wrap_future(ticket.future))
    waits in asyncio code; cancelling the awaiting task cancels the request the same way."""

    def __init__(self, request: Request, submitted: float):
        self.request = request
        self.submitted = submitted  # time.monotonic() at submit: latencies are measured from it
        self.admitted = submitted  # time.monotonic() when it took a slot (the scheduler sets it)
        self.future: Future = Future()

    def cancel(self) -> bool:
        """Cancel the request; False when its result was already delivered."""
        return self.future.cancel()

    def result(self, timeout: Optional[float] = None) -> Any:
        """The result, waiting up to `timeout` seconds (concurrent.futures semantics)."""
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.wrap_future(self.future).__await__()
