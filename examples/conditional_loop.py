"""A WHILE decided on the device: one exec runs a block at any depth (issue 22, item 1).

``DepthLoop`` builds ``memcpy x -> cur; WHILE counter < depth { one layer; advance }; memcpy
cur -> out`` once. The depth is a word in device memory, read by the graph at every replay: a
new depth needs no re-instantiation, no parameter update, no new graph.
"""

import sys

import numpy as np

import rawgraph as rg


def main() -> int:
    if not rg.gpu_available():
        print(f"conditional_loop.py needs a GPU: {rg.driver_status()[1]}", file=sys.stderr)
        return 2
    width, batch, layers = 256, 4, 6
    rng = np.random.default_rng()
    xh = rng.standard_normal((batch, width), dtype=np.float32)
    with rg.Stream() as s:
        model = rg.TinyBlock(width, batch, layers, seed=int(rng.integers(1 << 30)), form="fused")
        x, out = rg.DeviceBuffer.from_numpy(xh, stream=s), rg.DeviceBuffer((batch, width))
        loop = rg.control.DepthLoop(model, x, out, stream=s)  # max_depth = model.layers
        weights = model.weights_numpy(s)
        depths = [int(d) for d in rng.permutation(layers + 1)]
        for d in depths:
            loop.set_depth(d, s)  # the only thing that changes
            out.poison(s)
            loop.launch(s)
            got, want = out.to_numpy(s), rg.reference_forward(xh, weights[:d])
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            assert err < 1e-5, f"depth {d}: relative error {err:.2e}"
        loop.close()
        model.close()
    print(f"one WHILE exec ran depths {depths} as the device read them, each matching float64")
    return 0


if __name__ == "__main__":
    sys.exit(main())
