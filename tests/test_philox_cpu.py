"""The NumPy Philox4x32-10 reference (rawgraph.control.rng) on the CPU: known answers, NumPy's
Philox, the counter layout, the dropout constants; and the refusals that need no GPU."""

import numpy as np
import pytest

from rawgraph.control import (
    DeviceGraph,
    DeviceLaunchError,
    blocks_for,
    dropout_constants,
    launcher_graph,
    philox4x32_10,
    reference_keep,
    reference_noisy_forward,
    reference_numbers,
    uniform24,
)
from rawgraph.control.device_launch import AUTO_FREE, UPLOAD
from rawgraph.models.tinyblock import reference_forward
from rawgraph.runtime.compiler import compile_source
from rawgraph.runtime.module import kernel_source

# Random123's kat_vectors for philox4x32_10: (counter, key, result).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]

CONSTANTS = {
    32: (0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85),
    64: (0xD2E7470EE14C6C93, 0xCA5A826395121157, 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B),
}


def philox_ints(ctr, key, width):
    """Philox4xW-10 in Python integers, for W = 32 or 64: the same round and key schedule as
    rawgraph's reference, written independently of NumPy arrays."""
    m0, m1, w0, w1 = CONSTANTS[width]
    mask = (1 << width) - 1
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + w0) & mask, (k[1] + w1) & mask]
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> width) ^ c[1] ^ k[0], p1 & mask, (p0 >> width) ^ c[3] ^ k[1], p0 & mask]
    return c


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_reference_gives_the_random123_known_answers(ctr, key, want):
    got = philox4x32_10(np.array([ctr], dtype=np.uint32), key)
    assert [int(v) for v in got[0]] == list(want)
    assert philox_ints(ctr, key, 32) == list(want)


def test_round_structure_matches_numpys_philox(rng):
    # NumPy's Philox is Philox4x64-10; the same round function at W=64 must reproduce it (NumPy
    # bumps the 256-bit counter before each block, so its first block is at counter + 1).
    counter = [int(v) for v in rng.integers(0, 2**63, size=4, dtype=np.uint64)]
    key = [int(v) for v in rng.integers(0, 2**63, size=2, dtype=np.uint64)]
    raw = np.random.Philox(counter=counter, key=key).random_raw(12)
    want = []
    c = counter[0] + (counter[1] << 64) + (counter[2] << 128) + (counter[3] << 192)
    for b in range(1, 4):
        v = (c + b) % (1 << 256)
        want += philox_ints([(v >> (64 * i)) & (2**64 - 1) for i in range(4)], key, 64)
    assert [int(v) for v in raw] == want, f"seed {rng.seed_used}"


def test_vectorised_reference_equals_the_integer_one(rng):
    ctrs = rng.integers(0, 2**32, size=(64, 4), dtype=np.uint64).astype(np.uint32)
    key = tuple(int(v) for v in rng.integers(0, 2**32, size=2, dtype=np.uint64))
    got = philox4x32_10(ctrs, key)
    for row, out in zip(ctrs, got):
        assert [int(v) for v in out] == philox_ints([int(v) for v in row], key, 32)


def test_counter_layout_seed_split_and_offset_carry(rng):
    seed = int(rng.integers(0, 2**63)) * 2 + 1
    offset = (1 << 32) - 2  # the low counter word wraps inside this draw
    nums = reference_numbers(seed, offset, 16)
    for b in range(4):
        c = offset + b
        want = philox_ints([c & 0xFFFFFFFF, c >> 32, 0, 0], [seed & 0xFFFFFFFF, seed >> 32], 32)
        assert [int(v) for v in nums[4 * b : 4 * b + 4]] == want
    # 64-bit wrap-around of the block counter, as the device's unsigned long long add
    top = reference_numbers(seed, 2**64 - 1, 8)
    assert np.array_equal(top[4:], reference_numbers(seed, 0, 4))
    # a draw is a prefix of any longer draw, and blocks continue at offset + 1
    long = reference_numbers(seed, 5, 4099)
    assert np.array_equal(long[:1001], reference_numbers(seed, 5, 1001))
    assert np.array_equal(long[4:], reference_numbers(seed, 6, 4095))
    assert blocks_for(4099) == 1025 and blocks_for(4) == 1 and blocks_for(1) == 1


