"""`specrt generate --loop auto|round|host`: the device round or the host loop on the torch backend
(LlamaGen's, the unified and the continuous demos'), refused in one line where the backend or the
method has no round."""
import json
from pathlib import Path

import numpy as np

from cli_helpers import one_line, run


def generate(tmp_path, capsys, *flags: str) -> tuple[np.ndarray, dict]:
    name = "-".join(f.strip("-") for f in flags) or "default"
    tokens, stats = tmp_path / f"{name}.npy", tmp_path / f"{name}.json"
    code, err = run(["generate", "--method", "sd", "--class", "3", "--seed", "1", "--num-images", "2", *flags,
                     "--tokens-only", "--save-tokens", str(tokens), "--stats", str(stats)], capsys)
    assert code == 0, err
    return np.load(tokens), json.loads(stats.read_text())


def test_the_round_reads_the_host_once_a_round_and_the_host_loop_more(tmp_path, capsys):
    round_tokens, round_stats = generate(tmp_path, capsys, "--loop", "round")
    host_tokens, host_stats = generate(tmp_path, capsys, "--loop", "host")
    for stats in (round_stats, host_stats):
        assert stats["tokens"] == round_tokens.size and stats["host_syncs"] is not None
    # the round: one read a round (target_calls = rounds + 1 with the prefill) and two a call
    assert round_stats["host_syncs"] <= round_stats["target_calls"] + 1, round_stats
    assert host_stats["host_syncs"] > round_stats["host_syncs"] + 1, (host_stats, round_stats)
    # the loops draw the same counter uniforms: the same tokens, whichever ran
    np.testing.assert_array_equal(round_tokens, host_tokens)


def test_auto_on_a_cpu_is_the_host_loop(tmp_path, capsys):
    auto_tokens, auto_stats = generate(tmp_path, capsys)  # the default, --loop auto
    host_tokens, host_stats = generate(tmp_path, capsys, "--loop", "host")
    np.testing.assert_array_equal(auto_tokens, host_tokens)
    assert auto_stats["host_syncs"] == host_stats["host_syncs"]


def test_an_unknown_loop_exits_2_in_one_line(tmp_path, capsys):
    code, err = run(["generate", "--loop", "bogus", "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2
    assert "--loop" in one_line(err) and "bogus" in err
    assert not list(tmp_path.iterdir())


def test_round_for_a_method_without_one_exits_2_in_one_line(tmp_path, capsys):
    code, err = run(["generate", "--method", "cool-sd", "--param", "theorem2=true", "--loop", "round",
                     "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2
    assert "no device round" in one_line(err) and "'host'" in err
    assert not list(tmp_path.iterdir())


def test_round_on_a_bundle_exits_2_before_it_loads(demo_bundle, tmp_path, capsys):
    code, err = run(["generate", str(demo_bundle), "--loop", "round", "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2
    assert "--loop round" in one_line(err) and "BUNDLE" in err
    assert not list(tmp_path.iterdir())


def test_the_mar_demo_gives_a_seed_the_same_tokens_in_either_loop(tmp_path, capsys):
    """--loop and --device reach the continuous demo's PyTorch pipeline: the round reads the host once
    a round, the host loop never counts its reads, and a seed's tokens agree to float rounding."""
    tokens, stats = {}, {}
    for loop in ("round", "host"):
        name = tmp_path / loop
        code, err = run(["generate", "--demo", "mar", "--class", "3", "--seed", "2", "--loop", loop, "--device", "cpu",
                         "--tokens-only", "--save-tokens", f"{name}.npy", "--stats", f"{name}.json"], capsys)
        assert code == 0, err
        tokens[loop], stats[loop] = np.load(f"{name}.npy"), json.loads(Path(f"{name}.json").read_text())
    assert tokens["round"].shape == (1, 64, 4)
    np.testing.assert_allclose(tokens["round"], tokens["host"], rtol=0, atol=1e-4)
    assert stats["round"]["host_syncs"] == stats["round"]["target_passes"] + 2 and stats["host"]["host_syncs"] is None


def test_the_chameleon_demo_runs_the_device_round(tmp_path, capsys, monkeypatch):
    """The unified demo's round, under its image grammar, from the command line (the round's loop is
    the one that ran), and a seed's tokens are the host loop's."""
    from specrt.runtime import rounds

    ran, original = [], rounds.decode_rounds
    monkeypatch.setattr(rounds, "decode_rounds", lambda *args, **kwargs: ran.append(1) or original(*args, **kwargs))
    tokens = {}
    for loop in ("round", "host"):
        name = tmp_path / f"{loop}.npy"
        code, err = run(["generate", "--demo", "chameleon", "--prompt", "a thick seven", "--method", "sjd",
                         "--loop", loop, "--tokens-only", "--save-tokens", str(name)], capsys)
        assert code == 0, err
        tokens[loop] = np.load(name)
        assert len(ran) == 1, f"--loop {loop}: the device round ran {len(ran)} times"
    np.testing.assert_array_equal(tokens["round"], tokens["host"])


def test_torch_flags_on_a_continuous_bundle_exit_2_as_on_a_llamagen_bundle(tmp_path, capsys):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text('{"family": "continuous"}')
    for flags, message in [(["--loop", "round"], "a BUNDLE decodes with the host loop"),
                           (["--device", "cuda"], "a BUNDLE runs where --backend says"),
                           (["--compile"], "--compile/--no-compile does not apply")]:
        code, err = run(["generate", str(bundle), *flags, "--out", str(tmp_path / "x.png")], capsys)
        assert code == 2 and message in one_line(err), (flags, err)
    assert not (tmp_path / "x.png").exists()
