"""The CPU fake driver, which lives in the package (:mod:`rawgraph.testing.fakedriver`).

``import fakedriver`` in a test gets that very module (not a copy), so a test that reads or sets
anything in it, private names included, acts on the one the library's plugin uses.
"""

import sys

import rawgraph.testing.fakedriver as _fakedriver

sys.modules[__name__] = _fakedriver
