"""CPython's shared one-byte ``bytes`` and one-character ``str`` objects, and a check that they are intact.

CPython hands out one object for every one-byte ``bytes`` (``b" " * 1 is b" "``) and, for code
points below 256, every one-character ``str``. A C call that writes into such an object (NVRTC
filling a log buffer made as ``b" " * 1``) changes that value for the whole process.
"""

from __future__ import annotations


def corrupted_singletons() -> list[str]:
    """The shared objects whose content no longer matches their value, e.g. ``["bytes 0x20"]``.

    ``bytes([i])`` and ``chr(i)`` return the shared objects themselves, so reading them back reads
    the very memory a stray write would have changed.
    """
    bad = []
    for i in range(256):
        b = bytes([i])
        if len(b) != 1 or memoryview(b)[0] != i:
            bad.append(f"bytes 0x{i:02x} reads {bytes(memoryview(b))!r}")
        c = chr(i)
        if len(c) != 1 or ord(c) != i:
            bad.append(f"str U+{i:04X} reads {c!r}")
    return bad
