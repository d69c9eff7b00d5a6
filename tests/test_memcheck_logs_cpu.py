"""The memcheck stage covers every GPU test file, and each of its logs says which files and tests it ran.

``benchmarks/memcheck_gpu_tests.sh`` runs under a stand-in for compute-sanitizer here (a script
that runs the program it is given and prints memcheck's closing line), so what is checked is the
stage's own work: which files it hands to pytest, and what its logs record. On the CPU every GPU
test is skipped, and skipped tests are still listed by node id in pytest's verbose output.
"""

import os
import re
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "memcheck_gpu_tests.sh"

STAND_IN = """#!/usr/bin/env bash
# compute-sanitizer's options end at the program's name; run it, then close as memcheck does
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do
  case $1 in --tool|--report-api-errors) shift 2 ;; *) shift ;; esac
done
"$@"; rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
"""


def _run(tmp_path, out, *args, **env_extra):
    sanitizer = tmp_path / "compute-sanitizer"
    sanitizer.write_text(STAND_IN)
    sanitizer.chmod(sanitizer.stat().st_mode | stat.S_IXUSR)
    env = dict(
        os.environ,
        OUT=str(out),
        COMPUTE_SANITIZER=str(sanitizer),
        MEMCHECK_LIMIT="400",
        PYTHONPATH=str(ROOT),
        **env_extra,
    )
    run = subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_gpu_test_file_is_in_one_chunk_and_each_log_names_its_files_and_tests(tmp_path):
    out = tmp_path / "out"
    _run(tmp_path, out, "3")

    gpu_files = sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob("*_gpu.py"))
    logs = sorted(out.glob("sanitize_memcheck_chunk*.txt"))
    assert len(logs) == 3
    covered = []
    for log in logs:
        text = log.read_text()
        header = text.splitlines()[0]
        assert header.startswith("files: ")
        files = header.split()[1:]
        covered += files
        for f in files:  # the tests of each named file appear by node id, with their outcome
            assert re.search(rf"^{re.escape(f)}::\S+ (SKIPPED|PASSED)", text, re.M), f"{log.name}: no test of {f}"
        assert "ERROR SUMMARY: 0 errors" in text
    assert sorted(covered) == gpu_files  # each file exactly once, none left out
    for log in logs:  # committed as they are: no path of this machine in them
        assert str(ROOT) not in log.read_text() and "rootdir: <checkout>" in log.read_text()

    summary = (out / "sanitize_memcheck_files.txt").read_text()
    assert sorted(re.findall(r"^chunk \d+: (tests/\S+)$", summary, re.M)) == gpu_files
    assert len(re.findall(r"^chunk \d+: rc=0 \|.* skipped.*\| .*ERROR SUMMARY: 0 errors$", summary, re.M)) == 3


def test_chunks_picked_by_number_run_alone_and_split_the_files_as_a_whole_run_does(tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    _run(tmp_path, whole, "4", "3")
    _run(tmp_path, part, "4", "1", "3", MEMCHECK_PARALLEL="1")  # the two chunks at once
    summary = (part / "sanitize_memcheck_files.txt").read_text()
    assert re.findall(r"^chunk (\d+): rc=0 \|", summary, re.M) == ["1", "3"]
    assert sorted(p.name for p in part.glob("sanitize_memcheck_chunk*.txt")) == [
        "sanitize_memcheck_chunk1.txt",
        "sanitize_memcheck_chunk3.txt",
    ]
    assert [p.name for p in whole.glob("sanitize_memcheck_chunk*.txt")] == ["sanitize_memcheck_chunk3.txt"]
    header = (whole / "sanitize_memcheck_chunk3.txt").read_text().splitlines()[0]
    assert header == (part / "sanitize_memcheck_chunk3.txt").read_text().splitlines()[0]


def test_a_skipped_file_is_in_no_chunk_and_named_in_the_summary(tmp_path):
    out = tmp_path / "out"
    _run(tmp_path, out, "2", "1", MEMCHECK_SKIP="test_dot_gpu.py test_rng_gpu.py")
    summary = (out / "sanitize_memcheck_files.txt").read_text()
    assert re.findall(r"^skipped: (\S+)$", summary, re.M) == ["tests/test_dot_gpu.py", "tests/test_rng_gpu.py"]
    listed = re.findall(r"^chunk \d+: (tests/\S+)$", summary, re.M)
    assert "tests/test_dot_gpu.py" not in listed and "tests/test_rng_gpu.py" not in listed
    assert len(listed) == len(list((ROOT / "tests").glob("*_gpu.py"))) - 2
