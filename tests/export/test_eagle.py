"""EAGLE draft heads: LANTERN's drafter layout loads (and a wrong one is one line), the head's
forward is LANTERN's, the exported graph equals PyTorch (--verify) and onnxruntime drafts the
same tokens as PyTorch, and train-draft trains, checkpoints and resumes to the same weights."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny_export import TINY_OPTIONS, tiny_models  # noqa: E402

from specrt.errors import SpecrtError  # noqa: E402
from specrt.export.bundle import ModelSet  # noqa: E402
from specrt.export.eagle.checkpoint import load_eagle_head  # noqa: E402
from specrt.models.eagle_head import EagleConfig, EagleHead  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402


def lantern_shapes(hidden: int, ffn: int, vocab: int, n_head: int, n_kv_head: int) -> dict[str, tuple[int, ...]]:
    """The state_dict of LANTERN's models/drafters/cnets_llamagen.py Model with one layer, as its
    code declares it (embed_tokens, fc with bias, q/k/v/o_proj, gate/up/down_proj, and only a
    post-attention norm on layer 0)."""
    head_dim = hidden // n_head
    return {
        "embed_tokens.weight": (vocab, hidden),
        "fc.weight": (hidden, 2 * hidden), "fc.bias": (hidden,),
        "layers.0.self_attn.q_proj.weight": (n_head * head_dim, hidden),
        "layers.0.self_attn.k_proj.weight": (n_kv_head * head_dim, hidden),
        "layers.0.self_attn.v_proj.weight": (n_kv_head * head_dim, hidden),
        "layers.0.self_attn.o_proj.weight": (hidden, n_head * head_dim),
        "layers.0.mlp.gate_proj.weight": (ffn, hidden), "layers.0.mlp.up_proj.weight": (ffn, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, ffn),
        "layers.0.post_attention_layernorm.weight": (hidden,),
    }


def write_lantern_drafter(folder, target, n_head=2, n_kv_head=1, ffn=40, seed=0, drop=(), rename=None):
    """A drafter directory as LANTERN's from_pretrained reads it: config.json + pytorch_model.bin."""
    gen = torch.Generator().manual_seed(seed)
    dim, vocab = target.config.dim, target.config.vocab_size
    state = {k: torch.randn(shape, generator=gen) * 0.3 for k, shape in lantern_shapes(dim, ffn, vocab, n_head, n_kv_head).items()}
    state["layers.0.post_attention_layernorm.weight"] += 1.0
    for key in drop:
        del state[key]
    for old, new in (rename or {}).items():
        state[new] = state.pop(old)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": dim, "intermediate_size": ffn,
        "num_attention_heads": n_head, "num_hidden_layers": 1, "num_key_value_heads": n_kv_head,
        "rms_norm_eps": 1e-6, "vocab_size": vocab, "input_type": "c2i", "rope_scaling": None}))
    return state


