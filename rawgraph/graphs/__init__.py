"""Graphs: made by stream capture or by hand, instantiated, read back, drawn.

``capture`` (``Capture``: graph + node map, fork/join), ``graph`` (``Graph``, ``GraphExec``),
``builder`` (``GraphBuilder``: every node type), ``nodes`` (read back every node of any graph),
``dot`` (DOT/PNG), ``keepalive`` (what queued replays read stays alive until they ran),
``conditional`` (IF, IF/ELSE, WHILE and SWITCH nodes whose condition a kernel sets).
"""

# Nothing is re-exported here: the public API is the submodules, imported by name.
__all__: list[str] = []
