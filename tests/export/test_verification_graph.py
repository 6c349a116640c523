"""The verification graphs compute what the runtime computes: the counter uniforms bit for bit,
and SD chain verification (accepted counts and next tokens) equal to verify_chain_block fed the
device round's own uniforms, on random rows; and the bench that times the graph against the host runs."""
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from specrt.export.verification_graph import chain_verification_model, uniforms_model  # noqa: E402
from specrt.runtime.counter_random import counter_uniforms  # noqa: E402
from specrt.runtime.rounds.state import NEXT, TEST, RoundState  # noqa: E402
from specrt.runtime.verification.chains import verify_chain_block  # noqa: E402
from specrt.runtime.verification.rules import VANILLA  # noqa: E402


def _session(model):
    try:
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:  # an onnxruntime build without one of the graph's kernels
        if "NOT_IMPLEMENTED" in str(error) or "Could not find an implementation" in str(error):
            pytest.skip(f"this onnxruntime lacks an operator of the graph: {error}")
        raise


def test_graph_uniforms_equal_counter_uniforms_bit_for_bit():
    rng = np.random.default_rng(7)
    count = 20_000
    feeds = {"seed": rng.integers(0, 2**32, count), "image": rng.integers(0, 2**32, count),
             "position": rng.integers(0, 4096, count), "slot": rng.integers(0, 2**40, count)}
    feeds["seed"][:3] = [0, 2**32 - 1, 2**63 - 1]  # the edges of the 32-bit coordinates, and one taken mod 2^32
    (graph,) = _session(uniforms_model()).run(None, feeds)
    expected = counter_uniforms(*(feeds[name] for name in ("seed", "image", "position", "slot")))
    assert graph.dtype == np.float64
    np.testing.assert_array_equal(graph.view(np.uint64), expected.view(np.uint64))
    assert 0.0 < graph.min() and graph.max() < 1.0


def _rows(rng, shape, vocab):
    """Peaked random probability rows, float32, so tests pass and fail at every position."""
    logits = rng.standard_normal((*shape, vocab)) * 3.0
    rows = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (rows / rows.sum(axis=-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("images,draft_len,vocab", [(8, 4, 64), (5, 8, 512)])
def test_graph_verification_equals_verify_chain_block(images, draft_len, vocab):
    rng = np.random.default_rng(images * 100 + draft_len)
    session = _session(chain_verification_model(draft_len, vocab))
    seen_accepted = set()
    for trial in range(12):
        p = _rows(rng, (images, draft_len + 1), vocab)
        # drafts close to the target in half the trials: long accepted prefixes as well as early rejections
        mix = 0.05 if trial % 2 else 1.0
        q = ((1 - mix) * p[:, :draft_len] + mix * _rows(rng, (images, draft_len), vocab)).astype(np.float32)
        cdf = np.cumsum(q.astype(np.float64), axis=-1)
        drafts = np.minimum((cdf < rng.random((images, draft_len, 1)) * cdf[..., -1:]).sum(-1), vocab - 1)
        limits = rng.integers(0, draft_len + 1, images)
        limits[0] = draft_len
        state = RoundState.start(torch.device("cpu"), [int(s) for s in rng.integers(0, 2**63, images)], 1000,
                                 draft_len + 1)
        state.rounds.copy_(torch.from_numpy(rng.integers(0, 300, images)))
        index = torch.from_numpy(rng.integers(1, 900, images))
        steps = torch.arange(draft_len)
        expected_accepted, expected_next = verify_chain_block(
            torch.from_numpy(p), torch.from_numpy(q), torch.from_numpy(drafts), torch.from_numpy(limits),
            state.uniforms(index[:, None] + steps, TEST), state.uniforms(index, NEXT), VANILLA)
        accepted, next_token = session.run(None, {
            "p": p, "q": q, "drafts": drafts, "limits": limits, "seed_low": state.seed_low.numpy(),
            "seed_high": state.seed_high.numpy(), "index": index.numpy(), "round": state.rounds.numpy()})
        np.testing.assert_array_equal(accepted, expected_accepted.numpy())
        np.testing.assert_array_equal(next_token, expected_next.numpy())
        seen_accepted.update(accepted.tolist())
    assert {0, draft_len} <= seen_accepted and len(seen_accepted) >= 3  # rejections early, late and none


def test_the_bench_times_both_paths_and_counts_the_rows_each_round_reads_out():
    from specrt.bench.verification_graph import measure, table

    case = measure(vocab=64, draft_len=2, images=2, repeats=3)
    assert case.host_us > 0 and case.graph_us > 0 and case.counter_us > 0 and case.verify_us > 0
    assert 0 <= case.accepted_mean <= 2
    assert case.rows_bytes == 2 * (2 * 2 + 1) * 64 * 4  # P [B, L+1, V] and Q [B, L, V], float32
    assert len(table([case])) == 2
