"""``rawgraph trace --callable MODULE:NAME`` without a GPU: a model of the user's own through the
launch paths.

Checked: a ``--callable`` that names nothing the command can run (no colon, a file path, a module
that is not there or fails to import, an attribute that is missing, an object that is neither a
row-wise model nor a factory of one, a factory needing parameters the command cannot give, a
FunctionModel step function given bare) exits 2 with one line on stderr naming the problem, before
the GPU is looked for; a valid one on a machine without a GPU still exits 69. On the fake driver, a
FunctionModel of the user's own kernel, from a module written to ``tmp_path``, is traced through
``rawgraph trace`` itself: a path span and host spans of the driver calls each path makes, for every
path that ran; the paths a protocol model cannot take are named in the findings; and the JSON's
metadata names the workload as the user's callable. The TinyBlock class named as a factory runs the
indirect paths too; a model held by the module is traced at ``--batch`` rows and left open. The fake
runs no kernel: the outputs' agreement is checked on the GPU's side of the launch-path runner
(``tests/test_trace_gpu.py``); here on host arrays (``Runner._agree``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from test_trace_cpu import trace_problems

from rawgraph import cli
from rawgraph.bench import trace as bench_trace
from rawgraph.runtime.device import gpu_available
from rawgraph.trace import Tracer

ROOT = Path(__file__).resolve().parents[1]

USER_MODULE = '''
"""A user's model: out = x * s + x, one RawKernel, served as a FunctionModel."""
import numpy as np

import rawgraph as rg
from rawgraph.serving import FunctionModel

SRC = r"""
extern "C" __global__ void user_scale_add(const float* __restrict__ x, float s, float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s + x[i];
}
"""
NUMBER = 3
MADE = []


