"""specrt's UnifiedLM (Janus, Emu3, Lumina-mGPT / Chameleon) against transformers' own classes.

The checkpoints are tiny random ones written by transformers' save_pretrained
(unified_fixtures), loaded through specrt's loader, and compared with the same directory
loaded by transformers: teacher-forced logits over the full vocabulary; the head logits
(image rows of lm_head / Janus's generation head) with the grammar applied; prefill + steps
against a caller-owned cache with left-padded prompts; and greedy CFG generation against
transformers' own generate path for each model (Janus's generation_mode="image"; Emu3 and
Chameleon with prefix_allowed_tokens_fn forcing the row ends and unbatched classifier-free
guidance with a negative prompt, as their sample code does it).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specrt.errors import SpecrtError  # noqa: E402
from specrt.export.unified import SUPPORTED, load_unified  # noqa: E402
from specrt.runtime.grammar import FORCED_LOGIT  # noqa: E402

from unified_fixtures import tiny_chameleon, tiny_emu3, tiny_janus  # noqa: E402

ATOL = RTOL = 1e-4
GRID = (3, 4)  # Emu3 / Chameleon: 3 rows of 4 codes, each followed by the row end
COND_LEN = 10
ARCHS = ("janus", "emu3", "chameleon")


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


class LuminaLike(transformers.ChameleonForConditionalGeneration):
    """Chameleon's forward with image tokens left in the logits, as Lumina-mGPT's own class has
    it (transformers' sets them to the dtype minimum: Meta's release could not make images)."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, logits_to_keep=0, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return transformers.modeling_outputs.CausalLMOutputWithPast(
            logits=self.lm_head(hidden), past_key_values=out.past_key_values)


REFERENCE = {"janus": transformers.JanusForConditionalGeneration, "emu3": transformers.Emu3ForConditionalGeneration,
             "chameleon": LuminaLike}
FIXTURES = {"janus": tiny_janus, "emu3": tiny_emu3, "chameleon": tiny_chameleon}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("unified")
    return {arch: FIXTURES[arch](root / arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def pairs(checkpoints):
    """arch -> (ours, transformers'), both from the same directory."""
    torch.set_num_threads(1)
    out = {}
    for arch, path in checkpoints.items():
        grid = None if arch == "janus" else GRID
        ours = load_unified(path, grid=grid, cond_len=COND_LEN)
        out[arch] = (ours, REFERENCE[arch].from_pretrained(str(path)).eval())
    return out


def _vocab(path) -> dict[str, int]:
    return json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]


def _prompts(arch: str, path) -> tuple[list[int], list[int], list[int]]:
    """Two conditional prompts of different lengths and the unconditional one, each as the model's
    own sample code builds it: Janus's template with <begin_of_image> last (uncond: every token but
    the first and the last -> pad); Emu3's <|image start|>H*W<|image token|> after the caption
    (uncond: a negative prompt through the same template); Lumina-mGPT's <racm3:break> and size
    tokens (uncond: those alone)."""
    v = _vocab(path)
    if arch == "janus":
        def make(words):
            return [v["<｜begin▁of▁sentence｜>"], v["<|User|>"], *(v[w] for w in words), v["<|Assistant|>"],
                    v["<begin_of_image>"]]
        long, short = make(["a", "thin", "red", "two"]), make(["seven"])
        uncond = [long[0]] + [v["<｜▁pad▁｜>"]] * (len(long) - 2) + [long[-1]]
        return long, short, uncond
    if arch == "emu3":
        def make(words):
            return [v["<|extra_203|>"], *(v[w] for w in words), v["<|image start|>"], v[str(GRID[0])], v["*"],
                    v[str(GRID[1])], v["<|image token|>"]]
        return make(["a", "thin", "two"]), make(["one"]), make(["bold"])
    image = [v["<racm3:break>"], v[f"<reserved{8800 + GRID[0]:05d}>"], v[f"<reserved{8800 + GRID[1]:05d}>"]]
    return [v["<s>"], v["a"], v["blue"], v["seven"], *image], [v["<s>"], v["two"], *image], image


def _left_pad(rows: list[list[int]], length: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), length), pad, dtype=torch.int64)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, length - len(row):] = torch.tensor(row)
        mask[i, length - len(row):] = True
    return ids, mask


