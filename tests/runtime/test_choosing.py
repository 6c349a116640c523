"""--method auto's chooser (runtime/choosing): it picks what the cost model ranks first, falls back to
ar, keeps the lossless guarantee unless relaxed methods are allowed, and caches per key on disk."""
from __future__ import annotations

import json
import math
import os
import stat

import numpy as np
import pytest

from _toy_exact import one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.runtime import cost_model
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.choosing import MARGIN, Candidate, candidates, choose_method, pick
from specrt.runtime.choosing import choose as choosing
from specrt.runtime.choosing.probe import Measured
from specrt.runtime.methods import METHODS
from specrt.runtime.methods.speculative import SpeculativeDecoding
from specrt.runtime.pipeline import Pipeline


def measured(method: str, params: dict, tau: float, target_s: float, draft_s: float = 0.0, host_s: float = 0.0,
             straggle_passes: int | None = None) -> Measured:
    """A candidate's terms as a probe would leave them: 10 images of 1 call each, τ = tokens / forwards."""
    forwards = 1000
    entry = Measured(Candidate.of(method, params), target_s, draft_s, host_s, tokens=round(tau * forwards),
                     forwards=forwards, passes=straggle_passes or forwards, images=10, calls=10)
    return entry


def test_the_cost_model_ranks_and_the_first_is_chosen():
    ar = measured("ar", {}, 1.0, 0.010, host_s=0.001)
    entries = [ar, measured("sd", {"draft_len": 2}, 2.0, 0.012, 0.004, 0.002),   # 2·0.011/0.018 = 1.22
               measured("sjd", {"window": 4}, 1.9, 0.013, 0.0, 0.002),          # 1.9·0.011/0.015 = 1.39
               measured("sjd", {"window": 32}, 3.0, 0.040, 0.0, 0.003)]         # 3·0.011/0.043 = 0.77
    best, speedup, rows = pick(entries)
    assert best.candidate == Candidate.of("sjd", {"window": 4})
    assert speedup == pytest.approx(cost_model.speedup(1.9, 0.011, 0.015))
    assert [r["label"] for r in rows] == ["sjd(window=4)", "sd(draft_len=2)", "ar", "sjd(window=32)"]
    assert rows[0]["predicted_speedup"] == pytest.approx(1.9 * 0.011 / 0.015)


def test_ar_when_nothing_beats_it_by_the_margin():
    ar = measured("ar", {}, 1.0, 0.010)
    slow = [measured("sd", {"draft_len": 4}, 2.0, 0.015, 0.008), measured("sjd", {"window": 8}, 2.2, 0.030)]
    best, speedup, _ = pick([ar, *slow])
    assert best is ar and speedup == 1.0
    barely = measured("sjd", {"window": 2}, 1.02, 0.010)  # predicted 1.02 < MARGIN
    assert MARGIN > 1.02 and pick([ar, barely])[0] is ar
    clear = measured("sjd", {"window": 2}, 1.5, 0.010)
    assert pick([ar, barely, clear])[0] is clear


def test_a_refused_or_straggling_setting_is_priced_as_such():
    ar = measured("ar", {}, 1.0, 0.010)
    refused = measured("sjd", {"window": 64}, 9.0, 0.001)
    refused.error = "window too long for this bundle"
    assert pick([ar, refused])[0] is ar
    straggler = measured("sjd", {"window": 4}, 2.0, 0.010, straggle_passes=1000)
    straggler.images, straggler.calls = 40, 10  # 4 images a call: s = 1000 · 4 / 1000 = 4
    assert straggler.straggle == 4.0
    assert pick([ar, straggler])[0] is ar  # 2 / 4 = 0.5 of ar


