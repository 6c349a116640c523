"""Which methods and parameter settings a benchmark run measures.

`--methods ar,sd,cool-sd` names the methods at their runtime defaults; each
`--sweep cool-sd:delta=1.5,2,3` replaces that method's single setting with one setting per
value (several keys, separated by ';', give their cross product). Keys are the runtime's
parameter names (specrt.runtime.methods, each method's PARAMS) or the papers' symbols
(delta, nu, lambda, L, K, D), which mean different parameters for different methods.
`ar` is always measured, first, because every speed-up is a ratio against it from the same
run. Every setting is checked by constructing its runtime method object, so a misspelt key
or an out-of-range value fails before anything is measured. `--drafts` and `--loop` with several
values run every setting once per draft kind / decoding loop, side by side in one run.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from specrt.errors import SpecrtError
from specrt.runtime.methods import METHODS, make_method
from specrt.runtime.rounds import LOOPS

DEFAULT_METHODS = ("ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac")
AUTO = "auto"  # in --methods: one more row, the setting --method auto chooses here (runtime/choosing)
DRAFT_KINDS = ("independent", "eagle")  # `--drafts`: the demo's independent draft GPT, its EAGLE head

# The default run sweeps Cool-SD's relaxation budget δ so that its speed–fidelity trade-off
# (accepted length up with δ, Fréchet distance not better) is visible in one run, and SJD's draft
# coupling (target forwards down with maximal or Gumbel coupling, the distribution unchanged).
DEFAULT_SWEEPS = ("cool-sd:delta=1.5,2.5,4", "sjd:coupling=independent,maximal,gumbel")

_DRAFTED = {"L": "draft_len"}
_JACOBI = {"L": "window", "K": "branching", "D": "tree_depth"}
# Paper symbols -> runtime parameter names, per method (δ is Cool-SD's budget but LANTERN's TVD budget).
PARAM_ALIASES: dict[str, dict[str, str]] = {
    "ar": {},
    "sd": dict(_DRAFTED),
    "cool-sd": {**_DRAFTED, "delta": "relaxation_budget", "nu": "decay"},
    "lantern": {**_DRAFTED, "delta": "tvd_budget", "lambda": "ratio", "k": "neighbours_k"},
    "sjd": dict(_JACOBI),
    "sjd-pac": dict(_JACOBI),
    "gsd": {"L": "window", "G": "group", "delta": "gap", "d": "radius"},
}


def _symbol(method: str, param: str) -> str:
    """The short name a parameter is shown with (its paper symbol when it has one)."""
    for short, name in PARAM_ALIASES.get(method, {}).items():
        if name == param:
            return short
    return param


@dataclass(frozen=True)
class Setting:
    """One row of the benchmark: a method and the parameters it runs with (runtime names)."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    draft: str = ""  # a drafted method's draft when a run compares several (DRAFT_KINDS); "" = the pipeline's own
    loop: str = ""  # the decoding loop when a run compares several (runtime.rounds.LOOPS); "" = the pipeline's own
    chosen_by: str = ""  # "auto": the row of the setting --method auto chose (runtime/choosing), beside the fixed ones

    @property
    def label(self) -> str:
        """Human-readable name, e.g. `cool-sd(delta=2)`, `sd[eagle]`, `sd loop=round`, `auto:sjd(L=8)`."""
        suffix = (f"[{self.draft}]" if self.draft else "") + (f" loop={self.loop}" if self.loop else "")
        prefix = f"{self.chosen_by}:" if self.chosen_by else ""
        if not self.params:
            return prefix + self.method + suffix
        inner = ",".join(f"{_symbol(self.method, k)}={v}" for k, v in sorted(self.params.items()))
        return f"{prefix}{self.method}({inner}){suffix}"

    def __hash__(self) -> int:
        return hash((self.method, json.dumps(self.params, sort_keys=True), self.draft, self.loop, self.chosen_by))


