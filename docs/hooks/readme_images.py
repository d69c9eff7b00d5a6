"""MkDocs hook: the images README.md shows are pages' files of the site too.

``docs/readme.md`` includes README.md whole, so the README's image links (relative to the
repository root, where GitHub reads them) are read relative to ``docs/``, where no such file is.
Each image the README links is added to the site's files at that same relative path, from the
repository, so the link resolves in both places and a missing image still fails the strict build.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# ![alt](relative/path.png): a local image, not a URL
_IMAGE = re.compile(r"!\[[^\]]*\]\((?![a-z]+://)([^)\s]+)\)")


def on_files(files: Files, config: Any) -> Files:
    root = Path(config["config_file_path"]).parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    for rel in _IMAGE.findall(readme):
        if files.get_file_from_path(rel) is None and (root / rel).is_file():
            files.append(File.generated(config, rel, abs_src_path=str(root / rel)))
    return files