def _random_stream(model, seed: int) -> torch.Tensor:
    grammar = model.config.grammar
    grid = np.random.default_rng(seed).integers(0, grammar.image_vocab, (grammar.rows, grammar.cols))
    return torch.from_numpy(grammar.stream(grid)).long()


@torch.no_grad()
def _reference_head_logits(arch: str, ref, ours, prompt: list[int], stream: torch.Tensor) -> torch.Tensor:
    """transformers' logits [S, Vh] for the stream tokens after an unpadded prompt: Janus's
    generation_head over its generation embeddings, else lm_head at the image ids and the row end."""
    prompt_t = torch.tensor([prompt])
    if arch == "janus":
        embeds = torch.cat([ref.get_input_embeddings()(prompt_t),
                            ref.prepare_embeddings_for_image_generation(stream[None, :-1])], dim=1)
        hidden = ref.model.language_model(inputs_embeds=embeds).last_hidden_state
        return ref.model.generation_head(hidden[0, len(prompt) - 1:])
    head_ids = ours.head_ids
    ids = torch.cat([prompt_t, head_ids[stream[:-1]][None]], dim=1)
    logits = ref(input_ids=ids).logits[0, len(prompt) - 1:]
    return logits[:, head_ids]


def _check_head_logits(ours_logits: torch.Tensor, expected: torch.Tensor, model, what: str) -> None:
    """Free positions: the image columns equal transformers', structural columns FORCED_LOGIT;
    forced positions: exactly 0 at the forced token, FORCED_LOGIT elsewhere."""
    grammar = model.config.grammar
    forced = torch.tensor(grammar.forced())
    free = forced < 0
    iv = grammar.image_vocab
    torch.testing.assert_close(ours_logits[free, :iv], expected[free, :iv].float(), atol=ATOL, rtol=RTOL,
                               msg=lambda m: f"{what}: {m}")
    assert (ours_logits[free, iv:] == FORCED_LOGIT).all(), f"{what}: a structural token has mass at a free position"
    if (~free).any():
        point = torch.full_like(ours_logits[~free], FORCED_LOGIT)
        point[torch.arange(point.shape[0]), forced[~free]] = 0.0
        assert torch.equal(ours_logits[~free], point), f"{what}: a forced position is not a point mass"
        assert (forced[~free] == grammar.row_end_index).all()


# ---- full-vocabulary teacher forcing -------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_logits_of_matches_transformers_forward(pairs, arch):
    ours, ref = pairs[arch]
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, ours.config.text_vocab_size, (2, 11), generator=gen)
    expected = ref.lm_head(ref.model(input_ids=ids).last_hidden_state) if arch != "emu3" else ref(input_ids=ids).logits
    torch.testing.assert_close(ours.logits_of(ids), expected, atol=ATOL, rtol=RTOL)
    # left padding: transformers' positions for a padded row are cumsum(mask) - 1
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :4] = False
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    out = ref.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions).last_hidden_state
    padded = ours.logits_of(ids, mask)
    torch.testing.assert_close(padded[mask], ref.lm_head(out)[mask], atol=ATOL, rtol=RTOL)


# ---- head logits, grammar, cache ---------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_teacher_forced_head_logits_match_transformers(pairs, checkpoints, arch):
    ours, ref = pairs[arch]
    long, short, _ = _prompts(arch, checkpoints[arch])
    ids, mask = _left_pad([long, short], COND_LEN, pad=0)
    streams = torch.stack([_random_stream(ours, 1), _random_stream(ours, 2)])
    logits = ours.image_logits_of(ids, mask, streams)
    assert logits.shape == (2, ours.config.grammar.stream_len, ours.config.vocab_size) and logits.dtype == torch.float32
    for row, prompt in enumerate((long, short)):
        expected = _reference_head_logits(arch, ref, ours, prompt, streams[row])
        _check_head_logits(logits[row], expected, ours, f"{arch} row {row}")


