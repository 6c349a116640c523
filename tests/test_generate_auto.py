"""`specrt generate --method auto` on each family (c2i, continuous, unified; t2i prompts go the unified
model's way through the same code): the closing line names the choice and its
predicted speed-up, the first call measures and later ones read the cache, and the flags that
only mean something with auto are one line and exit 2 without it. The probe is stubbed (its own
tests are tests/runtime/test_choosing.py): these check the command around it."""
from __future__ import annotations

import json
import re

import pytest

from cli_helpers import one_line, run
from specrt.runtime.choosing import choose as choosing
from specrt.runtime.choosing.probe import Measured

pytest.importorskip("torch")

LINE = re.compile(r"wrote (.+?)  \((\d+) images? (\d+)x(\d+), auto:(\S+): \d+ tokens, \d+ target forwards, "
                  r"mean accepted length \d+\.\d\d, \d+\.\d\d s, predicted (\d+\.\d\d)x ar; sampling .+\)")


class Probe:
    """choose.probe's stand-in: the first draft_len=2 setting listed is predicted 1.50x ar, the rest 1x."""

    def __init__(self):
        self.calls, self.listed = 0, []

    def __call__(self, pipe, family, listed, batch, conditions, sampling, screen, confirm, progress=None):
        self.calls += 1
        self.listed = [c.label for c in listed]
        if progress:
            progress("auto: measuring (stub)")
        fast = next(c for c in listed if c.params == {"draft_len": 2})
        return [Measured(c, 0.01, 0.0, 0.0, tokens=150 if c == fast else 100, forwards=100, passes=100,
                         images=1, calls=1) for c in listed]


@pytest.fixture
def probe(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    stub = Probe()
    monkeypatch.setattr(choosing, "probe", stub)
    return stub


@pytest.mark.parametrize("argv, chosen", [([], "sd(draft_len=2)"),
                                          (["--demo", "mar", "--class", "3"], "cspd(draft_len=2)"),
                                          (["--demo", "chameleon", "--prompt", "a seven"], "sd(draft_len=2)")])
def test_every_family_names_its_choice_on_the_closing_line(argv, chosen, probe, tmp_path, capsys):
    from specrt.cli import main

    out = tmp_path / "img.png"
    main(["generate", *argv, "--method", "auto", "--out", str(out), "--stats", str(tmp_path / "s.json")])
    captured = capsys.readouterr()
    match = LINE.fullmatch(captured.out.strip().splitlines()[-1])
    assert match, captured.out
    assert match.group(5) == chosen and match.group(6) == "1.50" and probe.calls == 1
    assert "auto: measuring" in captured.err  # progress on stderr, never on stdout
    assert not {"cool-sd", "lantern"} & {label.split("(")[0] for label in probe.listed}  # lossless by default
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["auto"]["chose"] == chosen and stats["auto"]["measured_now"] is True
    if not argv:  # the next call reads the cache (one family is enough: the cache is the runtime's)
        main(["generate", *argv, "--method", "auto", "--out", str(out)])
        assert probe.calls == 1 and LINE.fullmatch(capsys.readouterr().out.strip().splitlines()[-1])


def test_relaxed_admits_relaxed_methods_and_remeasure_measures_again(probe, tmp_path, capsys):
    from specrt.cli import main

    main(["generate", "--method", "auto", "--relaxed", "--out", str(tmp_path / "a.png")])
    assert {"cool-sd", "lantern"} <= {label.split("(")[0] for label in probe.listed} and probe.calls == 1
    main(["generate", "--method", "auto", "--relaxed", "--remeasure", "--out", str(tmp_path / "a.png")])
    assert probe.calls == 2
    main(["generate", "--method", "auto", "--num-images", "2", "--out", str(tmp_path / "a.png")])
    assert probe.calls == 3  # another batch (two images a call), another guarantee: measured anew
    capsys.readouterr()


@pytest.mark.parametrize("argv, message", [
    (["--relaxed"], r"--relaxed applies to --method auto"),
    (["--method", "sd", "--remeasure"], r"--remeasure applies to --method auto"),
    (["--method", "auto", "--param", "draft_len=2"], r"--param draft_len: --method auto chooses the method's "
                                                      r"parameters itself"),
])
def test_flags_that_need_auto_or_contradict_it_exit_2(argv, message, probe, tmp_path, capsys):
    code, err = run(["generate", *argv, "--out", str(tmp_path / "img.png")], capsys)
    assert code == 2 and re.search(message, one_line(err))
    assert probe.calls == 0 and list(tmp_path.glob("*.png")) == []
