"""`--method auto`: the fastest setting here that keeps the user's guarantee.

    choice = choose_method(pipe, batch=1)                  # lossless methods only
    result = pipe.generate(class_ids=[3], method=choice.method, **choice.params)

Which method and window is fastest depends on the device (a CPU's t(W) grows with the window, a
GPU's is flat to W ≈ 16–32), the backend, the batch and the sampling, so it is measured, not
assumed: probe.measure times every candidate (candidates.candidates: the settings the family's
methods declare) on a few images of the user's own pipeline, runtime/cost_model.speedup turns
each one's accepted length and round cost into a predicted speed-up over ar, and the best one is
chosen — ar itself unless a setting is predicted at least MARGIN faster (a smaller gain is within
what a few probe images can tell apart). As TensorRT's builder and inductor's autotuning do, the
winner is cached on disk (cache.py) keyed by what decides it, and later calls read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from specrt import validation
from specrt.errors import SpecrtError
from specrt.runtime import cost_model
from specrt.runtime.choosing import cache
from specrt.runtime.choosing.candidates import Candidate, candidates, guarantee
from specrt.runtime.choosing.probe import CONFIRM_IMAGES, CONFIRMED, SCREEN_IMAGES, Measured, measure, probe_calls

MARGIN = 1.03  # a setting replaces ar only when predicted at least 3% faster


@dataclass(frozen=True)
class Choice:
    """What auto chose: the method and its parameters (pass both to generate), the speed-up over
    ar the cost model predicts for it here, and how every candidate fared (`candidates`: label,
    predicted speed-up, accepted length, ...). `measured`: measured by this call (False: read from
    the cache at `cache_path`)."""

    method: str
    params: dict[str, Any]
    predicted_speedup: float
    guarantee: str
    measured: bool
    candidates: list[dict[str, Any]] = field(default_factory=list)
    cache_path: Optional[Path] = None

    @property
    def label(self) -> str:
        return Candidate.of(self.method, self.params).label


def predicted(entry: Measured, ar: Measured) -> float:
    """The cost model's speed-up of `entry` over `ar` from their measured terms: τ · t(1) / (s ·
    round), ar's step and the setting's round both with their host work (runtime/cost_model)."""
    if entry.error is not None or not entry.timed or entry.round_s <= 0:
        return 0.0
    return cost_model.speedup(entry.accepted_length, ar.round_s, entry.round_s, entry.straggle)


def pick(measured: list[Measured], margin: float = MARGIN) -> tuple[Measured, float, list[dict[str, Any]]]:
    """The fastest candidate by the cost model (ar unless one beats it by `margin`), its predicted
    speed-up, and every candidate's row, fastest first. measured[0] must be ar."""
    ar = measured[0]
    if ar.candidate.method != "ar" or ar.error is not None:
        raise SpecrtError(f"--method auto could not run ar here: {ar.error or 'no ar measured'}")
    rows = []
    for entry in measured:
        rows.append({**entry.to_json(), "predicted_speedup": predicted(entry, ar)})
    rows.sort(key=lambda r: -r["predicted_speedup"])
    best = max(measured, key=lambda e: predicted(e, ar))
    if predicted(best, ar) < margin:
        best = ar
    return best, predicted(best, ar), rows


