"""Models built with the library: users of it, never dependencies of it.

``tinyblock`` (``TinyBlock``: ``y = relu(x @ W1) @ W2 + x`` in three kernel forms, keeping the
row-wise model protocol of :mod:`rawgraph.serving.protocol`), ``branches`` (``TwoBranchBlock``:
two blocks captured on forked streams).
"""

# Nothing is re-exported here: the public API is the submodules, imported by name.
__all__: list[str] = []
