"""rawgraph: a driver-level CUDA Graph reference library.

Your own kernel in one call: ``RawKernel(source, name)`` compiles it, calling it launches, and
inside a ``Capture`` the call records which array each argument holds, so ``ExecUpdateManager``
rebinds the graph by array (``rebind(old, new)``) with no plan written by hand.

The path from array to replay, in the order to read it:
``memory`` (arrays) -> ``launch`` (packed arguments) -> ``model`` (a launch plan) ->
``capture`` (graph + node map) -> ``graph`` (exec) -> ``static`` (copy in + replay) or
``manager`` (re-bind node arguments + replay) -> ``serving`` (bucket graphs, re-shaped graphs,
slots). Graphs from anywhere: ``nodes`` (read any graph back), ``builder`` (explicit
construction), ``rebind`` and ``adopt`` (re-bind by address; PyTorch's and CuPy's graphs);
``control`` (conditional nodes, device graph launch, graph-safe RNG).
"""

__version__ = "0.1.0"

from .runtime.errors import (  # noqa: E402
    ArgumentError,
    ArrayError,
    CaptureError,
    CaptureRefusedError,
    ClosedError,
    CudaError,
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
from .runtime.device import Device, driver_status, get_device, gpu_available  # noqa: E402
from .runtime.memory import DeviceArray, DeviceBuffer, HostBuffer, as_device_array  # noqa: E402
from .runtime.stream import Event, Stream  # noqa: E402
from .runtime.compiler import KernelCache, compile_source, nvrtc_version  # noqa: E402
from .runtime.module import get_kernel, kernel_dir, kernel_files  # noqa: E402
from .runtime.launch import KernelArgs, Launch, LaunchPlan  # noqa: E402
from .models.tinyblock import BlockWeights, TinyBlock, Workspace, reference_forward  # noqa: E402
from .graphs.graph import ForeignNode, Graph, GraphExec  # noqa: E402
from .graphs.capture import Capture, CaptureMode, capture_branches, capture_plan  # noqa: E402
from .runtime.rawkernel import RawKernel  # noqa: E402
from .updates.static import StaticGraph  # noqa: E402
from .updates.manager import Binding, ExecUpdateManager  # noqa: E402
from .updates.indirect import IndirectBinding, IndirectGraph  # noqa: E402
from .graphs.nodes import read_graph  # noqa: E402
from .graphs.builder import BuiltGraph, GraphBuilder, build_plan  # noqa: E402
from .updates.rebind import AddressRebinder, LayoutMismatchError, RebindError  # noqa: E402
from .updates.adopt import AdoptedGraph, adopt, from_cupy, from_torch  # noqa: E402
from .models.branches import TwoBranchBlock  # noqa: E402
from . import control  # noqa: E402
from . import serving  # noqa: E402
from .serving import BucketGraphs, ReshapedGraph, RowCountBuckets, SlotError, SlotPool  # noqa: E402

__all__ = [name for name in dir() if not name.startswith("_")]
