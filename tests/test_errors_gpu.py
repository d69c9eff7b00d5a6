"""Driver errors (rawgraph.runtime.errors) with a driver loaded: every ``CUresult`` decodes to its
name and code, and (nearly) every one carries the driver's own description."""

import pytest
from cuda.bindings import driver

from rawgraph.runtime.errors import cuda_error

pytestmark = pytest.mark.gpu


def test_every_cuda_result_decodes_to_its_name():
    undescribed = []
    for code in driver.CUresult:
        exc = cuda_error(code, "cuSomething")
        assert exc.name == code.name and exc.code == int(code) and code.name in str(exc)
        if "no description" in exc.message:
            undescribed.append(code.name)
    # With a driver loaded, cuGetErrorString describes (nearly) every code this binding knows.
    assert len(undescribed) <= 3, undescribed
