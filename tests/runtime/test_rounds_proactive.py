"""SJD-PAC's full trees in the device round (runtime/rounds/proactive.py, tree="full").

The round's full-tree window is the host loop's (build_window, row_route) slot for slot. Its tokens
follow the target's sequence distribution, enumerated from a tiny real GPT of vocabulary 2 on a 3x3
grid (512 sequences): test_rounds.py's 2x2 grid never lets a tree's second depth be verified, since
a tree window follows a rejected round, which leaves at most one more token to verify. The same check
flags a tree mask whose off-first subtrees see the first path's node in place of their own parent.
Greedy decoding gives the host loop's tokens (its one-hot rows give every depth one candidate, so
both loops verify chains: this holds the round's chain path and model step to the runner's).
Capture, batches and syncs: test_rounds.py's FAMILIES; on a GPU, test_rounds_cuda.py.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_rounds import chi2_of, pipeline  # noqa: E402
from specrt.runtime.methods.jacobi import Level, build_window, row_route  # noqa: E402
from specrt.runtime.rounds import proactive  # noqa: E402
from specrt.runtime.rounds.state import RoundState  # noqa: E402
from specrt.runtime.sampling import SamplingParams  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)

# guided and hot, so that many of the 512 sequences fill their cells; K = 2, D = 2: 6 tree slots, 2 chain slots
HOT = SamplingParams(cfg_scale=2.0, temperature=2.0)
FULL = {"tree": "full", "window": 8, "branching": 2, "tree_depth": 2}
SAMPLES = 4_000


@pytest.mark.parametrize("width,branching,depth", [(8, 2, 2), (14, 2, 3), (13, 3, 2), (4, 4, 1)])
def test_the_full_layout_is_the_host_loops_window(width, branching, depth):
    """Slot numbers, depths, candidate numbers, children and ancestry of the round's full-tree layout
    are those of the host loop's window for the same levels, and the rows the next window reads from
    each slot follow the host loop's route."""
    tables = proactive.window_layouts(width, branching, depth, full=True)
    chain = width - proactive.tree_nodes(branching, depth, full=True)
    levels = [Level(list(range(branching)), np.zeros(1), fanout=d < depth) for d in range(1, depth + 1)]
    levels += [Level([0], np.zeros(1)) for _ in range(chain)]
    window, children = build_window(0, levels)
    assert len(window) == width + 1 and tables["levels"][1] == depth + chain
    np.testing.assert_array_equal(tables["depths"][1], window.depths())
    np.testing.assert_array_equal(tables["ancestry"][1], window.ancestry())
    for level, kids in enumerate(children):
        for parent, slots in kids.items():
            assert tables["children"][1][parent][: len(slots)] == slots
            assert [tables["ks"][1][slot] for slot in slots] == list(range(len(slots)))
    leaves = {slot for slot in range(width + 1) if all(slot not in kids for kids in children)}
    assert leaves == {slot for slot, row in enumerate(tables["children"][1]) if row[0] < 0}
    for slot in range(width + 1):
        assert tables["route"][1][slot][: len(levels) + 1] == row_route(window.path_to(slot), children, len(levels))


class RowsBySlot:
    """A target whose row at window slot j is one-hot at argmax[j]: every test the walk makes then
    accepts or rejects for sure, and every draw is that token."""

    device, row_dtype = torch.device("cpu"), torch.float64

    def __init__(self, vocab: int, argmax: list[int]):
        self.rows = torch.nn.functional.one_hot(torch.tensor(argmax), vocab).to(torch.float64)[None]

    def tree_window(self, ids, depths, ancestry, start):
        return self.rows.expand(ids.shape[0], -1, -1).clone()

    def commit_path(self, slots, start):
        pass