def _parse_value(text: str) -> Any:
    """'2' -> 2, '1.1' -> 1.1, 'true' -> True, anything else stays a string."""
    text = text.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_sweep(spec: str) -> tuple[str, list[dict[str, Any]]]:
    """'cool-sd:delta=1.1,2,3' -> ('cool-sd', [{'relaxation_budget': 1.1}, ...]).

    Several keys are separated by ';': 'lantern:k=5,10;delta=0.1,0.3' gives 4 settings.
    """
    method, sep, rest = spec.partition(":")
    method = method.strip()
    if not sep or not method or not rest.strip():
        raise SpecrtError(f"--sweep {spec!r}: expected METHOD:KEY=V1,V2[;KEY=V1,V2]")
    if method not in METHODS:
        raise SpecrtError(f"--sweep {spec!r}: unknown method {method!r}; choose from {', '.join(METHODS)}")
    axes: list[tuple[str, list[Any]]] = []
    for part in rest.split(";"):
        key, eq, values = part.partition("=")
        key = key.strip()
        parsed = [_parse_value(v) for v in values.split(",") if v.strip()]
        if not eq or not key or not parsed:
            raise SpecrtError(f"--sweep {spec!r}: {part.strip()!r} is not KEY=V1,V2")
        name = PARAM_ALIASES.get(method, {}).get(key, key)
        if name not in METHODS[method].PARAMS:
            known = sorted(set(METHODS[method].PARAMS) | set(PARAM_ALIASES.get(method, {})))
            raise SpecrtError(f"--sweep {spec!r}: {method} has no parameter {key!r} (known: {', '.join(known) or 'none'})")
        axes.append((name, parsed))
    keys = [k for k, _ in axes]
    return method, [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in axes))]


def parse_drafts(text: str | None) -> tuple[str, ...]:
    """`--drafts independent,eagle` -> the draft kinds each drafted setting runs with (empty: the pipeline's own)."""
    if text is None:
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in DRAFT_KINDS]
    if not names or unknown:
        raise SpecrtError(f"--drafts {text!r}: expected a comma-separated list of {', '.join(DRAFT_KINDS)}")
    return names


def parse_loops(text: str) -> tuple[str, ...]:
    """`--loop host,round` -> the decoding loops a run compares (runtime.rounds.LOOPS), in order."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in LOOPS]
    if not names or unknown:
        raise SpecrtError(f"--loop {text!r}: expected {', '.join(LOOPS)} or a comma-separated list of them, "
                          "e.g. host,round")
    return names


def build_settings(methods: str | Sequence[str] = DEFAULT_METHODS, sweeps: Sequence[str] = (),
                   drafts: Sequence[str] = (), loops: Sequence[str] = ()) -> list[Setting]:
    """The ordered list of settings for a run: `ar` first, sweeps expanded in place, each validated;
    with `drafts`, every drafted setting once per draft kind (`sd[independent]`, `sd[eagle]`); with
    several `loops`, every setting once per loop, next to each other (`sd loop=host`, `sd loop=round`;
    one loop is the pipeline's own and labels nothing)."""
    names = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    unknown = sorted({m for m in names if m not in METHODS})
    if unknown:
        from specrt.runtime.family_registry import where_method_runs

        raise SpecrtError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}"
                          + where_method_runs(unknown[0], "llamagen"))
    swept: dict[str, list[dict[str, Any]]] = {}
    for spec in sweeps:
        method, params = parse_sweep(spec)
        swept.setdefault(method, []).extend(params)
    names += [m for m in swept if m not in names]
    settings = [Setting("ar")]
    for name in dict.fromkeys(n for n in names if n != "ar"):
        settings += [Setting(name, p) for p in swept[name]] if name in swept else [Setting(name)]
    for setting in settings:
        try:
            make_method(setting.method, **setting.params)
        except SpecrtError as exc:
            raise SpecrtError(f"setting {setting.label}: {exc}") from None
    if drafts:
        settings = [Setting(s.method, s.params, d) for s in settings
                    for d in (drafts if METHODS[s.method].needs_draft else ("",))]
    if len(loops) > 1:
        settings = [Setting(s.method, s.params, s.draft, loop) for s in settings for loop in loops]
    return settings


def without_auto(methods: str | Sequence[str]) -> tuple[list[str], bool]:
    """--methods' names without `auto`, and whether it was among them (its row is added once the
    models are open and the choice is made: auto_setting)."""
    names = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    return [m for m in names if m != AUTO], AUTO in names


def auto_setting(choice) -> Setting:
    """The bench row of a runtime.choosing.Choice: its method and parameters, labelled auto:..."""
    return Setting(choice.method, dict(choice.params), chosen_by=AUTO)


def needing_draft(settings: Sequence[Setting]) -> list[Setting]:
    """The settings whose method drafts with a draft model (sd, cool-sd, lantern)."""
    return [s for s in settings if METHODS[s.method].needs_draft]
