"""The address-scanning helpers the doctor shares with :mod:`rawgraph.updates` (one import line,
so a move of those helpers touches only this file)."""

from ..updates.addresses import WordHit, allocation_of, as_range, scan_words  # noqa: F401

__all__ = ["WordHit", "allocation_of", "as_range", "scan_words"]
