"""The driver objects everything else stands on (the lowest layer: imports nothing of rawgraph's).

``errors`` (typed errors naming the CUDA call), ``resource`` (one owner per driver handle,
deferred releases), ``device``, ``memory`` (``DeviceBuffer``, ``HostBuffer``, arrays from CuPy,
torch, DLPack), ``stream`` (streams, events, the capture query), ``compiler`` (NVRTC, the kernel
cache), ``cubin`` (what a CUBIN records of its kernels, read without a driver), ``module`` (loaded CUBINs
and their kernels), ``signature`` (C types from a ``__global__``
declaration), ``launch`` (packed arguments, ``Launch``, ``LaunchPlan``), ``rawkernel`` (a user's
kernel from source in one call), ``timing``.
"""

# Nothing is re-exported here: the public API is the submodules, imported by name.
__all__: list[str] = []
