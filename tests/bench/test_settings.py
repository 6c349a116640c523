"""--methods / --sweep parsing: aliases per method, cross products, ordering, validation."""
from __future__ import annotations

import pytest

from specrt.bench.settings import DEFAULT_METHODS, DEFAULT_SWEEPS, Setting, build_settings, parse_sweep
from specrt.errors import SpecrtError


def test_sweep_aliases_map_to_each_methods_own_parameter():
    assert parse_sweep("cool-sd:delta=1.1,2,3") == ("cool-sd", [{"relaxation_budget": 1.1}, {"relaxation_budget": 2},
                                                                 {"relaxation_budget": 3}])
    # δ is LANTERN's TVD budget, and L is the window for the Jacobi methods
    assert parse_sweep("lantern:delta=0.2") == ("lantern", [{"tvd_budget": 0.2}])
    assert parse_sweep("sjd-pac:L=16;K=2") == ("sjd-pac", [{"window": 16, "branching": 2}])
    assert parse_sweep("cool-sd:schedule=uniform") == ("cool-sd", [{"schedule": "uniform"}])


def test_sweep_keys_cross():
    method, params = parse_sweep("lantern:k=5,10;delta=0.1,0.3")
    assert method == "lantern"
    assert params == [{"neighbours_k": 5, "tvd_budget": 0.1}, {"neighbours_k": 5, "tvd_budget": 0.3},
                      {"neighbours_k": 10, "tvd_budget": 0.1}, {"neighbours_k": 10, "tvd_budget": 0.3}]


def test_default_settings_have_ar_first_and_the_cool_sd_sweep():
    settings = build_settings(DEFAULT_METHODS, DEFAULT_SWEEPS)
    assert settings[0] == Setting("ar")
    methods = [s.method for s in settings]
    assert set(methods) == set(DEFAULT_METHODS)
    budgets = [s.params["relaxation_budget"] for s in settings if s.method == "cool-sd"]
    assert len(budgets) >= 3 and budgets == sorted(budgets) and budgets[0] > 1
    assert methods.index("cool-sd") < methods.index("lantern")  # the sweep is expanded in place
    couplings = [s.params.get("coupling") for s in settings if s.method == "sjd"]
    assert couplings == ["independent", "maximal", "gumbel"]  # SJD's draft couplings side by side
    assert [s.label for s in settings if s.method == "sjd"][2] == "sjd(coupling=gumbel)"


def test_ar_is_always_measured_and_swept_methods_are_added():
    settings = build_settings("sjd", ["sd:L=2,6"])
    assert [s.label for s in settings] == ["ar", "sjd", "sd(L=2)", "sd(L=6)"]


def test_labels_use_paper_symbols():
    assert Setting("cool-sd", {"relaxation_budget": 2}).label == "cool-sd(delta=2)"
    assert Setting("lantern", {"ratio": 2.0}).label == "lantern(lambda=2.0)"
    assert Setting("sjd").label == "sjd"


@pytest.mark.parametrize("methods, sweeps, fragment", [
    ("ar,medusa", [], "unknown method(s) medusa"),
    ("ar", ["cool-sd"], "expected METHOD:KEY=V1,V2"),
    ("ar", ["cool-sd:delta"], "is not KEY=V1,V2"),
    ("ar", ["cool-sd:delta="], "is not KEY=V1,V2"),
    ("ar", ["nope:delta=2"], "unknown method 'nope'"),
    ("ar", ["sd:delta=2"], "sd has no parameter 'delta'"),
    ("ar", ["cool-sd:delta=0.5"], "relaxation_budget (δ) must be a finite number >= 1"),  # the runtime's own range check
    ("ar", ["sjd:L=abc"], "must be an integer"),
])
def test_bad_methods_and_sweeps_are_one_line_user_errors(methods, sweeps, fragment):
    with pytest.raises(SpecrtError) as info:
        build_settings(methods, sweeps)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_drafts_repeat_each_drafted_setting_per_draft_kind():
    from specrt.bench.settings import parse_drafts

    drafts = parse_drafts("independent, eagle")
    settings = build_settings("ar,sd,sjd", ("cool-sd:delta=2",), drafts)
    assert [s.label for s in settings] == ["ar", "sd[independent]", "sd[eagle]", "sjd",
                                           "cool-sd(delta=2)[independent]", "cool-sd(delta=2)[eagle]"]
    assert len({*settings}) == len(settings)  # the draft is part of a setting's identity
    for bad in ("medusa", ""):
        with pytest.raises(SpecrtError, match="--drafts"):
            parse_drafts(bad)
