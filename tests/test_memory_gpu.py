"""Device memory (rawgraph.runtime.memory: ``DeviceBuffer``) on the GPU: to and from the host, and
the CUDA array interface naming the buffer's own address."""

import numpy as np
import pytest

from rawgraph import DeviceBuffer

pytestmark = pytest.mark.gpu


def test_host_round_trip(rng):
    a = rng.standard_normal((3, 5), dtype=np.float32)
    with DeviceBuffer.from_numpy(a) as b:
        np.testing.assert_array_equal(b.to_numpy(), a)
        assert b.__cuda_array_interface__["data"][0] == b.ptr
