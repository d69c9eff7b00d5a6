"""rawgraph's pytest plugin (rawgraph.testing): off until enabled, its marker, fixtures and doctor,
the fake driver it serves, and the documented example run on the CPU (no GPU needed)."""

import os
import shutil
from pathlib import Path

import pytest
from cuda.bindings import driver

import rawgraph.runtime.device as device_mod
from rawgraph.runtime.device import gpu_available
from rawgraph.testing import FakeDriver, fake_driver_session

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "testing" / "test_my_graph.py"

# One file exercising each piece; run below with the plugin on and off.
PROBE = """
import pytest


@pytest.mark.gpu
def test_marked_gpu():
    pass


def test_fake(fake_driver, stream):
    assert stream.ptr in fake_driver.streams
"""

# Graph.instantiate and the doctor's check stood in for (no driver here): each instantiate of a
# graph the doctor may look at yields one finding.
DOCTORED = """
import pytest
import rawgraph.doctor
import rawgraph.graphs.graph as graph_mod


class Report:
    findings = ["dangling address 0x1000 at node 0"]


rawgraph.doctor.check = lambda graph: Report()
graph_mod.Graph.instantiate = lambda self, *args, **kwargs: "exec"


class FakeGraph:
    closed = False


def test_instantiates():
    assert graph_mod.Graph.instantiate(FakeGraph()) == "exec"


@pytest.mark.no_doctor
def test_exempt():
    assert graph_mod.Graph.instantiate(FakeGraph()) == "exec"


def test_on_the_fake_driver(fake_driver):
    assert graph_mod.Graph.instantiate(FakeGraph()) == "exec"
"""


@pytest.fixture
def plugin_env(monkeypatch):
    """A pytest subprocess as in a project with rawgraph installed: the entry point's module loaded
    by name (autoloading off, so what else is installed here cannot interfere), rawgraph and that
    module importable from this checkout."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return ["-p", "_rawgraph_pytestplugin", "-p", "no:cacheprovider"]


def test_options_are_listed_but_nothing_happens_until_enabled(pytester, plugin_env):
    helped = pytester.runpytest_subprocess(*plugin_env, "--help")
    text = helped.stdout.str()
    assert "--rawgraph-doctor" in text and "rawgraph_testing" in text and "rawgraph_doctor" in text
    pytester.makepyfile(
        test_probe=PROBE,
        test_imports="import sys\n\ndef test_no_rawgraph():\n    assert 'rawgraph' not in sys.modules\n",
    )
    r = pytester.runpytest_subprocess(*plugin_env, "-rs")
    # The marker skips nothing, the fixtures do not exist, and rawgraph is not even imported.
    r.assert_outcomes(passed=2, errors=1)
    assert "fixture 'fake_driver' not found" in r.stdout.str()


@pytest.mark.parametrize("how", ["-p", "ini"])
def test_enabled_the_marker_skips_with_the_reason_and_the_fixtures_serve(pytester, plugin_env, how):
    pytester.makepyfile(test_probe=PROBE)
    args = list(plugin_env)
    if how == "-p":
        args += ["-p", "rawgraph.testing"]
    else:
        pytester.makeini("[pytest]\nrawgraph_testing = true\n")
    r = pytester.runpytest_subprocess(*args, "-rs")
    if gpu_available():
        r.assert_outcomes(passed=2)
    else:
        r.assert_outcomes(passed=1, skipped=1)
        assert "needs a GPU: no CUDA driver/GPU found here" in r.stdout.str()


def test_the_doctor_runs_only_when_asked_and_its_findings_fail_the_run(pytester, plugin_env):
    pytester.makepyfile(test_doctored=DOCTORED)
    base = [*plugin_env, "-p", "rawgraph.testing"]
    off = pytester.runpytest_subprocess(*base)
    off.assert_outcomes(passed=3)
    assert off.ret == 0 and "rawgraph doctor" not in off.stdout.str()
    on = pytester.runpytest_subprocess(*base, "--rawgraph-doctor")
    on.assert_outcomes(passed=3)  # each test passes; the finding fails the run
    assert on.ret == pytest.ExitCode.TESTS_FAILED
    out = on.stdout.str()
    assert "rawgraph doctor over every instantiated graph: 1 finding(s)" in out
    assert "test_doctored.py::test_instantiates: dangling address 0x1000 at node 0" in out
    assert "test_exempt" not in out and "test_on_the_fake_driver" not in out
    pytester.makeini("[pytest]\nrawgraph_doctor = true\n")
    assert pytester.runpytest_subprocess(*base).ret == pytest.ExitCode.TESTS_FAILED


def test_the_documented_example_runs_on_the_cpu_with_the_fake_driver(pytester, plugin_env):
    shutil.copy(EXAMPLE, pytester.path / EXAMPLE.name)
    r = pytester.runpytest_subprocess(*plugin_env, "-p", "rawgraph.testing", "-rs", EXAMPLE.name)
    if gpu_available():
        r.assert_outcomes(passed=2)
    else:
        r.assert_outcomes(passed=1, skipped=1)
        assert "needs a GPU" in r.stdout.str()


def test_the_fake_driver_session_puts_everything_back():
    real_init = driver.cuInit
    state = device_mod._init_state
    with fake_driver_session() as fake:
        assert FakeDriver.installed is fake and driver.cuInit is not real_init
        from rawgraph import Stream, get_device

        assert get_device().info.name and get_device().handle is not None
        with Stream() as s:
            assert s.ptr in fake.streams
    assert FakeDriver.installed is None
    assert driver.cuInit is real_init
    assert device_mod._init_state == state


def test_stream_asked_for_before_fake_driver_is_the_fakes(stream, fake_driver):
    assert stream.ptr in fake_driver.streams


def test_the_tests_fake_driver_module_is_the_packages():
    import fakedriver

    import rawgraph.testing.fakedriver

    assert fakedriver is rawgraph.testing.fakedriver and fakedriver.FakeDriver is FakeDriver
