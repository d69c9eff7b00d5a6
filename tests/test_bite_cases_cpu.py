"""Every bite case of ``benchmarks/bite_cases/`` still applies to the code as it is now.

A case whose text no longer occurs (the code moved, its indentation changed under a new lock)
would be reported as ``stale`` or ``error`` only when ``bite_check.py`` runs on the device; here
CI catches it: each edit's text occurs exactly once, and the edited Python files still compile,
so the case breaks the feature instead of breaking the import.
"""

from pathlib import Path

import pytest
from helpers import bench_script

ROOT = Path(__file__).resolve().parent.parent
BITE = bench_script("bite_check")
CASES = BITE.load_cases()


def test_there_are_cases_for_every_module():
    modules = {c["module"] for c in CASES}
    on_disk = {p.name for p in (ROOT / "benchmarks" / "bite_cases").glob("*.py") if not p.name.startswith("_")}
    assert modules == on_disk and len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_case_applies_and_compiles(case):
    texts = BITE.edited_texts(ROOT, case["edits"])
    assert not isinstance(texts, str), f"{case['name']}: {texts}"
    assert all(new != old for _p, old, new in case["edits"])
    for path, text in texts.items():
        if path.endswith(".py"):
            compile(text, path, "exec")  # a SyntaxError names the case's file and line
    for test in case["tests"]:
        assert (ROOT / test.split("::")[0]).is_file(), f"{case['name']}: no test file {test}"
