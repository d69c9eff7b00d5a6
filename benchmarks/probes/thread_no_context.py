"""Which driver calls work from a thread that never made a context current?

Each operation runs in a fresh child interpreter: set-up on the main thread, then the operation on
a new thread with no current context (what a user's worker thread has). Prints one line per
operation: ok / CudaError text / the child's signal.  (Driver 580, H200: see docs/semantics.md.)
"""

import subprocess
import sys

CHILD = r"""
import sys, threading
import numpy as np
from cuda.bindings import driver
from rawgraph import TinyBlock, DeviceBuffer, capture_plan, ExecUpdateManager, Stream, Event
from rawgraph.runtime.errors import call
s = Stream()
m = TinyBlock(128, 2, 1, seed=1, form="fused")
xs = [DeviceBuffer.from_numpy(np.random.rand(2, 128).astype(np.float32), stream=s) for _ in range(2)]
out = DeviceBuffer((2, 128))
g = capture_plan(m.plan(xs[0], out), s); e = g.instantiate(); mgr = ExecUpdateManager(g, e)
node = g.nodes[0]
ev = Event()
ops = {
    "raw cuGraphExecKernelNodeSetParams": lambda: print(driver.cuGraphExecKernelNodeSetParams(e.handle, node.handle, node.launch.node_params())),
    "raw cuGraphLaunch": lambda: print(driver.cuGraphLaunch(e.handle, s.handle), driver.cuStreamSynchronize(s.handle)),
    "raw cuMemcpyHtoDAsync": lambda: print(driver.cuMemcpyHtoDAsync(xs[1].ptr, np.zeros(256, np.float32).ctypes.data, 1024, s.handle)),
    "raw cuEventRecord": lambda: print(driver.cuEventRecord(ev.handle, s.handle)),
    "raw cuStreamSynchronize": lambda: print(driver.cuStreamSynchronize(s.handle)),
    "raw cuMemAlloc": lambda: print(driver.cuMemAlloc(1024)),
    "manager.bind": lambda: print(mgr.bind("x", xs[1])),
    "exec.launch": lambda: (e.launch(s), s.synchronize(), print("launched")),
}
op = ops[sys.argv[1]]
err = []
def run():
    try:
        op()
    except Exception as exc:
        err.append(exc)
t = threading.Thread(target=run); t.start(); t.join()
print("RESULT", repr(err[0]) if err else "ok")
"""

NAMES = [
    "raw cuGraphExecKernelNodeSetParams",
    "raw cuGraphLaunch",
    "raw cuMemcpyHtoDAsync",
    "raw cuEventRecord",
    "raw cuStreamSynchronize",
    "raw cuMemAlloc",
    "manager.bind",
    "exec.launch",
]

for name in NAMES:
    p = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    res = next((ln for ln in lines if ln.startswith("RESULT")), None)
    print(
        f"{name:40s} rc={p.returncode:4d} {lines[-2] if len(lines) > 1 else ''} {res or p.stderr.strip().splitlines()[-1:]}"
    )
