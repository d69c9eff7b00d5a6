"""The seed note's static-address experiment, reproduced at driver level.

Prints the device, the static input/output pointers (unchanged across replays), the largest
difference between eager and graph results (0.0: the same kernels, the same order), the eager,
copy+replay and exec-update+replay medians, and the error type a different-shape copy raises.
"""

from __future__ import annotations

import platform

import numpy as np

from .. import __version__
from ..graphs.capture import capture_plan
from ..graphs.graph import read_node_args
from ..models.tinyblock import TinyBlock
from ..runtime.device import get_device
from ..runtime.errors import ArrayError
from ..runtime.memory import DeviceBuffer
from ..runtime.stream import Stream
from ..runtime.timing import stats, synced_us
from ..updates.manager import ExecUpdateManager
from ..updates.static import StaticGraph


def run(
    width: int = 128, batch: int = 1, layers: int = 1, form: str = "unfused", rounds: int = 200, seed: int = 83
) -> dict:
    dev = get_device()
    rng = np.random.default_rng(seed)
    stream = Stream()
    model = TinyBlock(width, batch, layers, seed=seed, form=form)
    shape = (batch, width)
    update = DeviceBuffer.from_numpy(rng.standard_normal(shape, dtype=np.float32))
    update2 = DeviceBuffer.from_numpy(rng.standard_normal(shape, dtype=np.float32))
    eager_out = DeviceBuffer(shape)

    static = StaticGraph(model, stream)
    in_ptr, out_ptr = static.static_input.ptr, static.static_output.ptr

    # Same input through eager and through copy + replay.
    eager_plan = model.plan(update, eager_out)
    eager_plan.run(stream)
    static(update, stream)
    stream.synchronize()
    eager = eager_out.to_numpy()
    graph_out = static.static_output.to_numpy()
    max_diff = float(np.max(np.abs(eager - graph_out)))
    ref = model.reference(update.to_numpy())
    rel_err = float(np.linalg.norm(graph_out - ref) / np.linalg.norm(ref))

    # Exec-update path: its own exec, input re-bound between two buffers, no copy.
    upd_out = DeviceBuffer(shape)
    graph = capture_plan(model.plan(update, upd_out), stream)
    exe = graph.instantiate()
    manager = ExecUpdateManager(graph, exe)
    inputs = [update, update2]
    state = {"i": 0}

    def eager_step() -> None:
        eager_plan.run(stream)

    def copy_step() -> None:
        static(update, stream)

    def update_step() -> None:
        state["i"] ^= 1
        manager.bind("x", inputs[state["i"]])
        manager.launch(stream)

    eager_us = stats(synced_us(eager_step, stream, rounds))
    copy_us = stats(synced_us(copy_step, stream, rounds))
    update_us = stats(synced_us(update_step, stream, rounds))

    # The exec's first node still reads the same static input after all those replays.
    node0 = static.graph.nodes[0]
    assert read_node_args(node0.handle, node0.launch)["x"] == in_ptr
    assert static.static_input.ptr == in_ptr and static.static_output.ptr == out_ptr

    try:
        static.copy_in(DeviceBuffer((batch + 1, width)), stream)
        rejected = "nothing (accepted!)"
    except ArrayError as exc:
        rejected = type(exc).__name__

    result = {
        "python": platform.python_version(),
        "rawgraph": __version__,
        "device": dev.info.name,
        "shape": shape,
        "layers": layers,
        "form": form,
        "input_ptr_static": in_ptr,
        "output_ptr_static": out_ptr,
        "max_abs_diff": max_diff,
        "rel_err_vs_float64": rel_err,
        "eager_median_us": eager_us["median"],
        "copy_plus_graph_replay_median_us": copy_us["median"],
        "exec_update_plus_graph_replay_median_us": update_us["median"],
        "driver_update_calls": manager.update_calls,
        "dynamic_shape_rejected": rejected,
        "spread_us": {"eager": eager_us, "copy_replay": copy_us, "update_replay": update_us},
    }
    manager.close()
    for obj in (exe, graph, static, model, update, update2, eager_out, upd_out, stream):
        obj.close()
    return result


def main(argv: list[str] | None = None) -> int:
    r = run()
    print(f"python={r['python']} rawgraph={r['rawgraph']}")
    print(f"device={r['device']} dtype=float32 shape={r['shape']} layers={r['layers']} form={r['form']}")
    print(f"input_ptr_static={r['input_ptr_static']} output_ptr_static={r['output_ptr_static']}")
    print(f"max_abs_diff={r['max_abs_diff']:.3e} (rel err vs float64 {r['rel_err_vs_float64']:.2e})")
    print(f"eager_median_us={r['eager_median_us']:.3f}")
    print(f"copy_plus_graph_replay_median_us={r['copy_plus_graph_replay_median_us']:.3f}")
    print(f"exec_update_plus_graph_replay_median_us={r['exec_update_plus_graph_replay_median_us']:.3f}")
    print(f"dynamic_shape_rejected={r['dynamic_shape_rejected']}")
    return 0
