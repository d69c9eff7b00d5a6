import functools
import importlib.util
import os

import numpy as np
import pytest

# torch before CuPy: on the H200 image, importing torch 2.11 after CuPy 14.2 in one process fails
# inside torch's custom-op registration (see benchmarks/NOTES.md, "torch after CuPy"); imported
# first, both work side by side, so the interop tests run in this process.
if importlib.util.find_spec("torch") is not None:
    try:
        import torch  # noqa: F401
    except Exception:  # reported by the interop tests that need it
        pass

from singletons import corrupted_singletons

# rawgraph's own pytest plugin gives the gpu marker's skip, the device and stream fixtures, the
# fake_driver fixture and the doctor over every instantiated graph (switched on below).
pytest_plugins = ["rawgraph.testing"]
# A bite check (benchmarks/bite_check.py): the known bug $RAWGRAPH_MUTATION names is put back in
# this process before the test modules are imported (tests/mutation_plugin.py). Unset: no effect.
if os.environ.get("RAWGRAPH_MUTATION"):
    pytest_plugins.append("mutation_plugin")

SEED_ENV = "RAWGRAPH_TEST_SEED"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """Fail the whole run if anything during it overwrote one of CPython's shared one-byte bytes or
    one-character str objects (a C call writing into an immutable object; see tests/singletons.py):
    every later use of that value in the process is wrong, so no green run may hide it."""
    bad = corrupted_singletons()
    if bad:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "rawgraph: interpreter singletons changed during the run: " + "; ".join(bad[:8])
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(text, red=True, bold=True)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


class SeededGenerator(np.random.Generator):
    """A Generator that remembers its seed, so a failure message can name it."""


@pytest.fixture
def rng(request):
    """Fresh random inputs every run: a new OS-entropy seed each time (or ``$RAWGRAPH_TEST_SEED``
    to replay one). A failing test that used it reports the seed (see the report hook below)."""
    env = os.environ.get(SEED_ENV)
    seed = int(env) if env else np.random.SeedSequence().entropy
    gen = SeededGenerator(np.random.PCG64(seed))
    gen.seed_used = seed
    request.node._rawgraph_seed = seed
    return gen


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seed = getattr(item, "_rawgraph_seed", None)
    if report.failed and seed is not None:
        report.sections.append(("rng seed", f"rng seed: {seed} -- reproduce with {SEED_ENV}={seed}"))


@pytest.fixture
def count_setparams(monkeypatch):
    """Every ``cuGraphExecKernelNodeSetParams`` call made during the test (the node handles),
    the real call still made."""
    from cuda.bindings import driver

    calls = []
    real = driver.cuGraphExecKernelNodeSetParams

    @functools.wraps(real)
    def counting(*args):
        calls.append(args[1])
        return real(*args)

    monkeypatch.setattr(driver, "cuGraphExecKernelNodeSetParams", counting)
    return calls


# -- the graph doctor over every graph the suite instantiates ------------------------------------
# The plugin's doctor (rawgraph.testing): before each Graph.instantiate on the real driver,
# rawgraph.doctor.check reads the graph back and asks the driver about every address in it. A clean
# suite must give no finding (false alarms show up here), and any finding fails the run at its end,
# listed per test. Tests that build faulty graphs on purpose are left out by file;
# RAWGRAPH_DOCTOR_ALL=0 turns the whole check off.
DOCTOR_ENV = "RAWGRAPH_DOCTOR_ALL"
DOCTOR_EXEMPT = (
    "test_doctor_gpu.py",  # seeded faults
    "test_fault_injection_cpu.py",
    "test_fault_injection_gpu.py",
)  # failures injected into check too


def pytest_configure(config):
    if os.environ.get(DOCTOR_ENV, "1") == "1":
        config.option.rawgraph_doctor = True


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in DOCTOR_EXEMPT:
            item.add_marker(pytest.mark.no_doctor)


# The driver module as the session found it. Fake-driver tests replace its functions and put them
# back; a patch undone in the wrong order (monkeypatch's undo after a fake's uninstall restores the
# fake) would silently route every later test's driver calls to the fake. Checked after each
# file's teardown (module-scoped fake drivers stay installed between the tests of their file): a
# difference is restored and fails the file's last test.
from cuda.bindings import driver as _driver  # noqa: E402

_DRIVER_AS_FOUND = {name: getattr(_driver, name) for name in dir(_driver) if name.startswith("cu")}


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is not None and nextitem.fspath == item.fspath:
        return
    changed = [name for name, fn in _DRIVER_AS_FOUND.items() if getattr(_driver, name, None) is not fn]
    for name in changed:
        setattr(_driver, name, _DRIVER_AS_FOUND[name])
    if changed:
        raise AssertionError(
            f"{item.fspath.basename} left cuda.bindings.driver patched after its teardown "
            f"({', '.join(changed[:6])}); restored for the tests after it"
        )
