"""specrt's export-friendly LlamaGen GPT against an independent reference implementation.

Weights are random but in LlamaGen's exact key layout, saved to disk and read back through
the checkpoint loader, so layout, loader, RoPE, caching and masking are all on the line.
The caller-owned KV cache is driven exactly as docs/contracts.md says (stale rows filled
with garbage and masked out; only accepted rows committed).
"""
import pytest
import torch

from specrt.export.checkpoints import load_gpt
from specrt.models.kv_cache import StaticCache
from specrt.models.llamagen_gpt import GPT, GPTConfig, gpt_config
from specrt.models.rope import rope_2d_tables

from llamagen_reference import ReferenceLlamaGen, llamagen_gpt_shapes, random_state_dict, rope_2d_complex

ATOL = RTOL = 1e-4


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(2)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")


def _build(tmp_path, shapes, config_or_arch, n_head, n_kv_head, grid, cond_len, seed=0):
    state = random_state_dict(shapes, seed=seed)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": state, "steps": 7}, path)  # LlamaGen wraps weights under "model"
    model = load_gpt(path, config_or_arch, grid_size=grid)
    reference = ReferenceLlamaGen(state, n_head, n_kv_head, grid, cond_len)
    return model, reference


class CacheDriver:
    """Drives GPT.prefill / GPT.step over one preallocated buffer, as the runtime does: the cache as
    an input and the window's rows as an output (the exported graphs), or, `static`, a buffer with
    scratch columns after the capacity that the step writes in place (the PyTorch backend)."""

    SCRATCH = 8

    def __init__(self, model: GPT, batch: int, capacity: int, cond_valid: torch.Tensor, static: bool = False):
        c = model.config
        gen = torch.Generator().manual_seed(123)
        # Garbage in never-written rows (and scratch columns): the mask alone must keep them out.
        columns = capacity + (self.SCRATCH if static else 0)
        self.kv = 50 * torch.randn(c.n_layer, 2, batch, c.n_kv_head, columns, c.head_dim, generator=gen)
        self.visible = torch.zeros(batch, capacity, dtype=torch.bool)
        self.model, self.capacity, self.length, self.cond_valid = model, capacity, 0, cond_valid
        self.static = static

    def prefill(self, cond, cond_mask=None):
        logits, hidden, present = self.model.prefill(cond, cond_mask)
        self.commit(present, self.cond_valid)
        return logits, hidden

    def step(self, ids: torch.Tensor, window_mask: torch.Tensor):
        """ids [B,W]; window_mask bool [W,W] among window slots; positions follow the committed prefix."""
        batch, width = ids.shape
        positions = (self.length + torch.arange(width)).expand(batch, width).int()
        mask = torch.cat([self.visible[:, None, :].expand(batch, width, self.capacity),
                          window_mask[None].expand(batch, width, width)], dim=2)
        if not self.static:
            return self.model.step(ids.int(), positions, mask, self.kv)
        committed = self.kv[:, :, :, :, : self.capacity].clone()
        logits, hidden, present = self.model.step(ids.int(), positions, mask, StaticCache(self.kv, self.capacity))
        assert torch.equal(self.kv[:, :, :, :, : self.capacity], committed), "a step wrote a committed column"
        assert present.data_ptr() == self.kv[:, :, :, :, self.capacity:].data_ptr(), "present is not the scratch"
        return logits, hidden, present

    def commit(self, present: torch.Tensor, valid: torch.Tensor = None):
        n = present.shape[4]
        self.kv[:, :, :, :, self.length:self.length + n] = present
        self.visible[:, self.length:self.length + n] = True if valid is None else valid
        self.length += n


def _check_decoding(model: GPT, ref: ReferenceLlamaGen, cond, cond_mask=None, n_single=4, window=5, static=False):
    """Prefill, single-token steps, then a causal multi-token window, each against the reference
    (`static`: over a static cache written in place, as the PyTorch backend steps)."""
    c = model.config
    batch = cond.shape[0]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, c.vocab_size, (batch, n_single + window), generator=gen)
    capacity = c.cond_len + n_single + window + 3
    ref.setup_caches(batch, capacity, cond_mask)
    valid = torch.ones(batch, c.cond_len, dtype=torch.bool) if cond_mask is None else cond_mask
    driver = CacheDriver(model, batch, capacity, valid, static)
    with torch.no_grad():
        logits, hidden = driver.prefill(cond, cond_mask)
        expected = ref.forward(cond=cond, input_pos=torch.arange(c.cond_len))[:, -1:]
        _assert_close(logits, expected, "prefill logits")
        _assert_close(logits, model.output(hidden).float(), "hidden is the final-norm output")
        for s in range(n_single):
            ids = tokens[:, s:s + 1]
            expected = ref.forward(idx=ids, input_pos=torch.tensor([driver.length]))
            logits, hidden, present = driver.step(ids, torch.ones(1, 1, dtype=torch.bool))
            assert present.shape == (c.n_layer, 2, batch, c.n_kv_head, 1, c.head_dim)
            _assert_close(logits, expected, f"single step {s}")
            driver.commit(present)
        ids = tokens[:, n_single:]
        expected = ref.forward(idx=ids, input_pos=torch.arange(driver.length, driver.length + window))
        logits, hidden, present = driver.step(ids, torch.ones(window, window, dtype=torch.bool).tril())
        assert logits.shape == (batch, window, c.vocab_size) and hidden.shape == (batch, window, c.dim)
        _assert_close(logits, expected, "causal window step")


