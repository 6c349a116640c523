"""The gsd method (runtime/methods/grouped.py): both loops, every discrete family, the shipped token
embeddings, and a relaxation a test can see.

For one seed the host loop and the device round give the same tokens (both draw the same counter
uniforms and test with the one GroupedRule), on the c2i demo and under the chameleon demo's grammar;
with no grouping (G = 0) gsd is SJD token for token. The round traces whole under
torch.compile(fullgraph=True). On a tiny real GPT (vocabulary 3, 2x2 grid: 81 sequences, enumerated
as tests/runtime/test_rounds.py does) G = 0 passes the chi-square test against the target's
distribution and a wide cluster fails it with the same number of images. A bundle carries the
target's embeddings; one exported before them refuses gsd in one line and still runs the rest.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cli_helpers import one_line, run  # noqa: E402
from specrt.errors import SpecrtError  # noqa: E402
from specrt.runtime.methods import make_method  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402
from specrt.runtime.token_embeddings import EMBEDDINGS_FILE, TokenEmbeddings, embedding_table_of  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)


def tokens(pipe, loop: str, classes, seed: int, method: str = "gsd", **params) -> np.ndarray:
    pipe.loop = loop
    try:
        return pipe.generate(classes, method, seed=seed, decode=False, **params).tokens
    finally:
        pipe.loop = "auto"


def test_the_host_loop_gives_the_rounds_tokens_and_g0_is_sjd(torch_pipe):
    wide = {"group": 30, "radius": 4.0}
    host = tokens(torch_pipe, "host", [0, 5], 100, **wide)
    np.testing.assert_array_equal(host, tokens(torch_pipe, "round", [0, 5], 100, **wide))
    sjd = tokens(torch_pipe, "host", [0, 5], 100, "sjd")
    np.testing.assert_array_equal(tokens(torch_pipe, "host", [0, 5], 100, group=0), sjd)
    assert not np.array_equal(host, sjd)  # the grouping changed some test's outcome


def test_under_a_grammar_the_round_gives_the_host_loops_streams():
    """The chameleon demo (a unified vocabulary: 512 codes and a forced row end): the table is the
    head vocabulary's input embeddings, and the round's streams are the host loop's."""
    from specrt.export.demo.registry import get_demo

    pipe = get_demo("chameleon").hook("torch_pipeline")(None, threads=1)
    assert pipe.token_embeddings.table.shape[0] == pipe.target.spec.vocab_size
    streams = []
    for loop in ("round", "host"):
        pipe.loop = loop
        result = pipe.generate(prompts=["a thin two"], seed=3, decode=False, method="gsd", window=8)
        assert pipe.grammar.is_valid(result.stream).all()
        streams.append(result.stream)
    np.testing.assert_array_equal(*streams)


def test_the_round_traces_whole_under_fullgraph_compile():
    from round_runs import run_to_end
    from test_rounds import GUIDED, tiny_models
    from specrt.runtime.decoding import Decoding
    from specrt.runtime.rounds import plan_round
    from specrt.runtime.sampling import guidance_mix

    target, _, vq = tiny_models(vocab=16, grid=4, classes=10)
    pipe = Pipeline.from_torch(target, None, vq, max_window=16)
    method = make_method("gsd", window=6, group=8, gap=0.5, radius=4.0)
    method.embeddings = TokenEmbeddings(embedding_table_of(target))
    rows = Decoding(pipe.target, None, GUIDED, [], None).condition_rows(pipe.conditions([3, 6]))
    out = []
    for compiled in (False, True):
        round_ = plan_round(method, pipe.target, None, GUIDED, guidance_mix(2, GUIDED), None)
        with torch.inference_mode():
            state = round_.start(rows, [5, 6], 16)
            run_to_end(round_, state, compiled, 16)
            out.append(state.tokens[:, :16].clone())
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=0)


def test_the_relaxation_is_visible_in_the_sequence_distribution():
    """6,000 images of a 4-token grid: G = 0 (SJD's test) passes the chi-square test against the
    target's exact sequence distribution; a cluster of the whole vocabulary fails it (level 1e-4)."""
    from test_rounds import PLAIN, chi2_of, pipeline

    pipe = pipeline(PLAIN, loop="host")
    statistic, critical = chi2_of(pipe, "gsd", PLAIN, samples=6_000, window=3, group=0)
    assert statistic < critical
    statistic, critical = chi2_of(pipe, "gsd", PLAIN, samples=6_000, window=3, group=4, gap=1.0, radius=1e6)
    assert statistic > critical


def test_the_bundle_ships_the_targets_embeddings(demo_bundle, ort_pipe, torch_pipe):
    manifest = json.loads((demo_bundle / "manifest.json").read_text())
    entry = manifest["token_embeddings"]
    table = np.load(demo_bundle / entry["file"])
    assert entry["file"] in manifest["files"] and table.dtype == np.float32
    np.testing.assert_array_equal(table, torch_pipe.token_embeddings.table)  # the target's tok_embeddings
    np.testing.assert_array_equal(ort_pipe.generate([0, 5], "gsd", seed=100, decode=False).tokens,
                                  tokens(torch_pipe, "host", [0, 5], 100))


def test_a_bundle_without_embeddings_refuses_gsd_in_one_line(demo_bundle, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(demo_bundle, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["token_embeddings"], manifest["files"][EMBEDDINGS_FILE]
    (old / "manifest.json").write_text(json.dumps(manifest))
    (old / EMBEDDINGS_FILE).unlink()
    pipe = Pipeline.from_bundle(old, threads=1)
    with pytest.raises(SpecrtError, match="token embeddings.*re-export"):
        pipe.generate([1], "gsd", decode=False)
    assert pipe.generate([1], "sjd", decode=False).tokens.shape == (1, 8, 8)
    code, err = run(["generate", str(old), "--method", "gsd", "--out", str(tmp_path / "png")], capsys)
    assert code == 2 and "re-export" in one_line(err)


def test_parameters_are_bounded_and_continuous_models_refuse_gsd():
    from specrt.commands._family import refuse
    from specrt.runtime.families.continuous import ContinuousFamily, GSD_REFUSAL
    from specrt.runtime.families.continuous.methods import make_continuous_method

    for bad in ({"group": 100_000}, {"gap": 1.5}, {"radius": -1.0}, {"proactive_drafting": True}):
        with pytest.raises(SpecrtError):
            make_method("gsd", **bad)
    for refusal in (lambda: refuse(ContinuousFamily(), "gsd", {}), lambda: make_continuous_method("gsd")):
        with pytest.raises(SpecrtError, match="does not apply") as raised:
            refusal()
        assert str(raised.value) == GSD_REFUSAL
