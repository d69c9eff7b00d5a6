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

from .errors import (  # noqa: E402
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
from .device import Device, driver_status, get_device, gpu_available  # noqa: E402
from .memory import DeviceArray, DeviceBuffer, HostBuffer, as_device_array  # noqa: E402
from .stream import Event, Stream  # noqa: E402
from .compiler import KernelCache, compile_source, nvrtc_version  # noqa: E402
from .kernels import get_kernel, kernel_dir, kernel_files  # noqa: E402
from .launch import KernelArgs, Launch, LaunchPlan  # noqa: E402
from .model import BlockWeights, TinyBlock, Workspace, reference_forward  # noqa: E402
from .graph import ForeignNode, Graph, GraphExec  # noqa: E402
from .capture import Capture, CaptureMode, capture_branches, capture_plan  # noqa: E402
from .rawkernel import RawKernel  # noqa: E402
from .static import StaticGraph  # noqa: E402
from .manager import Binding, ExecUpdateManager  # noqa: E402
from .indirect import IndirectBinding, IndirectGraph  # noqa: E402
from .nodes import read_graph  # noqa: E402
from .builder import BuiltGraph, GraphBuilder, build_plan  # noqa: E402
from .rebind import AddressRebinder, LayoutMismatchError, RebindError  # noqa: E402
from .adopt import AdoptedGraph, adopt, from_cupy, from_torch  # noqa: E402
from .branches import TwoBranchBlock  # noqa: E402
from . import control  # noqa: E402
from . import serving  # noqa: E402
from .serving import BucketGraphs, ReshapedGraph, RowCountBuckets, SlotError, SlotPool  # noqa: E402

__all__ = [name for name in dir() if not name.startswith("_")]