def test_a_rounds_seconds_come_from_one_call_not_from_each_parts_luckiest():
    """Three parts, each fastest in a different call: the round is the fastest call's whole round
    (summing each part's own minimum would price a round no call ever ran)."""
    entry = Measured(Candidate.of("sd", {"draft_len": 6}))
    entry.add(100, 50, 50, 1, None)  # the warm-up: counted, not timed
    for seconds in ((0.004, 0.006, 0.002), (0.008, 0.003, 0.002), (0.007, 0.006, 0.0005)):
        entry.add(100, 50, 50, 1, seconds)
    assert entry.round_s == pytest.approx(0.012) and (entry.target_s, entry.draft_s) == (0.004, 0.006)
    assert entry.accepted_length == 2.0 and entry.images == 4


def test_the_guarantee_decides_which_methods_compete():
    lossless = {c.method for c in candidates(METHODS)}
    assert lossless == {m for m, cls in METHODS.items() if cls.lossless and cls.auto_settings}
    assert {"ar", "sd", "sjd", "sjd-pac"} <= lossless and not {"cool-sd", "lantern"} & lossless
    relaxed = {c.method for c in candidates(METHODS, relaxed=True)}
    assert {"cool-sd", "lantern"} <= relaxed and lossless <= relaxed
    assert not any(METHODS[c.method].needs_draft for c in candidates(METHODS, relaxed=True, has_draft=False))
    assert candidates(METHODS)[0] == Candidate.of("ar")
    assert Candidate.of("sd", {"tree": "static"}) in candidates(METHODS)  # trees are lossless candidates too


def test_every_exact_coupling_competes_and_relaxed_methods_stay_out_of_lossless():
    """sjd at each window in every coupling, sjd-pac in its continuing ones (maximal, gumbel); gsd
    takes couplings too, but its test is relaxed: only --relaxed lets any of its settings in."""
    lossless = candidates(METHODS)
    for window in (2, 4, 8, 16, 32):
        for coupling in ("independent", "maximal", "gumbel"):
            assert Candidate.of("sjd", {"window": window, "coupling": coupling}) in lossless
    pac = {(c.params["window"], c.params["coupling"]) for c in lossless if c.method == "sjd-pac"}
    assert pac == {(w, c) for w in (8, 16, 32, 64) for c in ("maximal", "gumbel")}
    assert all(METHODS[c.method].lossless for c in lossless)
    assert not any(c.method == "gsd" for c in lossless)
    relaxed = candidates(METHODS, relaxed=True)
    assert {c.method for c in relaxed} >= {"gsd", "cool-sd", "lantern"} and set(lossless) <= set(relaxed)
    assert len(relaxed) == len(set(relaxed))  # no setting measured twice


def test_a_subclass_does_not_inherit_its_parents_guarantee():
    class Grouped(SpeculativeDecoding):  # a relaxed test over sd's loop that forgot to say so
        name = "grouped"

    class Exact(SpeculativeDecoding):
        name = "exact"
        lossless = True
        auto_settings = ({"draft_len": 2},)

    assert Grouped.lossless is False and Grouped.auto_settings == ()
    offered = {"ar": METHODS["ar"], "grouped": Grouped, "exact": Exact}
    assert [c.label for c in candidates(offered, relaxed=True)] == ["ar", "exact(draft_len=2)"]


# ---- choose_method: the probe stubbed, the cache real -----------------------------------------------


FAST = {"window": 4, "coupling": "gumbel"}  # the stand-in's fastest candidate


