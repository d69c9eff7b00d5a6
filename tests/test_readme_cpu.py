"""Every ``rawgraph ...`` command README.md shows parses and behaves as the README says.

Without a GPU each command that needs one must stop at the GPU check (exit 69, "needs a GPU"),
never at argparse; ``rawgraph info`` and the ``--help``/``--version`` forms must succeed. With a
GPU the commands that need it are skipped here: they run real work (a benchmark sweep writes
results), which the GPU tests and the device runs cover.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rawgraph.runtime.device import gpu_available

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# `rawgraph info` is a command, `rawgraph.bench` (a module) and a bare `rawgraph` are not.
_SPAN = re.compile(r"`(rawgraph [^`\n]+)`")
_FENCE = re.compile(r"^\s*(```|~~~)")
NO_GPU = {("info",), ("bench", "report")}  # commands that run without a GPU, by their leading words
HELP = {"-h", "--help", "--version"}


def readme_commands(markdown: str) -> list[str]:
    """The ``rawgraph ...`` commands in a Markdown text, in order, each once.

    Parameters
    ----------
    markdown : str
        The document.

    Returns
    -------
    list of str
        Inline code spans that start with ``rawgraph `` and lines in fenced code blocks that start
        with ``rawgraph`` (after an optional ``$ `` prompt).
    """
    found = []
    fenced = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            cmd = line.strip().removeprefix("$ ").strip()
            if cmd == "rawgraph" or cmd.startswith("rawgraph "):
                found.append(cmd)
        else:
            found.extend(m.group(1).strip() for m in _SPAN.finditer(line))
    return list(dict.fromkeys(found))


def needs_gpu(argv: list[str]) -> bool:
    """Whether ``rawgraph *argv`` needs a GPU (help and version forms never do)."""
    return not (HELP & set(argv)) and not any(tuple(argv[: len(words)]) == words for words in NO_GPU)


def test_needs_gpu():
    assert needs_gpu(["demo"]) and needs_gpu(["bench", "--quick"]) and needs_gpu(["bench", "slots"])
    assert not needs_gpu(["info", "--json"]) and not needs_gpu(["bench", "report", "x.json"])
    assert not needs_gpu(["bench", "--help"]) and not needs_gpu(["--version"])


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def test_readme_shows_rawgraph_commands():
    assert COMMANDS, "README.md shows no `rawgraph ...` command (inline code or fenced block)"


def test_readme_commands_extraction():
    md = (
        "Run `rawgraph info` or `rawgraph bench --quick`; the package `rawgraph.bench`, plain `rawgraph`.\n"
        "```bash\n$ rawgraph demo --width 64  # comment\npython3 -m rawgraph info\nrawgraph info\n```\n"
        "`rawgraph demo --width 64  # comment` again\n"
    )
    assert readme_commands(md) == ["rawgraph info", "rawgraph bench --quick", "rawgraph demo --width 64  # comment"]


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command(command, tmp_path):
    argv = shlex.split(command, comments=True)[1:]
    gpu = needs_gpu(argv)
    if gpu and gpu_available():
        pytest.skip("needs a GPU and runs real work; the GPU tests and device runs cover it")
    # In a scratch folder (rawgraph dot and bench write files), importing this checkout; a file of
    # the checkout the command names (a results file to report) is named by its full path there.
    missing = [a for a in argv if a.endswith(".json") and not (ROOT / a).is_file()]
    if missing:
        pytest.skip(f"{missing[0]} is not in this tree (the sdist carries no recorded results)")
    argv = [str(ROOT / a) if (ROOT / a).is_file() else a for a in argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run(
        [sys.executable, "-m", "rawgraph", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert "usage:" not in r.stderr and "error:" not in r.stderr, f"{command}: argparse refused it:\n{r.stderr}"
    if gpu:
        assert r.returncode == 69 and "needs a GPU" in r.stderr, f"{command}: rc={r.returncode}\n{r.stderr}"
    else:
        assert r.returncode == 0, f"{command}: rc={r.returncode}\n{r.stderr}"


def test_readme_shows_the_own_kernel_example_as_it_is():
    """The README's Python block is examples/own_kernel.py word for word (the GPU test runs the file)."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = (ROOT / "examples" / "own_kernel.py").read_text(encoding="utf-8")
    assert example in blocks, "README.md does not show examples/own_kernel.py as it is"
    assert len(example.splitlines()) < 25