def choose_method(pipe: Any, *, batch: int = 1, relaxed: bool = False, sampling: Optional[Mapping[str, Any]] = None,
                  conditions: Optional[Mapping[str, Any]] = None, identity: Optional[str] = None,
                  device: Optional[str] = None, backend: Optional[str] = None, remeasure: bool = False,
                  cache_dir: Optional[Path] = None, probe_images: tuple[int, int] = (SCREEN_IMAGES, CONFIRM_IMAGES),
                  progress: Optional[Callable[[str], None]] = None) -> Choice:
    """The fastest setting for `pipe` at `batch` images a call that keeps the guarantee: lossless
    methods only, unless `relaxed` lets relaxed ones (cool-sd, lantern, ...) compete too.

    `sampling`: the sampling keys the calls will use (cfg_scale, temperature, top_k, top_p) — they
    change accepted lengths, so they are part of the choice. `conditions`: generate's condition
    keyword to measure with ({"class_ids": [...]}, {"prompts": [...]}; default: every class of a
    class-conditional model; a prompt model needs prompts). The choice is cached on disk when
    `identity` names the models (a bundle's manifest digest; `specrt generate` gives one), keyed by
    it, `device` (default: this machine's name), `backend` (default: the target runner's type),
    the batch, the sampling and the guarantee; `remeasure` measures again and replaces the entry.
    Without an identity the choice is kept on the pipeline object only. `probe_images`: images per
    candidate in the first pass and for the few best in the second (probe.py); `progress`: a
    function given one line per stage (the CLI prints them on stderr)."""
    from specrt.runtime.family_registry import pipeline_family
    from specrt.runtime.machine import cpu_name

    batch = validation.count("batch", batch)
    screen, confirm = (validation.integer("probe_images", n, low=1, high=1024) for n in probe_images)
    family = pipeline_family(pipe)
    sampling = dict(sampling or {})
    listed = candidates(family.method_classes(), relaxed, getattr(pipe, "draft", None) is not None)
    key = {"format": cache.FORMAT, "identity": identity, "device": device or cpu_name(),
           "backend": backend or _runner_name(pipe), "batch": batch, "sampling": sampling,
           "guarantee": guarantee(relaxed), "loop": str(getattr(pipe, "loop", "")),
           "candidates": [c.label for c in listed]}
    path = cache.entry_path(key, cache_dir) if identity is not None else None
    memory = pipe.__dict__.setdefault("_auto_choices", {})
    memo = repr(sorted(key.items(), key=lambda kv: kv[0]))
    if not remeasure:
        if path is not None:
            entry = cache.read_entry(path, key)
            if entry is not None:
                return _choice(entry["choice"], key, False, entry.get("measured", []), path)
            if path.exists() and progress:
                progress(f"auto: ignoring the damaged cached choice {path}; measuring again")
        elif memo in memory:
            return replace(memory[memo], measured=False)
    if conditions is None:
        conditions = default_conditions(pipe, family)
    measured = probe(pipe, family, listed, batch, conditions, sampling, screen, confirm, progress)
    best, speedup, rows = pick(measured)
    chosen = {"method": best.candidate.method, "params": best.candidate.params, "predicted_speedup": speedup,
              "label": best.candidate.label}
    if path is not None:
        try:
            cache.write_entry(path, key, chosen, rows)
        except OSError as exc:  # an unwritable cache costs the next call a measurement, not this one its result
            if progress:
                progress(f"auto: could not cache the choice in {path.parent} ({exc.strerror or exc})")
            path = None
    choice = _choice(chosen, key, True, rows, path)
    memory[memo] = choice
    return choice


def probe(pipe: Any, family: Any, listed: list[Candidate], batch: int, conditions: Mapping[str, Any],
          sampling: Mapping[str, Any], screen: int, confirm: int,
          progress: Optional[Callable[[str], None]] = None) -> list[Measured]:
    """Both passes (probe.py): every candidate on `screen` images, then ar and the CONFIRMED best by
    the cost model on `confirm` more; returns every candidate's terms, ar first."""
    say = progress or (lambda _message: None)
    measured = [Measured(c) for c in listed]
    first = probe_calls(batch, screen)
    say(f"auto: measuring {len(listed)} settings on {first * batch} image(s) each (batch {batch})")
    measure(pipe, family, measured, batch, conditions, sampling, first, 0, progress)
    ar = measured[0]
    if ar.error is None and ar.timed:
        ranked = sorted((e for e in measured[1:] if e.timed), key=lambda e: -predicted(e, ar))[:CONFIRMED]
        more = probe_calls(batch, confirm)
        say(f"auto: measuring ar and the {len(ranked)} best again on {more * batch} more image(s) each: "
            + ", ".join(e.candidate.label for e in ranked))
        measure(pipe, family, [ar, *ranked], batch, conditions, sampling, more, first, progress)
    return measured


def default_conditions(pipe: Any, family: Any) -> dict[str, Any]:
    """Every class of a class-conditional model; a prompt model has no default (SpecrtError)."""
    if family.conditions(pipe) != "class ids":
        raise SpecrtError("--method auto measures a prompt model on prompts: give the prompts to measure with")
    classes = getattr(pipe, "num_classes", None) or pipe.target.spec.num_classes
    return {"class_ids": list(range(int(classes)))}


def _choice(chosen: Mapping[str, Any], key: Mapping[str, Any], measured: bool, rows: list[dict[str, Any]],
            path: Optional[Path]) -> Choice:
    return Choice(chosen["method"], dict(chosen["params"]), float(chosen["predicted_speedup"]), key["guarantee"],
                  measured, list(rows), path)


def _runner_name(pipe: Any) -> str:
    """What runs the target, as far as the pipeline says: the runner's class and its device."""
    target = getattr(pipe, "target", None)
    device = getattr(target, "device", None)
    return f"{type(target).__name__}" + (f" on {device}" if device is not None else "")