def _run_windows(model, ids, mask, streams, widths) -> torch.Tensor:
    """Prefill, then steps of the given widths against a caller-owned cache whose unused slots hold
    garbage (masked out), committing each window's present_kv: logits [B, S, Vh]."""
    c = model.config
    bsz, length = streams.shape
    capacity = c.capacity(max(widths))
    first, _, present = model.prefill(ids, mask)
    cache = torch.randn(c.n_layer, 2, bsz, c.n_kv_head, capacity, c.head_dim) * 50
    cache[..., : c.cond_len, :] = present
    out, done = [first], 1  # stream tokens 0..done-1 are known; token done-1 is the next input
    while done < length:
        width = min(widths[len(out) % len(widths)], length - done)
        start = c.cond_len + done - 1  # slot of the window's first token
        tokens = streams[:, done - 1: done - 1 + width]
        positions = (start + torch.arange(width))[None].expand(bsz, width)
        cache_cols = torch.zeros(bsz, width, capacity, dtype=torch.bool)
        cache_cols[:, :, : c.cond_len] = mask[:, None]
        cache_cols[:, :, c.cond_len: start] = True
        window_cols = torch.ones(width, width, dtype=torch.bool).tril()[None].expand(bsz, width, width)
        logits, hidden, present = model.step(tokens, positions, torch.cat([cache_cols, window_cols], -1), cache)
        assert hidden.shape == (bsz, width, c.dim) and present.shape[4] == width
        cache[..., start: start + width, :] = present
        out.append(logits)
        done += width
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("widths", [(1,), (3, 1, 4, 2)], ids=["w1", "w-mixed"])
@torch.no_grad()
def test_cached_steps_match_transformers(pairs, checkpoints, arch, widths):
    ours, ref = pairs[arch]
    long, short, _ = _prompts(arch, checkpoints[arch])
    ids, mask = _left_pad([short, long], COND_LEN, pad=ours.config.pad_id)
    streams = torch.stack([_random_stream(ours, 5), _random_stream(ours, 6)])
    logits = _run_windows(ours, ids, mask, streams, widths)
    for row, prompt in enumerate((short, long)):
        expected = _reference_head_logits(arch, ref, ours, prompt, streams[row])
        _check_head_logits(logits[row], expected, ours, f"{arch} {widths} row {row}")


def test_step_positions_past_the_stream_are_clamped(pairs, checkpoints):
    """A padding slot past the end of the stream (window wider than what is left) must still give
    finite logits under the last position's grammar, not index out of the table."""
    ours, _ = pairs["emu3"]
    long, _, _ = _prompts("emu3", checkpoints["emu3"])
    ids, mask = _left_pad([long], COND_LEN, pad=0)
    _, _, present = ours.prefill(ids, mask)
    c = ours.config
    positions = torch.tensor([[c.cond_len + c.grammar.stream_len + 2]])
    attn = torch.cat([mask[:, None], torch.ones(1, 1, 1, dtype=torch.bool)], -1)
    logits, _, _ = ours.step(torch.tensor([[0]]), positions, attn, present)
    assert torch.isfinite(logits).all()


# ---- greedy CFG generation against transformers' generate ---------------------------------


@torch.no_grad()
def _our_cfg_greedy(model, cond: list[int], uncond: list[int], scale: float, n_tokens: int) -> list[int]:
    """Rows [cond; uncond], logits mixed uncond + s (cond − uncond), argmax, fed back to both rows."""
    c = model.config
    ids, mask = _left_pad([cond, uncond], c.cond_len, pad=c.pad_id or 0)
    logits, _, cache = model.prefill(ids, mask)
    tokens = []
    for k in range(n_tokens):
        mixed = logits[1, -1] + scale * (logits[0, -1] - logits[1, -1])
        tokens.append(int(mixed.argmax()))
        if k == n_tokens - 1:
            break
        position = c.cond_len + k
        attn = torch.cat([mask, torch.ones(2, k + 1, dtype=torch.bool)], -1)[:, None]
        logits, _, present = model.step(torch.tensor([[tokens[-1]]] * 2), torch.full((2, 1), position), attn, cache)
        cache = torch.cat([cache, present], dim=4)
    return tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_cfg_generation_matches_transformers_generate(pairs, checkpoints, arch):
    ours, ref = pairs[arch]
    cond, _, uncond = _prompts(arch, checkpoints[arch])
    scale, grammar = 3.0, ours.config.grammar
    prompt = torch.tensor([cond])
    with torch.no_grad():
        if arch == "janus":  # generate builds the uncond row itself (bos and boi kept, the rest pad)
            expected = ref.generate(prompt, attention_mask=torch.ones_like(prompt), generation_mode="image",
                                    guidance_scale=scale, do_sample=False)[0].tolist()
        else:
            forced = grammar.forced()
            image_ids, row_end = ours.config.image_token_ids, ours.config.row_end_id

            def allowed(_batch, sequence):
                k = sequence.shape[-1] - len(cond)
                return [row_end] if forced[k] >= 0 else list(image_ids)

            out = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=grammar.stream_len,
                               do_sample=False, guidance_scale=scale, negative_prompt_ids=torch.tensor([uncond]),
                               prefix_allowed_tokens_fn=allowed, pad_token_id=ours.config.pad_id)[0, len(cond):]
            to_head = {int(i): h for h, i in enumerate(ours.head_ids.tolist())}
            expected = [to_head[int(t)] for t in out]
    ours_tokens = _our_cfg_greedy(ours, cond, uncond, scale, grammar.stream_len)
    assert ours_tokens == expected
    assert grammar.is_valid(np.array(ours_tokens))


