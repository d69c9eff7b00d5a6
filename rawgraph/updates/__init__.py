"""New data into an instantiated graph without capturing it again.

``manager`` (``ExecUpdateManager``: re-bind kernel-node arguments of rawgraph's own graphs),
``rebind`` (``AddressRebinder``: re-bind by address in any graph), ``adopt`` (PyTorch's and
CuPy's graphs), ``indirect`` (``IndirectGraph``: kernels read their pointers from a table in the
graph), ``static`` (``StaticGraph``: copy into the captured input, PyTorch's way).
"""
