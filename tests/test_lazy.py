"""A missing optional dependency is one line naming the extra that brings it (specrt.lazy)."""
from __future__ import annotations

import sys

import pytest

from specrt.errors import MissingDependency
from specrt.lazy import require


@pytest.mark.parametrize("module, feature, extra", [
    ("transformers", "T5 text encoders", "pip install 'specrt[t2i]'"),
    ("tokenizers", "the bundle's text encoder", "pip install 'specrt[t2i]'"),
    ("torch", "specrt export", "pip install 'specrt[export]'"),
    ("tritonclient.grpc", "the serving client", "pip install 'specrt[serve]'"),
    ("modelopt.onnx", "specrt quantize --mode int8", "pip install 'specrt[quant]'"),
])
def test_the_message_names_the_extra(module, feature, extra, monkeypatch):
    top = module.split(".")[0]
    monkeypatch.setitem(sys.modules, top, None)  # importing it now raises ImportError
    if module != top:
        monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(MissingDependency) as info:
        require(module, feature)
    assert str(info.value).startswith(f"{top} is not installed (needed for {feature}): {extra}")


def test_the_t2i_demo_without_transformers_exits_2_naming_the_extra(monkeypatch, capsys, tmp_path):
    pytest.importorskip("torch")
    from specrt.cli import main

    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--demo", "t2i", "--prompt", "a thick seven", "--out", str(tmp_path / "t2i.png")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert "transformers is not installed" in err and "pip install 'specrt[t2i]'" in err
