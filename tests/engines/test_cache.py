"""Engine cache: keys change with every component; stale or damaged engines are never served."""
import dataclasses
import json

import pytest

from specrt.engines.cache import DeviceInfo, EngineCache, EngineKey, atomic_write_bytes

ORIN = DeviceInfo("Orin", "8.7")


def _key(**changes) -> EngineKey:
    key = EngineKey(graph="target_step", trt_version="10.3.0", device=ORIN, precision="fp16",
                    profile={"input_ids": {"min": [1, 1], "opt": [2, 4], "max": [4, 8]}}, onnx_sha256="ab" * 32)
    return dataclasses.replace(key, **changes)


@pytest.mark.parametrize("change", [
    {"trt_version": "10.3.1"},
    {"device": DeviceInfo("Orin", "8.6")},
    {"device": DeviceInfo("NVIDIA H100 80GB HBM3", "8.7")},
    {"precision": "fp32"},
    {"profile": {"input_ids": {"min": [1, 1], "opt": [2, 4], "max": [4, 7]}}},
    {"onnx_sha256": "cd" * 32},
    {"converter": "specrt-precision-1"},
])
def test_every_component_changes_the_key(change):
    assert _key(**change).digest != _key().digest
    assert _key(**change).to_json() != _key().to_json()


def test_equal_keys_have_equal_digests():
    assert _key().digest == _key().digest and len(_key().digest) == 16


def test_store_then_lookup_hits(tmp_path):
    cache = EngineCache(tmp_path, ORIN, "10.3.0")
    path = cache.store(_key(), b"engine-bytes")
    assert cache.lookup(_key()) == path
    assert path.parent == tmp_path / "engines" / "orin-sm8.7-trt10.3.0"
    assert path.name == "target_step.fp16.engine" and path.read_bytes() == b"engine-bytes"
    sidecar = json.loads(cache.sidecar_path("target_step", "fp16").read_text())
    assert sidecar["digest"] == _key().digest and sidecar["engine_bytes"] == 12


def test_a_store_removes_what_a_killed_build_half_wrote(tmp_path):
    cache = EngineCache(tmp_path, ORIN, "10.3.0")
    cache.dir.mkdir(parents=True)
    stale = [cache.dir / ".target_step.fp16.engine.k2j4_x.tmp", cache.dir / ".draft_step.fp32.json.ab12cd.tmp"]
    for path in stale:
        path.write_bytes(b"half an engine")  # atomic_write_bytes' temporaries, left by a SIGKILL
    kept = cache.dir / ".timing.cache.zz99.tmp"  # the timing cache is written outside the lock: not touched
    kept.write_bytes(b"")
    cache.store(_key(), b"engine-bytes")
    assert not any(path.exists() for path in stale) and kept.exists()
    assert cache.lookup(_key()) is not None


def test_a_different_key_misses(tmp_path):
    cache = EngineCache(tmp_path, ORIN, "10.3.0")
    cache.store(_key(), b"engine-bytes")
    assert cache.lookup(_key(onnx_sha256="cd" * 32)) is None
    assert cache.lookup(_key(profile={})) is None


def test_a_modified_engine_file_misses(tmp_path):
    cache = EngineCache(tmp_path, ORIN, "10.3.0")
    path = cache.store(_key(), b"engine-bytes")
    path.write_bytes(b"engine-bytez")
    assert cache.lookup(_key()) is None


def test_missing_or_corrupt_sidecar_misses(tmp_path):
    cache = EngineCache(tmp_path, ORIN, "10.3.0")
    cache.store(_key(), b"engine-bytes")
    sidecar = cache.sidecar_path("target_step", "fp16")
    sidecar.write_text("{not json")
    assert cache.lookup(_key()) is None
    sidecar.unlink()
    assert cache.lookup(_key()) is None


def test_timing_cache_is_per_gpu_and_trt_version(tmp_path):
    cache = EngineCache(tmp_path, ORIN, "10.3.0")
    assert cache.load_timing_cache() == b""
    cache.save_timing_cache(b"timings")
    assert cache.load_timing_cache() == b"timings"
    assert EngineCache(tmp_path, ORIN, "10.4.0").load_timing_cache() == b""
    assert EngineCache(tmp_path, DeviceInfo("Thor", "11.0"), "10.3.0").load_timing_cache() == b""


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "x.engine"
    atomic_write_bytes(target, b"old")

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", fail)
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.engine"]  # no temp file left behind


def _hammer(bundle: str, worker: int, rounds: int) -> list[str]:
    """One process storing its own engine for a shared key and looking it up, again and again."""
    cache = EngineCache(bundle, ORIN, "10.3.0")
    key = _key()
    problems = []
    for i in range(rounds):
        cache.store(key, f"engine of worker {worker}, round {i} ".encode() * 2000)
        found = cache.lookup(key)
        if found is None:
            problems.append(f"worker {worker} round {i}: a stored engine read as a miss")
            continue
        data = found.read_bytes()
        unit = data[: data.find(b" ", data.find(b"round ") + 6) + 1]  # "engine of worker W, round R "
        if not unit.startswith(b"engine of worker ") or data != unit * 2000:
            problems.append(f"worker {worker} round {i}: a mixed or partial engine")
    return problems


def test_processes_sharing_one_cache_never_see_a_torn_pair(tmp_path):
    """Four processes store and look up the same engine 40 times each: every lookup after a store
    must hit (an engine whole and paired with its own sidecar), and no temp file is left over.
    Without the pair lock a reader can meet one writer's engine beside another's sidecar."""
    import multiprocessing

    # fork where there is one (fast; the workers only touch files), else spawn
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(4) as pool:
        results = pool.starmap(_hammer, [(str(tmp_path), w, 40) for w in range(4)])
    assert [p for r in results for p in r] == []
    cache = EngineCache(tmp_path, ORIN, "10.3.0")
    assert cache.lookup(_key()) is not None
    assert sorted(p.name for p in cache.dir.iterdir()) == [".lock", "target_step.fp16.engine", "target_step.fp16.json"]
