"""The request handler and wire format behind `specrt serve` and `specrt triton-repo`, without
Triton: rows -> grouped Pipeline.generate calls -> per-row outputs and one-line errors."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("torch")

from serving_fixtures import tiny_pipeline  # noqa: E402

from specrt.runtime.serving.handler import RequestHandler  # noqa: E402
from specrt.runtime.serving.protocol import decode_request  # noqa: E402


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline()


def rows(**columns) -> dict[str, np.ndarray]:
    """A request: each keyword a column of per-row values ([rows, 1] arrays, strings as bytes)."""
    out = {}
    for name, values in columns.items():
        if isinstance(values[0], str):
            out[name] = np.array([[v.encode()] for v in values], dtype=object)
        elif name == "seed":
            out[name] = np.array([[v] for v in values], dtype=np.uint64)
        else:
            out[name] = np.array([[v] for v in values])
    return out


def errors(outputs: dict) -> list[str]:
    return [bytes(e).decode() for e in outputs["error"][:, 0]]


def test_rows_are_grouped_by_method_and_parameters(pipe, monkeypatch):
    calls = []
    generate = pipe.generate

    def recording(*args, **kwargs):
        params = {k: v for k, v in kwargs.items() if k not in ("class_ids", "method", "seed", "decode")}
        calls.append((kwargs["method"], json.dumps(params, sort_keys=True), len(kwargs["class_ids"])))
        return generate(*args, **kwargs)

    monkeypatch.setattr(pipe, "generate", recording)
    handler = RequestHandler(pipe)
    first = rows(class_id=[1, 2, 3], method=["sd", "ar", "sd"], seed=[4, 5, 6],
                 params=['{"draft_len": 2}', "", '{"draft_len": 2}'])
    second = rows(class_id=[0], method=["sd"], seed=[7], params=['{"draft_len": 3}'])
    out = handler([first, second])
    assert errors(out[0]) == ["", "", ""] and errors(out[1]) == [""]
    # one call per (method, parameters), across the two requests, each row in it once
    assert sorted(calls) == [("ar", "{}", 1), ("sd", '{"draft_len": 2}', 2), ("sd", '{"draft_len": 3}', 1)]
    monkeypatch.undo()
    for request, outputs in ((first, out[0]), (second, out[1])):
        for row in range(len(request["class_id"])):
            params = json.loads(bytes(request["params"][row, 0]) or b"{}")
            method = bytes(request["method"][row, 0]).decode()
            expected = generate([int(request["class_id"][row, 0])], method=method,
                                seed=int(request["seed"][row, 0]), **params)
            np.testing.assert_array_equal(outputs["tokens"][row], expected.tokens.reshape(-1))
            png = Image.open(io.BytesIO(bytes(outputs["image"][row, 0])))
            np.testing.assert_array_equal(np.asarray(png.convert("RGB")), expected.images[0])
            stats = json.loads(outputs["stats"][row, 0])
            assert stats["method"] == method and stats["images_in_call"] == (2 if params == {"draft_len": 2} else 1)
            assert stats["target_passes"] >= 1


def test_bad_rows_get_errors_and_their_neighbours_are_served(pipe):
    handler = RequestHandler(pipe)
    request = rows(class_id=[1, 50, 2, 3, 4], method=["ar", "ar", "nope", "sd", "ar"], seed=[1, 1, 1, 1, 1],
                   params=["", "", "", '{"draft_len": 0}', '{"temperature": -1}'])
    out = handler([request])[0]
    got = errors(out)
    assert got[0] == ""
    assert "class id 50 out of range" in got[1]
    assert "unknown method 'nope'" in got[2]
    assert "draft_len" in got[3] and "temperature" in got[4]
    assert all("\n" not in e for e in got)
    assert (out["tokens"][1:] == -1).all() and all(bytes(i) == b"" for i in out["image"][1:, 0])
    np.testing.assert_array_equal(out["tokens"][0], pipe.generate([1], seed=1).tokens.reshape(-1))


def test_a_wrong_condition_is_refused_alike_served_and_submitted(pipe):
    """Serving's handler and the scheduler refuse a prompt sent to a class-conditional model with the
    same line (Family.check_submitted), naming the request field to use."""
    from specrt.errors import SpecrtError
    from specrt.runtime.scheduling import Request, Scheduler

    served = errors(RequestHandler(pipe)([rows(prompt=["a seven"])])[0])
    with Scheduler(pipe, slots=1) as scheduler, pytest.raises(SpecrtError) as submitted:
        scheduler.submit(Request(prompt="a seven"))
    assert served == [str(submitted.value)] == ["this model is class-conditional: give class_id, not prompt"]


def test_tokens_only_skips_the_image(pipe):
    out = RequestHandler(pipe)([rows(class_id=[3], seed=[2], tokens_only=[True])])[0]
    assert bytes(out["image"][0, 0]) == b"" and errors(out) == [""]
    np.testing.assert_array_equal(out["tokens"][0], pipe.generate([3], seed=2, decode=False).tokens.reshape(-1))


def test_an_internal_failure_answers_its_rows_and_the_handler_goes_on(pipe, monkeypatch):
    handler = RequestHandler(pipe)
    generate = pipe.generate

    def broken(*args, **kwargs):
        if kwargs["method"] == "sjd":
            raise RuntimeError("graph exploded\nsecond line")
        return generate(*args, **kwargs)

    monkeypatch.setattr(pipe, "generate", broken)
    out = handler([rows(class_id=[1, 2], method=["sjd", "ar"])])[0]
    assert errors(out) == ["internal error: RuntimeError: graph exploded", ""]


@pytest.mark.parametrize("request_, message", [
    (dict(class_id=np.array([[1], [2]]), seed=np.array([[1]], np.uint64)), "disagree on the batch size"),
    (dict(class_id=np.array([[1]]), params=np.array([[b"[1, 2]"]], object)), "must be a JSON object"),
    (dict(class_id=np.array([[1]]), params=np.array([[b'{"decode": false}']], object)), "tokens_only"),
    (dict(class_id=np.array([[1]]), params=np.array([[b'{"tree": "static", "static_tree": "/etc/hostname"}']], object)),
     "reads no plan files"),
    (dict(seed=np.array([[1]], np.uint64)), "give class_id"),
    (dict(prompt=np.array([[b"\xff\xfe"]], object)), "not valid UTF-8"),
    (dict(class_id=np.array([[1, 2]])), "one value per row"),
    (dict(class_id=np.array([[1]]), colour=np.array([[1]])), "unknown input 'colour'"),
])
def test_malformed_requests_are_refused_row_by_row(request_, message):
    decoded = decode_request(request_)
    assert decoded and all(message in str(row) for row in decoded)


def test_a_triton_load_failure_reads_as_one_line():
    from specrt.runtime.serving.pytriton_server import _one_line

    # what tritonclient raised when PyTriton's stub ran under pyenv's 3.11.7 (the venv quirk)
    raised = Exception("[400] load failed for model 'specrt': version 1 is at UNAVAILABLE state: Internal: "
                       "TritonModelException: Model initialize error: Traceback (most recent call last):\\n  File "
                       "\"data.py\", line 100, in ensure_running\\n    if self._lock._recursion_count() > 1:\\n"
                       "AttributeError: '_thread.RLock' object has no attribute '_recursion_count'\\n\\n\\nAt:\\n"
                       "  /tmp/folder/1/model.py(454): initialize\\n")
    line = _one_line(raised)
    assert "\n" not in line and line.startswith("[400] load failed for model 'specrt'")
    assert line.endswith("AttributeError: '_thread.RLock' object has no attribute '_recursion_count'")


def test_prompts_on_a_text_to_image_model():
    from tiny_t2i import t2i_bundle

    from specrt.runtime.pipeline import Pipeline

    _, models = t2i_bundle()  # the export tests' t2i family, built once per process
    if models.text_encoder is None:
        pytest.skip("transformers is not installed: no tiny T5 text encoder")
    pipe = Pipeline.from_torch(models.target, models.draft, models.vq, max_window=20, text_encoder=models.text_encoder)
    out = RequestHandler(pipe)([rows(prompt=["a thin seven", "a round zero"], method=["sd", "sd"], seed=[3, 4]),
                                rows(class_id=[1])])
    assert errors(out[0]) == ["", ""] and "conditioned on prompts: give prompt, not class_id" in errors(out[1])[0]
    for row, (prompt, seed) in enumerate([("a thin seven", 3), ("a round zero", 4)]):
        expected = pipe.generate(prompts=[prompt], method="sd", seed=seed)
        np.testing.assert_array_equal(out[0]["tokens"][row], expected.tokens.reshape(-1))


def test_negative_prompts_are_served_to_prompt_models_and_refused_elsewhere(pipe):
    from specrt.export.demo.registry import get_demo

    unified = get_demo("chameleon").hook("torch_pipeline")(None, threads=1)
    handler = RequestHandler(unified)
    out = handler([rows(prompt=["a thin two", "a thin two", "a thin two"], seed=[3, 3, 3],
                        negative_prompt=["", "a thick seven", "a thin two"], tokens_only=[True, True, True])])[0]
    assert errors(out) == ["", "", ""]
    for at, negative in enumerate(["", "a thick seven", "a thin two"]):  # each row as generate gives it
        expected = unified.generate(prompts=["a thin two"], seed=3, decode=False, negative_prompt=negative).tokens
        np.testing.assert_array_equal(out["tokens"][at], expected[0].ravel())
    assert not np.array_equal(out["tokens"][0], out["tokens"][1])  # the unconditional row is the client's
    suffix = handler([rows(prompt=["a thin two"], prompt_suffix=[False])])[0]
    assert "suffix" in errors(suffix)[0]  # the demo's recipe has no suffix to drop: that row's one-line error
    refused = RequestHandler(pipe)([rows(class_id=[1], negative_prompt=["blurry"])])[0]
    assert "negative_prompt apply to models whose unconditional row is a prompt" in errors(refused)[0]