def test_rope_table_matches_llamagen_layout():
    cos, sin = rope_2d_tables(grid_size=5, head_dim=16, cond_len=3)
    table = rope_2d_complex(5, 16, 3)
    assert cos.shape == (3 + 25, 8)
    assert torch.all(cos[:3] == 0) and torch.all(sin[:3] == 0)  # condition tokens: q = k = 0
    torch.testing.assert_close(torch.complex(cos, sin), table, atol=1e-6, rtol=0)
    # raster cell (i=2, j=4): first half of the pairs rotate with the row, second with the column
    row = 3 + 2 * 5 + 4
    assert cos[row, 0] == pytest.approx(torch.cos(torch.tensor(2.0)).item())
    assert cos[row, 4] == pytest.approx(torch.cos(torch.tensor(4.0)).item())


def test_gpt_b_c2i_real_shapes(tmp_path):
    shapes = llamagen_gpt_shapes(768, 12, 12, 12, vocab_size=16384, num_classes=1000)
    model, ref = _build(tmp_path, shapes, "GPT-B", 12, 12, grid=16, cond_len=1)
    assert model.config == gpt_config("GPT-B")
    assert model.config.ffn_hidden == 2048 and model.config.seq_len == 257
    _check_decoding(model, ref, torch.tensor([3, 1000]), n_single=3, window=4)  # row 2: the null class


