"""Profiles from the manifest: derivation, --max-window, and validation against the ONNX dims."""
import copy

import pytest

from specrt.engines.profiles import DimRange, derive_profile, dim_ranges, onnx_input_dims, validate_against_onnx
from specrt.errors import SpecrtError
from tiny_bundle import CAPACITY, HEAD_DIM, N_HEAD, N_LAYER, step_entry


def test_shapes_follow_the_symbolic_dims():
    profile = derive_profile("target_step", step_entry())
    by_name = {i.name: i for i in profile.inputs}
    assert by_name["input_ids"].min == (1, 1) and by_name["input_ids"].max == (4, 8)
    assert by_name["attention_mask"].opt == (2, 4, CAPACITY + 4)
    assert by_name["attention_mask"].max == (4, 8, CAPACITY + 8)
    assert by_name["past_kv"].max == (N_LAYER, 2, 4, N_HEAD, CAPACITY, HEAD_DIM)
    assert all(i.dynamic for i in profile.inputs)


def test_head_inputs_follow_images_batch_and_window():
    profile = derive_profile("target_step", step_entry())
    by_name = {i.name: i for i in profile.inputs}
    assert [by_name["mix"].shape(level) for level in ("min", "opt", "max")] == [(1, 1), (1, 2), (4, 4)]
    assert [by_name["uniforms"].shape(level) for level in ("min", "opt", "max")] == [(1, 1), (1, 4), (4, 8)]
    assert profile.dims["images"] == DimRange(1, 1, 4)
    shrunk = {i.name: i for i in derive_profile("target_step", step_entry(), max_window=3).inputs}
    assert shrunk["uniforms"].max == (4, 3) and shrunk["mix"].max == (4, 4)


def test_prefill_head_inputs_have_a_window_of_one():
    from tiny_bundle import prefill_entry

    by_name = {i.name: i for i in derive_profile("target_prefill", prefill_entry()).inputs}
    assert by_name["uniforms"].min == (1, 1) and by_name["uniforms"].max == (4, 1)
    assert by_name["mix"].opt == (1, 2)


def test_max_window_shrinks_window_and_total_len_together():
    ranges = dim_ranges("target_step", step_entry(), max_window=3)
    assert ranges["window"] == DimRange(1, 3, 3)
    assert ranges["total_len"] == DimRange(CAPACITY + 1, CAPACITY + 3, CAPACITY + 3)
    assert ranges["batch"] == DimRange(1, 2, 4)


@pytest.mark.parametrize("max_window", [0, 9])
def test_max_window_outside_the_exported_range_is_refused(max_window):
    with pytest.raises(SpecrtError, match="--max-window"):
        dim_ranges("target_step", step_entry(), max_window=max_window)


def test_inconsistent_total_len_is_refused():
    entry = step_entry()
    entry["profile"]["total_len"]["opt"] += 1
    with pytest.raises(SpecrtError, match=r"total_len = cache_len \+ window \(opt"):
        derive_profile("target_step", entry)


@pytest.mark.parametrize("levels, message", [
    ({"min": 4, "opt": 2, "max": 8}, "min <= opt <= max"),
    ({"min": 1, "opt": 2}, "needs min, opt and max"),
    ({"min": 0, "opt": 2, "max": 8}, "positive integers"),
])
def test_malformed_profiles_are_refused(levels, message):
    entry = step_entry()
    entry["profile"]["batch"] = levels
    with pytest.raises(SpecrtError, match=message):
        derive_profile("target_step", entry)


def test_a_dim_without_profile_is_refused():
    entry = step_entry()
    del entry["profile"]["batch"]
    with pytest.raises(SpecrtError, match="no profile"):
        derive_profile("target_step", entry)


def test_valid_bundle_graph_passes_onnx_validation(bundle):
    entry = step_entry()
    validate_against_onnx(derive_profile("target_step", entry), entry, onnx_input_dims(bundle / "target_step.onnx"))


def test_a_manifest_without_the_head_inputs_is_caught_against_the_onnx_graph(bundle):
    entry = step_entry()
    entry["inputs"] = [i for i in entry["inputs"] if i["name"] != "mix"]
    with pytest.raises(SpecrtError, match="ONNX input 'mix' is not in the manifest"):
        validate_against_onnx(derive_profile("target_step", entry), entry, _onnx_dims(bundle))


def _onnx_dims(bundle):
    return onnx_input_dims(bundle / "target_step.onnx")


def test_onnx_dynamic_dim_with_static_manifest_dim_is_found(bundle):
    entry = step_entry()
    entry["inputs"][0]["shape"] = [2, "window"]
    with pytest.raises(SpecrtError, match="input 'input_ids' axis 0 is dynamic .* has no profile"):
        validate_against_onnx(derive_profile("target_step", entry), entry, _onnx_dims(bundle))


def test_static_dim_mismatch_and_missing_input_are_all_reported(bundle):
    entry = step_entry()
    entry["inputs"][3]["shape"][-1] = HEAD_DIM + 1
    removed = entry["inputs"].pop(1)
    with pytest.raises(SpecrtError) as info:
        validate_against_onnx(derive_profile("target_step", entry), entry, _onnx_dims(bundle))
    message = str(info.value)
    assert f"axis 5 is {HEAD_DIM} in ONNX but {HEAD_DIM + 1}" in message
    assert f"ONNX input {removed['name']!r} is not in the manifest" in message


def test_one_onnx_dim_mapping_to_two_manifest_symbols_is_found(bundle):
    entry = step_entry()
    entry["inputs"][1]["shape"] = ["batch", "total_len"]  # ONNX says positions is [batch, window]
    with pytest.raises(SpecrtError, match="ONNX dim 'window' is 'window' elsewhere but 'total_len' here"):
        validate_against_onnx(derive_profile("target_step", entry), entry, _onnx_dims(bundle))


def test_symbol_pinned_to_the_onnx_static_value_is_accepted():
    entry = copy.deepcopy(step_entry())
    dims = {"input_ids": [4, "window"]}
    entry["inputs"] = [entry["inputs"][0]]
    entry["profile"]["batch"] = {"min": 4, "opt": 4, "max": 4}
    validate_against_onnx(derive_profile("target_step", entry), entry, dims)
    entry["profile"]["batch"] = {"min": 1, "opt": 4, "max": 4}
    with pytest.raises(SpecrtError, match="static 4 in ONNX"):
        validate_against_onnx(derive_profile("target_step", entry), entry, dims)
