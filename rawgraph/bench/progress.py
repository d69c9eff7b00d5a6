"""Progress over a benchmark sweep: a live bar with ETA when ``rich`` is there, plain lines if not.

::

    bar = SweepProgress(len(configs), "launch paths", plots=True)
    for layers, width, batch in bar.over(configs):
        bar.step(f"layers={layers} width={width} batch={batch}")
        ...  # print() still works: under the bar, rich shows each line above it

The bar is drawn only on a terminal; into a log file (``benchmarks/device_run.sh``) the same run
writes one plain ``[i/n] ... (elapsed, eta)`` line per configuration, as it does without rich.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

INSTALL_HINT = "pip install -e '.[bench]'"


def importable(name: str) -> bool:
    """True when the module ``name`` imports.

    Parameters
    ----------
    name : str
        Module name, e.g. ``"rich"``.

    Returns
    -------
    bool
        False for a missing module, one that fails to import, and one hidden with
        ``sys.modules[name] = None`` (how the tests simulate its absence).
    """
    try:
        importlib.import_module(name)
    except Exception:  # a broken install is as good as none for an optional extra
        return False
    return True


def missing_extras(plots: bool = False) -> list[str]:
    """One note per missing optional benchmark package, saying what the run does without it.

    Parameters
    ----------
    plots : bool
        Whether the caller draws plots (only then is a missing matplotlib worth a note).

    Returns
    -------
    list of str
        Notes such as ``"rich not installed: plain progress lines (pip install -e '.[bench]')"``.
    """
    notes = []
    if not importable("rich"):
        notes.append(f"rich not installed: plain progress lines ({INSTALL_HINT})")
    if plots and not importable("matplotlib"):
        notes.append(f"matplotlib not installed: no plots ({INSTALL_HINT})")
    return notes


def duration(seconds: float) -> str:
    """``"42s"``, ``"3m07s"`` or ``"1h05m"``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class SweepProgress:
    """Progress over ``total`` sweep configurations: a context manager, or iterate :meth:`over`.

    Parameters
    ----------
    total : int
        Number of configurations (calls to :meth:`step`).
    title : str
        What is swept, shown before each label.
    plots : bool
        The run draws plots: note at start when matplotlib is missing.
    file : TextIO, optional
        Where progress goes (default ``sys.stdout`` at entry).
    use_rich : bool, optional
        None (default): the rich bar when rich imports and ``file`` is a terminal. True: the bar
        whenever rich imports (drawn as if on a terminal). False: plain lines.
    """

    steps: int

    def __init__(
        self, total: int, title: str, *, plots: bool = False, file: TextIO | None = None, use_rich: bool | None = None
    ) -> None:
        self.total = total
        self.title = title
        self.plots = plots
        self.file = file
        self.use_rich = use_rich
        self.steps = 0  # configurations begun; all but the current one are done
        self._t0 = 0.0
        self._label = ""
        self._bar: Any = None  # rich.progress.Progress while a bar is shown
        self._task: Any = None

    @property
    def rich(self) -> bool:
        """True while the rich bar is shown (False: plain lines)."""
        return self._bar is not None

    def __enter__(self) -> SweepProgress:
        out = self.file if self.file is not None else sys.stdout
        self.file = out
        for note in missing_extras(self.plots):
            print(note, file=out, flush=True)
        want = out.isatty() if self.use_rich is None else self.use_rich
        if want and importable("rich"):
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            # speed_estimate_period: rich's ETA otherwise averages over the last 30 s only, and
            # forgets its speed (shows -:--:--) once one configuration takes longer than that.
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=Console(file=out, force_terminal=True if self.use_rich else None),
                speed_estimate_period=24 * 3600.0,
            )
            self._task = self._bar.add_task(self.title, total=self.total)
            self._bar.start()
        self._t0 = time.perf_counter()
        return self

    def over(self, items: Iterable[T]) -> Iterator[T]:
        """Yield ``items`` with the progress shown around the loop.

        The loop needs no ``with`` (so a sweep keeps its indentation): the bar starts at the first
        item and stops when the loop ends, breaks or raises (the generator is closed then).
        """
        with self:
            yield from items

    def step(self, label: str) -> None:
        """Begin the next configuration; the one before counts as done.

        Parameters
        ----------
        label : str
            The configuration, e.g. ``"layers=1 width=128 batch=1"``.
        """
        done = self.steps
        self.steps += 1
        self._label = label
        if self._bar is not None:
            self._bar.update(self._task, completed=done, description=f"{self.title}: {label}", refresh=True)
            return
        elapsed = time.perf_counter() - self._t0
        eta = duration(elapsed / done * (self.total - done)) if done else "?"
        print(
            f"[{self.steps}/{self.total}] {label} (elapsed {duration(elapsed)}, eta {eta})", file=self.file, flush=True
        )

    def detail(self, text: str) -> None:
        """Show where inside the current configuration the run is (bar only: a log gets no line)."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.title}: {self._label} {text}", refresh=True)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        elapsed = duration(time.perf_counter() - self._t0)
        if self._bar is not None:
            if exc_type is None:
                self._bar.update(self._task, completed=self.steps, description=self.title)
            self._bar.stop()  # also on an exception: it gives the terminal (cursor, stdout) back
            self._bar = None
        elif exc_type is None:
            print(f"{self.title}: {self.steps}/{self.total} done in {elapsed}", file=self.file, flush=True)
