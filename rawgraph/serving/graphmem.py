"""The driver's graph memory pool: what graphs with memory nodes hold, and giving it back.

Memory allocated inside a graph (``cuMemAllocAsync`` captured as an allocation node) comes from a
per-device pool. Its physical pages are mapped while a replay runs between the allocation and its
free node, and the driver reuses them across graphs launched into the same stream: bucket graphs
replayed one after another on one stream share the pages of the largest one.
"""

from __future__ import annotations

from cuda.bindings import driver

from ..runtime.device import Device, get_device
from ..runtime.errors import call

_ATTRS = {
    "used_current": "CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT",
    "used_high": "CU_GRAPH_MEM_ATTR_USED_MEM_HIGH",
    "reserved_current": "CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT",
    "reserved_high": "CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH",
}


def graph_memory(device: Device | None = None) -> dict[str, int]:
    """Bytes of graph memory used and reserved, now and at the high-water mark
    (``cuDeviceGetGraphMemAttribute``).

    See Also
    --------
    cuDeviceGetGraphMemAttribute : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    dev = (device or get_device()).activate()
    out = {}
    for key, name in _ATTRS.items():
        attr = getattr(driver.CUgraphMem_attribute, name)
        out[key] = int(call(driver.cuDeviceGetGraphMemAttribute, dev.handle, attr))
    return out


def reset_high_water(device: Device | None = None) -> None:
    """Reset the high-water marks to the current values (``cuDeviceSetGraphMemAttribute``).

    See Also
    --------
    cuDeviceSetGraphMemAttribute : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    dev = (device or get_device()).activate()
    for name in ("CU_GRAPH_MEM_ATTR_USED_MEM_HIGH", "CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH"):
        call(
            driver.cuDeviceSetGraphMemAttribute,
            dev.handle,
            getattr(driver.CUgraphMem_attribute, name),
            driver.cuuint64_t(0),
        )


def trim_graph_memory(device: Device | None = None) -> dict[str, int]:
    """Give the pool's unused physical memory back to the device (``cuDeviceGraphMemTrim``);
    returns :func:`graph_memory` afterwards.

    See Also
    --------
    cuDeviceGraphMemTrim : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    dev = (device or get_device()).activate()
    call(driver.cuDeviceGraphMemTrim, dev.handle)
    return graph_memory(dev)
