"""Loading a bundle cross-checks it before anything runs (specrt.runtime.bundle_check), and no
corruption of a bundle gets past `specrt generate` as a traceback, a hang or a crash.

Targeted cases first: a manifest that disagrees with its graphs, with itself or with
neighbours.npy gives one line naming both values. Then a fuzz run (fixed seed, bounded count)
of truncations, byte flips and JSON edits of the demo bundle through the CLI: each gives exit 2
and one line on stderr, or a run that writes the image.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from specrt.cli import main
from specrt.manifest import file_record

pytest.importorskip("onnxruntime")


def clone(src: Path, dst: Path) -> Path:
    """A copy of a bundle whose files are hard links (cheap); rewrite a file by replacing it."""
    dst.mkdir()
    for f in src.iterdir():
        os.link(f, dst / f.name)
    return dst


def replace(path: Path, data: bytes | str) -> None:
    path.unlink()
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def edit_manifest(bundle: Path, edit) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    replace(bundle / "manifest.json", json.dumps(manifest))


def generate(bundle: Path, capfd, *extra: str) -> tuple[int, str]:
    try:
        main(["generate", str(bundle), "--out", str(bundle / "x.png"), *extra])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    return code, capfd.readouterr().err


def _set(path: tuple, value):
    def edit(manifest):
        node = manifest
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _neighbours(table: np.ndarray):
    """Replace neighbours.npy (and its record, so the sha256 check passes and the table check speaks)."""
    def write(bundle: Path):
        path = bundle / "neighbours.npy"
        path.unlink()
        np.save(path, table)
        edit_manifest(bundle, lambda m: m["files"].__setitem__("neighbours.npy", file_record(path)))
    return write


V, K = 512, 32  # the demo's vocab and neighbour count
GOOD = np.stack([(np.arange(1, K + 1) + v) % V for v in range(V)]).astype(np.int32)
SELF = GOOD.copy()
SELF[5, 3] = 5


@pytest.mark.parametrize("change, message", [
    (_set(("models", "target", "n_layer"), 5), "present_kv axis 0 is 4 but models.target.n_layer is 5"),
    (_set(("models", "target", "vocab_size"), 500), "logits axis 2 is 512 but models.target.vocab_size is 500"),
    (_set(("models", "draft", "head_dim"), 48), "present_kv axis 5 is 32 but models.draft.head_dim is 48"),
    (_set(("models", "target", "n_kv_head"), "4"), "models.target.n_kv_head must be an integer >= 1, got '4'"),
    (_set(("models", "vq", "codebook_size"), 256), "models.vq.codebook_size is 256 but models.target.vocab_size is 512"),
    (_set(("models", "target", "capacity"), 100), "profile cache_len max is 130 but models.target.capacity is 100"),
    (_set(("limits", "max_window"), 128), "profile window max is 65 but limits.max_window is 128"),
    (_set(("sampling_defaults", "temperature"), float("nan")), "sampling_defaults: temperature must be a finite"),
    # the manifest edited consistently, but the graph disagrees: caught on the session's own I/O
    (_set(("graphs", "target_step", "inputs", 0, "dtype"), "int64"),
     "input input_ids is int64 in the manifest but int32 in target_step.onnx"),
    (_set(("graphs", "target_step", "outputs", 0, "shape", 2), 1024),
     "logits axis 2 is 1024 but models.target.vocab_size is 512"),
    # (the stacked past_kv's layer axis, or the per-layer inputs' names: 4 layers against the draft's 1)
    (_set(("graphs", "target_step", "file"), "draft_step.onnx"), "draft_step.onnx"),
    (_neighbours(GOOD[:, :16]), "neighbours.npy is int32 [512, 16] but the manifest needs int32 [512, 32]"),
    (_neighbours(GOOD.astype(np.float32)), "neighbours.npy is float32 [512, 32]"),
    (_neighbours(GOOD + 1), "token ids in [1, 512] but the vocabulary is [0, 511]"),
    (_neighbours(SELF), "lists a token as its own neighbour"),
])
def test_inconsistent_bundle_is_one_line(demo_bundle, tmp_path, capfd, change, message):
    bundle = clone(demo_bundle, tmp_path / "b")
    if change.__name__ == "write":
        change(bundle)
    else:
        edit_manifest(bundle, change)
    code, err = generate(bundle, capfd)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (bundle / "x.png").exists()


# ---- fuzz ------------------------------------------------------------------------------------

WEIRD = [None, -1, 0, 1, 7, 1.5, "x", "", [], {}, True, 1e308, 2**40, "float32", "batch"]


def _leaves(node, prefix=()):
    if prefix:
        yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from _leaves(value, prefix + (key,))


def _mutate(src: Path, dst: Path, rng: random.Random) -> str:
    """One random corruption of the bundle copy `dst`; returns what it did."""
    kind = rng.choice(["json", "json", "truncate", "flip"])
    if kind == "json":
        manifest = json.loads((src / "manifest.json").read_text())
        path = rng.choice(list(_leaves(manifest)))
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        old = parent[path[-1]]
        if rng.random() < 0.2 and isinstance(parent, dict):
            del parent[path[-1]]
            what = f"delete {path}"
        elif isinstance(old, (int, float)) and not isinstance(old, bool) and rng.random() < 0.5:
            parent[path[-1]] = rng.choice([old + 1, old - 1, old * 2, -old, old / 2])
            what = f"{path}: {old} -> {parent[path[-1]]}"
        else:
            parent[path[-1]] = rng.choice(WEIRD)
            what = f"{path} = {parent[path[-1]]!r}"
        text = json.dumps(manifest)
        replace(dst / "manifest.json", text.replace("1e+308", "NaN") if rng.random() < 0.2 else text)
        return what
    name = rng.choice(sorted(f.name for f in src.iterdir()))
    data = bytearray((src / name).read_bytes())
    if kind == "truncate":
        cut = rng.randrange(len(data))
        replace(dst / name, bytes(data[:cut]))
        return f"truncate {name} at {cut}"
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    replace(dst / name, bytes(data))
    return f"flip bits of {name}"


def test_fuzzed_bundles_give_one_line_or_a_run(demo_bundle, tmp_path, capfd):
    rng = random.Random(15)
    refused = 0
    for i in range(80):
        bundle = clone(demo_bundle, tmp_path / f"b{i}")
        what = _mutate(demo_bundle, bundle, rng)
        code, err = generate(bundle, capfd, "--method", "sd", "--param", "draft_len=2")
        if code == 0:
            assert (bundle / "x.png").is_file(), what
        else:
            assert code == 2 and err.count("\n") == 1 and err.startswith("specrt: error: "), (what, err)
            refused += 1
    assert refused >= 60  # most corruptions must be caught, not shrugged off


def test_inspect_refuses_an_inconsistent_manifest_in_one_line(demo_bundle, tmp_path, capfd):
    bundle = clone(demo_bundle, tmp_path / "b")
    edit_manifest(bundle, _set(("models", "target"), 7))
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(bundle), "--no-lint"])
    err = capfd.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "models.target is missing or not an object" in err
