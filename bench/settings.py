"""Which methods and parameter settings a benchmark run measures.

`--methods ar,sd,cool-sd` names the methods at their default parameters; each
`--sweep cool-sd:relaxation_budget=1.1,2,3` replaces that method's single setting with one
setting per value (several keys give their cross product). `ar` is always measured, first,
because every speed-up is a ratio against it from the same run.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from specrt.errors import SpecrtError

DEFAULT_METHODS = ("ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac")

# Short names accepted in --sweep (the papers' symbols) -> runtime parameter names.
PARAM_ALIASES = {
    "delta": "relaxation_budget",
    "nu": "decay",
    "L": "draft_len",
    "k": "k",
    "lambda": "lam",
}


@dataclass(frozen=True)
class Setting:
    """One row of the benchmark: a method and the parameters it runs with."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Human-readable name, e.g. `cool-sd(relaxation_budget=2)`."""
        if not self.params:
            return self.method
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.method}({inner})"

    def __hash__(self) -> int:
        return hash((self.method, json.dumps(self.params, sort_keys=True)))


def _parse_value(text: str) -> Any:
    """'2' -> 2, '1.1' -> 1.1, 'true' -> True, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()


def parse_sweep(spec: str) -> tuple[str, list[dict[str, Any]]]:
    """'cool-sd:delta=1.1,2,3' -> ('cool-sd', [{'relaxation_budget': 1.1}, ...]).

    Several keys are separated by ';': 'lantern:k=5,10;delta=0.1,0.3' gives 4 settings.
    """
    method, sep, rest = spec.partition(":")
    method = method.strip()
    if not sep or not method or not rest.strip():
        raise SpecrtError(f"--sweep {spec!r}: expected METHOD:KEY=V1,V2[;KEY=V1,V2]")
    axes: list[tuple[str, list[Any]]] = []
    for part in rest.split(";"):
        key, eq, values = part.partition("=")
        key = key.strip()
        if not eq or not key or not values.strip():
            raise SpecrtError(f"--sweep {spec!r}: {part!r} is not KEY=V1,V2")
        axes.append((PARAM_ALIASES.get(key, key), [_parse_value(v) for v in values.split(",") if v.strip()]))
    keys = [k for k, _ in axes]
    return method, [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in axes))]


def build_settings(methods: str | list[str] | tuple[str, ...], sweeps: list[str] | tuple[str, ...] = (),
                   known_methods: tuple[str, ...] = DEFAULT_METHODS) -> list[Setting]:
    """The ordered list of settings for a run; `ar` first, sweeps expanded in place."""
    names = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    unknown = [m for m in names if m not in known_methods]
    swept = dict(parse_sweep(s) for s in sweeps)
    unknown += [m for m in swept if m not in known_methods]
    if unknown:
        raise SpecrtError(f"unknown method(s) {', '.join(sorted(set(unknown)))}; choose from {', '.join(known_methods)}")
    for method in swept:
        if method not in names:
            names.append(method)
    if "ar" in names:
        names.remove("ar")
    settings = [Setting("ar")]
    for name in names:
        settings += [Setting(name, p) for p in swept[name]] if name in swept else [Setting(name)]
    return settings
