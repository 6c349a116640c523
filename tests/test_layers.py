"""The runtime sits below export, engines, bench and the CLI: it imports none of them, even lazily.

Each module under runtime/ is imported alone, in a fresh process of its own, and what that
loaded is checked, so a module that reaches upward is named even when another module imported
it first; and its source is read for import statements inside functions, which importing it
does not run. The modules are found on disk (pkgutil over runtime/'s folders), so a new one is
checked without an edit here.
"""
import ast
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ABOVE_THE_RUNTIME = ("specrt.export", "specrt.engines", "specrt.bench", "specrt.commands", "specrt.cli")
INSIDE_THE_LAYERS_ABOVE = tuple(f"{layer}." for layer in ABOVE_THE_RUNTIME)

# Runs in a subprocess: third-party libraries the runtime uses are imported once, then each
# module (specrt.runtime first) is imported in a forked child of its own, which reports what it
# loaded.
IMPORT_EACH_ALONE = r"""
import importlib, json, os, sys

layers = sys.argv[1].split(",")
inside = tuple(layer + "." for layer in layers)
for library in ("numpy", "torch"):
    try:
        importlib.import_module(library)
    except ImportError:
        pass
from specrt.errors import MissingDependency

outcomes = {}
for name in sys.argv[2:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            outcome = {"above": sorted(m for m in sys.modules if m in layers or m.startswith(inside))}
        except MissingDependency as err:
            outcome = {"missing": str(err)}
        except ModuleNotFoundError as err:
            outcome = {"missing": err.name} if err.name and not err.name.startswith("specrt") else {"error": repr(err)}
        except Exception as err:
            outcome = {"error": repr(err)}
        os.write(write, json.dumps(outcome).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        outcomes[name] = json.loads(pipe.read())
    os.waitpid(pid, 0)
    if name == "specrt.runtime" and outcomes[name] == {"above": []}:
        # every module imports its package first: loaded here once, the children skip that work.
        # What a child reports stays exact, since nothing loaded here is above the runtime.
        importlib.import_module(name)
print(json.dumps(outcomes))
"""


def runtime_modules() -> dict[str, Path]:
    """specrt.runtime and every module below it, by name, with its source file: found on disk
    without importing any of them."""
    root = Path(importlib.util.find_spec("specrt.runtime").submodule_search_locations[0])
    modules = {"specrt.runtime": root / "__init__.py"}

    def walk(folder: Path, package: str) -> None:
        for module in pkgutil.iter_modules([str(folder)]):
            name = f"{package}.{module.name}"
            if module.ispkg:
                modules[name] = folder / module.name / "__init__.py"
                walk(folder / module.name, name)
            else:
                modules[name] = folder / f"{module.name}.py"

    walk(root, "specrt.runtime")
    return dict(sorted(modules.items()))


def upward_imports(source: Path) -> list[str]:
    """The modules above the runtime that a source file's import statements name, wherever they
    stand (a function's body included)."""
    named = []
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "specrt":
            named += [f"specrt.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            named.append(node.module)
    return sorted(name for name in named if name in ABOVE_THE_RUNTIME or name.startswith(INSIDE_THE_LAYERS_ABOVE))


def import_each_alone(names: list[str]) -> dict:
    """Each module's outcome imported alone: the modules above the runtime it loaded, or the
    optional library it is missing, or the error it raised."""
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH_ALONE, ",".join(ABOVE_THE_RUNTIME), *names],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def imported_alone() -> dict:
    if not hasattr(os, "fork"):
        pytest.skip("importing each module alone forks a child per module (POSIX only)")
    return import_each_alone(list(runtime_modules()))


@pytest.mark.parametrize("name", list(runtime_modules()))
def test_each_runtime_module_imported_alone_loads_nothing_above_it(imported_alone, name):
    outcome = imported_alone[name]
    if "missing" in outcome:
        pytest.skip(f"{name} needs an optional library that is not installed: {outcome['missing']}")
    if "error" in outcome:
        pytest.fail(f"importing {name} alone fails: {outcome['error']}")
    assert not outcome["above"], f"importing {name} loads {outcome['above']}"


@pytest.mark.parametrize("name, source", [pytest.param(name, source, id=name)
                                          for name, source in runtime_modules().items()])
def test_no_runtime_module_imports_above_it_even_lazily(name, source):
    assert not upward_imports(source), f"{name} imports {upward_imports(source)}"


def test_the_walk_finds_the_runtime_modules():
    names = runtime_modules()
    assert {"specrt.runtime.pipeline", "specrt.runtime.backends.torch_backend"} <= set(names)


def test_the_checks_see_an_upward_import(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("importing each module alone forks a child per module (POSIX only)")
    outcome = import_each_alone(["specrt.export", "specrt.runtime.no_such_module"])
    assert outcome["specrt.export"]["above"] == ["specrt.export"]
    assert "error" in outcome["specrt.runtime.no_such_module"]  # a specrt module is never "optional"
    source = tmp_path / "lazy.py"
    source.write_text("def load():\n    from specrt import cli\n    import specrt.engines.build\n")
    assert upward_imports(source) == ["specrt.cli", "specrt.engines.build"]
