"""MkDocs hook for the API reference: the docstring warnings that `mkdocs build --strict` lets through,
each named exactly, and the docstrings' Sphinx roles made into code and links.

**Known warnings.** griffe (mkdocstrings' Python reader) warns where a numpy-style docstring does
not parse as one. The build is strict: any such warning fails it, except the ones listed in
``KNOWN`` below, matched by file and full message (not by line, so edits above them do not break the match). Each is a real
docstring error in a module the documentation change could not edit; fixing the docstring and
removing its entry here is the way out (the build says at INFO level when an entry no longer
occurs). Never add a pattern: add the exact message, and why it cannot be fixed now.

**Sphinx roles.** The docstrings cross-reference with Sphinx roles (``:class:`~rawgraph.Launch` ``,
``:meth:`close` ``), which mkdocstrings leaves as text (":class:" then the code). Each becomes the
code alone (the last part only after ``~``), linked where the target has a heading in the site: a
``rawgraph.`` name by where the object is defined (``rawgraph.Launch`` is
``rawgraph.runtime.launch.Launch``), a short or relative name by the one heading of the same page
that ends with it. An optional autorefs reference: a target with no heading stays plain code, with
no warning.
"""

from __future__ import annotations

import html
import importlib
import logging
import re
from typing import Any

# (file, message) -> the docstring error behind it.
KNOWN: dict[tuple[str, str], str] = {
    (
        "rawgraph/models/tp_block.py",
        "Could not parse line '``close()`` frees the shards and scratch (``cuMemFree`` / ``ncclMemFree``); safe twice.'",
    ): "TPBlock: a closing paragraph inside the Parameters section (the line is dropped from the page); "
    "it belongs before Parameters or in a Notes section",
    (
        "rawgraph/multi/comm.py",
        "No types or annotations for parameters ['Use']",
    ): "NcclComm: the closing paragraph 'Use :meth:`from_env` ...' inside Parameters is read as a parameter 'Use'",
    (
        "rawgraph/multi/comm.py",
        "Parameter 'Use' does not appear in the function signature",
    ): "NcclComm: the same paragraph",
    (
        "rawgraph/serving/choose.py",
        "No types or annotations for parameters ['A']",
    ): "choose_strategy: the paragraph 'A candidate that raises ...' inside Parameters is read as parameters "
    "'A', 'with' and 'happens'; it belongs in a Notes section",
    (
        "rawgraph/serving/choose.py",
        "Parameter 'A' does not appear in the function signature",
    ): "choose_strategy: the same paragraph",
    (
        "rawgraph/serving/choose.py",
        "No types or annotations for parameters ['with']",
    ): "choose_strategy: the same paragraph",
    (
        "rawgraph/serving/choose.py",
        "Parameter 'with' does not appear in the function signature",
    ): "choose_strategy: the same paragraph",
    (
        "rawgraph/serving/choose.py",
        "No types or annotations for parameters ['happens']",
    ): "choose_strategy: the same paragraph",
    (
        "rawgraph/serving/choose.py",
        "Parameter 'happens' does not appear in the function signature",
    ): "choose_strategy: the same paragraph",
}

# "griffe: rawgraph/serving/choose.py:248: message" (the path may be absolute)
_MESSAGE = re.compile(r"griffe: (?:.*[/\\])?(rawgraph/[\w/]+\.py):\d+: (.*)\Z", re.S)
_seen: set[tuple[str, str]] = set()
_log = logging.getLogger("mkdocs.hooks.docstrings")


class _KnownWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        m = _MESSAGE.match(record.getMessage())
        key = (m.group(1), m.group(2)) if m else None
        if key is not None and key in KNOWN:
            _seen.add(key)
            return False
        return True


_FILTER = _KnownWarnings()


def on_config(config: Any) -> Any:
    _seen.clear()
    griffe_log = logging.getLogger("mkdocs.plugins.griffe")  # where mkdocstrings relocates griffe's logger
    if _FILTER not in griffe_log.filters:
        griffe_log.addFilter(_FILTER)
    return config


def on_post_build(config: Any) -> None:
    for path, message in sorted(set(KNOWN) - _seen):
        _log.info("known docstring warning no longer raised (remove it from KNOWN): %s: %s", path, message)


_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):<code>([^<]*)</code>")
_HEADING_ID = re.compile(r'\bid="(rawgraph(?:\.\w+)+)"')


def _defined_at(name: str) -> str:
    """``rawgraph.X.Y`` as the name of the object where it is defined (re-exports followed); the
    name as given when it does not import."""
    parts = name.split(".")
    try:
        obj: Any = importlib.import_module(parts[0])
        for i, part in enumerate(parts[1:], 1):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                obj = importlib.import_module(".".join(parts[: i + 1]))
    except Exception:
        return name
    if hasattr(obj, "__qualname__") and isinstance(getattr(obj, "__module__", None), str):
        return f"{obj.__module__}.{obj.__qualname__}"
    return getattr(obj, "__name__", name) if type(obj).__name__ == "module" else name


def on_page_content(content: str, page: Any, **kwargs: Any) -> str:
    if ":<code>" not in content:
        return content
    ids = set(_HEADING_ID.findall(content))

    def link(m: re.Match[str]) -> str:
        text = html.unescape(m.group(1)).strip()
        if "<" in text and text.endswith(">"):  # :func:`title <target>`
            title, target = text[:-1].split("<", 1)
            title, target = title.strip(), target.strip()
        else:
            target = text.lstrip("~")
            title = target.rsplit(".", 1)[-1] if text.startswith("~") else target
        target = target.lstrip(".")
        title = title.lstrip(".")
        if target.startswith("rawgraph."):
            ident: str | None = _defined_at(target)
        else:
            near = [i for i in ids if i.endswith("." + target)]
            ident = near[0] if len(near) == 1 else None
        code = f"<code>{html.escape(title)}</code>"
        return code if ident is None else f'<autoref identifier="{html.escape(ident)}" optional>{code}</autoref>'

    return _ROLE.sub(link, content)
