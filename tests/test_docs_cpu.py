"""The semantics guide and the pages split from it (no GPU needed): they cite only tests that exist,
every claim cites one and is marked documented (with its link) or measured, the contents and the
links between pages resolve, every CUDA call a section names is linked to its documentation, and no
commit hash, issue number or session history is left in them."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDE = "semantics.md"
# The guide and the pages that describe rawgraph rather than the driver (sections 18, 19 and 23).
PAGES = [GUIDE, "rawgraph.md", "gemm.md", "trace.md"]
MOVED = {"18": "rawgraph.md", "19": "rawgraph.md", "23": "gemm.md"}
CITE = re.compile(r"`(tests/[A-Za-z0-9_]+\.py)::([A-Za-z0-9_]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
REF_DEF = re.compile(r"^\[([A-Za-z0-9-]+)\]: (\S+)$", re.M)
# A CUDA call named in the text: driver calls, the device runtime's graph calls, NVRTC's calls.
CALL = re.compile(
    r"\b(cu[A-Z][A-Za-z0-9]+|cudaGraph(?:Launch|SetConditional|KernelNodeUpdatesApply)\b|nvrtc[A-Z][A-Za-z]+)"
)
NOT_CALLS = {"cuBLAS", "cuRAND", "cuGraphExec"}  # libraries, and the exec type in `cuGraphExec*GetParams`
DOC_PAGES = re.compile(
    r"https://docs\.nvidia\.com/cuda/(cuda-driver-api/(group__CUDA__[A-Z_]+|api-sync-behavior)\.html"
    r"|cuda-runtime-api/group__CUDART__GRAPH\.html|nvrtc/index\.html)"
)
# Each claim's last words: documented, with a link to the page that says so, or measured only.
MARK = re.compile(r"(\[documented\]\[([a-z-]+)\]|\[measured\])$")
HISTORY = [
    (re.compile(r"`[0-9a-f]{7,40}`"), "a commit hash"),
    (re.compile(r"\b[Ii]ssues? \d+"), "an issue number"),
    (re.compile(r"\bthis session\b|\b[Ss]ession \d+"), "session history"),
    (re.compile(r"\bBefore this\b|\bwritten 20\d\d-|\bto run\)"), "history of the text itself"),
    (re.compile(r"(?<![\w{,-])20\d\d-\d\d-\d\d(?![\w}_-])"), "a date outside a results file name"),
]


def _text(page: str) -> str:
    return (DOCS / page).read_text(encoding="utf-8")


def _without_contents(text: str) -> str:
    return re.sub(r"(?ms)^## Contents\n.*?(?=^## )", "", text)


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def _anchors(page: str) -> set[str]:
    """The heading ids the rendered page has (Python-Markdown's toc, as MkDocs makes them)."""
    markdown = pytest.importorskip("markdown", reason="Python-Markdown comes with the docs extra (part of dev)")
    md = markdown.Markdown(extensions=["toc"])
    md.convert(_text(page))

    def walk(tokens):
        for t in tokens:
            yield t["id"]
            yield from walk(t["children"])

    return set(walk(md.toc_tokens))


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) for each `## ` section; subsections stay in their section."""
    parts = re.split(r"(?m)^(?=## )", _without_contents(text))
    return [(p.split("\n", 1)[0], p.split("\n", 1)[1] if "\n" in p else "") for p in parts if p.startswith("## ")]


def test_every_cited_test_exists():
    cites = [c for page in PAGES for c in CITE.findall(_text(page))]
    assert len(cites) >= 40, f"only {len(cites)} citations found: is the format still `tests/file.py::test_name`?"
    missing = [f"{f}::{t}" for f, t in cites if not (ROOT / f).is_file() or t not in _tests_in(ROOT / f)]
    assert missing == [], missing


@pytest.mark.parametrize("page", PAGES)
def test_every_claim_line_cites_a_test(page):
    """Each bullet of the reference text cites at least one test id (claims without one are not
    allowed in; context paragraphs are not bullets, nor are the contents' entries)."""
    bullets = re.split(r"\n(?=- )", _without_contents(_text(page)))
    uncited = [b.splitlines()[0][:80] for b in bullets if b.startswith("- ") and not CITE.search(b)]
    assert uncited == [], uncited


def _claims(text: str) -> list[str]:
    """Every claim: each bullet, each table row that cites a test, each other paragraph that does
    (the bold-led claims of the fork/join section, the doctor's)."""
    claims = []
    for block in re.split(r"\n\s*\n", _without_contents(text)):
        if block.startswith("#"):
            continue
        if block.startswith("- "):
            claims += re.split(r"\n(?=- )", block)
        elif block.startswith("|"):
            claims += [row.rstrip("|").rstrip() for row in block.splitlines() if CITE.search(row)]
        elif CITE.search(block):
            claims.append(block)
    return claims


@pytest.mark.parametrize("page", PAGES)
def test_every_claim_is_marked_documented_with_its_link_or_measured(page):
    text = _text(page)
    refs = dict(REF_DEF.findall(text))
    claims = _claims(text)
    assert claims
    unmarked = [c.splitlines()[0][:80] for c in claims if not MARK.search(c.rstrip())]
    assert unmarked == [], unmarked
    for claim in claims:
        ref = MARK.search(claim.rstrip()).group(2)
        assert ref is None or DOC_PAGES.fullmatch(refs.get(ref, "")), (ref, claim.splitlines()[0][:80])


def test_the_contents_list_every_section_of_the_guide_and_moved_ones_point_to_their_page():
    text = _text(GUIDE)
    contents = re.search(r"(?ms)^## Contents\n(.*?)(?=^## )", text)
    assert contents, "the guide has no '## Contents' list"
    entries = re.findall(r"^- \[([^\]]+)\]\(([^)]+)\)", contents.group(1), re.M)
    headings = [h[3:] for h, _ in _sections(text)]
    assert [title for title, _ in entries] == headings
    for (title, target), (_heading, body) in zip(entries, _sections(text)):
        number = title.split(".", 1)[0]
        if number in MOVED:  # the number stays (other files cite "section N"), its text moved
            assert target.startswith(MOVED[number] + "#"), (title, target)
            assert f"]({target})" in body and not CITE.search(body), f"section {number} is a stub linking {target}"
        else:
            assert target.startswith("#"), (title, target)


@pytest.mark.parametrize("page", PAGES)
def test_links_between_pages_resolve_to_a_heading(page):
    """MkDocs checks that a linked page exists; this also checks the anchor, which it only reports."""
    bad = []
    for target in LINK.findall(_text(page)):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        linked = path or page
        if not (DOCS / linked).is_file():
            bad.append(target)
        elif anchor and linked.endswith(".md") and anchor not in _anchors(linked):
            bad.append(target)
    assert bad == [], bad


@pytest.mark.parametrize("page", PAGES)
def test_every_cuda_call_a_section_names_links_its_documentation(page):
    text = _text(page)
    refs = dict(REF_DEF.findall(text))
    assert refs and all(DOC_PAGES.fullmatch(url) for url in refs.values()), refs
    # The page's opening text (a page split from the guide starts before its first section) counts
    # as a section of its own.
    opening = _without_contents(text).split("\n## ", 1)[0]
    unlinked = []
    for heading, body in [("(opening)", opening)] + _sections(text):
        linked = set(re.findall(r"\[`([A-Za-z0-9]+)`\]\[([a-z-]+)\]", body))
        for name, ref in linked:
            assert ref in refs, f"{heading}: [{name}][{ref}] has no link definition"
        names = {n for n in CALL.findall(REF_DEF.sub("", body)) if n not in NOT_CALLS}
        unlinked += [f"{heading[:40]}: {n}" for n in sorted(names - {n for n, _ in linked})]
    assert unlinked == [], unlinked


@pytest.mark.parametrize("page", PAGES)
def test_no_commit_hash_issue_number_or_session_history(page):
    """History belongs in benchmarks/NOTES.md (its heading "History moved out of the semantics
    guide"); results file names keep their commit and date."""
    found = [
        f"{what}: {m.group(0)!r} in {line.strip()[:70]!r}"
        for line in _text(page).splitlines()
        for rx, what in HISTORY
        for m in rx.finditer(line)
    ]
    assert found == [], found


def test_the_pages_split_from_the_guide_are_in_the_nav():
    config = ROOT / "mkdocs.yml"
    if not config.is_file():
        pytest.skip("mkdocs.yml is not in this tree")
    nav = config.read_text(encoding="utf-8")
    assert all(f": {page}" in nav for page in PAGES), nav


def _braces(pattern):
    """``a_{x,y}_b`` as ``a_x_b`` and ``a_y_b`` (the shell's brace expansion, one level)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [p for alt in m.group(1).split(",") for p in _braces(pattern[: m.start()] + alt + pattern[m.end() :])]


def test_every_result_kept_in_the_tree_is_quoted():
    """benchmarks/results holds the runs the README, the docs, the lab notes, the tests or the code
    name (a file, a glob over files, or the results document beside a quoted log or table); git keeps
    the rest."""
    import fnmatch

    results = ROOT / "benchmarks" / "results"
    sources = [ROOT / "README.md", ROOT / "benchmarks" / "NOTES.md", ROOT / "mkdocs.yml"]
    for pattern in ("docs/**/*.md", "tests/**/*.py", "rawgraph/**/*.py", "examples/**/*.py", "benchmarks/**/*.py"):
        sources += ROOT.glob(pattern)
    text = "\n".join(p.read_text(errors="replace") for p in sources if p.is_file())
    quoted = {f.name for f in results.iterdir() if f.name in text}
    for pattern in set(re.findall(r"[\w{}.,*-]*[*{][\w*.,{}-]*", text)):
        for one in _braces(pattern):
            if len(one) > 8:
                quoted |= {f.name for f in results.iterdir() if fnmatch.fnmatch(f.name, one)}
    stems = {q.split(".")[0] for q in quoted}
    unquoted = [
        f.name
        for f in sorted(results.iterdir())
        if f.name not in quoted and not any(f.name.split(".")[0].startswith(s) for s in stems if len(s) > 20)
    ]
    assert unquoted == [], unquoted
