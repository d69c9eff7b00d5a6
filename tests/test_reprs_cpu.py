"""Notebook reprs (issue 45, section 5), no GPU: ``Graph._repr_svg_`` renders the DOT export with
Graphviz's ``dot`` (None where it is missing, for a closed graph, or when anything fails: a repr
never raises), captured on the CPU fake driver; ``Report._repr_html_`` is the summary line and a
table of the findings, every text escaped."""

import shutil
from html.parser import HTMLParser

import pytest

import rawgraph as rg
from rawgraph.doctor import CLASS_NAMES, Finding, Report
from rawgraph.graphs.dot import SEVERITY_COLOURS

SRC = r"""
extern "C" __global__ void axpb(float a, const float* x, float b, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}"""
N = 256


@pytest.fixture
def graph(fake_driver, stream):
    with rg.DeviceBuffer((N,)) as x, rg.DeviceBuffer((N,)) as y:
        k = rg.RawKernel(SRC, "axpb")
        with rg.Capture(stream) as cap:
            k(1, 256, (2.0, x, 1.0, y, N), stream=stream)
        yield cap.graph
        cap.graph.close()


def test_graph_svg_from_the_dot_export(graph):
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not on PATH (apt-get install graphviz): the SVG path is not testable here")
    svg = graph._repr_svg_()
    assert svg is not None and "<svg" in svg and svg.rstrip().endswith("</svg>")
    assert "axpb" in svg  # the kernel node's label from its launch
    assert graph._repr_svg_() == svg  # the graph is still open and unchanged


def test_graph_svg_is_none_without_graphviz(graph, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **kw: None)
    assert graph._repr_svg_() is None


def test_graph_svg_is_none_for_a_closed_graph_before_anything_runs(graph, monkeypatch):
    asked = []
    monkeypatch.setattr(shutil, "which", lambda name, *a, **kw: asked.append(name) or "/usr/bin/dot")
    graph.close()
    assert graph._repr_svg_() is None and asked == []


def test_graph_svg_never_raises(graph, monkeypatch, tmp_path):
    import rawgraph.graphs.dot as dot

    def broken(*a, **kw):
        raise rg.RawgraphError("export failed")

    monkeypatch.setattr(shutil, "which", lambda name, *a, **kw: "/bin/false")
    assert graph._repr_svg_() is None  # dot exits non-zero
    monkeypatch.setattr(shutil, "which", lambda name, *a, **kw: str(tmp_path / "no-such-dot"))
    assert graph._repr_svg_() is None  # dot cannot be started
    monkeypatch.setattr(dot, "to_dot", broken)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **kw: "/usr/bin/dot")
    assert graph._repr_svg_() is None  # the export raised


class _Table(HTMLParser):
    """The text of each <p>, <th>, <td> and <li>, and each row's attributes."""

    def __init__(self):
        super().__init__()
        self.cells, self.heads, self.paras, self.items, self.rows = [], [], [], [], []
        self._into = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append(dict(attrs))
            self.cells.append([])
        elif tag in ("td", "th", "p", "li"):
            self._into = tag
            {
                "td": lambda: self.cells[-1].append(""),
                "th": lambda: self.heads.append(""),
                "p": lambda: self.paras.append(""),
                "li": lambda: self.items.append(""),
            }[tag]()
        elif tag == "br" and self._into == "td":
            self.cells[-1][-1] += "\n"

    def handle_endtag(self, tag):
        if tag == self._into:
            self._into = None

    def handle_data(self, data):
        target = {
            "td": lambda: self.cells[-1],
            "th": lambda: self.heads,
            "p": lambda: self.paras,
            "li": lambda: self.items,
        }.get(self._into)
        if target is not None:
            t = target()
            t[-1] += data


def _parse(text):
    p = _Table()
    p.feed(text)
    p.close()
    return p


def _finding(cls, sev, node, kernel="scale", owner="owner", advice="advice", related=()):
    return Finding(
        cls,
        CLASS_NAMES[cls],
        sev,
        node,
        "kernel",
        kernel,
        0x7F00,
        owner,
        advice,
        str(node),
        0x10 + node,
        "arg x",
        related,
    )


def test_report_html_is_the_summary_and_a_table_of_the_findings():
    evil = "<script>alert('x')</script> & \"q\""
    r = Report(
        [
            _finding(5, "error", 2, kernel=evil, related=("0", "<1>")),
            _finding(2, "warning", 0, owner=evil, advice=evil),
        ],
        graph=f"BuiltGraph {evil}",
        nodes=3,
        notes=[f"note {evil}"],
    )
    text = r._repr_html_()
    assert "<script>" not in text and "&lt;script&gt;" in text and "<1>" not in text
    got = _parse(text)
    assert got.paras == [str(r).splitlines()[0]]  # the summary line of str(report), unescaped back
    assert tuple(got.heads) == Report.HEADERS
    body = [c for c in got.cells if c]
    expected = [list(row) for row in r.rows()]
    expected[0][2] += "\nwith 0, <1>"
    assert body == expected
    tinted = [row for row in got.rows if "style" in row]
    assert [row["class"] for row in tinted] == ["error", "warning"]
    assert SEVERITY_COLOURS["error"] in tinted[0]["style"] and SEVERITY_COLOURS["warning"] in tinted[1]["style"]
    assert got.items == [f"note: note {evil}"]


def test_clean_report_html_has_no_table():
    r = Report([], graph="Graph 0x1", nodes=4)
    text = r._repr_html_()
    got = _parse(text)
    assert got.paras == [str(r)] and "clean" in got.paras[0]
    assert "<table" not in text and got.items == []