@pytest.mark.parametrize("second_drafted,committed,next_draft", [(True, [1, 2, 0], 3), (False, [1, 2], 3)])
def test_a_full_tree_walks_into_a_later_candidates_subtree_while_it_fans_out(second_drafted, committed, next_draft):
    """K = 2, D = 2, L = 8: slot 0 pending; 1, 2 depth 1's candidates (tokens 0, 1); 3, 4 under slot 1 and
    5, 6 under slot 2 (tokens 2, 3); 7, 8 the chain under slot 3. Token 0 fails, token 1 passes
    (slot 2), token 2 passes under it (slot 5, a leaf: its row's token 0 is the bonus). Where depth 2
    drafted no candidates of its own (the host loop's tree was one depth deep: only the first path
    goes on), slot 2 is a leaf, its row's token 2 the bonus, and the next window's rows follow the
    first path (slot 3's row, token 3; slot 5's would give 0)."""
    width, vocab = 8, 4
    target = RowsBySlot(vocab, [1, 3, 2, 3, 3, 0, 3, 3, 3])
    round_ = proactive.ProactiveRound(target, width, vocab, 2, 2, coupling="independent", full=True)
    state = RoundState.start(target.device, [7], total=20, window=width + 1)
    round_.candidates = torch.zeros((1, width, 2), dtype=torch.int64)
    round_.candidates[0, :2] = torch.tensor([[0, 1], [2, 3]])
    round_.counts = torch.ones((1, width), dtype=torch.int64)
    round_.counts[0, :2] = torch.tensor([2, 2 if second_drafted else 1])
    round_.proposal = torch.full((1, width, vocab), 1.0 / vocab, dtype=torch.float64)
    round_.proposal[0, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0])
    round_.proposal[0, 1] = torch.tensor([0.0, 0.0, 0.5, 0.5] if second_drafted else [0.0, 0.0, 1.0, 0.0])
    round_.tree = torch.tensor([True])
    round_.drafted = torch.tensor([[True, second_drafted]])
    round_(state)
    assert state.tokens[0, 1: int(state.length[0])].tolist() == committed
    assert int(round_.candidates[0, 0, 0]) == next_draft


def test_full_tree_rounds_match_the_exact_target_distribution():
    statistic, critical = chi2_of(pipeline(HOT, vocab=2, grid=3), "sjd-pac", HOT, SAMPLES, **FULL)
    assert statistic < critical, f"chi2 {statistic:.1f} >= {critical:.1f}"


def test_a_full_tree_whose_other_subtrees_see_the_first_parent_is_flagged(monkeypatch):
    """The tree mask's planted bug: below depth 1's other candidates, every node attends to depth 1's
    first candidate in place of its own ancestor there, so its row (a bonus token's, a deeper test's)
    follows the wrong prefix."""
    layouts = proactive.window_layouts

    def first_parent_seen(width, branching, depth, full=False):
        tables = layouts(width, branching, depth, full)
        children, ancestry, first = tables["children"][1], tables["ancestry"][1], tables["spine"][1][1]
        for other in children[0][1:]:
            below = [slot for slot in children[other] if slot >= 0]
            while below:
                slot = below.pop()
                ancestry[slot][other], ancestry[slot][first] = False, True
                below += [kid for kid in children[slot] if kid >= 0]
        return tables

    monkeypatch.setattr(proactive, "window_layouts", first_parent_seen)
    statistic, critical = chi2_of(pipeline(HOT, vocab=2, grid=3), "sjd-pac", HOT, SAMPLES, **FULL)
    assert statistic > critical, f"a mask off its parent passed: chi2 {statistic:.1f} < {critical:.1f}"


def test_greedy_full_tree_rounds_give_the_host_loops_tokens():
    greedy = SamplingParams(cfg_scale=2.0, temperature=0.0)
    pipe = pipeline(greedy, vocab=16, grid=4, classes=10)
    rounds = pipe.generate([3, 6, 1], method="sjd-pac", seed=4, decode=False, **FULL)
    pipe.loop = "host"
    host = pipe.generate([3, 6, 1], method="sjd-pac", seed=4, decode=False, **FULL)
    np.testing.assert_array_equal(rounds.tokens, host.tokens)
    assert len({tuple(row.ravel()) for row in host.tokens}) > 1


def test_a_full_tree_that_does_not_fit_the_window_runs_the_host_loop():
    """K + K² + … + K^D > L has no round (the method's own check refuses a full tree that large; a
    round is planned for what fits, with its chain below)."""
    from specrt.runtime.methods import make_method
    from specrt.runtime.rounds import plan_round
    from specrt.runtime.sampling import guidance_mix

    pipe = pipeline(HOT, vocab=2, grid=3)
    mix = guidance_mix(1, HOT)
    assert isinstance(plan_round(make_method("sjd-pac", **FULL), pipe.target, None, HOT, mix, None),
                      proactive.ProactiveRound)
    wide = make_method("sjd-pac", tree="spine", window=3, branching=2, tree_depth=2)  # K·D = 4 > 3
    assert plan_round(wide, pipe.target, None, HOT, mix, None) is None