# ---- config and loader errors ---------------------------------------------------------------


def test_config_facts(pairs):
    janus, emu3, cham = (pairs[a][0].config for a in ARCHS)
    assert SUPPORTED == ("janus", "emu3", "chameleon")
    assert (janus.grammar.rows, janus.grammar.cols, janus.vocab_size, janus.grammar.row_end) == (4, 4, 32, False)
    assert janus.image_token_ids is None and janus.boi_id is not None
    for c, codes in ((emu3, 24), (cham, 20)):
        assert c.grammar.row_end and c.vocab_size == codes + 1 and c.grammar.stream_len == GRID[0] * (GRID[1] + 1)
        assert c.capacity(4) == COND_LEN + c.grammar.stream_len + 4
    assert cham.qk_norm and cham.swin_norm and not emu3.qk_norm


def test_unsupported_architecture_is_one_line(checkpoints, tmp_path):
    path = tmp_path / "llama"
    shutil.copytree(checkpoints["emu3"], path)
    raw = json.loads((path / "config.json").read_text())
    raw.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(SpecrtError, match="LlamaForCausalLM.*supported: Janus.*Emu3.*Chameleon") as err:
        load_unified(path)
    assert "\n" not in str(err.value)


def test_missing_row_end_token_is_named(checkpoints, tmp_path):
    path = tmp_path / "no-row-end"
    shutil.copytree(checkpoints["chameleon"], path)
    raw = json.loads((path / "config.json").read_text())
    del raw["vocabulary_map"]["<reserved08799>"]
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(SpecrtError, match="reserved08799"):
        load_unified(path, grid=GRID)


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_weight_key_errors_name_the_key(checkpoints, tmp_path, change):
    from safetensors.torch import load_file, save_file

    path = tmp_path / change
    shutil.copytree(checkpoints["chameleon"], path)
    state = load_file(str(path / "model.safetensors"))
    if change == "missing":
        del state["model.layers.1.self_attn.k_norm.bias"]
        key = "layers.1.self_attn.k_norm.bias"
    else:
        state["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
        key = "model.layers.0.self_attn.extra.weight"
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(SpecrtError, match=f"{change}.*{key}") as err:
        load_unified(path, grid=GRID)
    assert "\n" not in str(err.value)


@torch.no_grad()
def test_sharded_checkpoint_and_dtype(checkpoints, pairs, tmp_path):
    """An index with shards loads like one file; bfloat16 weights compute in bfloat16 with float32 logits."""
    from safetensors.torch import load_file, save_file

    path = tmp_path / "sharded"
    shutil.copytree(checkpoints["janus"], path)
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, part in shards.items():
        save_file({k: state[k] for k in part}, str(path / name))
    index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    ids = torch.tensor([[0, 7, 10, 11, 8, 4]])
    reference = pairs["janus"][0].logits_of(ids)
    torch.testing.assert_close(load_unified(path).logits_of(ids), reference, atol=0, rtol=0)
    half = load_unified(path, dtype=torch.bfloat16)
    assert half.embed_tokens.weight.dtype == torch.bfloat16 and half.inv_freq.dtype == torch.float32
    logits = half.logits_of(ids)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference, atol=0.1, rtol=0.1)


