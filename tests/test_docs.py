"""The front page and the quickstart say what runs: the README is short and names exactly the two
set-up commands CI and the getting-started page use, and the quickstart's `specrt` commands write
the image they promise."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
CI = ROOT / ".ci" / "run"
MAX_README_LINES = 250


def _setup_lines(text: str) -> list[str]:
    """The set-up command lines: those that install specrt (`pip install ... -e '.[...]' && ...`)."""
    return [line.strip() for line in text.splitlines() if re.match(r"\s*pip install .*-e '\.\[[a-z0-9,]+\]' && ", line)]


def _quickstart_block() -> list[str]:
    """The command lines of the fenced block right after the quickstart marker."""
    text = GETTING_STARTED.read_text(encoding="utf-8")
    marker = text.index("<!-- quickstart:")
    block = re.search(r"```bash\n(.*?)```", text[marker:], re.S)
    assert block, "the quickstart marker is not followed by a ```bash block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"


def test_readme_has_exactly_the_two_setup_commands_ci_and_the_docs_use():
    readme = _setup_lines(README.read_text(encoding="utf-8"))
    assert len(readme) == 2, f"README.md should name exactly two set-up commands, found {readme}"
    run_demo, run_tests = readme
    assert run_demo.endswith("&& specrt generate"), run_demo
    assert run_tests.endswith("&& python -m pytest -q -ra -n 2 --dist loadfile"), run_tests
    # CI quietens pip (`pip install -q`); the command is otherwise the README's, character for character
    ci = [line.replace("pip install -q ", "pip install ", 1) for line in _setup_lines(CI.read_text(encoding="utf-8"))
          if "pytest" in line]
    assert ci == [run_tests], f".ci/run's test command {ci} differs from the README's {run_tests!r}"
    docs = _setup_lines(GETTING_STARTED.read_text(encoding="utf-8"))
    assert docs == readme, f"docs/getting-started.md's set-up commands {docs} differ from the README's {readme}"
    assert run_demo in _quickstart_block()


def test_no_project_history_wording_in_the_front_page_and_docs():
    pattern = re.compile(r"\b(session|issue)s? [0-9]", re.I)
    texts = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("*/*.md"))]
    found = [f"{path.relative_to(ROOT)}:{n}" for path in texts if "_api_src" not in path.parts
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, f"session / issue numbers in project text: {found}"


def _specrt_commands(lines: list[str]) -> list[list[str]]:
    """Every `specrt ...` command in the block, split out of `a && b` chains."""
    commands = []
    for line in lines:
        for part in line.split("&&"):
            argv = shlex.split(part.strip())
            if argv and argv[0] == "specrt":
                commands.append(argv)
    return commands


def _quoted_summaries() -> dict[str, str]:
    """The closing line of `specrt generate` as the README and the getting-started page quote it."""
    quoted = {}
    for path in (README, GETTING_STARTED):
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                 if line.strip().startswith("wrote img.png")]
        assert len(lines) == 1, f"{path.name} should quote generate's closing line once, found {lines}"
        quoted[path.name] = lines[0]
    return quoted


def _without_timing(line: str) -> str:
    """A summary line with its seconds masked: the one field that differs from run to run."""
    return re.sub(r"\b[0-9]+\.[0-9]+ s;", "T s;", line.strip())


@pytest.mark.slow
def test_the_quickstart_writes_the_image_it_promises(tmp_path):
    from PIL import Image

    commands = _specrt_commands(_quickstart_block())
    assert commands == [["specrt", "generate"]], commands
    for argv in commands:
        # the installed console script, as a user runs it (the venv's bin beside this interpreter)
        script = Path(sys.executable).with_name("specrt")
        argv = [str(script) if script.exists() else "specrt", *argv[1:]]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        # the summary line the pages show, field for field (the seconds aside)
        for page, quoted in _quoted_summaries().items():
            assert _without_timing(done.stdout) == _without_timing(quoted), (page, done.stdout)
    image = Image.open(tmp_path / "img.png")
    assert image.format == "PNG" and image.size == (32, 32) and image.mode == "RGB"
    # a digit: dark background, some bright ink
    darkest, brightest = image.convert("L").getextrema()
    assert darkest < 64 and brightest > 128


def test_one_venv_story_for_the_serve_extra():
    """The serve extra holds numpy below 2; every page that says where it goes says the same: the
    one venv the test command installs everything into (CI's), never a venv of its own."""
    pages = {path: path.read_text(encoding="utf-8") for path in (
        README, GETTING_STARTED, ROOT / "docs" / "guides" / "serve-triton.md", ROOT / "pyproject.toml", CI)}
    for path, text in pages.items():
        flat = " ".join(text.replace("#", " ").split())
        assert not re.search(r"(its|their|a) own venv", flat), f"{path.name} sends `serve` to a venv of its own"
        assert re.search(r"one venv|same venv", flat, re.I), f"{path.name} does not say the extras share one venv"
        assert re.search(r"numpy (below 2|<2|to 1\.26)|numpy 2\.x back to 1\.26|numpy 1\.26", flat), path.name
    assert "serve" in _setup_lines(CI.read_text(encoding="utf-8"))[0]  # CI runs the serving tests in that venv


def test_no_history_by_issue_number_in_the_code():
    """Docstrings and comments say what a thing is and since which version or date, not which
    ticket changed it."""
    pattern = re.compile(r"\b(session|issue)s? #?[0-9]", re.I)
    found = [f"{path.relative_to(ROOT)}:{n}"
             for folder in ("specrt", "runtime", "export", "engines", "bench", "models")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, f"issue / session numbers in the code: {found}"
