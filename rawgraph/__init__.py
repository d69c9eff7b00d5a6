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

# The subpackages the imports above load, named here so they are bound for type checkers too.
from . import (  # noqa: E402
    control,  # noqa: E402
    graphs,
    models,
    ops,
    runtime,
    serving,  # noqa: E402
    updates,
)
from .graphs.builder import BuiltGraph, GraphBuilder, build_plan  # noqa: E402
from .graphs.capture import Capture, CaptureMode, capture_branches, capture_plan  # noqa: E402
from .graphs.graph import ForeignNode, Graph, GraphExec  # noqa: E402
from .graphs.nodes import read_graph  # noqa: E402
from .models.branches import TwoBranchBlock  # noqa: E402
from .models.tinyblock import BlockWeights, TinyBlock, Workspace, reference_forward  # noqa: E402
from .runtime.compiler import CacheWarning, KernelCache, MissingHeadersError, compile_source, nvrtc_version  # noqa: E402
from .runtime.device import Device, driver_status, get_device, gpu_available  # noqa: E402
from .runtime.errors import (  # noqa: E402
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
from .runtime.launch import KernelArgs, Launch, LaunchPlan  # noqa: E402
from .runtime.memory import DeviceArray, DeviceBuffer, HostBuffer, as_device_array  # noqa: E402
from .runtime.module import get_kernel, kernel_dir, kernel_files  # noqa: E402
from .runtime.rawkernel import CompileOnlyError, KernelParam, RawKernel, check_kernel  # noqa: E402
from .runtime.stream import Event, Stream  # noqa: E402

# From the defining modules: rawgraph.serving's own re-exports are implicit, which strict checkers don't follow.
from .serving.buckets import BucketGraphs  # noqa: E402
from .serving.choose import Choice, ChooseError, choose_strategy  # noqa: E402
from .serving.device_shaped import DeviceShapedError, DeviceShapedGraph  # noqa: E402
from .serving.function import FunctionModel, FunctionModelError  # noqa: E402
from .serving.reshape import ReshapedGraph, RowCountBuckets  # noqa: E402
from .serving.slots import PendingRow, SlotError, SlotPool  # noqa: E402
from .updates.adopt import AdoptedGraph, adopt, from_cupy, from_torch  # noqa: E402
from .updates.indirect import IndirectBinding, IndirectGraph  # noqa: E402
from .updates.manager import Binding, ExecUpdateManager  # noqa: E402
from .updates.rebind import AddressRebinder, LayoutMismatchError, RebindError  # noqa: E402
from .updates.static import StaticGraph  # noqa: E402

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
    "updates",
]
