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


# -- Held: what a serving object must release, with its one finalizer ------------------------------
class _Closable:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def close(self):
        self.log.append(self.name)


def test_held_closes_each_object_once_newest_first_and_refuses_more_once_closed():
    from rawgraph.runtime.errors import ClosedError
    from rawgraph.serving.lifecycle import Held

    log: list = []
    held = Held("test.close", newest_first=True)
    for name in ("stream", "input", "graph", "exec"):
        assert held.add(_Closable(name, log)).name == name
    held.add(None)  # held as nothing
    assert not held.closed
    held.close()
    held.close()  # twice is safe: one release
    assert log == ["exec", "graph", "input", "stream"] and held.closed
    with pytest.raises(ClosedError):
        held.add(_Closable("late", log))
    assert log == ["exec", "graph", "input", "stream"]


def test_held_groups_close_in_the_order_given_and_read_lists_filled_later():
    from rawgraph.serving.lifecycle import Held

    log: list = []
    later: list = []  # a list its owner fills after the holder exists (a pool's pinned rows)
    held = Held("test.close", [[], later, []])
    held.add(_Closable("b1", log), 2)
    held.add(_Closable("a1", log), 0)
    held.add(_Closable("a2", log), 0)
    later.extend([None, _Closable("late", log)])
    held.close()
    assert log == ["a1", "a2", "late", "b1"]


def test_dropping_the_holder_releases_what_it_held():
    import gc

    from rawgraph.serving.lifecycle import Held

    log: list = []
    held = Held("test.close")
    held.add(_Closable("buffer", log))
    del held
    gc.collect()
    assert log == ["buffer"]