def make_model(width, batch=1):
    kernel = rg.RawKernel(SRC, "user_scale_add")

    def scale_add(x, out, scratch, rows, stream):
        n = rows * width
        kernel(-(-n // 128), 128, (x, 0.5, out, n), stream=stream)

    model = FunctionModel(scale_add, width, batch=batch, reference=lambda x: 1.5 * x)
    MADE.append(model)
    return model


def needs_two(a, b):
    return None


def step(x, out, scratch, rows, stream):
    return None


def not_a_model(width):
    return {"width": width}
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The folder ``usermod.py`` (and two broken modules) live in, made the current directory, as
    a user runs ``rawgraph trace`` from their project; the modules and ``sys.path`` put back after."""
    (tmp_path / "usermod.py").write_text(USER_MODULE)
    (tmp_path / "usermod_raises.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "usermod_needs.py").write_text("import no_such_dependency_of_usermod\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in ("usermod", "usermod_raises", "usermod_needs", "usermod_held"):
        sys.modules.pop(name, None)


def _no_gpu_check(monkeypatch):
    """Make the GPU check fail the test: a bad --callable must be refused before it."""

    def called():
        raise AssertionError("the GPU was looked for before --callable was checked")

    monkeypatch.setattr(cli, "_need_gpu", called)


@pytest.mark.parametrize(
    "spec, says",
    [
        ("usermod", "give MODULE:NAME"),
        (":make_model", "give MODULE:NAME"),
        ("usermod:", "give MODULE:NAME"),
        ("usermod.py:make_model", "is a file path; give the module's name"),
        ("usermod:make model", "must be dotted Python names"),
        ("no_such_module_of_yours:make_model", "no module named 'no_such_module_of_yours' in the current directory"),
        ("usermod_raises:f", "importing usermod_raises failed: RuntimeError: boom at import"),
        ("usermod_needs:f", "importing usermod_needs failed: ModuleNotFoundError"),
        ("usermod:missing", "usermod has no attribute 'missing'"),
        ("usermod:make_model.nope", "usermod:make_model has no attribute 'nope'"),
        ("usermod:NUMBER", "is of type int: neither a row-wise model"),
        ("usermod:needs_two", "takes 'a', 'b', which rawgraph trace cannot give"),
        ("usermod:step", "is a step function fn(x, out, scratch, rows, stream), not a model"),
    ],
)
def test_a_bad_callable_exits_2_with_one_line_before_the_gpu_check(user_module, monkeypatch, capsys, spec, says):
    _no_gpu_check(monkeypatch)
    rc = cli.main(["trace", "--callable", spec, "--width", "64"])
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rawgraph trace: --callable ")
    assert says in lines[0]
    assert repr(spec) in lines[0]  # names what was given


def test_the_module_entry_point_refuses_the_same_way(user_module, capsys):
    assert bench_trace.main(["--callable", "usermod:missing"]) == 2
    out, err = capsys.readouterr()
    assert (
        out == "" and err.strip() == "rawgraph trace: --callable 'usermod:missing': usermod has no attribute 'missing'"
    )


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run(
        [sys.executable, "-m", "rawgraph", "trace", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def test_in_a_process_a_bad_callable_exits_2_and_a_good_one_reaches_the_gpu_check(user_module):
    r = _cli(["--callable", "usermod:absent"], user_module)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr.strip().splitlines() == [
        "rawgraph trace: --callable 'usermod:absent': usermod has no attribute 'absent'"
    ]
    if gpu_available():
        pytest.skip("this machine has a GPU: a valid --callable would run")
    r = _cli(["--callable", "usermod:make_model", "--width", "64"], user_module)
    assert r.returncode == 69, r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "needs a GPU" in r.stderr


def test_the_help_offers_the_callable():
    text = cli.build_parser()._subparsers._group_actions[0].choices["trace"].format_help()
    assert "--callable MODULE:NAME" in text
    assert "row-wise protocol" in text and "rawgraph.serving.FunctionModel" in text


# -- on the fake driver -----------------------------------------------------------------------
def _host_spans(doc: dict, path: str) -> list[dict]:
    """The host driver-call spans made inside ``path``'s steps."""
    return [
        e
        for e in doc["traceEvents"]
        if e["ph"] == "X" and e["cat"] not in ("path", "step") and e["args"].get("path") == path and "step" in e["args"]
    ]


# The driver calls each path's steps make, at the least; only the stream path launches kernels
# one by one (cuLaunchKernel or cuLaunchKernelEx: the group "launch").
PATH_CALLS = {
    "stream": set(),
    "graph": {"cuGraphLaunch"},
    "graph_copy": {"cuMemcpyDtoDAsync", "cuGraphLaunch"},
    "graph_update": {"cuGraphExecKernelNodeSetParams", "cuGraphLaunch"},
    "graph_update2": {"cuGraphExecKernelNodeSetParams", "cuGraphLaunch"},
    "graph_exec_update": {"cuGraphExecUpdate", "cuGraphLaunch"},
    "graph_indirect": {"cuGraphLaunch"},
    "graph_indirect_mapped": {"cuGraphLaunch"},
}


def _check_paths(doc: dict, traced: list[str], steps: int) -> None:
    assert trace_problems(doc) == []
    assert [p["path"] for p in doc["metadata"]["latency_model"]["paths"]] == traced
    assert all(p["steps"] == steps for p in doc["metadata"]["latency_model"]["paths"])
    path_spans = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "path"]
    assert path_spans == traced
    for path in traced:
        calls = _host_spans(doc, path)
        names = {e["name"] for e in calls}
        assert PATH_CALLS[path] <= names, (path, sorted(names))
        assert ("launch" in {e["cat"] for e in calls}) == (path == "stream"), (path, sorted(names))
        assert len({e["args"]["step"] for e in calls}) == steps, path


def test_a_function_model_of_the_users_is_traced_through_the_cli(fake_driver, user_module, capsys):
    rc = cli.main(
        [
            "trace",
            "--callable",
            "usermod:make_model",
            "--width",
            "64",
            "--batch",
            "3",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--out",
            str(user_module / "traces"),
            "--no-png",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    result = json.loads(out)
    traced = ["stream", "graph", "graph_copy", "graph_update", "graph_update2"]
    assert result["paths_traced"] == traced
    path = user_module / "traces" / "trace_make_model_w64_b3.json"
    assert result["json"] == str(path)
    doc = json.loads(path.read_text())
    _check_paths(doc, traced, steps=2)
    workload = doc["metadata"]["workload"]
    assert workload == result["workload"]
    assert workload["kind"] == "callable" and workload["callable"] == "usermod:make_model"
    assert workload["object"] == "factory" and workload["given"] == {"width": 64, "batch": 3}
    assert workload["model"] == "FunctionModel" and (workload["width"], workload["batch"]) == (64, 3)
    # the stream path launches the user's own kernel, once a step
    launches = [e["args"]["kernel"] for e in _host_spans(doc, "stream") if e["cat"] == "launch"]
    assert launches == ["user_scale_add"] * 2
    # the paths a protocol model cannot take are said, with why; none of theirs ran
    findings = "\n".join(result["findings"])
    assert "torch_eager, torch_graph, torch_graph_rebind not traced for a model of your own" in findings
    assert "graph_indirect and graph_indirect_mapped left out" in findings and "user_scale_add" in findings
    assert not any("differ" in f for f in result["findings"])
    made = sys.modules["usermod"].MADE
    assert len(made) == 1
    with pytest.raises(Exception, match="closed"):  # the model the factory made is closed after
        made[0].plan(None, None)


def test_the_tinyblock_class_as_a_factory_takes_the_indirect_paths_too(fake_driver, user_module):
    paths = [*PATH_CALLS, "graph_nopdl", "torch_eager"]
    args = bench_trace.build_parser().parse_args(
        ["--callable", "rawgraph:TinyBlock", "--width", "64", "--form", "fused", "--steps", "2", "--no-png"]
        + ["--out", str(user_module), "--paths", *paths]
    )
    result = bench_trace.run(args)
    assert result["paths_traced"] == list(PATH_CALLS)
    doc = json.loads(Path(result["json"]).read_text())
    _check_paths(doc, list(PATH_CALLS), steps=2)
    assert doc["metadata"]["workload"]["given"] == {"width": 64, "batch": 1, "layers": 2, "form": "fused"}
    assert doc["metadata"]["graphs"]  # every graph the runner captured, labelled
    findings = result["findings"]
    assert any(f.startswith("graph_nopdl not traced for a model of your own") for f in findings)
    assert any(f.startswith("torch_eager not traced for a model of your own") for f in findings)
    assert len(findings) == 2, findings


def test_a_model_the_module_holds_is_traced_at_the_batch_asked_and_left_open(fake_driver, user_module):
    (user_module / "usermod_held.py").write_text("from usermod import make_model\nMODEL = make_model(32, batch=2)\n")
    args = bench_trace.build_parser().parse_args(
        ["--callable", "usermod_held:MODEL", "--batch", "5", "--steps", "1", "--no-png", "--no-torch"]
        + ["--out", str(user_module), "--paths", "stream", "graph"]
    )
    result = bench_trace.run(args)
    assert result["paths_traced"] == ["stream", "graph"]
    assert result["findings"] == []
    workload = json.loads(Path(result["json"]).read_text())["metadata"]["workload"]
    assert (workload["object"], workload["width"], workload["batch"]) == ("model", 32, 5)
    held = sys.modules["usermod_held"].MODEL
    held._check_open()  # the module's: not closed by the trace
    assert held.batch == 2
    held.close()


def test_a_factory_returning_no_model_exits_2_with_one_line(fake_driver, user_module, capsys):
    rc = cli.main(["trace", "--callable", "usermod:not_a_model", "--width", "64", "--no-png", "--out", "t"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == [
        "rawgraph trace: --callable 'usermod:not_a_model' returned a dict, not a row-wise model "
        "(rawgraph.serving.protocol): it has no width, batch, device, plan, with_batch, make_workspace, "
        "scratch_layout, reference, close"
    ]


def test_outputs_that_differ_from_the_stream_paths_are_a_finding():
    """The runner's check (``Runner._agree``): a user's model gets a finding, the TinyBlock's
    exact run an error."""
    from rawgraph.bench.launch_paths import Runner

    runner = types.SimpleNamespace(findings=[])
    ref = np.array([[1.0, np.nan, 3.0, 4.0]], dtype=np.float32)
    Runner._agree(runner, "graph", ref.copy(), ref, False, "(callable L0 w4 b1)")  # NaN where both left the poison
    assert runner.findings == []
    got = ref.copy()
    got[0, 2], got[0, 1] = 3.5, 2.0
    Runner._agree(runner, "graph_copy", got, ref, False, "(callable L0 w4 b1)")
    assert runner.findings == [
        "graph_copy: 2 of 4 output values differ from the stream path's (callable L0 w4 b1) (max |difference| 0.5 "
        "where both are finite); measured all the same"
    ]
    with pytest.raises(AssertionError, match="graph_copy differs from stream output"):
        Runner._agree(runner, "graph_copy", got, ref, True, "(fused L1 w4 b1)")


def test_the_tracer_writes_the_workload_it_was_given(fake_driver, tmp_path):
    given = {"name": "my step", "batch": 8}
    with Tracer(workload=given) as t:
        t.workload["note"] = "filled in later"
    given["batch"] = 9  # a copy was taken
    doc = json.loads(t.write(tmp_path / "t.json").read_text())
    assert doc["metadata"]["workload"] == {"name": "my step", "batch": 8, "note": "filled in later"}
    with Tracer() as t2:
        pass
    assert t2.metadata()["workload"] == {}


def test_the_docs_show_the_callable_and_the_python_api():
    text = (ROOT / "docs" / "trace.md").read_text()
    assert "--callable" in text and "rawgraph.serving.FunctionModel" in text
    block = text.split("## Tracing your own code", 1)[1].split("\n## ", 1)[0]
    assert "from rawgraph.trace import Tracer" in block
    code = textwrap.dedent(block.split("```python", 1)[1].split("```", 1)[0])
    compile(code, "docs/trace.md", "exec")
