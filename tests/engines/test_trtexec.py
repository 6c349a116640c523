"""trtexec lines built from the profiles, for TensorRT 10 (flags) and 11 (converted graphs)."""
import shlex

import pytest

from specrt.engines.profiles import derive_profile
from specrt.engines.trtexec import parse_size, shapes_arg, trtexec_line, trtexec_script
from specrt.errors import SpecrtError
from tiny_bundle import CAPACITY, step_entry


@pytest.mark.parametrize("text, expected", [
    ("4G", 4 << 30), ("512M", 512 << 20), ("1.5G", 3 << 29), ("4096", 4 << 30), ("64KiB", 64 << 10), ("2gb", 2 << 30),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "4X", "", "0"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(SpecrtError):
        parse_size(text)


def test_shapes_arg_lists_every_dynamic_input_at_each_level():
    profile = derive_profile("target_step", step_entry(), max_window=4)
    assert shapes_arg(profile, "max") == (
        f"input_ids:4x4,positions:4x4,attention_mask:4x4x{CAPACITY + 4},past_kv:1x2x4x2x{CAPACITY}x8,"
        "mix:4x4,uniforms:4x4")
    assert shapes_arg(profile, "opt").endswith(",mix:1x2,uniforms:1x4")  # one image, CFG batch of two
    assert shapes_arg(profile, "min").startswith("input_ids:1x1,positions:1x1,attention_mask:1x1x")
    assert shapes_arg(profile, "min").endswith(",mix:1x1,uniforms:1x1")


def test_tensorrt_10_line_uses_the_precision_flag():
    profile = derive_profile("target_step", step_entry())
    line = trtexec_line("target_step", "target_step.onnx", profile, "fp16", False, 3 << 30, "e/t.engine", "e/timing.cache")
    argv = list(line.argv)
    assert argv[:2] == ["trtexec", "--onnx=target_step.onnx"]
    assert f"--optShapes={shapes_arg(profile, 'opt')}" in argv
    assert "--fp16" in argv and "--stronglyTyped" not in argv
    assert "--memPoolSize=workspace:3072" in argv
    assert "--saveEngine=e/t.engine" in argv and "--timingCacheFile=e/timing.cache" in argv
    assert shlex.split(str(line)) == argv


def test_tensorrt_11_line_is_strongly_typed_without_precision_flags():
    profile = derive_profile("target_step", step_entry())
    line = trtexec_line("target_step", "conv/t.fp16.onnx", profile, "fp16", True, 1 << 30, "e.engine", "t.cache")
    assert "--stronglyTyped" in line.argv and "--fp16" not in line.argv and "fp16 conversion" in line.note


def test_fp32_line_has_no_precision_flag():
    profile = derive_profile("target_step", step_entry())
    line = trtexec_line("target_step", "t.onnx", profile, "fp32", False, 1 << 30, "e.engine", "t.cache")
    assert not {"--fp16", "--bf16", "--stronglyTyped"} & set(line.argv)


def test_script_for_a_bundle(bundle):
    script = trtexec_script(bundle, "bf16", 2 << 30, max_window=4, trt_major=10)
    assert f"cd {bundle}" in script and "mkdir -p engines/trtexec" in script
    assert script.count("--bf16") == 2 and "--saveEngine=engines/trtexec/vq_decode.bf16.engine" in script
    assert f"attention_mask:4x4x{CAPACITY + 4}" in script
    assert "mix:4x4,uniforms:4x4" in script  # the sampling head's inputs are profiled too


def test_prefill_line_profiles_the_head_inputs(tmp_path):
    from tiny_bundle import write_bundle

    bundle = write_bundle(tmp_path / "bundle", with_prefill=True)
    script = trtexec_script(bundle, "fp32", graphs=["target_prefill"])
    assert "--minShapes=class_ids:1,mix:1x1,uniforms:1x1" in script
    assert "--optShapes=class_ids:2,mix:1x2,uniforms:1x1" in script
    assert "--maxShapes=class_ids:4,mix:4x4,uniforms:4x1" in script


def test_script_for_tensorrt_11_writes_and_points_at_converted_graphs(bundle):
    script = trtexec_script(bundle, "fp16", trt_major=11)
    assert "--onnx=engines/converted/target_step.fp16.onnx" in script
    assert (bundle / "engines/converted/target_step.fp16.onnx").is_file()
    assert "--fp16" not in script