class Probe:
    """choose.probe's stand-in: counts its calls and returns fixed terms (gumbel-coupled sjd(window=4) the fastest)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, pipe, family, listed, batch, conditions, sampling, screen, confirm, progress=None):
        self.calls += 1
        rows = []
        for c in listed:
            fast = c == Candidate.of("sjd", FAST)
            rows.append(measured(c.method, c.params, 2.0 if fast else 1.0, 0.010))
        return rows


@pytest.fixture
def probe(monkeypatch):
    stub = Probe()
    monkeypatch.setattr(choosing, "probe", stub)
    return stub


def toy_pipeline() -> Pipeline:
    target, draft, vq = toy_models(vocab_size=5, grid_size=3, num_classes=4, seed=3, max_window=26)
    return Pipeline(target, vq, draft, sampling_defaults={"cfg_scale": 1.0})


def test_the_cache_is_keyed_by_batch_backend_sampling_and_guarantee(tmp_path, probe):
    def choose(pipe, **key):
        return choose_method(pipe, identity="toy", cache_dir=tmp_path, **{"batch": 1, "backend": "ort", **key})

    first = choose(toy_pipeline())
    assert (first.method, first.params, first.measured, probe.calls) == ("sjd", FAST, True, 1)
    assert first.predicted_speedup == pytest.approx(2.0)
    again = choose(toy_pipeline())  # a new pipeline object: read from disk
    assert (again.label, again.measured, probe.calls) == ("sjd(coupling=gumbel,window=4)", False, 1)
    for other in ({"batch": 4}, {"backend": "torch"}, {"sampling": {"temperature": 0.5}}, {"relaxed": True},
                  {"device": "another GPU"}):
        assert choose(toy_pipeline(), **other).measured
    assert probe.calls == 6 and len(list(tmp_path.glob("*.json"))) == 6
    assert choose(toy_pipeline(), remeasure=True).measured and probe.calls == 7
    mode = stat.S_IMODE(os.stat(first.cache_path).st_mode)
    assert mode == 0o644
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left behind


@pytest.mark.parametrize("damage", ["{not json", "[]", '{"format": 1}', ""])
def test_a_damaged_cache_entry_is_measured_again(tmp_path, probe, damage):
    first = choose_method(toy_pipeline(), identity="toy", cache_dir=tmp_path)
    first.cache_path.write_text(damage)
    said = []
    again = choose_method(toy_pipeline(), identity="toy", cache_dir=tmp_path, progress=said.append)
    assert again.measured and probe.calls == 2 and any("damaged" in line for line in said)
    assert json.loads(first.cache_path.read_text())["choice"]["label"] == "sjd(coupling=gumbel,window=4)"  # replaced


def test_an_entry_of_another_key_is_not_taken(tmp_path, probe):
    first = choose_method(toy_pipeline(), identity="toy", cache_dir=tmp_path)
    data = json.loads(first.cache_path.read_text())
    data["key"]["batch"] = 8  # a file whose key is not the one asked for (a collision, a hand edit)
    first.cache_path.write_text(json.dumps(data))
    assert choose_method(toy_pipeline(), identity="toy", cache_dir=tmp_path).measured


def test_without_an_identity_the_choice_stays_on_the_pipeline(tmp_path, probe, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path))
    pipe = toy_pipeline()
    assert choose_method(pipe).measured and not choose_method(pipe).measured and probe.calls == 1
    assert choose_method(toy_pipeline()).measured and list(tmp_path.iterdir()) == []


# ---- the real probe on the toy backend -------------------------------------------------------------


def test_the_probe_measures_every_runnable_candidate_through_generate(tmp_path):
    pipe = toy_pipeline()
    choice = choose_method(pipe, identity="toy", cache_dir=tmp_path, probe_images=(1, 1), batch=2)
    rows = {r["label"]: r for r in choice.candidates}
    assert set(rows) == {c.label for c in candidates(METHODS)}
    assert rows["ar"]["accepted_length"] == 1.0 and rows["ar"]["predicted_speedup"] == pytest.approx(1.0)
    refused = [label for label, r in rows.items() if r["error"]]
    assert "sjd-pac(coupling=maximal,window=32)" in refused  # the toy's window is 26
    assert "sjd(coupling=gumbel,window=4)" not in refused
    for r in rows.values():
        if not r["error"]:
            assert r["images"] >= 2 and r["accepted_length"] >= 1.0 and math.isfinite(r["target_s"])
    best = max((r for r in rows.values() if not r["error"]), key=lambda r: r["predicted_speedup"])
    expected = best["label"] if best["predicted_speedup"] >= MARGIN else "ar"
    assert choice.label == expected
    assert np.isfinite(choice.predicted_speedup) and choice.predicted_speedup >= 1.0
