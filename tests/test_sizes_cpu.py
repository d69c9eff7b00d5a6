"""Bucket size lists, the bucket a batch goes to, padding waste (no GPU needed)."""

import bisect

import pytest

from rawgraph import ShapeError
from rawgraph.serving.sizes import check_sizes, padding_waste, pick_bucket, powers_of_two, vllm_sizes


def test_vllm_sizes_follow_its_default_list():
    s = vllm_sizes(512)
    assert s[:4] == [1, 2, 4, 8] and s[3:34] == list(range(8, 256, 8)) and s[34:] == list(range(256, 513, 16))
    assert vllm_sizes(256) == [1, 2, 4] + list(range(8, 257, 8))
    assert vllm_sizes(100)[-2:] == [96, 100]  # stops short: the maximum is added
    assert vllm_sizes(3) == [1, 2, 3]


def test_powers_of_two():
    assert powers_of_two(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert powers_of_two(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert powers_of_two(1) == [1]
    with pytest.raises(ShapeError):
        powers_of_two(0)


def test_pick_bucket_is_the_smallest_that_holds_n():
    sizes = vllm_sizes(256)
    for n in range(1, 257):
        b = pick_bucket(sizes, n)
        assert b >= n and (sizes.index(b) == 0 or sizes[sizes.index(b) - 1] < n)
        assert b == sizes[bisect.bisect_left(sizes, n)]
    assert pick_bucket(sizes, 257) is None


def test_check_sizes_sorts_dedupes_and_refuses():
    assert check_sizes([8, 1, 8, 4]) == [1, 4, 8]
    for bad in ([], [0], [2, -1], [1.5], [True]):
        with pytest.raises(ShapeError):
            check_sizes(bad)


def test_padding_waste_counts_rows_nobody_asked_for():
    assert padding_waste([1, 2, 4, 8], [8, 4, 1]) == 0.0
    assert padding_waste([16], [9]) == pytest.approx(7 / 16)  # the vLLM PR's 9 -> 16 case
    # 20 rows over a largest bucket of 8: chunks 8, 8 and a bucket of 4 for the last 4
    assert padding_waste([1, 2, 4, 8], [20]) == 0.0
    assert padding_waste([4, 8], [19]) == pytest.approx(1 - 19 / 20)
