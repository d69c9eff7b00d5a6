"""A fresh NVRTC compile leaves CPython's shared one-byte bytes and one-character str intact (CPU)."""

import pytest
from singletons import corrupted_singletons

from rawgraph.runtime.compiler import compile_source

CLEAN = 'extern "C" __global__ void rg_singleton_clean(float* x) { x[threadIdx.x] = 1.0f; }\n'
# An unused variable: NVRTC's log holds a warning (a log of more than one byte).
WARNS = 'extern "C" __global__ void rg_singleton_warns(float* x) { int unused; x[threadIdx.x] = 2.0f; }\n'


@pytest.mark.parametrize("fmt", ["cubin", "ptx"])
def test_compile_with_an_empty_log_leaves_singletons_intact(fmt, tmp_path):
    assert corrupted_singletons() == []
    # A new source each time (the nonce): a fresh compile, never a cache hit.
    src = CLEAN + f"// nonce {tmp_path.name} {fmt}\n"
    entry = compile_source(src, "clean.cu", "sm_90", fmt=fmt, cache=False)
    assert entry.log == ""  # the case that used to write NVRTC's lone NUL into b" " * 1
    assert entry.image and not entry.from_cache
    assert corrupted_singletons() == []
    assert b" " == bytes([32]) and b" ".join([b"a", b"b"]) == b"a b" and " ".join("ab") == "a b"


def test_compile_with_a_warning_log_leaves_singletons_intact(tmp_path):
    src = WARNS + f"// nonce {tmp_path.name}\n"
    entry = compile_source(src, "warns.cu", "sm_90", cache=False)
    assert "unused" in entry.log and "\x00" not in entry.log
    assert corrupted_singletons() == []


def test_the_check_sees_a_corrupted_singleton():
    # The end-of-run check in conftest.py rests on corrupted_singletons(): it must see a changed
    # singleton. Corrupt one on purpose through ctypes (the way NVRTC did) and restore it at once.
    import ctypes

    victim = bytes([0x7E])  # "~"
    # Integers, not b"~": while it is corrupted, the literal b"~" is the corrupted object itself.
    data = ctypes.c_ubyte.from_address(id(victim) + bytes.__basicsize__ - 1)
    assert data.value == 0x7E
    data.value = 0x21
    try:
        bad = corrupted_singletons()
    finally:
        data.value = 0x7E
    assert bad == ["bytes 0x7e reads b'!'"]
    assert corrupted_singletons() == []
