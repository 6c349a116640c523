"""The device round under a unified model's image grammar (runtime/grammar.py): the host loop's tokens,
the grammar obeyed, the target's distribution, and no graph break.

The grammar lives in the models' logits, at the stream position each row predicts, so the round's
passes carry it as long as the positions they derive from each image's length are the host's; SJD's
fresh window slots follow it through a device table of the forced tokens (rounds/jacobi.py
FreshDrafts), as the host loop's _random_level. Both loops draw the same counter uniforms, so on the
chameleon demo (an 8x8 grid of 512 codes, each row followed by a forced row end) the round must give
the host loop's streams and tokens a round, sampled and greedy, for every family; a Jacobi round
whose fresh slots ignore the grammar drafts forced slots as random codes and loses both. The
chi-square runs a tiny random-weight unified model (3 codes, a 2x2 grid, a row end after each row:
81 valid streams, enumerated from the model's teacher-forced rows, the grammar applied from its
definition) and flags a round whose fresh q is read one stream position off the drafts it describes.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _toy_exact import chi_square, reference_row  # noqa: E402
from specrt.export.unified.config import UnifiedConfig  # noqa: E402
from specrt.export.unified.model import UnifiedLM  # noqa: E402
from specrt.runtime.decoding import Decoding  # noqa: E402
from specrt.runtime.families.unified.pipeline import UnifiedPipeline  # noqa: E402
from specrt.runtime.families.unified.prompts import PromptEncoder  # noqa: E402
from specrt.runtime.grammar import ImageGrammar  # noqa: E402
from specrt.runtime.methods import make_method  # noqa: E402
from specrt.runtime.rounds import plan_round  # noqa: E402
from specrt.runtime.rounds.jacobi import FreshDrafts  # noqa: E402
from specrt.runtime.sampling import SamplingParams, guidance_mix  # noqa: E402
from round_runs import run_to_end  # noqa: E402

PROMPTS = ["a thin two", "a thick seven"]
CHAIN, STATIC = ("sd", {"draft_len": 3}), ("sd", {"tree": "static", "static_tree": "reverse_balanced_25"})
SJD = ("sjd", {"window": 6})
SAMPLED = [CHAIN, ("lantern", {"draft_len": 3, "tvd_budget": 0.3}), STATIC,
           ("sd", {"tree": "dynamic", "total_tokens": 10, "depth": 3, "tree_top_k": 3}), SJD,
           ("sjd-pac", {"window": 8, "branching": 2, "tree_depth": 2}), ("sjd", {"window": 6, "coupling": "gumbel"})]
SAMPLED_IDS = ["sd-chain", "lantern-chain", "sd-static", "sd-dynamic", "sjd", "sjd-pac", "sjd-gumbel"]
GREEDY = [("ar", {}), CHAIN, STATIC, SJD]
GREEDY_IDS = ["ar", "sd-chain", "sd-static", "sjd"]

CODES, GRID, COND_LEN, PASS = 3, 2, 3, 256
PROMPT, NULL = [5, 6], [7]  # two real tokens of three (left-padded); the unconditional prompt is one token
TINY_GRAMMAR = ImageGrammar(GRID, GRID, CODES, row_end=True)
GUIDED = SamplingParams(cfg_scale=2.0, temperature=0.9)


@pytest.fixture(scope="module")
def chameleon():
    from specrt.export.demo.registry import get_demo

    torch.set_num_threads(1)
    return get_demo("chameleon").hook("torch_pipeline")(None, threads=1)


def decode_both(pipe, method: str, params: dict, **sampling) -> tuple:
    """The round's result (checked to be the round: the runners' own steps never run), then the host loop's."""
    pipe.loop = "round"
    rounds = pipe.generate(prompts=PROMPTS, seed=3, decode=False, method=method, **sampling, **params)
    assert pipe.target.forwards == 0, "the round did not decode: the host loop's steps ran"
    pipe.loop = "host"
    host = pipe.generate(prompts=PROMPTS, seed=3, decode=False, method=method, **sampling, **params)
    return rounds, host


