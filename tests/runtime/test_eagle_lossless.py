"""SD with an EAGLE head as the draft stays lossless, drafting chains and dynamic trees: a tiny
PyTorch target (vocabulary 3, a 2×2 grid: 81 images) and a random head, images from
Pipeline.generate against the target's exact distribution (chi-square), and a head whose
reported q rows are wrong is caught."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from _toy_exact import chi_square, one_torch_thread, reference_row  # noqa: F401 (autouse fixture)

torch = pytest.importorskip("torch")

from specrt.models.eagle_head import EagleConfig, EagleHead  # noqa: E402
from specrt.models.llamagen_gpt import GPT, GPTConfig  # noqa: E402
from specrt.models.llamagen_vq import VQConfig, VQModel  # noqa: E402
from specrt.runtime.eagle import EagleDrafter  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402
from specrt.runtime.sampling import SamplingParams  # noqa: E402

VOCAB, GRID, CLASS, SAMPLES = 3, 2, 1, 800
SAMPLING = SamplingParams(cfg_scale=2.0, temperature=1.0, top_k=0, top_p=1.0)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    target = GPT(GPTConfig(dim=16, n_layer=1, n_head=2, vocab_size=VOCAB, num_classes=2, grid_size=GRID,
                           multiple_of=16, initializer_range=0.6)).eval()
    head = EagleHead(EagleConfig.for_target(target, n_head=2, ffn_hidden=16)).tie_to(target).eval()
    with torch.no_grad():
        for p in (head.fc.weight, *head.layers.parameters()):
            p.normal_(0.0, 0.6)
    vq = VQModel(VQConfig(codebook_size=VOCAB, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), z_channels=8,
                          num_res_blocks=1, norm_groups=4, codebook_show_usage=False)).eval()
    return target, head, vq


@pytest.fixture(scope="module")
def exact(models):
    """P(x_1..x_4) of the guided target, from its teacher-forcing logits in float64."""
    target = models[0]
    sequences = list(itertools.product(range(VOCAB), repeat=GRID * GRID))
    tokens = torch.tensor(sequences)
    with torch.no_grad():
        cond = target(torch.full((len(tokens),), CLASS), tokens).double().numpy()
        uncond = target(torch.full((len(tokens),), target.null_class), tokens).double().numpy()
    out = {}
    for i, seq in enumerate(sequences):
        rows = [reference_row(cond[i, k], uncond[i, k], SAMPLING) for k in range(len(seq))]
        out[seq] = float(np.prod([row[t] for row, t in zip(rows, seq)]))
    return out


CHAIN = {"draft_len": 3}
TREE = {"tree": "dynamic", "total_tokens": 4, "depth": 3, "tree_top_k": 2}  # EAGLE-2 trees, siblings verified


def _sample(models, seed=0, params=CHAIN):
    target, head, vq = models
    pipe = Pipeline.from_torch(target, head, vq, max_window=5, threads=1, sampling_defaults=SAMPLING)
    result = pipe.generate([CLASS] * SAMPLES, method="sd", seed=seed, decode=False, **params)
    assert result.stats.draft_forwards > 0
    return result.tokens.reshape(SAMPLES, -1)


@pytest.mark.parametrize("params", [CHAIN, TREE], ids=["chain", "dynamic-tree"])
def test_sd_with_an_eagle_head_samples_the_target_distribution(models, exact, params):
    statistic, critical = chi_square(_sample(models, params=params), exact)
    assert statistic < critical, (statistic, critical)


def test_the_check_catches_a_head_that_reports_the_wrong_q(models, exact, monkeypatch):
    propose = EagleDrafter.propose_chain

    def wrong_rows(self, ctx, lengths):
        drafts, rows = propose(self, ctx, lengths)
        uniform = np.full(VOCAB, 1.0 / VOCAB, dtype=np.float32)  # not what was drawn from
        return drafts, [[uniform for _ in image] for image in rows]

    monkeypatch.setattr(EagleDrafter, "propose_chain", wrong_rows)
    statistic, critical = chi_square(_sample(models), exact)
    assert statistic > critical, (statistic, critical)
