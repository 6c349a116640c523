"""runtime.model_drafter: an independent draft model behind the Drafter protocol, its rows and its cache."""
from __future__ import annotations

import numpy as np

from _toy_exact import next_token_row, one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.conditions import Conditions
from specrt.runtime.decoding import Decoding
from specrt.runtime.drafter import Verified
from specrt.runtime.model_drafter import ModelDrafter
from specrt.runtime.runner import window_sizes
from specrt.runtime.sampling import SamplingParams, guidance_mix
from specrt.runtime.stats import Stats
from specrt.runtime.tree import TokenTree
from specrt.runtime.verification.siblings import TOP


def test_model_drafter_rows_are_the_drafts_own_and_a_rollback_keeps_the_committed_cache():
    """ModelDrafter (the independent draft behind the Drafter protocol): chain and tree rows are the
    draft model's exact rows for each context; after rollback + extend only what is no longer
    committed is recomputed."""
    plain = SamplingParams(cfg_scale=1.0)
    target, draft, _ = toy_models(vocab_size=5, grid_size=3, max_window=16)
    draft.allocate(guidance_mix(1, plain))
    ctx = Decoding(target, draft, plain, [0], Stats())
    drafter = ModelDrafter(draft)
    drafter.start(ctx, Conditions.of_classes([1]), [4], None)
    row = lambda context: next_token_row(draft.lm, 1, 2, tuple(context), plain)  # noqa: E731

    (drafts,), (rows,) = drafter.propose_chain(ctx, [3])
    for k in range(3):
        np.testing.assert_allclose(rows[k], row([4, *drafts[:k]]), atol=1e-6)
    assert draft.length == 1 + 3  # the class token, then the pending token and the first two drafts
    drafter.rollback([1])
    drafter.extend(ctx, [[drafts[0], 2]], Verified(None, [[0, 1]]))  # the first draft accepted, then token 2
    tree = TokenTree(2, TOP)
    child = tree.add(0, 3)
    sizes = []
    step = draft.step
    draft.step = lambda windows, *args: sizes.append(int(window_sizes(windows, 1).max())) or step(windows, *args)
    (root_row, child_row), = drafter.expand(ctx, [tree], [[0, child]])
    assert sizes == [2]  # [4, d0] still cached: only the new pending token 2 and the tree node are fed
    np.testing.assert_allclose(root_row, row([4, drafts[0], 2]), atol=1e-6)
    np.testing.assert_allclose(child_row, row([4, drafts[0], 2, 3]), atol=1e-6)
    assert draft.length == 1 + 2  # the committed tokens before the pending one; the tree left out
    # the next depth feeds only its own nodes: the root and the child stay as staged rows
    grandchild, cousin = tree.add(child, 1), tree.add(0, 4)
    (grandchild_row, cousin_row), = drafter.expand(ctx, [tree], [[grandchild, cousin]])
    assert sizes == [2, 2] and draft.length == 1 + 2
    np.testing.assert_allclose(grandchild_row, row([4, drafts[0], 2, 3, 1]), atol=1e-6)
    np.testing.assert_allclose(cousin_row, row([4, drafts[0], 2, 4]), atol=1e-6)
    # verification accepted the child and the grandchild: their staged rows become committed ones
    drafter.rollback([3])
    drafter.extend(ctx, [[3, 1, 0]], Verified(None, [[0, child, grandchild]]))
    assert draft.length == 1 + 2 + 3  # the root, the child and the grandchild, without a pass
    assert drafter.cached[0] == [4, drafts[0], 2, 3, 1]
    _, (rows,) = drafter.propose_chain(ctx, [1])
    assert sizes[-1] == 1  # only the new pending token 0
    np.testing.assert_allclose(rows[0], row([4, drafts[0], 2, 3, 1, 0]), atol=1e-6)
