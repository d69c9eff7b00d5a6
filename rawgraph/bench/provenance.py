"""What a results file records about where it came from: the commit measured, the machine, the
library versions. Every benchmark JSON under ``benchmarks/results/`` carries :func:`environment`.

The device machine gets a copy of the working tree without ``.git``, so the commit comes from
``$RAWGRAPH_COMMIT`` when set (``benchmarks/device_run.sh`` passes it on), else from ``git``.
"""

from __future__ import annotations

import datetime
import importlib.metadata as md
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

COMMIT_ENV = "RAWGRAPH_COMMIT"


def commit() -> str:
    """The commit being measured: ``$RAWGRAPH_COMMIT``, else ``git rev-parse --short HEAD``
    (with ``+dirty`` when the tree has uncommitted changes), else ``"unknown"``."""
    env = os.environ.get(COMMIT_ENV)
    if env:
        return env
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


def _version(package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def environment(**extra: Any) -> dict[str, Any]:
    """Commit, GPU, driver and library versions, date (plus ``extra``), for a results JSON."""
    from ..runtime.compiler import nvrtc_version
    from ..runtime.device import driver_version, get_device, gpu_available

    info: dict[str, Any] = {
        "commit": commit(),
        "gpu": get_device().info.name if gpu_available() else None,
        "driver": driver_version(),
        "cuda_bindings": _version("cuda-bindings"),
        "nvrtc": "{}.{}".format(*nvrtc_version()),
        "torch": _version("torch"),
        "cupy": _version("cupy-cuda13x") or _version("cupy"),
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }
    info.update(extra)
    return info
