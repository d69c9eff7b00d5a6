"""The mutation of ``$RAWGRAPH_MUTATION``, applied in a child interpreter a mutated test starts.

``tests/mutation_plugin.py`` puts this folder first on the children's ``PYTHONPATH``, so Python
runs this file at start-up. Without ``RAWGRAPH_MUTATION`` it does nothing. With it, the mutation
is applied right after the child's first ``import rawgraph`` has run (an import hook: nothing of
rawgraph is imported here, and a child that never imports rawgraph is untouched), as the plugin
applies it in the test process. Then the ``sitecustomize`` this one shadows, if any, runs.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_CATALOGUE = _HERE.parent  # benchmarks/mutations
_PACKAGE = "rawgraph_mutations"  # as tests/mutation_plugin.py names it


def _apply() -> None:
    if _PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            _PACKAGE, _CATALOGUE / "__init__.py", submodule_search_locations=[str(_CATALOGUE)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[_PACKAGE] = module
        spec.loader.exec_module(module)
    catalogue = sys.modules[_PACKAGE]
    catalogue.apply(catalogue.by_name(os.environ["RAWGRAPH_MUTATION"]))


class _MutateAfterImport(importlib.abc.MetaPathFinder):
    """Finds ``rawgraph`` as the other finders do, then runs the mutation after its module body."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "rawgraph":
            return None
        sys.meta_path.remove(self)  # once; and find_spec below must not find this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _apply()

        spec.loader.exec_module = exec_module
        return spec


def _chain() -> None:
    """Run the ``sitecustomize`` this file shadows (a distribution's own), if there is one."""
    others = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


if os.environ.get("RAWGRAPH_MUTATION"):
    sys.meta_path.insert(0, _MutateAfterImport())
_chain()
