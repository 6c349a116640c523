"""The demo's reference decoders: KV-cached steps match teacher forcing, SD is lossless."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specrt.export.demo.decoding import KVBuffer, ar_generate, speculative_generate  # noqa: E402
from specrt.export.llamagen_gpt import GPT, GPTConfig  # noqa: E402
from specrt.runtime.sampling import SamplingParams, target_probabilities  # noqa: E402


def tiny_gpt(seed: int, n_layer: int = 2, vocab: int = 16, grid: int = 4, dim: int = 32) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(dim=dim, n_layer=n_layer, n_head=2, vocab_size=vocab, num_classes=3, grid_size=grid,
                          multiple_of=32))
    with torch.no_grad():  # sharper, less uniform distributions than the 0.02-std init gives
        model.output.weight.mul_(40.0)
    return model.eval()


def test_kv_buffer_steps_match_teacher_forcing():
    model = tiny_gpt(0)
    tokens = torch.randint(0, 16, (2, 16), generator=torch.Generator().manual_seed(1))
    classes = torch.tensor([0, 2])
    with torch.no_grad():
        reference = model(classes, tokens).numpy()
    cache = KVBuffer(model, batch=2, capacity=20)
    logits = [cache.prefill(classes)]
    for k in range(5):  # one token at a time ...
        step_logits, present = cache.step(tokens[:, k:k + 1].numpy())
        cache.commit(present, np.ones(2, dtype=np.int64))
        logits.append(step_logits[:, 0])
    window_logits, _ = cache.step(tokens[:, 5:9].numpy())  # ... then a window of four
    np.testing.assert_allclose(np.stack(logits, 1), reference[:, :6], atol=1e-5)
    np.testing.assert_allclose(window_logits, reference[:, 6:10], atol=1e-5)


def test_speculative_decoding_with_the_target_as_draft_accepts_everything():
    model = tiny_gpt(0)
    _, stats = speculative_generate(model, model, np.array([0, 1, 2]), SamplingParams(cfg_scale=2.0), 4, seed=0)
    assert stats.acceptance_rate == 1.0
    assert stats.mean_accepted_length == 16 / 4  # prefill, then 3 windows of 4 accepted + 1 bonus = 16 tokens


def exact_marginals(model: GPT, class_id: int, params: SamplingParams, vocab: int, length: int) -> np.ndarray:
    """P(token k = v) for every position by enumerating all vocab**length sequences."""
    seqs = np.array(np.meshgrid(*[np.arange(vocab)] * length, indexing="ij")).reshape(length, -1).T
    cond = torch.cat([torch.full((len(seqs),), class_id), model.null_condition(len(seqs))])
    with torch.no_grad():
        logits = model(cond, torch.from_numpy(np.concatenate([seqs, seqs]))).numpy()
    probs = target_probabilities(logits, params)  # [N, length, V]
    joint = np.prod(probs[np.arange(len(seqs))[:, None], np.arange(length)[None], seqs], axis=1)
    return np.stack([np.bincount(seqs[:, k], weights=joint, minlength=vocab) for k in range(length)])


def test_speculative_decoding_is_lossless():
    """Token marginals of SD with a poor draft match the target's exact ones (and AR's)."""
    vocab, grid, n = 4, 2, 3000
    target, draft = tiny_gpt(0, vocab=vocab, grid=grid, dim=16), tiny_gpt(7, n_layer=1, vocab=vocab, grid=grid, dim=16)
    params = SamplingParams(cfg_scale=1.5, temperature=1.0)
    exact = exact_marginals(target, 1, params, vocab, grid * grid)
    codes, stats = speculative_generate(target, draft, np.ones(n, dtype=np.int64), params, draft_len=2, seed=3)
    empirical = np.stack([np.bincount(codes[:, k], minlength=vocab) / n for k in range(grid * grid)])
    tolerance = 5 * np.sqrt(0.25 / n)  # 5 standard errors of a frequency
    assert stats.acceptance_rate < 0.95  # the draft really differs, so resampling is exercised
    np.testing.assert_allclose(empirical, exact, atol=tolerance)
    ar = ar_generate(target, np.ones(n, dtype=np.int64), params, seed=4)
    ar_empirical = np.stack([np.bincount(ar[:, k], minlength=vocab) / n for k in range(grid * grid)])
    np.testing.assert_allclose(ar_empirical, exact, atol=tolerance)
