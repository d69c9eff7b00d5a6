"""Benchmarks, each a module with ``build_parser()`` and ``main(argv)`` (``rawgraph bench SUITE``,
or ``python -m rawgraph.bench.<module>``): launch paths and microcosts, kernel times against
cuBLAS, bucket strategies and the device-shaped graph, continuous batching with slots, the
strategy choice, the graph doctor's cost, control flow, device launch, fork/join, the multi-GPU
block; ``provenance``, ``report`` and ``progress`` serve them all. Results and notes: ``benchmarks/``."""

# Nothing is re-exported here: the public API is the submodules, imported by name.
__all__: list[str] = []
