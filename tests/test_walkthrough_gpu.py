"""``examples/driver_walkthrough.py`` on the GPU (issue 44, section 3), run as a user runs it: its
own process, exit status 0, and a report that the three paths (eager launches, copy + graph replay,
rebind + graph replay) gave equal bits, that rebinding moved x in both kernel nodes, and a timing
row per path. The example checks the bits (and float64) itself before it prints anything.
Also run under ``PYTHONMALLOC=debug`` (fresh memory filled with 0xCD), as the GPU suite is (semantics
§16): a node-parameter field the example left unset would show there."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "driver_walkthrough.py"
PATHS = ("eager (2 launches)", "copy + replay", "rebind + replay")
FLOAT = r"\d+\.\d\d"


@pytest.mark.parametrize("malloc", [None, "debug"])
def test_the_walkthrough_reports_equal_bits_for_the_three_paths(malloc):
    env = dict(os.environ)
    if malloc:
        env["PYTHONMALLOC"] = malloc
    r = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, f"exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 7, r.stdout
    assert re.fullmatch(r".+ \(sm_\d+a?\), block 1x128 float32, median of 200 steps", lines[0]), lines[0]
    assert lines[1].split() == ["path", "host", "us/step", "device", "us/step"], lines[1]
    for path, row in zip(PATHS, lines[2:5]):
        m = re.fullmatch(rf"{re.escape(path)} +({FLOAT}) +({FLOAT})", row)
        assert m, row
        assert float(m[1]) > 0 and float(m[2]) > 0, row
    assert lines[5] == "rebinding moved x in 2 of 2 kernel nodes", lines[5]
    assert re.fullmatch(
        r"three paths, equal bits: eager == copy \+ replay == rebind \+ replay "
        r"\(vs float64: \d\.\de[-+]\d+\)",
        lines[6],
    ), lines[6]
    assert float(lines[6].rsplit(" ", 1)[1].rstrip(")")) < 1e-5
