import re

import pytest

from rawgraph import DeviceBuffer, TinyBlock, capture_plan
from rawgraph.graphs.dot import export, to_dot

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("form", ["unfused", "fused"])
def test_dot_has_one_kernel_node_per_launch(stream, tmp_path, form):
    model = TinyBlock(64, 2, 3, form=form)
    x, out = DeviceBuffer((2, 64)), DeviceBuffer((2, 64))
    x.poison(stream)
    plan = model.plan(x, out)
    graph = capture_plan(plan, stream)
    text = to_dot(graph)
    assert len(re.findall(r'kind="kernel"', text)) == len(plan)
    assert len(re.findall(r"->\s*n[0-9a-f]+( \[style=dashed, label=\"PDL\"\])?;", text)) == len(plan) - 1
    assert text.count("PDL") == (len(plan) - 1 if model.pdl else 0)
    assert "x -> x" in text and "y -> out" in text and "matvec_kernel<" in text
    paths = export(graph, tmp_path / "g")
    assert paths["dot"].read_text() == to_dot(graph, "g")
    raw = paths["driver_dot"].read_text()
    assert raw.startswith("digraph")
