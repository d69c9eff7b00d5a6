"""The reference's docstrings link the CUDA documentation of the calls they name (CuPy's
``seealso`` habit): in ``runtime``, ``graphs``, ``updates`` and ``doctor``, every public class,
function and method whose docstring names a driver or NVRTC call in double backticks has a
numpy-style ``See Also`` section that lists that call with the page of the CUDA documentation
where it is defined (the driver API's group page, or NVRTC's guide). No GPU needed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "rawgraph"
LAYERS = ("runtime", "graphs", "updates", "doctor")
# ``cuGraphLaunch``, ``cuGraphExecKernelNodeSetParams(...)``, ``nvrtcCompileProgram``
NAMED = re.compile(r"``((?:cu[A-Z]|nvrtc[A-Z])[A-Za-z0-9_]*)(?:\([^`]*\))?``")
NOT_CALLS = {"cuBLAS", "cuRAND", "cuGraphExec", "cuGraphNode", "cuGraph"}
# "cuGraphLaunch, cuGraphUpload : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html"
# (numpy's See Also form: the calls of one page share its line)
SEE_ALSO_LINE = re.compile(
    r"^\s*((?:cu|nvrtc)[A-Za-z0-9_]+(?:, (?:cu|nvrtc)[A-Za-z0-9_]+)*) : (https://docs\.nvidia\.com/cuda/"
    r"(?:cuda-driver-api/group__CUDA__[A-Z_]+\.html|nvrtc/index\.html)(?:#\S*)?)$",
    re.M,
)


def _linked(doc: str) -> dict[str, str]:
    """Call -> documentation page, from the docstring's See Also section."""
    parts = doc.split("See Also\n--------\n", 1)
    if len(parts) < 2:
        return {}
    return {call: url for calls, url in SEE_ALSO_LINE.findall(parts[1]) for call in calls.split(", ")}


def _public_docstrings(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def walk(node, prefix, public):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                pub = public and (not child.name.startswith("_") or child.name == "__init__")
                doc = ast.get_docstring(child, clean=True)
                if pub and doc:
                    yield name, doc
                if isinstance(child, ast.ClassDef):
                    yield from walk(child, f"{name}.", pub)

    yield from walk(tree, "", True)


def _files():
    return [p for layer in LAYERS for p in sorted((PKG / layer).glob("*.py"))]


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(PKG)))
def test_every_driver_call_a_docstring_names_is_linked(path):
    missing = []
    for name, doc in _public_docstrings(path):
        named = {n for n in NAMED.findall(doc) if n not in NOT_CALLS}
        if not named:
            continue
        missing += [f"{name}: {call}" for call in sorted(named - set(_linked(doc)))]
    assert missing == [], f"{path.relative_to(PKG)}: {len(missing)} unlinked: {missing}"


def test_the_links_name_the_right_group():
    """A call's page is its group's: the checker would pass a wrong group, so spot-check the
    groups of the calls the package names most."""
    groups = {
        "cuGraphLaunch": "GRAPH",
        "cuGraphExecKernelNodeSetParams": "GRAPH",
        "cuGraphInstantiateWithFlags": "GRAPH",
        "cuStreamBeginCapture": "STREAM",
        "cuStreamEndCapture": "STREAM",
        "cuLaunchKernel": "EXEC",
        "cuLaunchKernelEx": "EXEC",
        "cuMemAlloc": "MEM",
        "cuMemcpyHtoDAsync": "MEM",
        "cuEventRecord": "EVENT",
        "cuModuleLoadData": "MODULE",
        "cuLibraryLoadData": "LIBRARY",
        "cuCtxSynchronize": "CTX",
    }
    wrong = []
    for path in _files():
        for name, doc in _public_docstrings(path):
            for call, url in _linked(doc).items():
                want = groups.get(call)
                if want and f"group__CUDA__{want}.html" not in url:
                    wrong.append(f"{path.relative_to(PKG)}:{name}: {call} -> {url}")
    assert wrong == [], wrong
