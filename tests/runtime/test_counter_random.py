"""Counter-based uniforms: the same numbers in numpy and torch, uniform, and a function of every coordinate."""
import numpy as np
import pytest
import torch

from specrt.runtime.counter_random import counter_uniforms

N = 200_000
BINS = 20
# chi-square with BINS - 1 = 19 degrees of freedom: P(X > 43.82) = 0.001 for a uniform sample
CHI2_19_999 = 43.82


def _chi_square(u: np.ndarray) -> float:
    counts = np.histogram(u, bins=BINS, range=(0.0, 1.0))[0]
    expected = len(u) / BINS
    return float(((counts - expected) ** 2 / expected).sum())


def _coordinates(count: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2**32, count), rng.integers(0, 64, count), rng.integers(0, 4096, count),
            rng.integers(0, 8, count))


def test_numpy_and_torch_compute_the_same_numbers():
    coordinates = _coordinates(50_000)
    host = counter_uniforms(*coordinates)
    device = counter_uniforms(*(torch.from_numpy(c) for c in coordinates))
    assert host.dtype == np.float64 and device.dtype == torch.float64
    np.testing.assert_array_equal(host, device.numpy())


def test_uniform_in_the_open_interval_and_detects_a_skewed_sampler():
    u = counter_uniforms(np.int64(12345), np.int64(3), np.arange(N, dtype=np.int64), np.int64(1))
    assert 0.0 < u.min() and u.max() < 1.0
    assert _chi_square(u) < CHI2_19_999
    assert abs(u.mean() - 0.5) < 4 * np.sqrt(1 / 12 / N)
    assert _chi_square(u ** 1.05) > CHI2_19_999  # the test has the power to see a 5% skew


@pytest.mark.parametrize("coordinate", range(4), ids=["seed", "image", "position", "slot"])
def test_every_coordinate_moves_the_number(coordinate):
    count = 20_000
    base = list(_coordinates(count, seed=coordinate + 1))
    moved = list(base)
    moved[coordinate] = moved[coordinate] + 1
    a, b = counter_uniforms(*base), counter_uniforms(*moved)
    assert np.all(a != b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 4 / np.sqrt(count)  # neighbours are unrelated


def test_an_image_draws_the_same_numbers_alone_or_in_a_batch():
    positions = np.arange(256, dtype=np.int64)
    batch = counter_uniforms(np.int64(9) + np.arange(8)[:, None], np.arange(8)[:, None], positions[None], np.int64(2))
    alone = counter_uniforms(np.int64(9 + 5), np.int64(5), positions, np.int64(2))
    np.testing.assert_array_equal(batch[5], alone)


@pytest.mark.parametrize("images,width", [(1, 1), (2, 3), (4, 40)], ids=["one", "few", "many"])
def test_the_host_loops_draws_are_the_array_functions_bits(images, width):
    """The host loop's draws (Decoding.uniforms: a step's few hashed one by one in Python, many as
    numpy arrays, from each image's key hashed once) are counter_uniforms' numbers bit for bit."""
    from specrt.runtime.counter_random import TEST, draw_slot, seed_halves
    from specrt.runtime.decoding import Decoding
    from specrt.runtime.sampling import SamplingParams

    rng = np.random.default_rng(3)
    seeds = [int(s) for s in rng.integers(0, 2**63, size=images)]
    lengths = rng.integers(1, 500, size=images)
    ctx = Decoding(None, None, SamplingParams(), seeds, None)
    ctx.start_round(lengths.tolist())
    ctx.start_round(lengths.tolist())  # round 1
    halves = np.array([seed_halves(s) for s in seeds], dtype=np.int64)

    def expected(offsets, parts):  # every coordinate broadcast by numpy, hashed as arrays
        offsets, parts = np.asarray(offsets), np.asarray(parts)
        extra = (None,) * (max(offsets.ndim, parts.ndim, 1) - 1)
        column = (slice(None), *extra)
        return counter_uniforms(halves[:, 0][column], halves[:, 1][column], lengths[column] + offsets,
                                draw_slot(TEST, parts, 1))

    per_image = rng.integers(0, 64, size=(images, width))
    every_image = rng.integers(0, 64, size=(1, width))
    for offsets, parts in ((per_image, 0), (per_image, rng.integers(0, 4, size=(1, width))),
                           (every_image, rng.integers(0, 4, size=(images, width))), (every_image, 3),
                           (per_image[:, 0], 2), (per_image[:, 0], rng.integers(0, 4, size=images)), (5, 1)):
        drawn = ctx.uniforms(offsets, TEST, parts)
        assert drawn.dtype == np.float64
        np.testing.assert_array_equal(drawn, np.broadcast_to(expected(offsets, parts), drawn.shape))
        assert drawn.shape == ((images,) if np.ndim(offsets) < 2 else (images, width))
