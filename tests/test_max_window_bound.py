"""A largest window beyond what a model's images can use is one line, never a 37 GiB allocation."""
import pytest

from cli_helpers import one_line, run


def test_generate_refuses_a_window_longer_than_an_image(tmp_path, capsys):
    code, err = run(["generate", "--max-window", "100000", "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2
    assert "no window is longer than 65; give at most 65" in one_line(err)
    assert not list(tmp_path.iterdir())


def test_the_python_api_applies_the_same_bound():
    pytest.importorskip("torch")
    from specrt.errors import SpecrtError
    from specrt.export.demo import load_demo
    from specrt.runtime.pipeline import Pipeline

    demo = load_demo()
    with pytest.raises(SpecrtError, match="give at most 65"):
        Pipeline.from_torch(demo.target, demo.draft, demo.vq, max_window=66)
    assert Pipeline.from_torch(demo.target, demo.draft, demo.vq, max_window=65).target.max_window == 65


@pytest.mark.parametrize("flags,message", [
    (["--windows", "100000"], "--windows 100000: this model's images have 256 tokens"),
    (["--profile-images", "100000"], "--profile-images 100000: at most 32 images a step"),
    (["--repeats", "100000000"], "'--repeats': 100000000 is not in the range"),
])
def test_the_step_profile_bounds_what_it_allocates(flags, message, capsys):
    code, err = run(["bench", "--profile-arch", "llamagen-c2i-B", *flags], capsys)
    assert code == 2
    assert message in one_line(err)
