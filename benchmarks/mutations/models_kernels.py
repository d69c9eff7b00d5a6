"""Models and kernels: the TinyBlock's plan and the kernels the soak's verdict runs on."""

from __future__ import annotations

import types
from typing import Any

from ._base import Mutation, edit_kernel

INTEROP = "tests/test_interop_gpu.py"


def _ops_without_relu_epilogue(original: types.ModuleType) -> types.ModuleType:
    """``rawgraph.ops`` as ``tinyblock.py`` sees it, except that a matmul asked for the ``relu``
    epilogue gets ``none``: the fused form's first matmul loses its relu (eager and replays agree,
    float64 does not). Only tinyblock's name ``ops`` is rebound; other users of ``rawgraph.ops``
    are untouched."""
    real = original.matmul
    copy = types.ModuleType(original.__name__, original.__doc__)
    copy.__dict__.update(vars(original))

    def matmul(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 5 and args[5] == "relu":  # matmul(device, buffers, x, w, out, epilogue, ...)
            args = (*args[:5], "none", *args[6:])
        if kwargs.get("epilogue") == "relu":
            kwargs["epilogue"] = "none"
        return real(*args, **kwargs)

    copy.matmul = matmul  # type: ignore[attr-defined]
    return copy


MUTATIONS = [
    Mutation(
        name="s5-count-mismatch-counts-every-element",
        why="the count_mismatch kernel (the soak's verdict) counts every element, equal or not",
        tests=(
            f"{INTEROP}::test_the_mismatch_counter_the_soak_relies_on_counts_exactly",
            f"{INTEROP}::test_soak_replays_are_checked_against_float64",
        ),
        target="rawgraph.runtime.module:kernel_source",
        mutate=edit_kernel("elementwise", "bad += a[i] != b[i];", "bad += 1;"),
        kind="kernel-text",
    ),
    Mutation(
        name="s5-fused-form-drops-its-relu",
        why="the fused TinyBlock's first matmul loses its relu epilogue: eager and replays agree, float64 does not",
        tests=(f"{INTEROP}::test_soak_replays_are_checked_against_float64",),
        target="rawgraph.models.tinyblock:ops",
        mutate=_ops_without_relu_epilogue,
        kind="wrap",
        everywhere=False,
    ),
]
