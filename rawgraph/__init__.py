"""rawgraph: a driver-level CUDA Graph reference library.

Your own kernel in one call: ``RawKernel(source, name)`` compiles it, calling it launches, and
inside a ``Capture`` the call records which array each argument holds, so ``ExecUpdateManager``
rebinds the graph by array (``rebind(old, new)``) with no plan written by hand.

The package, in the order to read it (each layer imports only the ones before it):

- ``runtime``: the driver objects: errors, owned resources, device, memory (arrays from
  anywhere, DLPack), streams and events, NVRTC and loaded modules, packed launches and launch
  plans, and ``RawKernel``.
- ``ops``: launch builders for rawgraph's own kernels (``kernels/*.cu``): the matmul family, the
  elementwise kernels, row gathers and scatters.
- ``graphs``: ``Capture`` (graph + node map), ``Graph``/``GraphExec``, the explicit
  ``GraphBuilder``, reading any graph back (``nodes``), DOT export, keep-alive of what queued
  replays read.
- ``updates``: new data into an exec without re-capture: ``ExecUpdateManager`` (re-bind kernel
  arguments), ``AddressRebinder`` and ``adopt`` (any graph, PyTorch's and CuPy's too),
  ``IndirectGraph`` (a pointer table in the graph), ``StaticGraph`` (copy in, PyTorch's way).
- ``serving`` and ``control``: many batch sizes over any row-wise model (buckets, re-shaped graphs,
  slots; the protocol in ``serving.protocol``), and work decided on the device (conditional nodes,
  device graph launch, graph-safe RNG, ``DepthLoop``/``NormGate``).
- ``models``: ``TinyBlock`` and the two-branch block: users of all of the above.
- ``bench`` and ``cli``: benchmarks and the ``rawgraph`` command.
"""

__version__ = "0.1.0"

# The subpackages (the imports below load them), named so they are bound for type checkers too.
from . import control, graphs, models, ops, runtime, serving, trace, updates
from .graphs.builder import BuiltGraph, GraphBuilder, build_plan
from .graphs.capture import Capture, CaptureMode, capture_branches, capture_plan
from .graphs.graph import ForeignNode, Graph, GraphExec
from .graphs.nodes import read_graph
from .models.branches import TwoBranchBlock
from .models.tinyblock import BlockWeights, TinyBlock, Workspace, reference_forward
from .runtime.compiler import CacheWarning, KernelCache, MissingHeadersError, compile_source, nvrtc_version
from .runtime.device import Device, driver_status, get_device, gpu_available
from .runtime.errors import (
    ArgumentError,
    ArrayError,
    CaptureError,
    CaptureRefusedError,
    ClosedError,
    CudaError,
    DeviceUpdatableError,
    DTypeError,
    ForeignNodeError,
    GraphUpdateError,
    LayoutError,
    NoDeviceError,
    NotOnDeviceError,
    NvrtcError,
    RawgraphError,
    ShapeError,
    SignatureError,
)
from .runtime.launch import KernelArgs, Launch, LaunchPlan
from .runtime.memory import DeviceArray, DeviceBuffer, HostBuffer, as_device_array
from .runtime.module import get_kernel, kernel_dir, kernel_files
from .runtime.rawkernel import CompileOnlyError, KernelParam, RawKernel, check_kernel
from .runtime.stream import Event, Stream

# From the defining modules: rawgraph.serving's own re-exports are implicit, which strict checkers don't follow.
from .serving.buckets import BucketGraphs
from .serving.choose import Choice, ChooseError, choose_strategy
from .serving.device_shaped import DeviceShapedError, DeviceShapedGraph
from .serving.function import FunctionModel, FunctionModelError
from .serving.reshape import ReshapedGraph, RowCountBuckets
from .serving.slots import PendingRow, SlotError, SlotPool
from .updates.adopt import AdoptedGraph, adopt, from_cupy, from_torch
from .updates.indirect import IndirectBinding, IndirectGraph
from .updates.manager import Binding, ExecUpdateManager
from .updates.rebind import AddressRebinder, LayoutMismatchError, RebindError
from .updates.static import StaticGraph

# The public API, spelled out so type checkers see it (tests/test_typing_cpu.py checks it against every
# public name the imports above bind).
__all__ = [
    "AddressRebinder",
    "AdoptedGraph",
    "ArgumentError",
    "ArrayError",
    "Binding",
    "BlockWeights",
    "BucketGraphs",
    "BuiltGraph",
    "CacheWarning",
    "Capture",
    "CaptureError",
    "CaptureMode",
    "CaptureRefusedError",
    "Choice",
    "ChooseError",
    "ClosedError",
    "CompileOnlyError",
    "CudaError",
    "DTypeError",
    "Device",
    "DeviceArray",
    "DeviceBuffer",
    "DeviceShapedError",
    "DeviceShapedGraph",
    "DeviceUpdatableError",
    "Event",
    "ExecUpdateManager",
    "ForeignNode",
    "ForeignNodeError",
    "FunctionModel",
    "FunctionModelError",
    "Graph",
    "GraphBuilder",
    "GraphExec",
    "GraphUpdateError",
    "HostBuffer",
    "IndirectBinding",
    "IndirectGraph",
    "KernelArgs",
    "KernelCache",
    "KernelParam",
    "Launch",
    "LaunchPlan",
    "LayoutError",
    "LayoutMismatchError",
    "MissingHeadersError",
    "NoDeviceError",
    "NotOnDeviceError",
    "NvrtcError",
    "PendingRow",
    "RawKernel",
    "RawgraphError",
    "RebindError",
    "ReshapedGraph",
    "RowCountBuckets",
    "ShapeError",
    "SignatureError",
    "SlotError",
    "SlotPool",
    "StaticGraph",
    "Stream",
    "TinyBlock",
    "TwoBranchBlock",
    "Workspace",
    "adopt",
    "as_device_array",
    "build_plan",
    "capture_branches",
    "capture_plan",
    "check_kernel",
    "choose_strategy",
    "compile_source",
    "control",
    "driver_status",
    "from_cupy",
    "from_torch",
    "get_device",
    "get_kernel",
    "gpu_available",
    "graphs",
    "kernel_dir",
    "kernel_files",
    "models",
    "nvrtc_version",
    "ops",
    "read_graph",
    "reference_forward",
    "runtime",
    "serving",
    "trace",
    "updates",
]
