"""`specrt demo report` says what it is doing while it runs (minutes at the default size)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    from specrt.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_report_prints_its_steps_on_stderr(tmp_path, capsys):
    code, out, err = run(["demo", "report", "--per-class", "2", "--threads", "1", "--json", str(tmp_path / "r.json")],
                         capsys)
    assert code == 0 and "mean accepted length" in out
    steps = [line for line in err.splitlines() if line.startswith("[")]
    assert [line[:5] for line in steps] == ["[1/3]", "[2/3]", "[3/3]"] and err.splitlines()[-1].startswith("done in")
    assert "20 images" in steps[0]
    assert (tmp_path / "r.json").is_file()

    code, out, err = run(["demo", "report", "--per-class", "2", "--threads", "1", "--no-progress"], capsys)
    assert code == 0 and err == ""
