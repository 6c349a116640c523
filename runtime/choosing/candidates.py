"""Which settings `--method auto` measures: read from the methods themselves, never listed here.

Each strategy class declares whether it samples the target's distribution (`lossless`) and the
parameter settings worth measuring (`auto_settings`, runtime/methods/base.py); a family offers
its methods (Family.method_classes). So a method added to a family joins auto's candidates with
the line that declares its settings, and a relaxed one stays out unless the user allows it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from specrt.errors import SpecrtError

GUARANTEES = ("lossless", "relaxed")  # lossless: exact methods only; relaxed: relaxed methods may join


@dataclass(frozen=True)
class Candidate:
    """One setting auto may choose: a method name and its parameters (runtime names)."""

    method: str
    params_json: str = "{}"  # the parameters as sorted JSON: hashable, and the cache's own spelling

    @classmethod
    def of(cls, method: str, params: Mapping[str, Any] | None = None) -> "Candidate":
        return cls(method, json.dumps(dict(params or {}), sort_keys=True))

    @property
    def params(self) -> dict[str, Any]:
        return json.loads(self.params_json)

    @property
    def label(self) -> str:
        """`sd(draft_len=2)`, `sjd(window=4)`, `ar`: what the user would type to run it."""
        params = self.params
        inner = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
        return f"{self.method}({inner})" if inner else self.method


def candidates(method_classes: Mapping[str, Any], relaxed: bool = False, has_draft: bool = True) -> list[Candidate]:
    """ar first, then every declared setting of every method the family offers that keeps the
    guarantee (lossless ones always, relaxed ones only when `relaxed`) and can run here (a drafted
    method needs a draft model)."""
    if "ar" not in method_classes:
        raise SpecrtError("--method auto measures every setting against ar, and this model family has no ar")
    out = [Candidate.of("ar")]
    for name, cls in method_classes.items():
        if name == "ar" or not (cls.lossless or relaxed) or (cls.needs_draft and not has_draft):
            continue
        out += [Candidate.of(name, params) for params in cls.auto_settings]
    return list(dict.fromkeys(out))


def guarantee(relaxed: bool) -> str:
    return GUARANTEES[1] if relaxed else GUARANTEES[0]
