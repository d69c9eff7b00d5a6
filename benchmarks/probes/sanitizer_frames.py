"""Does anything keep the frames of a driver call alive? (memcheck-only lifetime failures)

Under compute-sanitizer two lifetime tests saw objects kept by the frames of a launch
(``Launch.__call__`` at the ``cuLaunchKernel`` line, ``LauncherExec.launch``): something holds a
frame below them, and every frame up the call chain with its locals. This calls each driver path
from a function whose local is weakly watched, then reports whether the local survived, the
thread's exception state, and who holds it.

    PYTHONPATH=. python3 benchmarks/probes/sanitizer_frames.py
    PYTHONPATH=. compute-sanitizer --tool memcheck python3 benchmarks/probes/sanitizer_frames.py
"""

import gc
import sys
import weakref

sys.path.insert(0, "tests")
from helpers import describe_holders  # noqa: E402

from rawgraph import DeviceBuffer, Stream, capture_plan, get_device, ops  # noqa: E402
from rawgraph.bench import device_launch as bench  # noqa: E402


class Token:
    pass


def kernel_launch():
    tok = Token()
    s = Stream()
    ops.spin(get_device(), 0)(s)
    s.synchronize()
    s.close()
    return weakref.ref(tok)


def graph_launch():
    tok = Token()
    s = Stream()
    counter = DeviceBuffer((1,), "uint32")
    exe = capture_plan(bench.bump_chain(counter, 1), s).instantiate()
    exe.launch(s)
    s.synchronize()
    exe.close()
    s.close()
    return weakref.ref(tok)


for name, fn in (
    ("cuLaunchKernel", kernel_launch),
    ("cuLaunchKernel again", kernel_launch),
    ("cuGraphLaunch", graph_launch),
    ("cuGraphLaunch again", graph_launch),
):
    r = fn()
    gc.collect()
    alive = r() is not None
    print(f"{name}: local alive after return: {alive}; exc_info {sys.exc_info()[0]}", flush=True)
    if alive:
        print(describe_holders(r(), depth=10, width=3), flush=True)