def assert_the_same(pipe, rounds, host, method: str) -> None:
    assert pipe.grammar.is_valid(rounds.stream).all()
    np.testing.assert_array_equal(rounds.stream, host.stream)
    assert rounds.stats.accepted_lengths == host.stats.accepted_lengths
    assert len({tuple(row) for row in rounds.stream.tolist()}) == len(PROMPTS)
    if method != "ar":
        assert max(rounds.stats.accepted_lengths) > 1


@pytest.mark.parametrize("method,params", SAMPLED, ids=SAMPLED_IDS)
def test_a_round_under_a_grammar_gives_the_host_loops_tokens(chameleon, method, params):
    """The demo's own sampling (CFG 3, temperature 1): the same uniforms, so the same streams."""
    assert_the_same(chameleon, *decode_both(chameleon, method, params), method)


@pytest.mark.parametrize("method,params", GREEDY, ids=GREEDY_IDS)
def test_a_greedy_round_under_a_grammar_gives_the_host_loops_tokens(chameleon, method, params):
    assert_the_same(chameleon, *decode_both(chameleon, method, params, temperature=0.0), method)


def test_a_jacobi_round_whose_fresh_slots_ignore_the_grammar_is_not_the_host_loop(chameleon, monkeypatch):
    """Fresh slots drawn over the whole head vocabulary, q uniform over it (a forced row end drafted as a
    random code and rejected): still lossless, but not the host loop's drafts — other streams when
    sampled, and under greedy decoding (lossless and deterministic) the same streams in more rounds."""
    greedy, _ = decode_both(chameleon, *SJD, temperature=0.0)
    fresh = FreshDrafts.__init__
    monkeypatch.setattr(FreshDrafts, "__init__", lambda self, target, vocab, grammar=None, **options:
                        fresh(self, target, vocab, **options))
    monkeypatch.setattr(chameleon, "_rounds", {})  # plan anew; the correct rounds come back after
    rounds, host = decode_both(chameleon, *SJD)
    assert chameleon.grammar.is_valid(rounds.stream).all()
    assert not np.array_equal(rounds.stream, host.stream)
    ignoring, host = decode_both(chameleon, *SJD, temperature=0.0)
    np.testing.assert_array_equal(ignoring.stream, host.stream)
    assert sum(ignoring.stats.accepted_lengths.values()) > sum(greedy.stats.accepted_lengths.values())


# ---- a tiny unified model: exact distribution, planted bug, fullgraph trace -------------------------


def tiny_unified(seed: int, dim: int, layers: int) -> UnifiedLM:
    """A Chameleon-layout UnifiedLM with random weights over TINY_GRAMMAR (text ids 8..10 the codes, 11 the row end)."""
    head_dim = dim // 2
    config = UnifiedConfig(architecture="chameleon", n_layer=layers, n_head=2, n_kv_head=1, head_dim=head_dim,
                           dim=dim, ffn_hidden=2 * dim, text_vocab_size=16, norm_eps=1e-5,
                           inv_freq=[1.0 / 10000 ** (i / head_dim) for i in range(0, head_dim, 2)], rope_scaling=1.0,
                           grammar=TINY_GRAMMAR, cond_len=COND_LEN, qk_norm=True,
                           image_token_ids=(8, 9, 10), row_end_id=11)
    torch.manual_seed(seed)
    model = UnifiedLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:  # embeddings and projections: rows far from uniform
                parameter.normal_(0.0, 0.5)
    return model


@pytest.fixture(scope="module")
def tiny_pipe():
    torch.set_num_threads(1)
    prompts = PromptEncoder({"uncond": {"kind": "ids", "ids": NULL}, "pad_id": 0}, COND_LEN)
    pipe = UnifiedPipeline.from_torch(tiny_unified(1, 16, 2), tiny_unified(2, 8, 1), prompts=prompts, max_window=16,
                                      sampling_defaults=vars(GUIDED), max_images=PASS)
    pipe.loop = "round"
    return pipe


