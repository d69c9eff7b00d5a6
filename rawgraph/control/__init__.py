"""Control flow on the device: work the GPU decides or advances itself, without the host.

- :mod:`rawgraph.control.device_launch`: graphs instantiated for device launch
  (:class:`DeviceGraph`) and host graphs whose kernel launches them with the device runtime's
  ``cudaGraphLaunch`` (:func:`launcher_graph`: tail, fire-and-forget, sibling), which hold the
  target's exec while anything can still launch it (:class:`LauncherGraph`, :class:`LauncherExec`).
- :func:`add_conditional`, :func:`capture_conditional`, :func:`make_handle`: re-exported from
  :mod:`rawgraph.graphs.conditional` (IF, IF/ELSE, WHILE and SWITCH nodes, added by the builder
  or during capture, whose condition a kernel sets with ``cudaGraphSetConditional``).
- :mod:`rawgraph.control.loops`: worked examples over any row-wise model: :class:`DepthLoop`
  (depth decided per replay) and :class:`NormGate` (early exit).
- :mod:`rawgraph.control.rng`: a Philox4x32-10 generator whose seed and offset live in device
  memory and are advanced by the graph itself (:class:`PhiloxGenerator`, :func:`noisy_plan`), so
  every replay draws fresh numbers.

Sits beside ``serving`` in the import order (runtime -> ops -> graphs -> updates -> serving,
control -> models -> bench); nothing below imports it, and it imports no model.
"""

from ..graphs.conditional import add_conditional, capture_conditional, make_handle
from .device_launch import (
    FIRE_AND_FORGET,
    MODES,
    SIBLING,
    TAIL,
    DeviceGraph,
    DeviceLaunchError,
    LauncherExec,
    LauncherGraph,
    device_launch_problems,
    launcher_graph,
)
from .loops import DepthLoop, NormGate
from .rng import (
    PhiloxGenerator,
    blocks_for,
    dropout_constants,
    noisy_plan,
    philox4x32_10,
    reference_keep,
    reference_noisy_forward,
    reference_numbers,
    uniform24,
)

__all__ = [
    "DepthLoop",
    "NormGate",
    "add_conditional",
    "capture_conditional",
    "make_handle",
    "FIRE_AND_FORGET",
    "MODES",
    "SIBLING",
    "TAIL",
    "DeviceGraph",
    "DeviceLaunchError",
    "LauncherExec",
    "LauncherGraph",
    "PhiloxGenerator",
    "blocks_for",
    "device_launch_problems",
    "dropout_constants",
    "launcher_graph",
    "noisy_plan",
    "philox4x32_10",
    "reference_keep",
    "reference_noisy_forward",
    "reference_numbers",
    "uniform24",
]
