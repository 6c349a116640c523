"""The runtime sits below export, engines, bench and the CLI: importing it loads none of them."""
import json
import subprocess
import sys

ABOVE_THE_RUNTIME = ("specrt.export", "specrt.engines", "specrt.bench", "specrt.commands", "specrt.cli")


def _loaded_after(statement: str) -> list[str]:
    code = f"{statement}; import sys, json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_runtime_loads_nothing_above_it():
    loaded = _loaded_after("import specrt.runtime, specrt.runtime.pipeline")
    assert "specrt.runtime.pipeline" in loaded  # the check sees what was imported
    above = [name for name in loaded if name.startswith(ABOVE_THE_RUNTIME)]
    assert not above, f"the runtime imports upward: {above}"


def test_the_check_sees_an_upward_import():
    loaded = _loaded_after("import specrt.runtime, specrt.export.kv_cache")
    assert any(name.startswith(ABOVE_THE_RUNTIME) for name in loaded)