def exact_streams(lm: UnifiedLM, sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(stream) of every valid stream: the chain rule over the model's teacher-forced code logits at the
    sampled positions (CFG and temperature from their definitions), 1 at the forced row ends."""
    forced = TINY_GRAMMAR.forced()
    sampled = [k for k in range(TINY_GRAMMAR.stream_len) if forced[k] < 0]
    streams = []
    for codes in itertools.product(range(CODES), repeat=len(sampled)):
        stream = forced.copy()
        stream[sampled] = codes
        streams.append(stream)
    stream = torch.tensor(np.array(streams))
    count = len(streams)

    def logits(prompt: list[int]) -> np.ndarray:
        ids = torch.tensor([[0] * (COND_LEN - len(prompt)) + prompt] * count)
        mask = torch.tensor([[False] * (COND_LEN - len(prompt)) + [True] * len(prompt)] * count)
        with torch.no_grad():
            return lm.image_logits_of(ids, mask, stream).double().numpy()

    cond, uncond = logits(PROMPT), logits(NULL)
    out = {}
    for s, row in enumerate(streams):
        prob = 1.0
        for k in sampled:
            prob *= reference_row(cond[s, k, :CODES], uncond[s, k, :CODES], sampling)[row[k]]
        out[tuple(row.tolist())] = prob
    return out


def chi2_of(pipe, method: str, samples: int, **params) -> tuple[float, float]:
    result = pipe.generate(prompt_ids=[PROMPT] * samples, method=method, seed=11, decode=False, **params)
    assert TINY_GRAMMAR.is_valid(result.stream).all()
    exact = exact_streams(pipe.target.gpt, GUIDED)
    assert abs(sum(exact.values()) - 1) < 1e-9
    return chi_square(result.stream, exact)


@pytest.mark.parametrize("method,params,samples", [
    ("sjd", {"window": 3}, 6_000),
    # a window of 4 on a 6-token stream: a chain window can accept every draft with tokens to spare,
    # which reads the row after its last draft
    ("sjd-pac", {"window": 4, "branching": 2, "tree_depth": 1}, 4_000),
    ("sd", {"draft_len": 3}, 4_000),
], ids=["sjd", "sjd-pac", "sd"])
def test_a_round_under_a_grammar_samples_the_targets_distribution(tiny_pipe, method, params, samples):
    statistic, critical = chi2_of(tiny_pipe, method, samples, **params)
    assert statistic < critical, f"{method} {params}: chi2 {statistic:.1f} >= {critical:.1f}"


def test_a_round_whose_fresh_q_is_one_stream_position_off_is_flagged(tiny_pipe, monkeypatch):
    """The fresh drafts follow the table, but the q they are tested with is read at the next stream
    position: a code drafted at a row's last column is tested against the row end's point mass (q = 0
    there, so p/q is infinite) and always kept, whatever the target's row says. 2,000 images: the
    statistic is about 16,000, the critical value 56."""
    rows = FreshDrafts.rows
    monkeypatch.setattr(FreshDrafts, "rows", lambda self, index: rows(self, index + 1))
    monkeypatch.setattr(tiny_pipe, "_rounds", {})  # plan anew; the correct rounds come back after
    statistic, critical = chi2_of(tiny_pipe, "sjd", 2_000, window=3)
    assert statistic > critical, f"a shifted fresh q passed: chi2 {statistic:.1f} < {critical:.1f}"


def test_a_round_under_a_grammar_traces_whole_under_fullgraph_compile(tiny_pipe):
    """torch.compile(fullgraph=True, aot_eager) of the round planned under the grammar: no graph break,
    the eager round's tokens, and streams the grammar allows. sjd-pac: the fresh slots' table, the
    unified model's tree window and the commit of its accepted path (a drafted round's passes are the
    same model's window: test_rounds.py traces those)."""
    method_ = make_method("sjd-pac", window=4, branching=2, tree_depth=1)
    rows = Decoding(tiny_pipe.target, None, GUIDED, [], None).condition_rows(
        tiny_pipe.conditions(prompt_ids=[PROMPT, [4, 5, 6]]))
    total = TINY_GRAMMAR.stream_len
    streams = []
    for compiled in (False, True):
        round_ = plan_round(method_, tiny_pipe.target, tiny_pipe.draft, GUIDED, guidance_mix(2, GUIDED), TINY_GRAMMAR)
        with torch.inference_mode():
            state = round_.start(rows, [5, 6], total)
            run_to_end(round_, state, compiled, total)
            streams.append(state.tokens[:, :total].clone())
    torch.testing.assert_close(streams[1], streams[0], rtol=0, atol=0)
    assert TINY_GRAMMAR.is_valid(streams[0].numpy()).all()
