"""`specrt generate --compile/--no-compile`: the torch backend's step compiled or eager, refused where nothing compiles."""
import numpy as np

from cli_helpers import one_line, run


def test_compiled_and_eager_demo_write_the_same_tokens(tmp_path, capsys):
    tokens = {}
    for flag in ("--compile", "--no-compile"):
        path = tmp_path / f"{flag[2:]}.npy"
        code, err = run(["generate", "--class", "4", "--seed", "2", flag, "--tokens-only", "--save-tokens", str(path)],
                        capsys)
        assert code == 0, err
        tokens[flag] = np.load(path)
    np.testing.assert_array_equal(tokens["--compile"], tokens["--no-compile"])


def test_compile_flags_on_a_bundle_exit_2(demo_bundle, tmp_path, capsys):
    for flag in ("--compile", "--no-compile"):
        code, err = run(["generate", str(demo_bundle), flag, "--out", str(tmp_path / "x.png")], capsys)
        assert code == 2
        assert "a BUNDLE runs its exported graphs" in one_line(err)
    assert not list(tmp_path.iterdir())


def test_compile_flags_on_another_family_exit_2(tmp_path, capsys):
    code, err = run(["generate", "--demo", "mar", "--no-compile", "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2
    assert "--compile/--no-compile does not apply" in one_line(err)
