"""The serving objects' shared set-up steps that need no GPU: the eager run before each capture
(:class:`rawgraph.serving.lifecycle.WarmUp`) runs only for launches that bring a new kernel function."""

from types import SimpleNamespace

import pytest

from rawgraph.serving.lifecycle import WarmUp


class _Stream:
    def __init__(self):
        self.syncs = 0

    def synchronize(self):
        self.syncs += 1


class _Launch:
    def __init__(self, handle, log):
        self.kernel = SimpleNamespace(handle=handle)
        self.log = log

    def __call__(self, stream):
        self.log.append(self.kernel.handle)


def test_a_run_whose_kernel_functions_all_ran_before_is_skipped():
    log: list = []
    setup = {"capture": 1.0}
    warm = WarmUp(setup)
    stream = _Stream()
    a, b, c = (_Launch(h, log) for h in (0x10, 0x20, 0x30))
    assert warm([a, b], stream) is True
    assert warm([b, a, b], stream) is False  # nothing new: no launch, no synchronize
    assert warm([a, c], stream) is True  # one new function: the whole run, in order
    assert warm([c], stream) is False
    assert log == [0x10, 0x20, 0x10, 0x30]
    assert stream.syncs == 2 and (warm.runs, warm.skipped) == (2, 2)
    assert setup["capture"] == 1.0 and setup["warmup"] >= 0.0


def test_two_warm_ups_do_not_share_what_they_have_seen():
    log: list = []
    stream = _Stream()
    launch = _Launch(0x10, log)
    first, second = WarmUp({}), WarmUp({})
    assert first([launch], stream) and second([launch], stream)
    assert log == [0x10, 0x10]


def test_a_failing_launch_marks_nothing_as_warmed():
    stream = _Stream()
    ok = _Launch(0x10, [])

    class _Boom(_Launch):
        def __call__(self, stream):
            raise RuntimeError("launch failed")

    warm = WarmUp({})
    with pytest.raises(RuntimeError):
        warm([ok, _Boom(0x20, [])], stream)
    assert warm([ok], stream) is True  # 0x10 was not recorded as warmed by the failed run