@pytest.mark.parametrize("static", [False, True], ids=["cache-as-input", "static-cache-in-place"])
def test_small_c2i_gqa_decoding_and_teacher_forcing(tmp_path, static):
    config = GPTConfig(dim=96, n_layer=3, n_head=6, n_kv_head=2, vocab_size=300, num_classes=10, grid_size=4)
    shapes = llamagen_gpt_shapes(96, 3, 6, 2, vocab_size=300, num_classes=10)
    model, ref = _build(tmp_path, shapes, config, 6, 2, grid=4, cond_len=1)
    cond = torch.tensor([0, 7, 10])
    _check_decoding(model, ref, cond, static=static)
    tokens = torch.randint(0, 300, (3, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _assert_close(model(cond, tokens), ref.teacher_forcing(cond, tokens), "teacher forcing")


@pytest.mark.parametrize("static", [False, True], ids=["cache-as-input", "static-cache-in-place"])
def test_small_t2i_with_left_padded_captions(tmp_path, static):
    cond_len, caption_dim = 8, 32
    config = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=200, model_type="t2i", cond_len=cond_len,
                       caption_dim=caption_dim, grid_size=4)
    shapes = llamagen_gpt_shapes(64, 2, 4, 4, vocab_size=200, model_type="t2i", caption_dim=caption_dim, cond_len=cond_len)
    model, ref = _build(tmp_path, shapes, config, 4, 4, grid=4, cond_len=cond_len)
    captions = torch.randn(2, cond_len, caption_dim, generator=torch.Generator().manual_seed(2))
    cond_mask = torch.ones(2, cond_len, dtype=torch.bool)
    cond_mask[0, :3] = False  # LlamaGen left-pads short captions
    captions[0, :3] = 0
    _check_decoding(model, ref, captions, cond_mask, static=static)
    tokens = torch.randint(0, 200, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _assert_close(model(captions, tokens, cond_mask), ref.teacher_forcing(captions, tokens, cond_mask), "t2i teacher forcing")
        # the padding mask matters: without it the padded row's logits change
        assert not torch.allclose(model(captions, tokens)[0], model(captions, tokens, cond_mask)[0], atol=1e-3)


def test_tree_mask_branch_equals_its_own_path():
    """A tree node attends to itself and its ancestors only (tree verification)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=50, num_classes=5, grid_size=4)).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.3)
    driver = CacheDriver(model, 1, 12, torch.ones(1, 1, dtype=torch.bool))
    a, b, c = 11, 22, 33
    with torch.no_grad():
        driver.prefill(torch.tensor([2]))
        # slots: 0 = a, 1 = b (child of a), 2 = c (sibling of b); positions 1, 2, 2
        tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        ids = torch.tensor([[a, b, c]], dtype=torch.int32)
        positions = torch.tensor([[1, 2, 2]], dtype=torch.int32)
        mask = torch.cat([driver.visible[:, None].expand(1, 3, 12), tree[None]], dim=2)
        tree_logits, _, tree_kv = model.step(ids, positions, mask, driver.kv)
        path_logits, _, _ = driver.step(torch.tensor([[a, c]]), torch.ones(2, 2, dtype=torch.bool).tril())
    _assert_close(tree_logits[:, 2], path_logits[:, 1], "sibling branch")
    _assert_close(tree_logits[:, 0], path_logits[:, 0], "shared root")
    assert not torch.allclose(tree_logits[:, 1], tree_logits[:, 2])


def test_drop_conditions_uses_null_class_and_uncond_caption():
    c2i = GPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=20, num_classes=5, grid_size=2))
    dropped = c2i.drop_conditions(torch.tensor([1, 2, 3]), torch.tensor([True, False, True]))
    assert dropped.tolist() == [5, 2, 5]
    t2i = GPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=20, model_type="t2i", cond_len=4, caption_dim=8, grid_size=2))
    captions = torch.randn(2, 4, 8)
    dropped = t2i.drop_conditions(captions, torch.tensor([False, True]))
    assert torch.equal(dropped[0], captions[0])
    assert torch.equal(dropped[1], t2i.cls_embedding.uncond_embedding)


def test_step_exports_to_onnx_as_matmul_softmax(tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from torch.export import Dim

    torch.manual_seed(0)
    model = GPT(GPTConfig(dim=64, n_layer=2, n_head=4, n_kv_head=2, vocab_size=100, num_classes=10, grid_size=4)).eval()

    class Step(torch.nn.Module):
        def __init__(self, gpt):
            super().__init__()
            self.gpt = gpt

        def forward(self, input_ids, positions, attention_mask, past_kv):
            return self.gpt.step(input_ids, positions, attention_mask, past_kv)

    def inputs(batch, window, cache):
        gen = torch.Generator().manual_seed(window)
        mask = torch.rand(batch, window, cache + window, generator=gen) > 0.4
        mask[:, :, 0] = True
        return (torch.randint(0, 100, (batch, window), dtype=torch.int32, generator=gen),
                torch.randint(1, 17, (batch, window), dtype=torch.int32, generator=gen),
                mask, torch.randn(2, 2, batch, 2, cache, 16, generator=gen))

    batch, window = Dim("batch", min=1, max=8), Dim("window", min=1, max=64)
    cache_len, total_len = Dim("cache_len", min=1, max=128), Dim("total_len", min=2, max=192)
    path = tmp_path / "step.onnx"
    torch.onnx.export(Step(model).eval(), inputs(2, 3, 5), str(path), opset_version=18,
                      input_names=["input_ids", "positions", "attention_mask", "past_kv"],
                      output_names=["logits", "hidden", "present_kv"],
                      dynamic_shapes=({0: batch, 1: window}, {0: batch, 1: window},
                                      {0: batch, 1: window, 2: total_len}, {2: batch, 4: cache_len}))
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert {"MatMul", "Softmax"} <= ops and "Attention" not in ops
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = inputs(3, 4, 9)
    got = session.run(None, dict(zip(["input_ids", "positions", "attention_mask", "past_kv"], (t.numpy() for t in feed))))
    with torch.no_grad():
        want = model.step(*feed)
    for name, g, w in zip(["logits", "hidden", "present_kv"], got, want):
        _assert_close(torch.from_numpy(g), w, f"onnx {name}")


def test_positions_past_the_image_reuse_the_last_rope_row():
    """Window padding slots beyond cond_len + grid² must not index out of the table."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=20, num_classes=3, grid_size=2)).eval()
    kv = torch.randn(1, 2, 1, 2, 4, 16)
    mask = torch.ones(1, 1, 5, dtype=torch.bool)
    with torch.no_grad():
        past_end, _, _ = model.step(torch.tensor([[7]]), torch.tensor([[model.config.seq_len + 3]]), mask, kv)
        last, _, _ = model.step(torch.tensor([[7]]), torch.tensor([[model.config.seq_len - 1]]), mask, kv)
        other, _, _ = model.step(torch.tensor([[7]]), torch.tensor([[model.config.seq_len - 2]]), mask, kv)
    torch.testing.assert_close(past_end, last, atol=0, rtol=0)
    assert not torch.allclose(last, other)
