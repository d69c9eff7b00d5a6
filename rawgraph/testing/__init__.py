"""rawgraph's pytest plugin, for tests of your own graph code.

Installed with rawgraph, it does nothing until a project enables it, in one of three ways:
``pytest -p rawgraph.testing``; ``pytest_plugins = ["rawgraph.testing"]`` in the top
``conftest.py``; or ``rawgraph_testing = true`` in the pytest ini section
(``[tool.pytest.ini_options]`` of ``pyproject.toml``, or ``pytest.ini``). Then it gives:

- the ``gpu`` marker: a test marked ``@pytest.mark.gpu`` is skipped, with the reason the driver
  gave, where there is no CUDA driver or GPU;
- the fixtures ``device`` (device 0 as a :class:`rawgraph.Device`; skips without a GPU) and
  ``stream`` (a new :class:`rawgraph.Stream` on it, closed after the test);
- the fixture ``fake_driver``: the CPU fake of ``cuda.bindings.driver``
  (:class:`~rawgraph.testing.fakedriver.FakeDriver`) installed for the test, so graph code is
  captured, instantiated and re-bound on a machine with no GPU (kernels compile with NVRTC and
  load; they never run). ``device`` and ``stream`` asked for beside it are the fake's;
- ``--rawgraph-doctor`` (or ``rawgraph_doctor = true`` in the ini): :func:`rawgraph.doctor.check`
  over every graph a test instantiates, right before the instantiation; findings are listed at
  the end and fail the run. A test that builds faulty graphs on purpose is marked ``no_doctor``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .fakedriver import FakeDriver, fake_driver_session

try:
    # The entry point's module, installed beside rawgraph. A checkout used from its folder without
    # an install may lack it: the options are then not added, and read as their defaults.
    import _rawgraph_pytestplugin as _options
except ImportError:  # pragma: no cover - depends on how rawgraph was put on the path
    _options = None  # type: ignore[assignment]

GPU_MARKER = "gpu: needs a CUDA driver and a GPU (skipped with the driver's reason where there is none)"
NO_DOCTOR_MARKER = "no_doctor: builds faulty graphs on purpose: --rawgraph-doctor leaves its graphs alone"
_FINDINGS = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    if _options is not None:
        _options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", GPU_MARKER)
    config.addinivalue_line("markers", NO_DOCTOR_MARKER)
    config.stash[_FINDINGS] = []


def doctor_enabled(config: pytest.Config) -> bool:
    """Whether ``--rawgraph-doctor`` or the ini option ``rawgraph_doctor`` asks for the doctor.

    A project may also set ``config.option.rawgraph_doctor`` itself (in its conftest's
    ``pytest_configure``); without the options module neither option exists and this reads False.
    """
    if config.getoption("rawgraph_doctor", default=False):
        return True
    try:
        return bool(config.getini("rawgraph_doctor"))
    except ValueError:  # the ini option was never added
        return False


def no_gpu_reason() -> str | None:
    """None where the CUDA driver initialises, else why not, as a skip reason."""
    from rawgraph.runtime.device import driver_status

    ok, reason = driver_status()
    return None if ok else f"needs a GPU: no CUDA driver/GPU found here ({reason.split('(')[0].strip()})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = no_gpu_reason() if marked else None
    if reason is not None:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def fake_driver() -> Iterator[FakeDriver]:
    """The CPU fake driver, installed for this test (see :func:`fake_driver_session`)."""
    with fake_driver_session() as fake:
        yield fake


@pytest.fixture
def device(request: pytest.FixtureRequest) -> Any:
    """Device 0; the test is skipped where there is no GPU (the fake's device beside ``fake_driver``)."""
    if "fake_driver" in request.fixturenames:
        request.getfixturevalue("fake_driver")  # installed first, whatever the argument order
    reason = no_gpu_reason()
    if reason is not None:
        pytest.skip(reason)
    from rawgraph import get_device

    return get_device()


@pytest.fixture
def stream(device: Any) -> Iterator[Any]:
    """A new stream on ``device``, closed after the test."""
    from rawgraph import Stream

    s = Stream()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _rawgraph_doctor(request: pytest.FixtureRequest) -> Iterator[None]:
    # Patched by hand, not with monkeypatch: an autouse fixture asking for monkeypatch would set it
    # up before a test's fake-driver fixture, so its undo would run after the fake is uninstalled
    # and put the fake's entries back into cuda.bindings.driver for every later test.
    config = request.config
    if not doctor_enabled(config) or request.node.get_closest_marker("no_doctor") is not None:
        yield
        return
    from rawgraph.doctor import check
    from rawgraph.graphs.graph import Graph

    findings = config.stash[_FINDINGS]
    real = Graph.instantiate
    nodeid = request.node.nodeid

    def checked(self: Graph, *args: Any, **kwargs: Any) -> Any:
        # A fake-driver graph is left alone: its addresses are the fake's, and the doctor asks the
        # real driver (cuPointerGetAttributes) about memory, which knows none of them. A closed
        # graph is left to instantiate, which refuses it.
        if FakeDriver.installed is None and not self.closed:
            try:
                findings.extend(f"{nodeid}: {f}" for f in check(self).findings)
            except Exception as exc:  # the doctor failing on a graph is a finding about the doctor
                findings.append(f"{nodeid}: check raised {type(exc).__name__}: {exc}")
        return real(self, *args, **kwargs)

    Graph.instantiate = checked  # type: ignore[method-assign]
    try:
        yield
    finally:
        Graph.instantiate = real  # type: ignore[method-assign]


def doctor_findings(config: pytest.Config) -> list[str]:
    """The doctor's findings so far in this run, one ``"node id: finding"`` line each."""
    return config.stash.get(_FINDINGS, [])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if doctor_findings(session.config):  # listed by pytest_terminal_summary below
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not doctor_enabled(config):
        return
    findings = doctor_findings(config)
    terminalreporter.write_line(
        f"rawgraph doctor over every instantiated graph: {len(findings)} finding(s)", red=bool(findings), bold=True
    )
    for line in findings[:50]:
        terminalreporter.write_line("  " + line)


__all__ = [
    "FakeDriver",
    "device",
    "doctor_enabled",
    "doctor_findings",
    "fake_driver",
    "fake_driver_session",
    "no_gpu_reason",
    "stream",
]