# ---- ONNX tracing ----------------------------------------------------------------------------


class _Prefill(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, prompt_mask):
        return self.model.prefill(input_ids, prompt_mask)


class _Step(_Prefill):
    def forward(self, input_ids, positions, attention_mask, past_kv):
        return self.model.step(input_ids, positions, attention_mask, past_kv)


def test_prefill_and_step_trace_to_onnx(pairs, checkpoints, tmp_path):
    """Chameleon (qk-norm, swin norm, row-end grammar) exports with torch.onnx.export(dynamo=True)
    with dynamic batch / window / cache, int32 ids, and onnxruntime agrees with PyTorch."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    ours, _ = pairs["chameleon"]
    c = ours.config
    long, short, _ = _prompts("chameleon", checkpoints["chameleon"])
    ids, mask = _left_pad([long, short], COND_LEN, pad=0)
    width, cached = 3, COND_LEN + 2
    tokens = torch.tensor([[0, 5, 19], [3, 3, 1]], dtype=torch.int32)
    positions = (cached + torch.arange(width, dtype=torch.int32))[None].expand(2, width)
    attn = torch.cat([mask[:, None].expand(2, width, COND_LEN), torch.ones(2, width, 2, dtype=torch.bool),
                      torch.ones(width, width, dtype=torch.bool).tril()[None].expand(2, width, width)], -1)
    past = torch.randn(c.n_layer, 2, 2, c.n_kv_head, cached, c.head_dim)
    dim = torch.export.Dim
    batch, win = dim("batch", min=1, max=64), dim("window", min=1, max=16)
    cases = [
        ("prefill", _Prefill(ours), (ids.int(), mask), ({0: batch}, {0: batch})),
        ("step", _Step(ours), (tokens, positions, attn, past),
         ({0: batch, 1: win}, {0: batch, 1: win}, {0: batch, 1: win, 2: dim("total", min=2, max=1024)},
          {2: batch, 4: dim("cache", min=1, max=1000)})),
    ]
    for name, module, inputs, shapes in cases:
        module.eval()
        program = torch.onnx.export(module, inputs, dynamo=True, dynamic_shapes=shapes, verbose=False)
        program.save(str(tmp_path / f"{name}.onnx"))
        session = ort.InferenceSession(str(tmp_path / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        got = session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)})
        with torch.no_grad():
            want = module(*inputs)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.numpy(), atol=ATOL, rtol=RTOL, err_msg=name)


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
    {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64},
], ids=["linear", "yarn"])
@torch.no_grad()
def test_scaled_rope_types_come_from_transformers(checkpoints, tmp_path, rope):
    """Non-default rope types (frequencies and yarn's attention scaling) agree with transformers."""
    path = tmp_path / rope["rope_type"]
    shutil.copytree(checkpoints["janus"], path)
    raw = json.loads((path / "config.json").read_text())
    raw["text_config"]["rope_parameters"] = rope
    (path / "config.json").write_text(json.dumps(raw))
    ours, ref = load_unified(path, cond_len=COND_LEN), transformers.JanusForConditionalGeneration.from_pretrained(str(path))
    assert (ours.config.rope_scaling != 1.0) == (rope["rope_type"] == "yarn")
    ids = torch.randint(0, ours.config.text_vocab_size, (1, 40), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(ours.logits_of(ids), ref(input_ids=ids).logits, atol=ATOL, rtol=RTOL)


def test_vocabulary_from_tokenizer_when_config_has_none(checkpoints, pairs, tmp_path):
    """A checkpoint whose config.json carries no vocabulary_map reads the token names from tokenizer.json."""
    path = tmp_path / "no-map"
    shutil.copytree(checkpoints["chameleon"], path)
    raw = json.loads((path / "config.json").read_text())
    del raw["vocabulary_map"]
    (path / "config.json").write_text(json.dumps(raw))
    from specrt.export.unified import read_config

    config, expected = read_config(path, grid=GRID, cond_len=COND_LEN), pairs["chameleon"][0].config
    assert (config.image_token_ids, config.row_end_id) == (expected.image_token_ids, expected.row_end_id)