def test_reference_refuses_out_of_range_state():
    with pytest.raises(ValueError):
        reference_numbers(2**64, 0, 4)
    with pytest.raises(ValueError):
        reference_numbers(0, -1, 4)
    with pytest.raises(TypeError):
        reference_numbers(1.5, 0, 4)


def test_uniforms_are_exact_24_bit_fractions(rng):
    nums = reference_numbers(int(rng.integers(0, 2**62)), 0, 1 << 16)
    u = uniform24(nums)
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    assert np.array_equal((u.astype(np.float64) * 2**24).astype(np.uint64), (nums >> 8).astype(np.uint64))


def test_reference_stream_statistics(rng):
    n = 1 << 18
    u = uniform24(reference_numbers(int(rng.integers(0, 2**62)), int(rng.integers(0, 2**40)), n)).astype(np.float64)
    assert abs(u.mean() - 0.5) < 6 * np.sqrt(1 / 12 / n), f"seed {rng.seed_used}"
    assert abs(u.var() - 1 / 12) < 6 * np.sqrt(1 / 180 / n), f"seed {rng.seed_used}"
    counts = np.bincount((u * 64).astype(np.int64), minlength=64)
    chi2 = float(((counts - n / 64) ** 2 / (n / 64)).sum())
    assert chi2 < 63 + 6 * np.sqrt(2 * 63), f"chi2 {chi2}, seed {rng.seed_used}"


def test_dropout_constants():
    assert dropout_constants(0.0) == (0, 1.0)
    t, s = dropout_constants(0.25)
    assert t == 1 << 22 and s == np.float32(4 / 3)
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            dropout_constants(bad)
    with pytest.raises(TypeError):
        dropout_constants(True)
    with pytest.raises(ValueError):
        dropout_constants(1 - 2**-26)  # rounds to dropping everything


def test_keep_fraction_is_one_minus_p(rng):
    n = 1 << 18
    keep = reference_keep(int(rng.integers(0, 2**62)), 0, n, 0.3)
    assert abs(keep.mean() - 0.7) < 6 * np.sqrt(0.21 / n), f"seed {rng.seed_used}"


def test_noisy_reference_with_p0_is_the_plain_reference(rng):
    x = rng.standard_normal((3, 16))
    weights = [(rng.standard_normal((16, 16)), rng.standard_normal((16, 16))) for _ in range(2)]
    assert np.array_equal(reference_noisy_forward(x, weights, 1, 2, 0.0), reference_forward(x, weights))
    noisy = reference_noisy_forward(x, weights, 1, 2, 0.5)
    assert not np.allclose(noisy, reference_forward(x, weights))


@pytest.mark.parametrize("name", ["philox", "device_launch"])
def test_kernels_compile_for_sm90_without_rdc(name):
    img = compile_source(kernel_source(name), f"{name}.cu", "sm_90", cache=False)
    assert img.fmt == "cubin" and len(img.image) > 0


def test_device_launch_flag_refusals_before_any_driver_call():
    with pytest.raises(DeviceLaunchError, match="AUTO_FREE"):
        DeviceGraph(None, None, flags=AUTO_FREE)  # type: ignore[arg-type]
    with pytest.raises(DeviceLaunchError, match="UPLOAD"):
        DeviceGraph(None, None, flags=UPLOAD)  # type: ignore[arg-type]
    with pytest.raises(DeviceLaunchError, match="unknown"):
        DeviceGraph(None, None, flags=1 << 40)  # type: ignore[arg-type]


def test_launcher_refuses_a_target_that_is_not_a_device_graph():
    with pytest.raises(DeviceLaunchError, match="DeviceGraph"):
        launcher_graph(object(), None)  # type: ignore[arg-type]