def lantern_forward(state, lm_head, ids, feats, grid, n_head, n_kv_head, eps=1e-6):
    """LANTERN's drafter forward for a c2i sequence of pairs (drafter index j = image token j),
    written from its code in float64: fc over [embedding; feature], 2D RoPE of raster cell j
    (cls_token_num 0), causal attention, post-attention RMSNorm, SwiGLU MLP, the target's lm_head."""
    s = {k: v.double() for k, v in state.items()}
    x = torch.cat([s["embed_tokens.weight"][ids], feats.double()], -1) @ s["fc.weight"].T + s["fc.bias"]
    n, dim = x.shape[1], x.shape[2]
    hd = dim // n_head
    half = hd // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, half, 2)[: half // 2].double() / half))
    cells = torch.arange(n)
    angles = torch.cat([cells[:, None] // grid * freqs, cells[:, None] % grid * freqs], -1)  # [n, hd/2]

    def rope(t):  # t [B, n, H, hd], interleaved pairs
        a, b = t[..., 0::2], t[..., 1::2]
        c, sn = angles.cos()[None, :, None], angles.sin()[None, :, None]
        return torch.stack([a * c - b * sn, b * c + a * sn], -1).flatten(-2)

    q = rope((x @ s["layers.0.self_attn.q_proj.weight"].T).view(1, n, n_head, hd)).transpose(1, 2)
    k = rope((x @ s["layers.0.self_attn.k_proj.weight"].T).view(1, n, n_kv_head, hd)).transpose(1, 2)
    v = (x @ s["layers.0.self_attn.v_proj.weight"].T).view(1, n, n_kv_head, hd).transpose(1, 2)
    k, v = k.repeat_interleave(n_head // n_kv_head, 1), v.repeat_interleave(n_head // n_kv_head, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + torch.full((n, n), -torch.inf).triu(1).double()
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, n, dim) @ s["layers.0.self_attn.o_proj.weight"].T
    h = x + attn
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * s["layers.0.post_attention_layernorm.weight"]
    mlp = (torch.nn.functional.silu(normed @ s["layers.0.mlp.gate_proj.weight"].T) * (normed @ s["layers.0.mlp.up_proj.weight"].T)) \
        @ s["layers.0.mlp.down_proj.weight"].T
    out = h + mlp
    return out @ lm_head.double().T, out


def test_a_lantern_drafter_loads_computes_lanterns_forward_and_drafts(tmp_path):
    models = tiny_models()
    target, grid = models.target, models.target.config.grid_size
    state = write_lantern_drafter(tmp_path / "drafter", target)
    head = load_eagle_head(tmp_path / "drafter", target)
    assert head.config.n_head == 2 and head.config.n_kv_head == 1 and head.config.ffn_hidden == 40
    ids = torch.randint(0, target.config.vocab_size, (1, grid * grid))
    feats = torch.randn(1, grid * grid, target.config.dim)
    positions = target.config.cond_len + torch.arange(grid * grid)[None]  # the contract's sequence positions
    with torch.no_grad():
        logits, out = head(ids, feats, positions)
    want_logits, want_out = lantern_forward(state, target.output.weight, ids, feats, grid, 2, 1)
    assert torch.allclose(out.double(), want_out, atol=1e-4)
    assert torch.allclose(logits.double(), want_logits, atol=1e-4)
    result = Pipeline.from_torch(target, head, models.vq, max_window=8, threads=1).generate(
        [0, 1], method="sd", seed=0, decode=False, draft_len=3)
    assert result.tokens.shape == (2, grid, grid) and result.stats.draft_forwards > 0


@pytest.mark.parametrize("drop, rename, named", [
    (("fc.bias",), None, "fc.bias"),
    ((), {"layers.0.mlp.gate_proj.weight": "layers.0.mlp.w1.weight"}, "layers.0.mlp.w1.weight"),
])
def test_a_wrong_drafter_checkpoint_is_one_line_naming_the_keys(tmp_path, drop, rename, named):
    models = tiny_models()
    write_lantern_drafter(tmp_path / "bad", models.target, drop=drop, rename=rename)
    with pytest.raises(SpecrtError) as err:
        load_eagle_head(tmp_path / "bad", models.target)
    message = str(err.value)
    assert "\n" not in message and named in message and "EAGLE head" in message


def test_a_drafter_for_another_target_is_refused(tmp_path):
    models = tiny_models()
    write_lantern_drafter(tmp_path / "d", models.target)
    other = tiny_models().target
    other.config.dim = 48  # what config.json's hidden_size is checked against
    with pytest.raises(SpecrtError, match="does not fit the target"):
        load_eagle_head(tmp_path / "d", other)


@pytest.fixture(scope="module")
def eagle_bundle(tmp_path_factory):
    """The shared tiny bundle with its draft replaced by a random EAGLE head: only the head's
    graphs (draft_step, draft_chain) are exported here (the target's and the VQ's are the tiny bundle's, exported once per
    process), and the manifest is written by the exporter's own build_manifest."""
    import shutil

    from specrt.export.bundle import build_manifest
    from specrt.export.eagle_graphs import export_head_chain, export_head_step
    from specrt.export.onnx_export import GraphLimits, capacity_for
    from specrt.manifest import MANIFEST_NAME, read_manifest, rows_for_images
    from tiny_export import tiny_bundle

    tiny, base = tiny_bundle()
    torch.manual_seed(1)
    head = EagleHead(EagleConfig.for_target(base.target, n_head=2, ffn_hidden=48)).tie_to(base.target).eval()
    with torch.no_grad():
        for p in (head.fc.weight, *head.layers.parameters()):
            p.normal_(0.0, 0.3)
    models = ModelSet(target=base.target, draft=head, vq=base.vq, sources={"draft": "random eagle"})
    root = tmp_path_factory.mktemp("eagle") / "bundle"
    shutil.copytree(tiny.root, root, ignore=shutil.ignore_patterns("draft_*", MANIFEST_NAME))
    options = TINY_OPTIONS
    limits = GraphLimits(capacity=capacity_for(base.target.config, options.max_window), max_window=options.max_window,
                         max_batch=rows_for_images(options.max_batch), max_images=options.max_batch)
    graphs = [g for g in tiny.graphs.values() if g.role == "target"] + [export_head_step(head, limits, root)] + \
             [export_head_chain(head, limits, root, steps=options.chain_steps)] + \
             [g for g in tiny.graphs.values() if g.role == "vq"]
    (root / MANIFEST_NAME).write_text(json.dumps(build_manifest(models, options, graphs, root)))
    return read_manifest(root), models


def test_the_eagle_bundle_verifies_and_drafts_like_pytorch(eagle_bundle):
    from specrt.export.verify import verify_bundle

    manifest, models = eagle_bundle
    assert manifest.models["draft"]["kind"] == "eagle" and "draft_prefill" not in manifest.graphs
    step = manifest.graph("draft_step")
    assert step.input_names[:2] == ("input_ids", "hidden") and "features" in step.output_names
    report = verify_bundle(manifest, models, threads=1)
    assert report.passed, report.format()
    assert any(c.graph == "draft_step" and c.output == "features" for c in report.comparisons)
    assert report.draw_counts("draft_chain")[1] > 0  # the head's chain, its drafts fed back in the graph
    ort = Pipeline.from_bundle(manifest.root, threads=1).generate([0, 3], method="sd", seed=5, decode=False)
    ref = Pipeline.from_torch(models.target, models.draft, models.vq, max_window=TINY_OPTIONS.max_window,
                              threads=1).generate([0, 3], method="sd", seed=5, decode=False)
    assert np.array_equal(ort.tokens, ref.tokens)
    # one head call per round on both (the graph's 4 drafts, the PyTorch chain the round's longest)
    assert ort.stats.draft_calls == ref.stats.draft_calls > 0


def test_an_eagle_head_after_a_shrunk_batch_steps_as_a_fresh_one(eagle_bundle):
    """Images leave a batch as they finish (retain), and the next call may find the head's batch
    already the size it needs: the feature buffers its onnxruntime bindings view must still be
    the ones it writes (a swapped buffer once fed every later call dead features: still exact,
    but accepted lengths fell from 2.8 to 1.3 on the demo)."""
    from specrt.runtime.sampling import SamplingParams, guidance_mix
    from specrt.runtime.window import Window

    manifest, _ = eagle_bundle
    plain = SamplingParams(cfg_scale=1.0)
    rng = np.random.default_rng(0)

    def step(head, images):
        head.begin()
        features = [rng.standard_normal((1, 3, head.dim)).astype(np.float32) for _ in range(images)]
        return features, head.step_pairs([Window.chain([1, 2, 3])] * images, features, np.full((images, 3), 0.5))

    used = Pipeline.from_bundle(manifest.root, threads=1).draft
    used.allocate(guidance_mix(6, plain))
    step(used, 6)
    used.retain([4])  # five images finished; the last runs on alone
    step(used, 1)
    step(used, 1)  # both output buffers (the runner alternates two) bound for this window size
    used.allocate(guidance_mix(1, plain))  # the next call: one image, the batch it already has
    rng = np.random.default_rng(1)
    _, out = step(used, 1)
    fresh = Pipeline.from_bundle(manifest.root, threads=1).draft
    fresh.allocate(guidance_mix(1, plain))
    rng = np.random.default_rng(1)
    _, want = step(fresh, 1)
    np.testing.assert_allclose(np.asarray(out.probs), np.asarray(want.probs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(used.features_out, fresh.features_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("params", [{}, {"tree": "dynamic", "total_tokens": 8, "depth": 3, "tree_top_k": 2}],
                         ids=["chain", "dynamic-tree"])
def test_an_eagle_head_batch_gives_each_image_as_alone(eagle_bundle, params):
    """EAGLE chains and trees decode a batch together (one head pass per draft position or tree
    depth for every image); each image keeps its own features, queue and stream."""
    manifest, _ = eagle_bundle
    pipe = Pipeline.from_bundle(manifest.root, threads=1)
    classes = [0, 3, 1, 2]
    batch = pipe.generate(classes, method="sd", seed=6, decode=False, **params)
    for i, class_id in enumerate(classes):
        alone = pipe.generate([class_id], method="sd", seed=6 + i, decode=False, **params)
        np.testing.assert_array_equal(batch.tokens[i], alone.tokens[0])
    assert batch.stats.target_calls < len(classes) * alone.stats.target_calls


def test_an_eagle_bundle_without_target_hidden_is_one_line(eagle_bundle, tmp_path):
    import shutil

    from specrt.manifest import MANIFEST_NAME

    manifest, _ = eagle_bundle
    copy = tmp_path / "b"
    shutil.copytree(manifest.root, copy)
    raw = json.loads((copy / MANIFEST_NAME).read_text())
    raw["models"]["draft"]["dim"] = raw["models"]["target"]["dim"] + 1
    (copy / MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(SpecrtError, match="EAGLE head needs the target's dim"):
        Pipeline.from_bundle(copy)
