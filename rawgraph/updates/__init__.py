"""New data into an instantiated graph without capturing it again.

``shadow`` (the kernel-parameter rebinding, top to bottom: where a node's parameters live, which
argument words a bind changes, ``ExecShadow``'s push of changed nodes with rollback and the
keep-alive over the streams launched on; every update path below runs on it), ``manager``
(``ExecUpdateManager``: re-bind kernel-node arguments of rawgraph's own graphs, one class; the
checks it runs before anything changes are functions in ``validate``, those of a scalar or grid
edit in ``setters``), ``addresses`` (scanning parameters for
addresses in a range) and ``rebind`` (``AddressRebinder``: re-bind by address in any graph),
``adopt`` (PyTorch's and CuPy's graphs), ``indirect`` (``IndirectGraph``: kernels read their
pointers from a table in the graph), ``static`` (``StaticGraph``: copy into the captured input,
PyTorch's way).
"""

# Nothing is re-exported here: the public API is the submodules, imported by name.
__all__: list[str] = []
