import numpy as np
import pytest

from rawgraph.device import driver_status


def pytest_collection_modifyitems(config, items):
    ok, reason = driver_status()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: no CUDA driver/GPU found here ({reason.split('(')[0].strip()})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class SeededGenerator(np.random.Generator):
    """A Generator that remembers its seed, so a failure message can name it."""


@pytest.fixture
def rng():
    """Fresh random inputs every run (a new OS-entropy seed each time, kept in ``seed_used``)."""
    seed = np.random.SeedSequence().entropy
    gen = SeededGenerator(np.random.PCG64(seed))
    gen.seed_used = seed
    return gen


@pytest.fixture
def device():
    from rawgraph import get_device

    return get_device()


@pytest.fixture
def stream(device):
    from rawgraph import Stream

    s = Stream()
    yield s
    s.close()

