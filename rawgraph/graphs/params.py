"""The driver's node-parameter structs, every field set: what :class:`~rawgraph.graphs.builder.GraphBuilder`
hands ``cuGraphAdd*Node`` (memcpy, memset, host, memory allocation, kernel nodes), the edge data of
``cuGraphAddNode`` and the address a memory-allocation node hands out.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver

from ..runtime.errors import RawgraphError, call
from ..runtime.launch import Launch

DEP_DEFAULT: Any = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_DEFAULT
DEP_PROGRAMMATIC: Any = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
# Stream capture turns a launch with PROGRAMMATIC_STREAM_SERIALIZATION into an edge of type
# PROGRAMMATIC leaving the producer's programmatic port (the port that fires when every CTA has
# called griddepcontrol.launch_dependents or exited): the CUDA programming guide's PDL-in-graphs
# table. tests/test_builder_gpu.py compares these fields with a captured graph's edges.
PORT_DEFAULT = int(driver.CU_GRAPH_KERNEL_NODE_PORT_DEFAULT)
PORT_PROGRAMMATIC = int(driver.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC)
PORT_LAUNCH_ORDER = int(driver.CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER)
EDGE_KINDS = ("default", "programmatic")

# -- driver structs: every field set ------------------------------------------------------------
# cuda-bindings allocates a struct zeroed (its reserved bytes too); these helpers still set every
# field the binding exposes, so no field reaches the driver with a value nobody chose.
_MT = driver.CUmemorytype


def memcpy_params(dst: int, dst_is_host: bool, src: int, src_is_host: bool, nbytes: int) -> Any:
    """A ``CUDA_MEMCPY3D`` for a 1D copy of ``nbytes`` (for ``cuGraphAddMemcpyNode``).

    Every field is set: the unused pointer of each side (host or device), the array, the offsets
    (``XInBytes``, ``Y``, ``Z``, ``LOD``) zero; pitch ``nbytes`` and heights 1.

    See Also
    --------
    cuGraphAddMemcpyNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    p = driver.CUDA_MEMCPY3D()
    for side, ptr, host in (("src", src, src_is_host), ("dst", dst, dst_is_host)):
        setattr(p, f"{side}XInBytes", 0)
        setattr(p, f"{side}Y", 0)
        setattr(p, f"{side}Z", 0)
        setattr(p, f"{side}LOD", 0)
        setattr(p, f"{side}MemoryType", _MT.CU_MEMORYTYPE_HOST if host else _MT.CU_MEMORYTYPE_DEVICE)
        setattr(p, f"{side}Host", int(ptr) if host else 0)
        setattr(p, f"{side}Device", 0 if host else int(ptr))
        setattr(p, f"{side}Array", 0)
        setattr(p, f"{side}Pitch", int(nbytes))
        setattr(p, f"{side}Height", 1)
    p.WidthInBytes, p.Height, p.Depth = int(nbytes), 1, 1
    return p


def memset_params(dst: int, value: int, element_size: int, count: int) -> Any:
    """A ``CUDA_MEMSET_NODE_PARAMS`` filling ``count`` elements in one row (``cuGraphAddMemsetNode``).

    See Also
    --------
    cuGraphAddMemsetNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    p = driver.CUDA_MEMSET_NODE_PARAMS()
    p.dst = int(dst)
    p.value = int(value)
    p.elementSize = int(element_size)
    p.width = int(count)
    p.height = 1
    p.pitch = int(count) * int(element_size)  # one row: the driver ignores it, set anyway
    return p


def host_params(address: int) -> Any:
    """A ``CUDA_HOST_NODE_PARAMS`` calling the function at ``address`` with null user data."""
    p = driver.CUDA_HOST_NODE_PARAMS()
    p.fn = driver.CUhostFn(int(address))
    p.userData = 0
    return p


def mem_alloc_params(nbytes: int, ordinal: int) -> Any:
    """A ``CUDA_MEM_ALLOC_NODE_PARAMS`` for ``nbytes`` of pinned memory on device ``ordinal``
    (``cuGraphAddMemAllocNode``).

    Every pool property is set (handle types none: graph memory cannot be exported; no Win32
    attributes, default maximum size, no usage flags, no RDMA hint); no access descriptors (the
    allocating device has access); ``dptr`` zero until the driver writes the address. The
    location's ``localized`` member shares a union with ``id`` and is therefore not written.

    See Also
    --------
    cuGraphAddMemAllocNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    p = driver.CUDA_MEM_ALLOC_NODE_PARAMS()
    pp = p.poolProps
    pp.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    pp.handleTypes = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
    pp.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    pp.location.id = int(ordinal)
    pp.win32SecurityAttributes = 0
    # Fields newer bindings expose (cuda-bindings 13.3.1 has neither); the struct comes zeroed.
    for name in ("maxSize", "usage", "gpuDirectRDMACapable"):
        if hasattr(pp, name):
            setattr(pp, name, 0)
    p.accessDescs = []
    p.accessDescCount = 0
    p.bytesize = int(nbytes)
    p.dptr = 0
    return p


def kernel_params(launch: Launch) -> Any:
    """``launch.node_params()`` with the fields it leaves to their zero default set explicitly:
    no ``extra`` (arguments go through ``kernelParams``), no ``CUkernel`` (``func`` names the
    function), ``ctx`` null (the current context, which the builder made current)."""
    p = launch.node_params()
    p.extra = 0
    p.kern = 0
    p.ctx = 0
    return p


def edge_data(kind: str) -> Any:
    """A ``CUgraphEdgeData``: ``default`` (from the default port) or ``programmatic`` (from the
    programmatic port: a PDL edge), ``to_port`` 0."""
    if kind not in EDGE_KINDS:
        raise ValueError(f"edge kind must be one of {EDGE_KINDS}, got {kind!r}")
    d = driver.CUgraphEdgeData()
    if kind == "programmatic":
        d.type, d.from_port = DEP_PROGRAMMATIC, PORT_PROGRAMMATIC
    else:
        d.type, d.from_port = DEP_DEFAULT, PORT_DEFAULT
    d.to_port = 0
    return d


def allocation_address(node: Any) -> int:
    """The address a memory allocation node hands out (``cuGraphMemAllocNodeGetParams``).

    The returned struct is held while ``dptr`` is read: cuda-bindings' ``dptr`` is a view into the
    struct's memory that does not keep the struct alive, so ``int(call(...).dptr)`` reads freed
    memory. With the default allocator that memory happens to still hold the address; under
    ``PYTHONMALLOC=debug`` it reads 0xDDDDDDDDDDDDDDDD, which the next ``cuGraphAddMemcpyNode`` or
    ``cuGraphAddMemFreeNode`` refused with ``CUDA_ERROR_INVALID_VALUE``.

    See Also
    --------
    cuGraphMemAllocNodeGetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuGraphAddMemcpyNode, cuGraphAddMemFreeNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    params = call(driver.cuGraphMemAllocNodeGetParams, node)
    ptr = int(params.dptr)
    del params  # only now may the struct go
    if ptr == 0:
        raise RawgraphError("cuGraphMemAllocNodeGetParams returned a null address")
    return ptr
