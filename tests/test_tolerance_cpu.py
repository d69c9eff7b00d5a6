"""The float64 checks' tolerance (tests/helpers.py): plain for a well-conditioned block, wider only
where the block's residual adds cancel."""

import numpy as np
from helpers import perturbed_tolerance, random_input


def test_the_tolerance_grows_only_with_cancellation(rng):
    x = random_input(rng, (17, 8))
    w = [(rng.standard_normal((8, 8)) / np.sqrt(8), rng.standard_normal((8, 8)) / np.sqrt(8)) for _ in range(8)]
    assert perturbed_tolerance(x, w, rng) == 1e-5  # a random block: the plain tolerance
    cancel = [(np.array([[1.5]]), np.array([[-1 / 1.5 + 1e-4]]))] * 2  # 1 + w1 w2 = 1.5e-4 per layer
    xp = np.abs(random_input(rng, (17, 1))) + 0.1
    assert perturbed_tolerance(xp, cancel, rng) > 1e-3
